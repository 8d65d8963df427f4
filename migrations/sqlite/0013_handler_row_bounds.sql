-- SQLite (issue 23, the twenty-third read): the longest row, in bytes of its values, that a
-- handler's tables may hold. SQLite bounds a value and a row only as they are written
-- (SQLITE_LIMIT_LENGTH inside the walls), so rows written under a larger limits.max_row_bytes
-- (or by a migration, at 1 MiB) outlast a lower one. The statement guard judges a handler's
-- statements at this size when it is larger than its limit (db/migrate/row_bound.rs).
-- PostgreSQL keeps the bound as a CHECK on each table instead.
CREATE TABLE handler_row_bounds (
    handler       TEXT    PRIMARY KEY,
    max_row_bytes INTEGER NOT NULL
);
