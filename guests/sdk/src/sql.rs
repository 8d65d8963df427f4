//! SQL inside the host's transaction, with typed parameters and rows.
//!
//! Parameters are `$1, $2, ...` on both SQLite and PostgreSQL, given as a
//! tuple of Rust values (`(&order.id, order.amount_cents)`) or `()`. Rows come
//! back as tuples: `let rows: Vec<(String, i64)> = sql::query(...)?`.
//!
//! A failed statement becomes an [`Error`] that `?` returns from the handler:
//! `database` errors are retried; a refused, malformed or limit-breaking
//! statement, or a broken constraint, can never succeed and is rejected.

use crate::Error;
pub use crate::bindings::inboxd::handler::sql::SqlDialect as Dialect;
use crate::bindings::inboxd::handler::sql::{self as wit, SqlError};
pub use crate::bindings::inboxd::handler::types::Value;

impl From<SqlError> for Error {
    fn from(error: SqlError) -> Self {
        match error {
            SqlError::Database(m) => Error::Retry(format!("database error: {m}")),
            SqlError::Forbidden(m) => Error::Reject(format!("statement refused: {m}")),
            SqlError::Invalid(m) => Error::Reject(format!("invalid statement: {m}")),
            SqlError::Constraint(m) => Error::Reject(format!("constraint failed: {m}")),
            SqlError::Limit(m) => Error::Reject(format!("limit reached: {m}")),
        }
    }
}

/// Runs one statement; returns how many rows it changed.
pub fn execute(statement: &str, params: impl Params) -> Result<u64, Error> {
    Ok(wit::execute(statement, &params.values())?)
}

/// Runs one query; returns its rows, each decoded into `R` (a tuple).
pub fn query<R: FromRow>(statement: &str, params: impl Params) -> Result<Vec<R>, Error> {
    wit::query(statement, &params.values())?
        .into_iter()
        .map(|row| R::from_row(row).map_err(|e| Error::Reject(format!("{statement}: {e}"))))
        .collect()
}

/// The database the handler runs on.
pub fn dialect() -> Dialect {
    wit::dialect()
}

/// A Rust value that is one SQL parameter.
pub trait ToValue {
    fn to_value(&self) -> Value;
}

macro_rules! to_value {
    ($($t:ty => |$v:ident| $e:expr),* $(,)?) => {$(
        impl ToValue for $t {
            fn to_value(&self) -> Value {
                let $v = self;
                $e
            }
        }
    )*};
}

to_value! {
    i64 => |v| Value::Int64(*v),
    i32 => |v| Value::Int64((*v).into()),
    u32 => |v| Value::Int64((*v).into()),
    f64 => |v| Value::Float64(*v),
    bool => |v| Value::Boolean(*v),
    str => |v| Value::Text(v.to_owned()),
    String => |v| Value::Text(v.clone()),
    [u8] => |v| Value::Blob(v.to_vec()),
    Vec<u8> => |v| Value::Blob(v.clone()),
    Value => |v| v.clone(),
}

impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}

impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToValue::to_value)
    }
}

/// A statement's parameters: `()`, a tuple of [`ToValue`]s, or a slice of [`Value`]s.
pub trait Params {
    fn values(self) -> Vec<Value>;
}

impl Params for () {
    fn values(self) -> Vec<Value> {
        Vec::new()
    }
}

impl Params for &[Value] {
    fn values(self) -> Vec<Value> {
        self.to_vec()
    }
}

macro_rules! tuple_params {
    ($($name:ident),+) => {
        impl<$($name: ToValue),+> Params for ($($name,)+) {
            #[allow(non_snake_case)]
            fn values(self) -> Vec<Value> {
                let ($($name,)+) = self;
                vec![$($name.to_value()),+]
            }
        }
    };
}

tuple_params!(A);
tuple_params!(A, B);
tuple_params!(A, B, C);
tuple_params!(A, B, C, D);
tuple_params!(A, B, C, D, E);
tuple_params!(A, B, C, D, E, F);
tuple_params!(A, B, C, D, E, F, G);
tuple_params!(A, B, C, D, E, F, G, H);

/// One column decoded into a Rust value.
pub trait FromValue: Sized {
    fn from_value(value: Value) -> Result<Self, String>;
}

fn mismatch<T>(value: &Value) -> Result<T, String> {
    Err(format!("cannot read {value:?} as {}", std::any::type_name::<T>()))
}

impl FromValue for i64 {
    fn from_value(value: Value) -> Result<Self, String> {
        match value {
            Value::Int64(v) => Ok(v),
            other => mismatch(&other),
        }
    }
}

impl FromValue for f64 {
    fn from_value(value: Value) -> Result<Self, String> {
        match value {
            Value::Float64(v) => Ok(v),
            Value::Int64(v) => Ok(v as f64),
            other => mismatch(&other),
        }
    }
}

impl FromValue for bool {
    fn from_value(value: Value) -> Result<Self, String> {
        match value {
            Value::Boolean(v) => Ok(v),
            // SQLite has no boolean type.
            Value::Int64(v) => Ok(v != 0),
            other => mismatch(&other),
        }
    }
}

impl FromValue for String {
    fn from_value(value: Value) -> Result<Self, String> {
        match value {
            Value::Text(v) => Ok(v),
            other => mismatch(&other),
        }
    }
}

impl FromValue for Vec<u8> {
    fn from_value(value: Value) -> Result<Self, String> {
        match value {
            Value::Blob(v) => Ok(v),
            other => mismatch(&other),
        }
    }
}

impl FromValue for Value {
    fn from_value(value: Value) -> Result<Self, String> {
        Ok(value)
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(value: Value) -> Result<Self, String> {
        match value {
            Value::Null => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

/// A row decoded into a tuple of [`FromValue`]s.
pub trait FromRow: Sized {
    fn from_row(row: Vec<Value>) -> Result<Self, String>;
}

macro_rules! tuple_row {
    ($n:literal; $($name:ident),+) => {
        impl<$($name: FromValue),+> FromRow for ($($name,)+) {
            fn from_row(row: Vec<Value>) -> Result<Self, String> {
                if row.len() != $n {
                    return Err(format!("expected {} columns, got {}", $n, row.len()));
                }
                let mut columns = row.into_iter();
                Ok(($($name::from_value(columns.next().expect("length checked"))?,)+))
            }
        }
    };
}

tuple_row!(1; A);
tuple_row!(2; A, B);
tuple_row!(3; A, B, C);
tuple_row!(4; A, B, C, D);
tuple_row!(5; A, B, C, D, E);
tuple_row!(6; A, B, C, D, E, F);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_become_parameters_in_order() {
        let id = String::from("e-1");
        let values = (&id, 5_i64, "x", None::<i64>, true, 1.5_f64, vec![1_u8]).values();
        assert_eq!(
            values,
            [
                Value::Text("e-1".into()),
                Value::Int64(5),
                Value::Text("x".into()),
                Value::Null,
                Value::Boolean(true),
                Value::Float64(1.5),
                Value::Blob(vec![1]),
            ]
        );
        assert!(().values().is_empty());
    }

    #[test]
    fn rows_decode_into_tuples_or_say_why_not() {
        let row = vec![Value::Text("a".into()), Value::Int64(2), Value::Null];
        let decoded: (String, i64, Option<String>) = FromRow::from_row(row.clone()).unwrap();
        assert_eq!(decoded, ("a".into(), 2, None));
        let wrong = <(i64, i64, i64)>::from_row(row.clone()).unwrap_err();
        assert!(wrong.contains("cannot read Value::Text(\"a\") as i64"), "{wrong}");
        let short = <(String, i64)>::from_row(row).unwrap_err();
        assert!(short.contains("expected 2 columns, got 3"), "{short}");
        // SQLite has no boolean: 0/1 read as bool.
        assert_eq!(<(bool,)>::from_row(vec![Value::Int64(1)]).unwrap(), (true,));
    }

    #[test]
    fn only_database_errors_are_retried() {
        assert!(matches!(
            Error::from(SqlError::Database("gone".into())),
            Error::Retry(_)
        ));
        for error in [
            SqlError::Forbidden("no".into()),
            SqlError::Invalid("syntax".into()),
            SqlError::Constraint("unique".into()),
            SqlError::Limit("rows".into()),
        ] {
            assert!(matches!(Error::from(error), Error::Reject(_)));
        }
    }
}
