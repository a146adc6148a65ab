-- entity_capability_states, version 2 (SQLite). See media_registry/sqlite.sql
-- for the t: and r: placeholders. One row per media task operation that
-- produces a capability (crates/domain/src/capabilities.rs); the 12
-- capability statuses are enforced here.
CREATE TABLE {{t:entity_capability_states}} (
    operation_id      TEXT    PRIMARY KEY NOT NULL,
    media_id          TEXT    NOT NULL REFERENCES {{r:media}} (id) ON DELETE CASCADE,
    capability        TEXT    NOT NULL,
    task_kind         TEXT    NOT NULL,
    status            TEXT    NOT NULL CHECK (status IN (
        'not_applicable', 'pending', 'queued', 'running', 'succeeded', 'no_result',
        'missing_confirmed', 'blocked', 'failed_retryable', 'failed_terminal', 'skipped', 'stale')),
    required          INTEGER NOT NULL CHECK (required IN (0, 1)),
    requested_version TEXT,
    claimed_version   TEXT,
    produced_version  TEXT,
    current_version   TEXT,
    version_key       TEXT    NOT NULL CHECK (version_key = task_kind || '@' || coalesce(current_version, '?')),
    produced_revision TEXT,
    reason            TEXT,
    updated_at        TEXT    NOT NULL,
    version           INTEGER NOT NULL CHECK (version >= 1),
    UNIQUE (media_id, capability),
    -- Only running work has a claimed version.
    CHECK (claimed_version IS NULL OR status = 'running'),
    -- Stale means a result exists, produced by another version.
    CHECK (status <> 'stale' OR (produced_version IS NOT NULL AND produced_version <> current_version))
);

-- The version sweep counts by kind@version and reads the rows of the keys
-- that are not current. No index by status: dashboards read the running
-- counts below, and every status change would rewrite an index entry.
CREATE INDEX {{t:entity_capability_states}}_by_version_key ON {{r:entity_capability_states}} (version_key);

-- Running counts of capabilities by status, kept by the same fold as the rows they count
-- (a removed media item's rows are subtracted as they cascade away), so the
-- dashboard reads one row instead of counting a table (version 2).
CREATE TABLE {{t:entity_capability_counts}} (
    name   TEXT    PRIMARY KEY NOT NULL,
    counts TEXT    NOT NULL
) WITHOUT ROWID;
