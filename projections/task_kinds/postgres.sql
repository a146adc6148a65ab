-- task_kinds, version 1 (PostgreSQL). See media_registry/postgres.sql for
-- the t: and r: placeholders. One row per task kind the application
-- declared (or, in a log from before declarations, saw in its tasks). The
-- processing-state tables reference (name, target), so a state of an
-- undeclared kind, or of a region kind on a media row, cannot be stored.
CREATE TABLE {{t:task_kinds}} (
    name         text        PRIMARY KEY,
    target       text        NOT NULL CHECK (target IN ('media', 'region')),
    kind_version text        NOT NULL,
    capability   text,
    required     boolean     NOT NULL,
    declared     boolean     NOT NULL,
    declaration  text,
    declared_at  timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    version      bigint      NOT NULL CHECK (version >= 0),
    UNIQUE (name, target),
    -- One kind produces each capability; region kinds produce none.
    UNIQUE (capability),
    CHECK ((target = 'media') = (capability IS NOT NULL)),
    CHECK (declared = (declaration IS NOT NULL))
);
