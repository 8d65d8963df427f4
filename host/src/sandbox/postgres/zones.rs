//! Time zones named in text, which a PostgreSQL session keeps for good.
//!
//! Regression (the forty-second adversarial read, issue 23): reading a date
//! or time from text, PostgreSQL looks up any time zone it names and keeps
//! each one in a cache of the backend's that nothing empties before the
//! connection closes (about 24 KB each, `DISCARD ALL` included). The zones
//! of the time zone database are a few hundred, but a POSIX rule
//! (`qaab+1qab`: a name, an offset, maybe a summer time) is parsed from the
//! text itself, so every distinct one is a new entry: 20,000 held 480 MB,
//! and 61,680 in one cast of a 1 MiB array ran 6.5 s past a 5 s timeout.
//!
//! So on PostgreSQL text becomes a date or time only where its text is known
//! before it is read: a cast (`CAST(x AS timestamptz)`, `x::date`, the call
//! `date(x)`) takes a literal, a parameter, or a value that is already a date,
//! a time or a number (a call such as `now()` or `date_trunc(...)`, another
//! cast); a literal anywhere holds no POSIX rule (PostgreSQL types an untyped
//! literal by its context, a date column's included); and the host reads each
//! text parameter a date or time cast takes before it binds it
//! ([`zone_free`], `capabilities::sql`). A date or time array is refused.
//! Parameters are bound as `text`, which PostgreSQL never turns into a date
//! by itself (its casts from text are explicit only).

use super::{catalog_name, forbidden, strings};
use crate::sandbox::guard::Refusal;
use serde_json::Value;
use std::collections::HashSet;

/// The types whose text input may name a time zone.
const ZONED_TYPES: &[&str] = &["date", "time", "timetz", "timestamp", "timestamptz"];

/// Calls whose value is already a date, a time or a number, which a cast to
/// a date or time converts without reading text.
const NOT_TEXT_CALLS: &[&str] = &[
    "current_date",
    "current_time",
    "current_timestamp",
    "date_part",
    "date_trunc",
    "now",
    "to_timestamp",
];

/// Types of a cast whose value is not text (a nested cast to one of them is
/// a date, a time or a number already).
const STRING_TYPES: &[&str] = &["text", "varchar", "bpchar", "char", "character", "name", "json"];

/// Refuses what could make PostgreSQL read a time zone from text no one
/// checked; returns the numbers of the parameters a date or time cast reads
/// as text, for the host to check ([`zone_free`]) when they are bound.
pub(super) fn check(tree: &Value) -> Result<Vec<usize>, Refusal> {
    let mut params = Vec::new();
    // Literals cast to a type that is not a date or time (`'abc-1'::text`):
    // typed, PostgreSQL never reads them as one.
    let mut typed: HashSet<*const Value> = HashSet::new();
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let (1, Some(Value::Object(kind))) = (fields.len(), fields.get("node"))
                    && let Some((name, inner)) = kind.iter().next()
                {
                    match name.as_str() {
                        "TypeCast" => {
                            if cast(inner, &mut params)? == Cast::Other
                                && let Some(constant) = inner.pointer("/arg/node/AConst")
                            {
                                typed.insert(constant);
                            }
                        }
                        "FuncCall" => call(inner, &mut params)?,
                        "AConst" if !typed.contains(&(inner as *const Value)) => literal(inner)?,
                        _ => {}
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    params.sort_unstable();
    params.dedup();
    Ok(params)
}

/// True if `text` names no time zone as a POSIX rule: no run of three or
/// more letters (or a `<...>` name) followed by an offset (a digit, or a
/// sign and a digit).
/// Zone names of the time zone database (`Europe/Paris`), abbreviations
/// (`CET`, `Z`), month and day names are fine.
pub fn zone_free(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut letters = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'<'
            && let Some(end) = bytes[i..].iter().position(|&c| c == b'>')
        {
            letters = 3;
            i += end + 1;
            continue;
        }
        if b.is_ascii_alphabetic() {
            letters += 1;
        } else {
            // An offset: hours, signed or not (`abc1`, `abc+1`; `abc-` is none).
            let signed = (b == b'+' || b == b'-') && bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
            if letters >= 3 && (b.is_ascii_digit() || signed) {
                return false;
            }
            letters = 0;
        }
        i += 1;
    }
    true
}

/// The last part of a type's name and whether it is an array.
fn type_of(type_name: Option<&Value>) -> (Option<&str>, bool) {
    let names = strings(type_name.and_then(|t| t.get("names")));
    let array = type_name
        .and_then(|t| t.get("array_bounds"))
        .and_then(Value::as_array)
        .is_some_and(|b| !b.is_empty());
    (names.last().copied(), array)
}

/// What a cast is to.
#[derive(PartialEq)]
enum Cast {
    Zoned,
    Other,
}

fn cast(node: &Value, params: &mut Vec<usize>) -> Result<Cast, Refusal> {
    let (name, array) = type_of(node.get("type_name"));
    if !name.is_some_and(|n| ZONED_TYPES.contains(&n)) {
        return Ok(Cast::Other);
    }
    if array {
        return Err(forbidden(
            "an array of dates or times is not allowed on PostgreSQL: each element's text may name a time \
             zone, which the session then keeps until it closes; bind the values one by one",
        ));
    }
    source(node.get("arg"), params).map(|()| Cast::Zoned)
}

/// `date(x)`, `timestamptz(x)` and the like are casts too.
fn call(node: &Value, params: &mut Vec<usize>) -> Result<(), Refusal> {
    let parts = strings(node.get("funcname"));
    if !catalog_name(&parts).is_some_and(|n| ZONED_TYPES.contains(&n)) {
        return Ok(());
    }
    let args = node.get("args").and_then(Value::as_array);
    match args.map(Vec::as_slice) {
        Some([one]) => source(Some(one), params),
        _ => Ok(()),
    }
}

/// What a date or time cast may read: see the module's comment.
fn source(arg: Option<&Value>, params: &mut Vec<usize>) -> Result<(), Refusal> {
    let inner = arg.and_then(|a| a.get("node"));
    let Some((kind, node)) = inner.and_then(Value::as_object).and_then(|o| o.iter().next()) else {
        return Err(refused());
    };
    match kind.as_str() {
        // A literal's text is checked wherever it stands (`literal`).
        "AConst" => Ok(()),
        "ParamRef" => {
            let number = node.get("number").and_then(Value::as_u64).unwrap_or_default();
            params.push(number as usize);
            Ok(())
        }
        "SqlvalueFunction" => Ok(()),
        "TypeCast" => match type_of(node.get("type_name")) {
            // `$1::text::date` reads the parameter's text all the same.
            (Some(name), false) if STRING_TYPES.contains(&name) => source(node.get("arg"), params),
            _ => Ok(()),
        },
        "FuncCall" => {
            let parts = strings(node.get("funcname"));
            match catalog_name(&parts) {
                Some(name) if NOT_TEXT_CALLS.contains(&name) || ZONED_TYPES.contains(&name) => Ok(()),
                _ => Err(refused()),
            }
        }
        _ => Err(refused()),
    }
}

fn refused() -> Refusal {
    forbidden(
        "a cast to a date or time on PostgreSQL takes a literal, a parameter (`$1::timestamptz`), or a value \
         that is already a date, a time or a number (`now()`, `date_trunc('day', created_at)`): text read from \
         anywhere else may name time zones, which the session keeps until it closes",
    )
}

/// A string literal may be typed as a date or time by its context (a date
/// column beside it), so none may hold a POSIX time zone.
fn literal(node: &Value) -> Result<(), Refusal> {
    match node.pointer("/val/Sval/sval").and_then(Value::as_str) {
        Some(text) if !zone_free(text) => Err(forbidden(format!(
            "the string literal {:?} is not allowed on PostgreSQL: read as a date or time it names a time zone \
             as a POSIX rule (letters, then an offset: `abc+1`), which the session keeps until it closes; bind \
             it as a parameter, or type it (`'...'::text`)",
            text.chars().take(40).collect::<String>()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::zone_free;

    #[test]
    fn posix_rules_are_told_from_zone_names() {
        for free in [
            "2024-01-01 12:00:00+02",
            "2024-01-01T12:00:00Z",
            "2024-01-01 12:00 Europe/Paris",
            "Jan 8 1999 04:05:06 PST",
            "today",
            "v2",
            "order-",
            "refund-%",
            "YYYY-MM-DD HH24:MI:SS",
            "",
        ] {
            assert!(zone_free(free), "{free}");
        }
        for rule in [
            "1-1-1 qaab+1qab",
            "abc123",
            "EST5EDT",
            "x <+03>-3",
            "Pst8",
            "order-7",
        ] {
            assert!(!zone_free(rule), "{rule}");
        }
    }
}
