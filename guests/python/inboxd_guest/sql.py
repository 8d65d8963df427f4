"""SQL inside the host's transaction: `$1, $2, ...` parameters given as
Python values (str, int, float, bool, bytes, None), rows returned as tuples
of Python values."""

from componentize_py_types import Err
from wit_world.imports import sql as _sql
from wit_world.imports import types


class SqlError(Exception):
    """A statement failed. Database errors are retried; a refused, malformed
    or limit-breaking statement, or a broken constraint, is rejected."""

    def __init__(self, error):
        self.error = error
        super().__init__(f"{type(error).__name__.removeprefix('SqlError_').lower()}: {error.value}")

    def as_handler_error(self):
        if isinstance(self.error, _sql.SqlError_Database):
            return types.HandlerError_Retry(f"database error: {self.error.value}")
        return types.HandlerError_Reject(f"statement failed ({self}")


def _value(v):
    if v is None:
        return types.Value_Null()
    if isinstance(v, bool):
        return types.Value_Boolean(v)
    if isinstance(v, int):
        return types.Value_Int64(v)
    if isinstance(v, float):
        return types.Value_Float64(v)
    if isinstance(v, str):
        return types.Value_Text(v)
    if isinstance(v, (bytes, bytearray)):
        return types.Value_Blob(bytes(v))
    raise TypeError(f"cannot pass {type(v).__name__} as an SQL parameter")


def _python(v):
    return None if isinstance(v, types.Value_Null) else v.value


def execute(statement: str, *params) -> int:
    """Runs one statement; returns how many rows it changed."""
    try:
        return _sql.execute(statement, [_value(p) for p in params])
    except Err as e:
        raise SqlError(e.value) from None


def query(statement: str, *params) -> list:
    """Runs one query; returns its rows as tuples."""
    try:
        rows = _sql.query(statement, [_value(p) for p in params])
    except Err as e:
        raise SqlError(e.value) from None
    return [tuple(_python(v) for v in row) for row in rows]


def dialect() -> str:
    """'sqlite' or 'postgres'."""
    return _sql.dialect().name.lower()
