-- review_queue, version 2 (SQLite). See media_registry/sqlite.sql for the t:
-- and r: placeholders. One row per operation: its latest entry. Only open
-- entries are in the queue; the partial index is the queue.
CREATE TABLE {{t:review_queue}} (
    operation_id      TEXT    PRIMARY KEY NOT NULL,
    entry_id          INTEGER NOT NULL UNIQUE CHECK (entry_id >= 1),
    kind              TEXT    NOT NULL,
    media_id          TEXT,
    path              TEXT,
    reason_code       TEXT    NOT NULL CHECK (reason_code IN (
        'failed_terminal', 'dead_lettered', 'blocked', 'missing_required', 'source_missing')),
    operation_status  TEXT    NOT NULL,
    detail            TEXT,
    state             TEXT    NOT NULL CHECK (state IN ('open', 'retrying', 'resolved', 'superseded')),
    resolution        TEXT    CHECK (resolution IS NULL OR resolution IN ('retry', 'dismiss', 'acknowledge')),
    resolution_reason TEXT,
    resolved_by       TEXT,
    opened_at         TEXT    NOT NULL,
    resolved_at       TEXT,
    updated_at        TEXT    NOT NULL,
    -- An open entry is unresolved; a closed one says when it closed.
    CHECK (state <> 'open' OR (resolution IS NULL AND resolved_at IS NULL)),
    CHECK (state NOT IN ('resolved', 'superseded') OR resolved_at IS NOT NULL)
);

CREATE INDEX {{t:review_queue}}_by_state ON {{r:review_queue}} (state, entry_id);

-- Running counts of review entries by state, kept by the same fold as the rows they count
-- (a removed media item's rows are subtracted as they cascade away), so the
-- dashboard reads one row instead of counting a table (version 2).
CREATE TABLE {{t:review_queue_counts}} (
    name   TEXT    PRIMARY KEY NOT NULL,
    counts TEXT    NOT NULL
) WITHOUT ROWID;
