//! Reading the host's own rows back, column by column.
//!
//! A host row that does not hold what its query selected (a column of the
//! wrong kind, a NULL where the schema has none, a row cut short) is a defect
//! or a damaged database, and an operator must hear of it: it fails the read
//! with the column's name, and is never skipped in silence (a dead letter that
//! a list quietly dropped would be an event nobody sees again).

use super::{DecodeError, SqlValue};

/// One row, read left to right.
pub struct Columns {
    /// What the row is, for the error: "handler_deployments row", ...
    what: &'static str,
    values: std::vec::IntoIter<SqlValue>,
}

impl Columns {
    pub fn new(what: &'static str, row: Vec<SqlValue>) -> Self {
        Self {
            what,
            values: row.into_iter(),
        }
    }

    pub fn text(&mut self, column: &'static str) -> Result<String, DecodeError> {
        self.opt_text(column)?
            .ok_or_else(|| self.wrong(column, "text", "NULL"))
    }

    pub fn opt_text(&mut self, column: &'static str) -> Result<Option<String>, DecodeError> {
        match self.next(column)? {
            SqlValue::Null => Ok(None),
            SqlValue::Text(s) => Ok(Some(s)),
            other => Err(self.wrong(column, "text", kind(&other))),
        }
    }

    pub fn int(&mut self, column: &'static str) -> Result<i64, DecodeError> {
        self.opt_int(column)?
            .ok_or_else(|| self.wrong(column, "an integer", "NULL"))
    }

    pub fn opt_int(&mut self, column: &'static str) -> Result<Option<i64>, DecodeError> {
        match self.next(column)? {
            SqlValue::Null => Ok(None),
            SqlValue::Int64(v) => Ok(Some(v)),
            other => Err(self.wrong(column, "an integer", kind(&other))),
        }
    }

    /// Bytes; SQLite hands back text for a BLOB column written as text.
    pub fn opt_blob(&mut self, column: &'static str) -> Result<Option<Vec<u8>>, DecodeError> {
        match self.next(column)? {
            SqlValue::Null => Ok(None),
            SqlValue::Blob(b) => Ok(Some(b)),
            SqlValue::Text(s) => Ok(Some(s.into_bytes())),
            other => Err(self.wrong(column, "bytes", kind(&other))),
        }
    }

    pub fn blob(&mut self, column: &'static str) -> Result<Vec<u8>, DecodeError> {
        self.opt_blob(column)?
            .ok_or_else(|| self.wrong(column, "bytes", "NULL"))
    }

    fn next(&mut self, column: &'static str) -> Result<SqlValue, DecodeError> {
        self.values
            .next()
            .ok_or_else(|| self.wrong(column, "a value", "nothing (the row is short)"))
    }

    /// The error for `column`; public so a caller can refuse a value that
    /// has the right kind but cannot be read (a JSON column that is not JSON).
    pub fn wrong(&self, column: &'static str, expected: &'static str, found: &str) -> DecodeError {
        DecodeError::Column {
            what: self.what,
            column,
            expected,
            found: found.to_owned(),
        }
    }
}

/// The single integer column of each of `rows` (`what` rows).
pub fn ints(
    rows: Vec<Vec<SqlValue>>,
    what: &'static str,
    column: &'static str,
) -> Result<Vec<i64>, DecodeError> {
    rows.into_iter()
        .map(|row| Columns::new(what, row).int(column))
        .collect()
}

/// The single text column of each of `rows` (`what` rows).
pub fn texts(
    rows: Vec<Vec<SqlValue>>,
    what: &'static str,
    column: &'static str,
) -> Result<Vec<String>, DecodeError> {
    rows.into_iter()
        .map(|row| Columns::new(what, row).text(column))
        .collect()
}

fn kind(value: &SqlValue) -> &'static str {
    match value {
        SqlValue::Null => "NULL",
        SqlValue::Int64(_) => "an integer",
        SqlValue::Float64(_) => "a float",
        SqlValue::Text(_) => "text",
        SqlValue::Blob(_) => "bytes",
        SqlValue::Boolean(_) => "a boolean",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_that_does_not_hold_what_was_selected_names_its_column() {
        let mut row = Columns::new(
            "test row",
            vec![SqlValue::Int64(7), SqlValue::Null, SqlValue::Text("x".into())],
        );
        assert_eq!(row.int("id").unwrap(), 7);
        let err = row.text("name").unwrap_err().to_string();
        assert_eq!(
            err,
            "reading a test row: column name holds NULL where text was expected"
        );
        let err = row.int("count").unwrap_err().to_string();
        assert_eq!(
            err,
            "reading a test row: column count holds text where an integer was expected"
        );
        let err = row.opt_text("more").unwrap_err().to_string();
        assert!(
            err.contains("column more holds nothing (the row is short)"),
            "{err}"
        );
    }
}
