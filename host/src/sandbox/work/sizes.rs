//! The work bound's costs and sizes: the measured weights per byte, the
//! calls and operators of each weight, and what a value's size (bytes as
//! text, digits as a number) can be after a literal, a cast or a call.

use super::super::guard::Refusal;
use super::tree::last_name;
use serde_json::{Map, Value};

/// Nanoseconds per byte of input of the cheap calls, operators and casts:
/// `=`, `<>`, arithmetic, `md5`, `length`, `substr`, `trim`, `left`, `right`,
/// casts to anything but JSON (measured at most 6 ns per byte on 6 MiB values).
pub(super) const LIGHT: u64 = 12;
/// Nanoseconds per byte of collation-aware work: `<` and kin, `upper`,
/// `lower`, `concat` (measured at most 12 ns per byte, with an ICU collation).
pub(super) const COLLATED: u64 = 32;
/// Nanoseconds per byte of everything else: JSON parsing (`->>` on text,
/// casts to json and jsonb), `||` (on jsonb: measured 34 ns per byte), casts
/// to floating point (39), `to_char` and `to_timestamp` formats (53).
pub(super) const HEAVY: u64 = 64;
/// Nanoseconds per pair of base-10,000 digit groups of a numeric
/// multiplication, division or remainder (measured 1.5).
pub(super) const DIGIT_PAIR: u64 = 3;

/// Digits of a number from a column: `numeric(p, s)` has p <= 1000.
pub const COLUMN_DIGITS: u64 = 1_000;
/// Digits of an integer or floating-point value.
pub(super) const NUMBER_DIGITS: u64 = 20;
/// The most digits a number summed by `sum` or `avg` in a query with GROUP
/// BY may have: a product of two columns. Regression (the nineteenth adversarial read, issue 23): a
/// hash aggregate checks its memory only when it makes a group, and a sum's
/// state grows with its numbers after that: `sum(0.0 + '1e131071')` per
/// group held 1.7 GB in 5 s, with `enable_hashagg = off` outweighed by a
/// large enough row estimate.
pub(super) const SUMMED_DIGITS: u64 = 2 * COLUMN_DIGITS + NUMBER_DIGITS;

pub(super) fn summed_digits_refused(call: &str, digits: u64) -> Refusal {
    Refusal::Forbidden(format!(
        "{call}() over a number of up to {digits} digits is not allowed (at most {SUMMED_DIGITS}: a \
         grouped sum's state grows with its numbers where PostgreSQL no longer weighs it); cast what \
         you sum, as in `{call}(CAST(x AS numeric(20, 2)))`"
    ))
}

/// PostgreSQL's own bound on a numeric's digits (131,072 before the point,
/// 16,383 after).
pub(super) const MAX_DIGITS: u64 = 147_455;
/// The largest scale PostgreSQL gives a number (`NUMERIC_DSCALE_MAX`; 15's
/// `round` stops at 2,000, later releases may not).
pub(super) const MAX_SCALE: u64 = 16_383;

/// The value of argument `at` of a call when it is an integer literal.
pub(super) fn integer_argument(args: Option<&Value>, at: usize) -> Option<i64> {
    let arg = args.and_then(Value::as_array)?.get(at)?.as_object()?;
    let (kind, c) = super::tree::node(arg)?;
    if kind != "AConst" {
        return None;
    }
    c.get("val")?
        .get("Ival")?
        .get("ival")
        .map_or(Some(0), Value::as_i64)
}

/// Calls that cost [`LIGHT`] per byte.
pub(super) const LIGHT_CALLS: &[&str] = &[
    "abs",
    "avg",
    "btrim",
    "ceil",
    "ceiling",
    "char_length",
    "coalesce",
    "count",
    "floor",
    "gen_random_uuid",
    "left",
    "length",
    "ltrim",
    "md5",
    "mod",
    "nullif",
    "right",
    "round",
    "rtrim",
    "sign",
    "sqrt",
    "substr",
    "substring",
    "sum",
    "trim",
    "trunc",
];
/// Calls that cost [`COLLATED`] per byte.
pub(super) const COLLATED_CALLS: &[&str] = &[
    "concat",
    "concat_ws",
    "date_part",
    "date_trunc",
    "extract",
    "greatest",
    "least",
    "lower",
    "max",
    "min",
    "upper",
];
/// Operators that cost [`LIGHT`] per byte.
pub(super) const LIGHT_OPERATORS: &[&str] =
    &["=", "<>", "+", "-", "*", "/", "%", "&", "|", "#", "<<", ">>", "?"];
/// Operators that cost [`COLLATED`] per byte.
pub(super) const COLLATED_OPERATORS: &[&str] = &["<", ">", "<=", ">="];
/// Calls whose result can be as long as all their arguments together.
pub(super) const CONCATENATING: &[&str] = &["concat", "concat_ws"];
/// Calls that write their arguments as JSON: an escaped character takes up
/// to six bytes (`\u0001`).
pub(super) const JSON_BUILDING: &[&str] = &[
    "json_array",
    "json_build_array",
    "json_build_object",
    "json_object",
    "jsonb_build_array",
    "jsonb_build_object",
];

/// Upper bounds of one value: bytes as text, and digits if it is a number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Size {
    pub(super) bytes: u64,
    pub(super) digits: u64,
}

impl Size {
    pub(super) const SMALL: Size = Size {
        bytes: 32,
        digits: NUMBER_DIGITS,
    };

    pub(super) fn max(self, other: Size) -> Size {
        Size {
            bytes: self.bytes.max(other.bytes),
            digits: self.digits.max(other.digits),
        }
    }
}

pub(super) fn literal(n: &Map<String, Value>) -> Size {
    let text = |v: &Value| {
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    match n
        .get("val")
        .and_then(Value::as_object)
        .and_then(|v| v.iter().next())
        .map(|(k, v)| (k.as_str(), v))
    {
        // An unknown-typed string may become a number, and `1e65000` is
        // 65,001 digits long: its digits are what it reads as.
        Some(("Sval" | "Fval" | "Bsval", v)) => {
            let text = text(v).unwrap_or_default();
            let digits = numeric_digits(&text);
            Size {
                bytes: (text.len() as u64).max(digits),
                digits,
            }
        }
        _ => Size::SMALL,
    }
}

/// The digits `text` has as a numeric (at most PostgreSQL's maximum): its
/// mantissa's, plus what an exponent adds before or after the point.
pub(super) fn numeric_digits(text: &str) -> u64 {
    let text = text.trim();
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].trim().parse::<i64>().ok()),
        None => (text, Some(0)),
    };
    let digits = mantissa.bytes().filter(u8::is_ascii_digit).count() as u64;
    let shift = exponent.map_or(MAX_DIGITS, |e| e.unsigned_abs());
    digits
        .max(text.len() as u64)
        .saturating_add(shift)
        .min(MAX_DIGITS)
}

/// The size of `arg` cast to `type_name`, and the cast's cost per byte of `arg`.
pub(super) fn cast(type_name: Option<&Value>, arg: Size) -> Result<(Size, u64), Refusal> {
    let name = last_name(type_name.and_then(|t| t.get("names"))).unwrap_or_default();
    let typmods = type_name
        .and_then(|t| t.get("typmods"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    // As text, a bytea doubles (hex) and jsonb gains a space per member; a
    // char(n) is padded to n characters (up to four bytes each).
    let mut bytes = arg.bytes.saturating_mul(2).saturating_add(32);
    if matches!(name, "bpchar" | "char" | "character") && typmods > 0 {
        bytes = bytes.max(precision(type_name).saturating_mul(4));
    }
    let weight = if matches!(name, "json" | "jsonb" | "float4" | "float8") {
        HEAVY
    } else {
        LIGHT
    };
    let digits = match name {
        "numeric" | "decimal" if typmods == 0 => return Err(bare_numeric("a cast to")),
        "numeric" | "decimal" => {
            let precision = precision(type_name);
            if !scale_within(type_name, precision) {
                return Err(Refusal::Forbidden(NUMERIC_SCALE_REFUSED.into()));
            }
            precision.min(MAX_DIGITS)
        }
        _ => NUMBER_DIGITS,
    };
    Ok((Size { bytes, digits }, weight))
}

/// The refusal of a numeric without a precision.
pub fn bare_numeric(what: &str) -> Refusal {
    Refusal::Forbidden(format!(
        "{what} numeric without a precision is not allowed: write numeric(p, s) (p at most 1000); a bare \
         numeric holds up to 147,455 digits, and one multiplication or division of two of them takes \
         seconds that PostgreSQL does not interrupt"
    ))
}

/// The precision of `numeric(p, s)`.
pub(super) fn precision(type_name: Option<&Value>) -> u64 {
    type_name
        .and_then(|t| t.get("typmods"))
        .and_then(Value::as_array)
        .and_then(|m| m.first())
        .and_then(|p| p.pointer("/node/AConst/val/Ival/ival"))
        .and_then(Value::as_u64)
        .unwrap_or(MAX_DIGITS)
}

/// Regression (the review of the nineteenth adversarial read, issue 23): a
/// negative scale puts zeros after a numeric's precision (`numeric(1, -999)`
/// holds 1e999) and a scale above it zeros before, so its precision is not
/// its digits.
pub const NUMERIC_SCALE_REFUSED: &str = "a numeric's scale must be between 0 and its precision \
     (`numeric(p, s)` with 0 <= s <= p): a negative scale, or one above the precision, gives it more \
     digits than its precision says";

/// Whether a `numeric(p, s)` type's scale (0 if not written) is within 0..=p.
fn scale_within(type_name: Option<&Value>, precision: u64) -> bool {
    let scale = type_name
        .and_then(|t| t.get("typmods"))
        .and_then(Value::as_array)
        .and_then(|m| m.get(1))
        .map(|s| {
            s.pointer("/node/AConst/val/Ival/ival")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        });
    // A scale written as anything but an integer literal PostgreSQL refuses.
    scale.is_none_or(|s| s >= 0 && s as u64 <= precision)
}

pub(super) fn total(sizes: &[Size]) -> u64 {
    sizes.iter().fold(0u64, |sum, s| sum.saturating_add(s.bytes))
}

pub(super) fn pair(args: &[Size]) -> (Size, Size) {
    (
        args.first().copied().unwrap_or_default(),
        args.get(1).copied().unwrap_or_default(),
    )
}

/// Nanoseconds of a numeric multiplication or division of `l` by `r`.
pub(super) fn digit_pairs(l: Size, r: Size) -> u64 {
    (l.digits / 4 + 1)
        .saturating_mul(r.digits / 4 + 1)
        .saturating_mul(DIGIT_PAIR)
}

/// Nanoseconds of a numeric division or modulo of `l` by `r`: long
/// division makes a quotient of `l`'s digits plus up to as many again of
/// result scale, each taking a pass over `r`, and normalises and rounds
/// at each step. Regression (the fifty-second read, issue 23): charged as
/// one multiplication, `numeric(1000,0) / numeric(1000,999)` took 0.44 ms a
/// row against 0.21 counted, half the margin the bound keeps; now 0.84.
pub(super) fn quotient_pairs(l: Size, r: Size) -> u64 {
    let quotient = Size {
        digits: l.digits.saturating_add(r.digits),
        ..l
    };
    digit_pairs(quotient, r).saturating_mul(2)
}

/// The weight of a binary operator, per byte of both sides.
pub(super) fn operator_weight(op: &str) -> u64 {
    if LIGHT_OPERATORS.contains(&op) {
        LIGHT
    } else if COLLATED_OPERATORS.contains(&op) {
        COLLATED
    } else {
        HEAVY
    }
}
