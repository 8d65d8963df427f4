//! Which types a value may have on PostgreSQL: casts, columns and the
//! SQL-standard value functions, each type's input function being code
//! PostgreSQL runs on every value it reads.

use super::allowlists::INTERNAL_TYPES;
use super::{catalog_name, forbidden, strings};
use crate::sandbox::guard::Refusal;
use crate::sandbox::walk::CAST_TYPES;
use serde_json::Value;

/// Why `jsonb` is refused on PostgreSQL (regression, the tenth adversarial
/// read, issue 23): reading a value into jsonb's tree, which a cast, jsonb's
/// operators (`-`, `||`, `#-`) and the jsonb builders all do, takes up to
/// about 200 bytes of memory per byte of text, held until the row ends. One
/// row ran 7.5 s against a 5 s limit and grew its backend to 4 GB. `json`
/// keeps the text and reads it as a stream, in the memory of its result.
pub const JSONB_REFUSED: &str = "jsonb is not allowed on PostgreSQL: reading a value into jsonb (a cast, a \
     jsonb column's operators, the jsonb builders) takes up to 200 bytes of memory per byte of text, held \
     until the row ends, which neither work_mem nor a deadline bounds; use json";

/// Why `time` and `timetz` are refused on PostgreSQL. Regression (the
/// forty-fifth adversarial read, issue 23): reading a time of day from text,
/// PostgreSQL looks up a time zone named at its very start, no date needed
/// (`'qaab+1 101010'`: `DecodeTimeOnly`), and keeps each POSIX rule it read
/// for the session's life (1,200 distinct ones in a statement held 115 MB past
/// `DISCARD ALL`); a literal beside a time value (`current_time < '...'`, a
/// time column) is read so with no cast at all. With no time type anywhere,
/// no text is read as one, and `sandbox::postgres::zones` holds for dates.
pub const TIME_REFUSED: &str = "time and timetz are not allowed on PostgreSQL: PostgreSQL reads a time zone \
     from the start of a time of day's text, and keeps every one it read until the session closes; use \
     timestamptz (or an interval, or minutes since midnight) instead";

/// `current_time` and `localtime` are times of day: see [`TIME_REFUSED`].
pub(super) fn check_sql_value_function(node: &Value) -> Result<(), Refusal> {
    use pg_query::protobuf::SqlValueFunctionOp as Op;
    let op = node.get("op").and_then(Value::as_i64).unwrap_or_default();
    let times = [
        Op::SvfopCurrentTime,
        Op::SvfopCurrentTimeN,
        Op::SvfopLocaltime,
        Op::SvfopLocaltimeN,
    ];
    if times.iter().any(|t| *t as i64 == op) {
        return Err(forbidden(format!("current_time and localtime: {TIME_REFUSED}")));
    }
    Ok(())
}

pub(super) fn check_cast(node: &Value) -> Result<(), Refusal> {
    check_type_name(node.get("type_name"), "a cast to")
}

pub(super) fn check_type_name(type_name: Option<&Value>, what: &str) -> Result<(), Refusal> {
    let parts = strings(type_name.and_then(|t| t.get("names")));
    if catalog_name(&parts) == Some("jsonb") {
        return Err(forbidden(format!("{what} jsonb: {JSONB_REFUSED}")));
    }
    if let Some(time @ ("time" | "timetz")) = catalog_name(&parts) {
        return Err(forbidden(format!("{what} {time}: {TIME_REFUSED}")));
    }
    let flag = |f: &str| type_name.and_then(|t| t.get(f)).and_then(Value::as_bool) == Some(true);
    let plain = catalog_name(&parts).filter(|name| {
        !flag("setof") && !flag("pct_type") && (INTERNAL_TYPES.contains(name) || CAST_TYPES.contains(name))
    });
    if plain.is_none() {
        return Err(forbidden(format!(
            "{what} {} is not allowed: only plain types ({}); PostgreSQL runs a type's input function on \
             every value it reads (for a generated key, use an identity column)",
            parts.join("."),
            CAST_TYPES.join(", ")
        )));
    }
    let typmods = type_name
        .and_then(|t| t.get("typmods"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if let Some("bpchar" | "char" | "character") = catalog_name(&parts)
        && typmods > 0
    {
        // PostgreSQL also reads a length written as a string or a name
        // (`bpchar('10485760')`: the second review of the fifty-second read).
        let length = first_typmod(type_name).filter(|_| typmods == 1);
        if length.is_none_or(|length| length > MAX_PADDED_CHARS) {
            let written = length.map_or_else(
                || "a length that is not one integer".to_owned(),
                |l| l.to_string(),
            );
            return Err(forbidden(format!(
                "{what} char({written}): at most char({MAX_PADDED_CHARS}), written as an integer; PostgreSQL \
                 pads every such value to its length, while it plans too (each element of an array, each row \
                 of a VALUES list into such a column), where no deadline reaches; use text or varchar(n)"
            )));
        }
    }
    Ok(())
}

/// The longest `char(n)` a cast or a column may have. Regression (the
/// review of the fifty-second read): `'{"",...}'::char(100000)[]` padded
/// 2,000 elements while planning (600 MB for `EXPLAIN` alone), and a
/// `char(100000)` column padded every row of a VALUES list the same way,
/// neither counted as a cast of one value is.
pub const MAX_PADDED_CHARS: u64 = 256;

/// A type's first modifier (`n` of `char(n)`), if it is an integer.
fn first_typmod(type_name: Option<&Value>) -> Option<u64> {
    type_name?
        .get("typmods")?
        .as_array()?
        .first()?
        .pointer("/node/AConst/val/Ival/ival")
        .and_then(Value::as_u64)
}

/// A column's type: a plain type (see [`check_type_name`]), not an array
/// (see [`crate::sandbox::work`]: an array may stand only where its elements are
/// visited once), and a numeric with its precision, so that no stored number
/// has more than [`crate::sandbox::work::COLUMN_DIGITS`] digits.
pub(super) fn check_column_type(type_name: Option<&Value>) -> Result<(), Refusal> {
    check_type_name(type_name, "a column of type")?;
    let list = |f: &str| {
        type_name
            .and_then(|t| t.get(f))
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    };
    if list("array_bounds") > 0 {
        return Err(forbidden(
            "a column of an array type is not allowed on PostgreSQL: an operator over an array (such as \
             jsonb - text[]) loops over both sides without interruption; use a table of rows, or json",
        ));
    }
    let parts = strings(type_name.and_then(|t| t.get("names")));
    if matches!(catalog_name(&parts), Some("numeric" | "decimal")) && list("typmods") == 0 {
        return Err(crate::sandbox::work::bare_numeric("a column of type"));
    }
    Ok(())
}
