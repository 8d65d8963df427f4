-- Handlers uploaded through the admin API (design §6). Handlers named in the
-- configuration file are not kept here: the file is their source of truth.

-- Every uploaded version, kept so that a rollback is one call. `settings` is
-- the JSON of a [[handlers]] entry without name, component and migrations;
-- `migrations` is the JSON list of the SQL files that came with the version
-- (already applied when the row was written).
CREATE TABLE handlers (
    name        TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    sha256      TEXT    NOT NULL,
    component   BLOB    NOT NULL,
    settings    TEXT    NOT NULL,
    migrations  TEXT    NOT NULL,
    uploaded_at INTEGER NOT NULL,
    uploaded_by TEXT    NOT NULL,
    PRIMARY KEY (name, version)
);

-- One row per uploaded handler: which version runs and whether it is paused.
-- Every host polls this small table and converges on it, so a change made
-- through any host's API reaches all hosts of the consumer group.
CREATE TABLE handler_deployments (
    name             TEXT    PRIMARY KEY,
    active_version   INTEGER NOT NULL,
    -- The version that was active before the last activation: what rollback restores.
    previous_version INTEGER,
    paused           INTEGER NOT NULL DEFAULT 0,
    updated_at       INTEGER NOT NULL
);
