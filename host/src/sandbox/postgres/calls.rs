//! Which functions a handler's statement may call on PostgreSQL, and how:
//! the allowlists' names by their plain names, SQL-standard syntax that
//! PostgreSQL turns into calls, and the arguments each call may take.

use super::{JSONB_REFUSED, Place, catalog_name, forbidden, strings};
use crate::sandbox::guard::Refusal;
use crate::sandbox::{PURE_FUNCTIONS, TABLE_FUNCTIONS};
use serde_json::Value;

/// The `pg_catalog` functions PostgreSQL's grammar calls for SQL-standard
/// syntax the guard allows: `TRIM(x)` (one argument, see below),
/// `EXTRACT(f FROM x)` and `SUBSTRING(x FROM a FOR b)`.
/// Each is linear in its input. Not here, so refused: `position` (from
/// `POSITION(a IN b)`, quadratic and not interruptible), `timezone`
/// (`AT TIME ZONE`), `overlay`, `normalize`, `pg_collation_for`, `xml*`.
pub const STANDARD_FORM_FUNCTIONS: &[&str] = &["btrim", "extract", "substring"];

/// Functions allowed with at most one argument: with a second (characters to
/// trim) each call's time grows with both lengths, in one step no deadline
/// interrupts.
const SINGLE_ARGUMENT: &[&str] = &["btrim", "ltrim", "rtrim", "trim"];

/// Functions of [`PURE_FUNCTIONS`] and [`TABLE_FUNCTIONS`] that PostgreSQL
/// may not call, and why.
const REFUSED_HERE: &[(&str, &str)] = &[
    ("jsonb_build_array", JSONB_REFUSED),
    ("jsonb_build_object", JSONB_REFUSED),
    ("jsonb_each", JSONB_REFUSED),
    ("jsonb_array_elements", JSONB_REFUSED),
    (
        "power",
        "on numeric it builds a number of up to 131,072 digits, whose arithmetic then takes seconds PostgreSQL \
         does not interrupt",
    ),
    (
        "json_object",
        "on PostgreSQL it takes its keys from a text array, as many as a value holds, and a jsonb column sorts \
         them without interruption when it stores the result; use json_build_object",
    ),
];

pub(super) fn check_call(node: &Value, place: Place) -> Result<(), Refusal> {
    let parts = strings(node.get("funcname"));
    let shown = parts.join(".");
    let Some(name) = catalog_name(&parts) else {
        return Err(forbidden(format!(
            "function {shown} is not allowed: handlers may call only pure functions by their plain names"
        )));
    };
    let allowed = match place {
        Place::TableFunction => TABLE_FUNCTIONS.contains(&name),
        Place::Anywhere => PURE_FUNCTIONS.contains(&name) || STANDARD_FORM_FUNCTIONS.contains(&name),
    };
    if !allowed {
        return Err(forbidden(format!(
            "function {shown} is not allowed: handlers may call only pure functions on their own rows \
             (PostgreSQL's reading of the statement calls it)"
        )));
    }
    if let Some((_, why)) = REFUSED_HERE.iter().find(|(refused, _)| *refused == name) {
        return Err(forbidden(format!(
            "function {name} is not allowed on PostgreSQL: {why}"
        )));
    }
    if node.get("func_variadic").and_then(Value::as_bool) == Some(true) {
        return Err(forbidden(format!("VARIADIC arguments to {name} are not allowed")));
    }
    let arguments = node.get("args").and_then(Value::as_array).map_or(0, Vec::len);
    if SINGLE_ARGUMENT.contains(&name) && arguments > 1 {
        return Err(forbidden(format!(
            "{name}(x, characters) is not allowed: its time grows with both lengths and one call cannot be \
             interrupted at the event's deadline; use {name}(x)"
        )));
    }
    // Regression (the forty-second adversarial read, issue 23): a time zone
    // named in text is parsed and kept by the backend for good (about 24 KB
    // each, past every reset; 20,000 distinct POSIX rules held 480 MB), and
    // `date_trunc`'s third argument is one.
    if name == "date_trunc" && arguments > 2 {
        return Err(forbidden(
            "date_trunc(field, source, zone) is not allowed: PostgreSQL keeps every time zone a session \
             names in memory until the connection closes; use date_trunc(field, source)",
        ));
    }
    // The same for PostgreSQL 16's `generate_series(from, to, step, zone)`
    // (the forty-fifth read).
    if name == "generate_series" && arguments > 3 {
        return Err(forbidden(
            "generate_series(from, to, step, zone) is not allowed: PostgreSQL keeps every time zone a session \
             names in memory until the connection closes; use generate_series(from, to, step)",
        ));
    }
    // Regression (the ninth adversarial read, issue 23): with a text second
    // argument `substring` is a POSIX regular expression, with a third a
    // SIMILAR TO one, both refused as operators. Which overload PostgreSQL
    // picks depends on the arguments' types, so they must be integers by
    // their syntax: a literal or a cast to an integer type.
    if name == "substring" {
        let rest = node
            .get("args")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .skip(1);
        if !rest.into_iter().all(is_integer_syntax) {
            return Err(forbidden(
                "substring(x, pattern) is a regular expression on PostgreSQL: give the start and length as \
                 integer literals or casts, as in `substring(x FROM 2 FOR CAST($1 AS integer))`",
            ));
        }
    }
    Ok(())
}

/// An integer literal, or a cast to an integer type (not an array).
fn is_integer_syntax(node: &Value) -> bool {
    let Some(inner) = node.get("node") else {
        return false;
    };
    if let Some(constant) = inner.get("AConst") {
        return constant.get("val").and_then(|v| v.get("Ival")).is_some();
    }
    let Some(cast) = inner.get("TypeCast") else {
        return false;
    };
    let Some(type_name) = cast.get("type_name") else {
        return false;
    };
    let array = type_name
        .get("array_bounds")
        .and_then(Value::as_array)
        .is_some_and(|bounds| !bounds.is_empty());
    let names = strings(type_name.get("names"));
    let integer = catalog_name(&names).is_some_and(|name| ["int2", "int4", "int8"].contains(&name));
    integer && !array
}
