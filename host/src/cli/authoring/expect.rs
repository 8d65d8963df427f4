//! `inboxd test --expect expected.json`: the end state a team expects, and
//! how far the run's end state is from it.
//!
//! ```json
//! {
//!   "outcomes": {"applied": 2, "duplicate": 1, "parked": 1},
//!   "tables": {"invoices": [{"order_id": "o-1", "amount_cents": 1250}], "audit": 3},
//!   "outbox": [{"topic": "invoices.created", "key": "o-1"}],
//!   "dead_letters": [{"line": 4, "kind": "rejected", "reason_contains": "negative"}]
//! }
//! ```
//!
//! Every key is optional, and only what is written is compared. A section is
//! a count, or a list of objects each matching one actual item: an object
//! matches when every key it has holds the same value (numbers by value, so
//! `5` matches `5.0`), and `reason_contains` matches part of a reason. The
//! order of a list does not matter.

use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    #[serde(default)]
    pub outcomes: BTreeMap<String, u64>,
    #[serde(default)]
    pub tables: BTreeMap<String, Value>,
    pub outbox: Option<Value>,
    pub dead_letters: Option<Value>,
}

/// What the run ended with, each item as JSON (see `run_events`).
pub struct Actual<'a> {
    pub outcomes: &'a BTreeMap<String, u64>,
    pub tables: &'a BTreeMap<String, Vec<Value>>,
    pub outbox: &'a [Value],
    pub dead_letters: &'a [Value],
}

impl Expected {
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// The differences, one readable paragraph each; empty when it matches.
    pub fn compare(&self, actual: &Actual<'_>) -> Vec<String> {
        let mut diffs = Vec::new();
        for (outcome, want) in &self.outcomes {
            let got = actual.outcomes.get(outcome).copied().unwrap_or(0);
            if got != *want {
                diffs.push(format!("outcomes.{outcome}: expected {want}, got {got}"));
            }
        }
        for (table, want) in &self.tables {
            match actual.tables.get(table) {
                Some(rows) => diffs.extend(section(&format!("tables.{table}"), want, rows)),
                None => diffs.push(format!(
                    "tables.{table}: the handler has no such table (it has: {})",
                    actual.tables.keys().cloned().collect::<Vec<_>>().join(", ")
                )),
            }
        }
        if let Some(want) = &self.outbox {
            diffs.extend(section("outbox", want, actual.outbox));
        }
        if let Some(want) = &self.dead_letters {
            diffs.extend(section("dead_letters", want, actual.dead_letters));
        }
        diffs
    }
}

/// One section: a count, or a list of partial objects.
fn section(name: &str, want: &Value, items: &[Value]) -> Option<String> {
    match want {
        Value::Number(n) => {
            let count = n.as_u64()?;
            (count != items.len() as u64).then(|| {
                format!(
                    "{name}: expected {count}, got {}{}",
                    items.len(),
                    shown(items, "got")
                )
            })
        }
        Value::Array(wanted) => {
            let mut left: Vec<&Value> = items.iter().collect();
            let mut missing = Vec::new();
            for w in wanted {
                match left.iter().position(|item| matches(w, item)) {
                    Some(i) => {
                        left.remove(i);
                    }
                    None => missing.push(w.clone()),
                }
            }
            if missing.is_empty() && left.is_empty() {
                return None;
            }
            let mut text = format!("{name}: expected {}, got {}", wanted.len(), items.len());
            let unmatched: Vec<Value> = left.into_iter().cloned().collect();
            text.push_str(&shown(&missing, "expected but not found"));
            text.push_str(&shown(&unmatched, "found but not expected"));
            Some(text)
        }
        other => Some(format!(
            "{name}: the expectation must be a count or a list of objects, not {other}"
        )),
    }
}

fn shown(items: &[Value], label: &str) -> String {
    items
        .iter()
        .map(|item| format!("\n    {label}: {item}"))
        .collect()
}

/// Whether `actual` has every key of `want` with the same value.
fn matches(want: &Value, actual: &Value) -> bool {
    match (want, actual) {
        (Value::Object(want), Value::Object(actual)) => want.iter().all(|(key, w)| field(key, w, actual)),
        (w, a) => same(w, a),
    }
}

fn field(key: &str, want: &Value, actual: &Map<String, Value>) -> bool {
    if key == "reason_contains" {
        let reason = actual.get("reason").and_then(Value::as_str).unwrap_or_default();
        return want.as_str().is_some_and(|part| reason.contains(part));
    }
    actual.get(key).is_some_and(|a| matches(want, a))
}

fn same(want: &Value, actual: &Value) -> bool {
    match (want, actual) {
        (Value::Number(w), Value::Number(a)) => w.as_f64() == a.as_f64(),
        (Value::Array(w), Value::Array(a)) => {
            w.len() == a.len() && w.iter().zip(a).all(|(w, a)| matches(w, a))
        }
        (w, a) => w == a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn diff(expected: Value, tables: Vec<Value>, letters: Vec<Value>) -> Vec<String> {
        let expected = Expected::parse(&expected.to_string()).unwrap();
        let outcomes = BTreeMap::from([("applied".to_owned(), 2u64)]);
        let tables = BTreeMap::from([("invoices".to_owned(), tables)]);
        expected.compare(&Actual {
            outcomes: &outcomes,
            tables: &tables,
            outbox: &[],
            dead_letters: &letters,
        })
    }

    #[test]
    fn partial_objects_match_one_item_each_in_any_order() {
        let rows = vec![
            json!({"id": "a", "cents": 5, "at": 1}),
            json!({"id": "b", "cents": 7.0, "at": 2}),
        ];
        let letters = vec![json!({"line": 3, "kind": "rejected", "reason": "amount must not be negative"})];
        let expected = json!({
            "outcomes": {"applied": 2},
            "tables": {"invoices": [{"id": "b", "cents": 7}, {"id": "a"}]},
            "dead_letters": [{"line": 3, "reason_contains": "negative"}],
        });
        assert_eq!(
            diff(expected, rows.clone(), letters.clone()),
            Vec::<String>::new()
        );
        assert!(diff(json!({"tables": {"invoices": 2}}), rows.clone(), letters.clone()).is_empty());
    }

    #[test]
    fn a_difference_says_what_was_expected_and_what_was_found() {
        let rows = vec![json!({"id": "a"}), json!({"id": "a"})];
        let got = diff(
            json!({"outcomes": {"applied": 1, "parked": 0}, "tables": {"invoices": [{"id": "a"}], "emails": 0}}),
            rows,
            vec![],
        );
        assert_eq!(
            got,
            [
                "outcomes.applied: expected 1, got 2".to_owned(),
                "tables.emails: the handler has no such table (it has: invoices)".to_owned(),
                "tables.invoices: expected 1, got 2\n    found but not expected: {\"id\":\"a\"}".to_owned(),
            ]
        );
        let got = diff(json!({"dead_letters": [{"kind": "rejected"}]}), vec![], vec![]);
        assert_eq!(
            got,
            ["dead_letters: expected 1, got 0\n    expected but not found: {\"kind\":\"rejected\"}"]
        );
        assert!(
            Expected::parse(r#"{"rows": 1}"#)
                .unwrap_err()
                .contains("unknown field")
        );
    }
}
