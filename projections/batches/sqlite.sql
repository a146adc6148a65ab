-- batches, version 3 (SQLite). See media_registry/sqlite.sql for the t: and
-- r: placeholders. Progress columns are exact counts of the batch's items;
-- the CHECKs keep them consistent with each other.
CREATE TABLE {{t:batches}} (
    batch_id         TEXT    PRIMARY KEY NOT NULL,
    name             TEXT    NOT NULL,
    batch_kind       TEXT    NOT NULL,
    task_kinds       TEXT    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN (
        'running', 'cancelling', 'completed', 'completed_with_failures', 'cancelled')),
    cancel_requested INTEGER NOT NULL CHECK (cancel_requested IN (0, 1)),
    total            INTEGER NOT NULL CHECK (total >= 0),
    settled          INTEGER NOT NULL CHECK (settled >= 0 AND settled <= total),
    succeeded        INTEGER NOT NULL CHECK (succeeded >= 0),
    failed           INTEGER NOT NULL CHECK (failed >= 0),
    skipped          INTEGER NOT NULL CHECK (skipped >= 0),
    cancelled        INTEGER NOT NULL CHECK (cancelled >= 0),
    blocked          INTEGER NOT NULL CHECK (blocked >= 0),
    remaining        INTEGER NOT NULL CHECK (remaining >= 0),
    resumes          INTEGER NOT NULL CHECK (resumes >= 0),
    created_at       TEXT    NOT NULL,
    updated_at       TEXT    NOT NULL,
    version          INTEGER NOT NULL CHECK (version >= 1),
    CHECK (settled = succeeded + failed + skipped + cancelled + blocked),
    CHECK (remaining = total - settled),
    -- Active (unsettled items) exactly when running or cancelling.
    CHECK ((remaining > 0) = (status IN ('running', 'cancelling')))
);

CREATE INDEX {{t:batches}}_by_status ON {{r:batches}} (status);
-- `batch list`, newest first from a keyset position (version 2). Neither
-- column changes as a batch progresses.
CREATE INDEX {{t:batches}}_by_created ON {{r:batches}} (created_at, batch_id);

CREATE TABLE {{t:batch_items}} (
    item_key     TEXT    PRIMARY KEY NOT NULL,
    batch_id     TEXT    NOT NULL REFERENCES {{r:batches}} (batch_id) ON DELETE CASCADE,
    operation_id TEXT    NOT NULL,
    position     INTEGER NOT NULL CHECK (position >= 0),
    label        TEXT    NOT NULL,
    outcome      TEXT    CHECK (outcome IS NULL OR outcome IN ('succeeded', 'failed', 'skipped', 'cancelled', 'blocked')),
    last_status  TEXT,
    reason       TEXT,
    runs         INTEGER NOT NULL CHECK (runs >= 1),
    settled_at   TEXT,
    history      TEXT    NOT NULL,
    updated_at   TEXT    NOT NULL,
    UNIQUE (batch_id, operation_id),
    UNIQUE (batch_id, position),
    CHECK ((outcome IS NULL) = (settled_at IS NULL))
);

-- Completion reconciliation finds an operation's batches.
CREATE INDEX {{t:batch_items}}_by_operation ON {{r:batch_items}} (operation_id);
