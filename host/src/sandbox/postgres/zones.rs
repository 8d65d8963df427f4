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
//! cast); a literal anywhere holds no POSIX rule PostgreSQL's date reader
//! would reach (it types an untyped literal by its context, a date column's
//! included), and one cast to text on its way to a date is checked as well;
//! and the host reads each
//! text parameter a date or time cast takes before it binds it
//! ([`zone_free`], `capabilities::sql`). A date or time array is refused.
//! Parameters are bound as `text`, which PostgreSQL never turns into a date
//! by itself (its casts from text are explicit only).

use super::nodes::nodes;
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
    for (name, inner) in nodes(tree) {
        match name {
            "TypeCast" => {
                if cast(inner, &mut params)? == Cast::Other
                    && let Some(constant) = inner.pointer("/arg/node/AConst")
                {
                    typed.insert(constant);
                }
            }
            "FuncCall" => {
                call(inner, &mut params)?;
                typed.extend(format_literal(inner));
            }
            "AConst" if !typed.contains(&(inner as *const Value)) => literal(inner)?,
            _ => {}
        }
    }
    params.sort_unstable();
    params.dedup();
    Ok(params)
}

/// True if PostgreSQL, reading `text` as a date or time, would look up no
/// time zone that is not a name of the time zone database: no field that
/// starts with letters (other than a date word, `T` included) and goes on to
/// a digit, once a date may be known before it (a digit, or `today` and
/// its kin, earlier in the text). That is how PostgreSQL 15's date reader
/// (`ParseDateTime`, `DecodeDateTime`) comes to `pg_tzset`, and a POSIX rule
/// needs an offset, so a digit. Regression (the forty-fourth adversarial
/// read): the first version wanted three letters before the digit, where
/// PostgreSQL takes any (`1-1-1 qq1:00:10`, `a.b+1`).
pub fn zone_free(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut date_may_be_known = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_digit() {
            date_may_be_known = true;
            i += 1;
            continue;
        }
        if !b.is_ascii_alphabetic() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let word = &text[start..i];
        let next = bytes.get(i).copied();
        // ParseDateTime: letters then `-`, `/` or `.` are a date or a zone
        // name; then a digit or `+`, unless the letters are a date word.
        let zone_field = match next {
            Some(b'-' | b'/' | b'.') => true,
            Some(c) if c.is_ascii_digit() || c == b'+' => !is_one_of(DATE_WORDS, word),
            _ => false,
        };
        if zone_field && date_may_be_known {
            let field_end = bytes[i..]
                .iter()
                .position(|c| !(c.is_ascii_alphanumeric() || b"+-/_.:".contains(c)))
                .map_or(bytes.len(), |n| i + n);
            if bytes[i..field_end].iter().any(u8::is_ascii_digit) {
                return false;
            }
            // Every later word of this field starts a zone field that ends
            // where this one does, with no digit either, and a date is
            // already known: nothing in it can change the answer. Skipping
            // it keeps the scan linear. (Regression, the forty-eighth read:
            // scanning each word's tail again made `1a-a-a-...` quadratic,
            // minutes of a runtime thread for a 1 MiB parameter.)
            i = field_end;
            continue;
        }
        if is_one_of(DAY_WORDS, word) {
            date_may_be_known = true;
        }
    }
    true
}

/// Whether `word` is one of `words`, in any case (no copy: a parameter may
/// be megabytes of one-letter words).
fn is_one_of(words: &[&str], word: &str) -> bool {
    words.iter().any(|w| w.eq_ignore_ascii_case(word))
}

/// Words PostgreSQL's date reader takes as such before a digit or `+`
/// (month and day names, the ISO `T`, eras, halves of the day, Julian `J`).
const DATE_WORDS: &[&str] = &[
    "t",
    "j",
    "am",
    "pm",
    "ad",
    "bc",
    "jan",
    "january",
    "feb",
    "february",
    "mar",
    "march",
    "apr",
    "april",
    "may",
    "jun",
    "june",
    "jul",
    "july",
    "aug",
    "august",
    "sep",
    "sept",
    "september",
    "oct",
    "october",
    "nov",
    "november",
    "dec",
    "december",
    "mon",
    "monday",
    "tue",
    "tues",
    "tuesday",
    "wed",
    "wednesday",
    "thu",
    "thur",
    "thurs",
    "thursday",
    "fri",
    "friday",
    "sat",
    "saturday",
    "sun",
    "sunday",
];

/// Words that give a whole date by themselves.
const DAY_WORDS: &[&str] = &["today", "tomorrow", "yesterday", "now", "epoch", "allballs"];

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

/// The format of `to_char(x, format)` or `to_timestamp(x, format)`, a
/// literal PostgreSQL types as text by the call (`'FM999G999D00'`).
fn format_literal(node: &Value) -> Option<*const Value> {
    let parts = strings(node.get("funcname"));
    if !matches!(catalog_name(&parts), Some("to_char" | "to_timestamp")) {
        return None;
    }
    match node.get("args").and_then(Value::as_array).map(Vec::as_slice) {
        Some([_, format]) => format.pointer("/node/AConst").map(|c| c as *const Value),
        _ => None,
    }
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
        // Checked here too: a literal cast to text on its way to a date
        // (`CAST('...'::text AS date)`) is exempt where it stands (the
        // forty-fourth read).
        "AConst" => literal(node),
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
             as a POSIX rule (a date, then letters going on to an offset: `2024-01-01 abc+1`), which the \
             session keeps until it closes; bind it as a parameter, or type it (`'...'::text`)",
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
            "2024-01-01T12:00:00.123-05:30",
            "2024-01-01 12:00 Europe/Paris",
            "Jan 8 1999 04:05:06 PST",
            "Mon, 01 Jan 2024 12:00:00 +0100",
            "today",
            "v2",
            "sha256",
            "utf8",
            "ORD-7",
            "user+1@example.com",
            "order-",
            "refund-%",
            "YYYY-MM-DD HH24:MI:SS",
            "",
        ] {
            assert!(zone_free(free), "{free}");
        }
        for rule in [
            "1-1-1 qaab+1qab",
            "2024-01-01 abc123",
            "2024-01-01 EST5EDT",
            "1-1-1 qq1:00:10",
            "2020-01-01 00:00 a1",
            "2020-01-01 00:00 ab+1",
            "2020-01-01 00:00 a.b+1",
            "2020-01-01 00:00 a/b+1",
            "2020-01-01 00:00 a.bc1",
            "2024-01-01qq1",
            "today qq1",
            "2020-01-01 jan-5",
        ] {
            assert!(!zone_free(rule), "{rule}");
        }
    }

    /// Regression (issue 23, the forty-eighth read): every word of a long
    /// digit-free field scanned the field's whole tail again, so
    /// `1a-a-a-...` took time in the square of its length: minutes of a
    /// runtime thread for one 1 MiB parameter, hours at 8 MiB. The answer
    /// must not change, and 8 MiB must take a linear scan's time.
    #[test]
    fn a_long_field_is_scanned_once() {
        // 128 KiB: the quadratic scan took 100 s in a debug build, the
        // linear one 10 ms.
        let long = format!("1{}", "a-".repeat(64 << 10));
        let started = std::time::Instant::now();
        assert!(zone_free(&long));
        assert!(
            !zone_free(&format!("{long}1")),
            "a digit at the field's end is still found"
        );
        assert!(!zone_free(&format!("{long} x1")), "and a field after it");
        let took = started.elapsed();
        assert!(
            took < std::time::Duration::from_secs(1),
            "three 128 KiB scans took {took:?}"
        );
    }
}
