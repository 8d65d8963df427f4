//! The walk's calls, operators and subqueries: what each costs per byte of
//! its arguments, and the size of what it returns.

use super::repeats::*;
use super::sizes::*;
use super::tree::*;
use super::*;

impl Walk {
    pub(super) fn call(&mut self, n: &Map<String, Value>, from_function: bool) -> Result<Size, Refusal> {
        let name = last_name(n.get("funcname")).unwrap_or_default();
        let mut args = Vec::new();
        for arg in n.get("args").and_then(Value::as_array).into_iter().flatten() {
            self.array_ok = from_function;
            args.push(self.visit(arg)?);
        }
        self.array_ok = false;
        for clause in ["agg_order", "agg_filter", "over"] {
            self.field(n, clause)?;
        }
        let weight = if LIGHT_CALLS.contains(&name) {
            LIGHT
        } else if COLLATED_CALLS.contains(&name) {
            COLLATED
        } else {
            HEAVY
        };
        self.charge(weight.saturating_mul(total(&args)));
        if name == "to_timestamp" && args.len() == 2 {
            // Each field of the format scans the rest of the input.
            let format = short_literal_format(name, n.get("args"))?;
            self.charge(LIGHT.saturating_mul(args[0].bytes).saturating_mul(format));
        }
        if name == "to_char" && args.len() == 2 {
            // Each field works over the whole number's digits (a short
            // format: a few passes, within the call's own charge).
            short_literal_format(name, n.get("args"))?;
        }
        let widest = args.iter().fold(Size::default(), |a, b| a.max(*b));
        if from_function {
            // Its columns are parts of its arguments (elements, members).
            return Ok(widest);
        }
        // A number's text is as long as its digits (`concat`, casts to text).
        let size = match name {
            // x - trunc(x / y) * y keeps x's scale (the twenty-seventh read:
            // `mod(p, 7)` of a 16,000-digit p has 16,000 digits, taken for 20).
            "mod" => {
                let (l, r) = pair(&args);
                self.charge(quotient_pairs(l, r));
                Size {
                    bytes: r.bytes.max(l.bytes),
                    digits: l.digits.saturating_add(r.digits).min(MAX_DIGITS),
                }
            }
            "sqrt" => {
                self.charge(digit_pairs(widest, widest));
                widest
            }
            "sum" | "avg" => {
                if self.grouped && widest.digits > SUMMED_DIGITS {
                    return Err(summed_digits_refused(name, widest.digits));
                }
                // Values of different scales: one's integer digits and
                // another's fraction (`1e999` and `1e-999` sum to 1,999).
                Size {
                    bytes: widest.bytes.max(Size::SMALL.bytes),
                    digits: widest
                        .digits
                        .saturating_mul(2)
                        .saturating_add(NUMBER_DIGITS)
                        .min(MAX_DIGITS),
                }
            }
            // `round(x, s)` and `trunc(x, s)` give x the scale s: digits x
            // never had (the twenty-sixth read: `round(1.0, 1000) / 3` has
            // 1,000, taken for 20, and sixteen of them multiplied made a
            // 16,000-digit number whose products ran 90 s in one row
            // against a counted 1 s). A scale that is no literal may be
            // PostgreSQL's largest.
            "round" | "trunc" if args.len() == 2 => {
                let scale = integer_argument(n.get("args"), 1)
                    .map_or(MAX_SCALE, |s| s.clamp(0, MAX_SCALE as i64) as u64);
                let digits = args[0].digits.saturating_add(scale).min(MAX_DIGITS);
                Size {
                    bytes: args[0].bytes.max(digits),
                    digits,
                }
            }
            "abs" | "ceil" | "ceiling" | "coalesce" | "floor" | "greatest" | "lag" | "lead" | "least"
            | "max" | "min" | "nullif" | "round" | "trunc" | "sign" => widest,
            // `concat_ws` writes its separator between every two arguments.
            "concat_ws" => Size {
                bytes: total(&args).saturating_add(args.first().map_or(0, |sep| {
                    sep.bytes.saturating_mul(args.len().saturating_sub(2) as u64)
                })),
                digits: NUMBER_DIGITS,
            },
            _ if CONCATENATING.contains(&name) => Size {
                bytes: total(&args),
                digits: NUMBER_DIGITS,
            },
            _ if JSON_BUILDING.contains(&name) => Size {
                bytes: total(&args).saturating_mul(6).saturating_add(16),
                digits: NUMBER_DIGITS,
            },
            // Case mapping can triple a character's bytes (ICU: `ΐ` to `Ϊ́`); hex doubles.
            "upper" | "lower" | "hex" => Size {
                bytes: widest.bytes.saturating_mul(3),
                digits: NUMBER_DIGITS,
            },
            "substr" | "substring" | "left" | "right" | "trim" | "btrim" | "ltrim" | "rtrim" => Size {
                bytes: widest.bytes,
                digits: NUMBER_DIGITS,
            },
            // Its output is its format's, each pattern character at most 16
            // wide (`J` of an interval of huge years: 11).
            "to_char" => Size {
                bytes: widest.bytes.saturating_mul(16),
                digits: NUMBER_DIGITS,
            },
            _ => Size::SMALL,
        };
        Ok(Size {
            bytes: size.bytes.max(size.digits),
            ..size
        })
    }

    pub(super) fn operator(&mut self, n: &Map<String, Value>) -> Result<Size, Refusal> {
        let op = last_name(n.get("name")).unwrap_or_default();
        let kind = n.get("kind").and_then(Value::as_i64).unwrap_or_default();
        let kind = i32::try_from(kind)
            .ok()
            .and_then(|k| pg_query::protobuf::AExprKind::try_from(k).ok());
        use pg_query::protobuf::AExprKind as K;
        let l = self.field(n, "lexpr")?;
        let any_all = matches!(kind, Some(K::AexprOpAny | K::AexprOpAll));
        let array = match any_all {
            true => Some(any_all_array(op, n.get("rexpr"))?),
            false => None,
        };
        self.array_ok = any_all;
        let r = if kind == Some(K::AexprIn) {
            Size::default()
        } else {
            self.field(n, "rexpr")?
        };
        self.array_ok = false;
        let (lb, rb) = (l.bytes, r.bytes);
        let both = lb.saturating_add(rb);
        match kind {
            // `a IN (x, y, ...)`: the list's items, each compared.
            Some(K::AexprIn) => {
                let items = match n.get("rexpr").and_then(|r| r.as_object()).and_then(node) {
                    Some(("List", list)) => self.items(list, "items")?,
                    _ => vec![self.field(n, "rexpr")?],
                };
                let compared = lb
                    .saturating_mul(items.len() as u64)
                    .saturating_add(total(&items));
                self.charge(LIGHT.saturating_mul(compared));
                return Ok(Size::SMALL);
            }
            Some(K::AexprOpAny | K::AexprOpAll) => {
                // The operator runs once per element, each time over all of
                // `x` (a compressed value is even decompressed again).
                let weight = operator_weight(op);
                match array {
                    Some(AnyAll::Elements(count)) => {
                        let compared = lb.saturating_mul(count).saturating_add(rb);
                        self.charge(weight.saturating_mul(compared));
                    }
                    // `=`/`<>` over scalars: unequal lengths end a comparison
                    // at once, so the work is both sides once; against numbers,
                    // a numeric `x` compares its digits with each element
                    // (about one per two bytes of the array's text, which the
                    // cast counts twice).
                    Some(AnyAll::Scalars { numbers }) => {
                        self.charge(weight.saturating_mul(lb.saturating_add(rb.saturating_mul(2))));
                        if numbers {
                            let groups = l.digits / 4 + 1;
                            self.charge(groups.saturating_mul(rb / 4).saturating_mul(DIGIT_PAIR));
                        }
                    }
                    None => {}
                }
                return Ok(Size::SMALL);
            }
            Some(K::AexprOp) => {}
            _ => {
                // DISTINCT, NULLIF, BETWEEN: comparisons.
                self.charge(COLLATED.saturating_mul(both.saturating_mul(2)));
                return Ok(l.max(r));
            }
        }
        self.charge(operator_weight(op).saturating_mul(both));
        let size = match op {
            "||" => Size {
                bytes: both,
                digits: NUMBER_DIGITS,
            },
            "*" => {
                self.charge(digit_pairs(l, r));
                Size {
                    bytes: both,
                    digits: (l.digits.saturating_add(r.digits)).min(MAX_DIGITS),
                }
            }
            "/" | "%" => {
                self.charge(quotient_pairs(l, r));
                Size {
                    bytes: both,
                    digits: (l.digits.saturating_add(r.digits).saturating_add(NUMBER_DIGITS)).min(MAX_DIGITS),
                }
            }
            // Not even the one digit a sum may gain: a counter in a recursive
            // CTE must keep a stable bound (PostgreSQL's numerics stop at
            // MAX_DIGITS, and a quadratic cost needs thousands).
            // Inside a CTE that reads itself, `x + x` may double a number at
            // every step: any number there may reach PostgreSQL's maximum.
            // A long number and another keep one's integer digits and the
            // other's fraction (`1e999 + 1e-999` has 1,999 digits): past
            // NUMBER_DIGITS, their digits add up.
            "+" | "-" => Size {
                bytes: lb.max(rb),
                digits: match (self.recursive > 0, l.digits.max(r.digits) > NUMBER_DIGITS) {
                    (true, true) => MAX_DIGITS,
                    (false, true) => l.digits.saturating_add(r.digits).min(MAX_DIGITS),
                    (_, false) => l.digits.max(r.digits),
                },
            },
            "->" | "->>" | "#>" | "#>>" | "&" | "|" | "#" | "<<" | ">>" => l.max(r),
            _ => Size::SMALL,
        };
        // A number's text is as long as its digits.
        Ok(Size {
            bytes: size.bytes.max(size.digits),
            ..size
        })
    }

    pub(super) fn sublink(&mut self, n: &Map<String, Value>) -> Result<Size, Refusal> {
        use pg_query::protobuf::SubLinkType as T;
        let kind = n.get("sub_link_type").and_then(Value::as_i64).unwrap_or_default();
        let kind = i32::try_from(kind).ok().and_then(|k| T::try_from(k).ok());
        if kind == Some(T::ArraySublink) {
            return Err(Refusal::Forbidden(
                "ARRAY(subquery) is not allowed: it builds one value from any number of rows, which \
                 PostgreSQL then works on without interruption; join or use = ANY (subquery)"
                    .into(),
            ));
        }
        let test = self.field(n, "testexpr")?;
        let output = self.nested(n.get("subselect"))?;
        if test.bytes > 0 {
            // `x = ANY (subquery)`: one comparison per row of the subquery.
            self.charge(COLLATED.saturating_mul(test.bytes.saturating_add(output.bytes)));
        }
        Ok(match kind {
            Some(T::ExprSublink | T::MultiexprSublink) => output.max(Size {
                bytes: self.derived.bytes,
                digits: self.derived.digits,
            }),
            _ => Size::SMALL,
        })
    }
}
