//! PostgreSQL sorts an object's keys when it reads one into `jsonb`
//! (`uniqueifyJsonbObject`, a quicksort with no interrupt check), and a key
//! order can be crafted so the sort takes time quadratic in their number: a
//! 1 MiB document of 131,000 keys took 39.5 s past its deadline (the sixth
//! adversarial read, issue 23). So a cast to `json` or `jsonb` may only take a
//! parameter or a literal (`super::walk`), whose keys are counted here first
//! (a `json` value is read into `jsonb` when it is stored in a `jsonb` column):
//! the sum over its objects of their key count squared must stay within
//! [`MAX_KEYS_SQUARED`].

use crate::sandbox::guard::Refusal;

/// The bound on Σ keys² over a value's objects: one object of 6,324 keys, or
/// 400 of 316. At the measured 2.3 ns per key² of the crafted worst case,
/// about 90 ms, which the work bound charges for each such cast
/// ([`SORT_NS`]).
pub const MAX_KEYS_SQUARED: u64 = 40_000_000;

/// What one cast to `json`/`jsonb` of a checked value may cost at most.
pub const SORT_NS: u64 = 100_000_000;

/// Objects open at once that [`keys_squared`] follows: deeper ones are
/// counted as if they held every key the text has left. PostgreSQL's JSON
/// parser recurses per level and stops at its stack limit (between 12,000
/// and 14,000 levels on a 2 MB `max_stack_depth`, measured on 15), and one
/// counter per open object once made the host hold eight bytes per `{` of
/// a parameter (the fiftieth read).
const MAX_OPEN: usize = 16_384;

/// Σ keys² over the objects of a JSON text, counted leniently: every `:`
/// outside a string counts for the innermost open object, so a text that is
/// not valid JSON (PostgreSQL sorts an object before it finds a later error)
/// counts no less than it would parse to. Past [`MAX_OPEN`] levels each `:`
/// counts for one object that holds them all, an upper bound.
pub fn keys_squared(text: &str) -> u64 {
    let mut open: Vec<u64> = Vec::new();
    // Objects open past MAX_OPEN, and the keys of all of them together.
    let (mut deeper, mut deep_keys) = (0usize, 0u64);
    let (mut total, mut in_string, mut escaped) = (0u64, false, false);
    for byte in text.bytes() {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' if open.len() < MAX_OPEN => open.push(0),
            b'{' => deeper += 1,
            b':' if deeper > 0 => deep_keys += 1,
            b':' => {
                if let Some(keys) = open.last_mut() {
                    *keys += 1;
                }
            }
            b'}' if deeper > 0 => {
                deeper -= 1;
                if deeper == 0 {
                    total = total.saturating_add(deep_keys.saturating_mul(deep_keys));
                    deep_keys = 0;
                }
            }
            b'}' => {
                let keys = open.pop().unwrap_or(0);
                total = total.saturating_add(keys.saturating_mul(keys));
            }
            _ => {}
        }
    }
    // Objects left open still sort what they hold.
    open.iter()
        .fold(total, |t, k| t.saturating_add(k.saturating_mul(*k)))
        .saturating_add(deep_keys.saturating_mul(deep_keys))
}

/// Refuses a JSON text whose objects hold too many keys; `what` names it.
pub fn check(text: &str, what: &str) -> Result<(), Refusal> {
    let squared = keys_squared(text);
    if squared > MAX_KEYS_SQUARED {
        return Err(Refusal::Limit(format!(
            "{what} is JSON whose objects hold too many keys (the sum of their key counts squared is \
             {squared}, at most {MAX_KEYS_SQUARED}: one object of 6,324 keys, or 400 of 316): PostgreSQL \
             sorts an object's keys when it reads one into jsonb, without interruption; split the document"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_objects_keys_squared_and_ignores_strings() {
        assert_eq!(
            keys_squared(r#"{"a": 1, "b": {"c": 2, "d": 3, "e": ":{"}}"#),
            4 + 9
        );
        assert_eq!(keys_squared(r#"[{"a":1},{"b":2}] "x:y""#), 2);
        assert_eq!(keys_squared(r#"{"a\":":1"#), 1, "escaped quote; unclosed");
        assert_eq!(keys_squared("not json at all: no braces"), 0);
    }

    /// Regression (the fiftieth read): a counter per open object held
    /// eight bytes per `{`. Past `MAX_OPEN` levels the keys of the deeper
    /// objects count as one object's, never less than they would.
    #[test]
    fn deep_nesting_is_counted_in_bounded_memory_and_never_less() {
        let deep = |levels: usize, keys: usize| {
            let mut text = "{\"k\":".repeat(levels);
            text.push_str(&format!(
                "{{{}}}",
                (0..keys)
                    .map(|i| format!("\"a{i}\":0"))
                    .collect::<Vec<_>>()
                    .join(",")
            ));
            text.push_str(&"}".repeat(levels));
            text
        };
        // Within the bound: each level's one key, and the innermost's 3.
        assert_eq!(keys_squared(&deep(100, 3)), 100 + 9);
        // Past it: the deeper levels' keys counted together, so more.
        let past = keys_squared(&deep(MAX_OPEN + 10, 3));
        assert!(past >= (MAX_OPEN + 9) as u64, "{past}");
        let unclosed = "{".repeat(1 << 20) + &":".repeat(10_000);
        assert_eq!(keys_squared(&unclosed), 100_000_000);
    }

    #[test]
    fn a_document_of_many_keys_is_refused_and_an_ordinary_one_is_not() {
        let keys = |n: usize| {
            let members: Vec<String> = (0..n).map(|i| format!("\"k{i}\":0")).collect();
            format!("{{{}}}", members.join(","))
        };
        assert!(check(&keys(6_000), "parameter 1").is_ok());
        let err = check(&keys(7_000), "parameter 1").unwrap_err().to_string();
        assert!(
            err.contains("parameter 1") && err.contains("too many keys"),
            "{err}"
        );
        assert!(check(r#"{"order_id": "o-1", "lines": [{"sku": "a", "n": 2}]}"#, "p").is_ok());
    }
}
