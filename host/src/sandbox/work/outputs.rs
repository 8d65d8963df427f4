//! What a query outputs for its readers (each column by name, its whole
//! row), set operations' arms by position, and the refusals of shapes the
//! walk cannot follow.

use super::*;

impl Walk {
    /// Records what a nested query outputs for its readers: each column by
    /// its name, and its whole row. An arm of a set operation's is kept for
    /// the set operation to record.
    pub(super) fn record(&mut self, columns: Vec<Output>, row: u64, row_cost: Cost) {
        if self.depth == 0 {
            return;
        }
        match self.arms.last_mut() {
            Some((depth, arms)) if *depth == self.depth => arms.push((columns, row, row_cost)),
            _ => {
                for column in columns {
                    self.named(column.name.as_deref(), column.size, column.cost);
                }
                let cost = self.read_cost(row_cost);
                self.inner.row = self.inner.row.max(row);
                self.inner.row_cost = self.inner.row_cost.max(cost);
            }
        }
    }

    /// Regression (the twentieth adversarial read, issue 23): a UNION's
    /// columns are named by its first arm, by position, and the planner
    /// pushes a condition on one into every arm of a UNION ALL it pulled up,
    /// each a copy of that arm's expression: so a column costs its arms'
    /// expressions together, not the first one's, nor the costliest.
    pub(super) fn set_operation(&mut self, fields: &Map<String, Value>) -> Result<Size, Refusal> {
        let outermost = self.arms.last().is_none_or(|(depth, _)| *depth != self.depth);
        if outermost {
            self.arms.push((self.depth, Vec::new()));
        }
        let mut output = Size::default();
        for arm in ["larg", "rarg"].iter().filter_map(|k| fields.get(*k)) {
            output = output.max(self.visit(arm)?);
        }
        if outermost {
            let (_, arms) = self.arms.pop().unwrap_or_default();
            let mut arms = arms.into_iter();
            if let Some((mut columns, mut row, mut row_cost)) = arms.next() {
                let mut aligned = true;
                for (others, other_row, other_cost) in arms {
                    // A `*` in an arm stands for columns this list cannot
                    // line up (the review of the twenty-first read).
                    aligned &= others.len() == columns.len();
                    for (column, other) in columns.iter_mut().zip(others) {
                        column.size = column.size.max(other.size);
                        column.cost = column.cost.plus(other.cost);
                    }
                    row = row.max(other_row);
                    row_cost = row_cost.plus(other_cost);
                }
                if !aligned {
                    // Then any column may be any arm's: all their rows' cost.
                    for column in &mut columns {
                        column.cost = column.cost.max(row_cost);
                    }
                }
                self.record(columns, row, row_cost);
            }
        }
        Ok(output)
    }
}

/// Regression (the twenty-first adversarial read, issue 23): PostgreSQL
/// copies a column's default into each `DEFAULT` of a VALUES list of several
/// rows while it rewrites the statement (1,000 of them reached 2.6 GB), and
/// the default's work is not the statement's.
pub(super) fn default_in_rows() -> Refusal {
    Refusal::Forbidden(
        "DEFAULT is not allowed in a VALUES list of several rows: PostgreSQL copies the column's default \
         into each one; leave the column out of the INSERT's column list instead"
            .into(),
    )
}

/// Whether `value` holds a node of `kind` anywhere.
pub(super) fn holds_kind(value: &Value, kind: &str) -> bool {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if fields.contains_key(kind) {
                    return true;
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    false
}
