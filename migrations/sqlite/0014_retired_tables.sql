-- Names of tables and views a handler had and then dropped or renamed. No
-- other handler may take such a name (SQLite has one namespace for every
-- handler): until each host swaps to the handler's new version, the old one
-- still runs with walls made before the drop, and they name it.
CREATE TABLE handler_retired_tables (
    handler    TEXT NOT NULL,
    table_name TEXT NOT NULL,
    PRIMARY KEY (handler, table_name)
);
CREATE INDEX handler_retired_tables_by_name ON handler_retired_tables (lower(table_name));
