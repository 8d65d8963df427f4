//! PostgreSQL: a guest statement of the one shape the host may hold back and
//! send with others of the same text as one multi-row INSERT (issue 24: a
//! round trip per guest statement, `send` alone, was a fifth of the host's CPU).
//!
//! The shape is `INSERT INTO t (c1, ..., ck) VALUES ($1, ..., $k)`: one row,
//! every value a parameter in order, no `ON CONFLICT`, `RETURNING`, `WITH`,
//! alias or `OVERRIDING`. Its effect is one row, always (a handler's tables
//! have no triggers or rules: the host refuses to start with any), and the
//! multi-row statement of n of them is the same n rows: PostgreSQL coerces
//! each row of a multi-row VALUES to the target columns as it does one row.
//! The text is the host's, made from PostgreSQL's own reading of the names.

use pg_query::NodeEnum;

/// A plain one-row INSERT, as the host writes it for many rows.
#[derive(Debug, PartialEq, Eq)]
pub struct PlainInsert {
    /// `INSERT INTO "t" ("c1", ..., "ck") VALUES `
    head: String,
    /// k: the parameters (and columns) of one row.
    pub params: usize,
}

impl PlainInsert {
    /// The shape of `sql` if it is a plain one-row INSERT (see the module).
    pub fn of(sql: &str) -> Option<Self> {
        let parsed = pg_query::parse(sql, pg_query::ParserOptions::DEFAULT).ok()?;
        let [statement] = parsed.protobuf.stmts.as_slice() else {
            return None;
        };
        let Some(NodeEnum::InsertStmt(insert)) = statement.stmt.as_ref()?.node.as_ref() else {
            return None;
        };
        // 0: not set in the tree, 1: OVERRIDING_NOT_SET.
        let plain = insert.on_conflict_clause.is_none()
            && insert.returning_clause.is_none()
            && insert.with_clause.is_none()
            && insert.r#override <= 1;
        let relation = insert.relation.as_ref()?;
        if !plain || relation.alias.is_some() || !relation.catalogname.is_empty() {
            return None;
        }
        let Some(NodeEnum::SelectStmt(select)) = insert.select_stmt.as_ref()?.node.as_ref() else {
            return None;
        };
        let [row] = select.values_lists.as_slice() else {
            return None;
        };
        let Some(NodeEnum::List(row)) = row.node.as_ref() else {
            return None;
        };
        let in_order = row.items.iter().enumerate().all(|(i, item)| {
            matches!(item.node.as_ref(), Some(NodeEnum::ParamRef(p)) if p.number as usize == i + 1)
        });
        let mut columns = Vec::with_capacity(insert.cols.len());
        for column in &insert.cols {
            match column.node.as_ref() {
                Some(NodeEnum::ResTarget(t)) if t.indirection.is_empty() && t.val.is_none() => {
                    columns.push(quoted(&t.name))
                }
                _ => return None,
            }
        }
        if !in_order || row.items.is_empty() || columns.len() != row.items.len() {
            return None;
        }
        let table = match relation.schemaname.as_str() {
            "" => quoted(&relation.relname),
            schema => format!("{}.{}", quoted(schema), quoted(&relation.relname)),
        };
        Some(Self {
            head: format!("INSERT INTO {table} ({}) VALUES ", columns.join(", ")),
            params: row.items.len(),
        })
    }

    /// The statement of `rows` rows, parameters numbered row after row.
    pub fn text(&self, rows: usize) -> String {
        let mut text = self.head.clone();
        for row in 0..rows {
            text.push_str(if row == 0 { "(" } else { ", (" });
            for i in 0..self.params {
                if i > 0 {
                    text.push_str(", ");
                }
                text.push('$');
                text.push_str(&(row * self.params + i + 1).to_string());
            }
            text.push(')');
        }
        text
    }
}

/// An identifier as PostgreSQL's parser read it, quoted so it reads the same.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_one_row_insert_of_parameters_in_order_has_the_shape() {
        let billing = PlainInsert::of(
            "INSERT INTO invoices (order_id, customer_email, amount_cents, event_id) VALUES ($1,$2,$3,$4)",
        )
        .unwrap();
        assert_eq!(billing.params, 4);
        assert_eq!(
            billing.text(2),
            "INSERT INTO \"invoices\" (\"order_id\", \"customer_email\", \"amount_cents\", \"event_id\") \
             VALUES ($1, $2, $3, $4), ($5, $6, $7, $8)"
        );
        let named = PlainInsert::of(r#"insert into Handler_x."My ""T""" (A, "b") values ($1, $2)"#).unwrap();
        assert_eq!(
            named.text(1),
            r#"INSERT INTO "handler_x"."My ""T""" ("a", "b") VALUES ($1, $2)"#
        );
        for sql in [
            "INSERT INTO t (a, b) VALUES ($2, $1)",
            "INSERT INTO t (a, b) VALUES ($1, 2)",
            "INSERT INTO t (a) VALUES (lower($1))",
            "INSERT INTO t (a) VALUES ($1), ($2)",
            "INSERT INTO t VALUES ($1)",
            "INSERT INTO t (a) VALUES ($1) ON CONFLICT DO NOTHING",
            "INSERT INTO t (a) VALUES ($1) RETURNING a",
            "INSERT INTO t AS x (a) VALUES ($1)",
            "INSERT INTO t (a) OVERRIDING SYSTEM VALUE VALUES ($1)",
            "WITH w AS (SELECT 1) INSERT INTO t (a) VALUES ($1)",
            "INSERT INTO t (a) SELECT $1",
            "INSERT INTO t (a[1]) VALUES ($1)",
            "UPDATE t SET a = $1",
            "INSERT INTO t (a) VALUES ($1); INSERT INTO t (a) VALUES ($1)",
        ] {
            assert_eq!(PlainInsert::of(sql), None, "{sql}");
        }
    }
}
