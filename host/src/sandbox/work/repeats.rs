//! Work that repeats over a value's structure rather than its bytes, and
//! the rules that bound it: an operator once per element of `ANY/ALL
//! (array)`, a jsonb object's key sort (`super::json_keys`), a format's
//! fields each scanning the input (`to_timestamp`). Each was an adversarial
//! read's finding in issue 23.

use super::tree::*;
use super::*;
use crate::sandbox::MAX_FORMAT_BYTES;

/// What an `x op ANY/ALL (array)` loops over.
pub(super) enum AnyAll {
    /// `ARRAY[a, b, ...]`: this many elements.
    Elements(u64),
    /// A cast to an array of scalars whose `=`/`<>` first compares lengths;
    /// `numbers`: of integers or floats, which a numeric `x` meets digit by digit.
    Scalars { numbers: bool },
}

/// Element types of an array on the right of `= ANY` / `<> ALL` whose
/// comparison costs no more than the shorter side (and unequal lengths end
/// it at once): not `jsonb`, whose `=` decompresses and walks `x` again for
/// every element, nor `char(n)`, nor a type PostgreSQL infers from `x`, nor
/// a date or time: each element's text may name a time zone, which PostgreSQL
/// parses (about 100 µs for a POSIX rule) inside the one cast, with no
/// interrupt, and keeps for the session's life (the forty-second adversarial
/// read: 61,680 rules in a 1 MiB parameter ran 6.5 s past a 5 s timeout and
/// held 1.47 GB).
const SCALAR_ARRAY_TYPES: &[&str] = &[
    "bool", "boolean", "bytea", "float4", "float8", "int", "int2", "int4", "int8", "integer", "bigint",
    "smallint", "real", "text", "uuid", "varchar",
];

const NUMBER_TYPES: &[&str] = &[
    "float4", "float8", "int", "int2", "int4", "int8", "integer", "bigint", "smallint", "real",
];

/// Checks the array of `x op ANY/ALL (array)`: `ARRAY[...]` with any allowed
/// operator, or, with `=` and `<>` only, a cast to an array of
/// [`SCALAR_ARRAY_TYPES`] (`$1::bigint[]`). Anything else (a bare parameter,
/// whose type PostgreSQL takes from `x`; `<` over text, which copies and
/// compares all of `x` per element) runs an operator per element over `x`,
/// for as many elements as a parameter holds, without interruption.
pub(super) fn any_all_array(op: &str, array: Option<&Value>) -> Result<AnyAll, Refusal> {
    match array.and_then(|a| a.as_object()).and_then(node) {
        // ARRAY(subquery): refused as such when visited.
        Some(("SubLink", _)) => Ok(AnyAll::Elements(0)),
        Some(("AArrayExpr", a)) => Ok(AnyAll::Elements(
            a.get("elements").and_then(Value::as_array).map_or(0, Vec::len) as u64,
        )),
        Some(("TypeCast", cast))
            if matches!(op, "=" | "<>")
                && is_array("TypeCast", cast)
                && last_name(cast.get("type_name").and_then(|t| t.get("names")))
                    .is_some_and(|t| SCALAR_ARRAY_TYPES.contains(&t)) =>
        {
            let element = last_name(cast.get("type_name").and_then(|t| t.get("names")));
            Ok(AnyAll::Scalars {
                numbers: element.is_some_and(|t| NUMBER_TYPES.contains(&t)),
            })
        }
        _ => Err(Refusal::Forbidden(format!(
            "x {op} ANY/ALL (array) is allowed over ARRAY[...], or with = and <> over an array cast to one of \
             ({}[]), e.g. = ANY($1::bigint[]): otherwise PostgreSQL runs the operator over all of x once per \
             element, as many as a parameter holds, without interruption",
            SCALAR_ARRAY_TYPES.join("[], ")
        ))),
    }
}

/// True for a cast to `json` or `jsonb` (an array of them is refused elsewhere).
pub(super) fn is_json_cast(type_name: Option<&Value>) -> bool {
    let name = last_name(type_name.and_then(|t| t.get("names")));
    matches!(name, Some("json" | "jsonb"))
}

/// A cast to `json`/`jsonb` may take a parameter (the host counts its keys
/// when it binds it, `capabilities::sql`) or a literal (counted here), never
/// a value PostgreSQL computes or stores: reading an object into `jsonb`
/// sorts its keys, in time quadratic in their number for a crafted order.
pub(super) fn json_cast_argument(arg: Option<&Value>) -> Result<(), Refusal> {
    match arg.and_then(|a| a.as_object()).and_then(node) {
        Some(("ParamRef", _)) => Ok(()),
        Some(("AConst", c)) => match c.get("val").and_then(|v| v.get("Sval")).and_then(|v| v.get("sval")).and_then(Value::as_str) {
            Some(text) => super::json_keys::check(text, "a literal cast to json"),
            None => Ok(()),
        },
        _ => Err(Refusal::Forbidden(
            "a cast to json or jsonb may take only a parameter or a literal ($1::jsonb): PostgreSQL sorts an \
             object's keys when it reads one into jsonb, in time that grows with the square of their number \
             and without interruption, and the host counts them only in what the handler binds or writes"
                .into(),
        )),
    }
}

/// The length of `to_timestamp(x, format)`'s or `to_char(x, format)`'s
/// format, which must be a literal of at most [`MAX_FORMAT_BYTES`].
/// `to_char`: regression (the thirteenth adversarial read, issue 23): a
/// 1 MiB format from a parameter, `9V` and 131,000 nines then `th` nodes,
/// made each call over a numeric scan its 131,001 digits once per node
/// (6.3 s in one row against a 5 s limit, charged 0.94 s).
pub(super) fn short_literal_format(name: &str, args: Option<&Value>) -> Result<u64, Refusal> {
    let format = args
        .and_then(Value::as_array)
        .and_then(|a| a.get(1))
        .and_then(|f| f.as_object())
        .and_then(node)
        .and_then(|(kind, c)| (kind == "AConst").then_some(c))
        .and_then(|c| {
            c.get("val")
                .and_then(|v| v.get("Sval"))
                .and_then(|v| v.get("sval"))
        })
        .and_then(Value::as_str);
    match format {
        Some(format) if format.len() <= MAX_FORMAT_BYTES => Ok(format.len().max(1) as u64),
        _ => Err(Refusal::Forbidden(format!(
            "{name}(x, format) needs a literal format of at most {MAX_FORMAT_BYTES} bytes: each field of the \
             format works over all of x, so a long format over a long x runs minutes without interruption"
        ))),
    }
}
