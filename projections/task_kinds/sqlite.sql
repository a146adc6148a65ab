-- task_kinds, version 1 (SQLite). See media_registry/sqlite.sql for the t:
-- and r: placeholders. One row per task kind the application declared (or,
-- in a log from before declarations, saw in its tasks). The processing-state
-- tables reference (name, target), so a state of an undeclared kind, or of a
-- region kind on a media row, cannot be stored.
CREATE TABLE {{t:task_kinds}} (
    name         TEXT    PRIMARY KEY NOT NULL,
    target       TEXT    NOT NULL CHECK (target IN ('media', 'region')),
    kind_version TEXT    NOT NULL,
    capability   TEXT,
    required     INTEGER NOT NULL CHECK (required IN (0, 1)),
    declared     INTEGER NOT NULL CHECK (declared IN (0, 1)),
    declaration  TEXT,
    declared_at  TEXT    NOT NULL,
    updated_at   TEXT    NOT NULL,
    version      INTEGER NOT NULL CHECK (version >= 0),
    UNIQUE (name, target),
    -- One kind produces each capability; region kinds produce none.
    UNIQUE (capability),
    CHECK ((target = 'media') = (capability IS NOT NULL)),
    CHECK (declared = (declaration IS NOT NULL))
);
