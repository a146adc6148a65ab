-- review_queue, version 2 (PostgreSQL). See media_registry/postgres.sql for
-- the t: and r: placeholders. One row per operation: its latest entry. Only
-- open entries are in the queue.
CREATE TABLE {{t:review_queue}} (
    operation_id      uuid        PRIMARY KEY,
    entry_id          bigint      NOT NULL UNIQUE CHECK (entry_id >= 1),
    kind              text        NOT NULL,
    media_id          uuid,
    path              text,
    reason_code       text        NOT NULL CHECK (reason_code IN (
        'failed_terminal', 'dead_lettered', 'blocked', 'missing_required', 'source_missing')),
    operation_status  text        NOT NULL,
    detail            text,
    state             text        NOT NULL CHECK (state IN ('open', 'retrying', 'resolved', 'superseded')),
    resolution        text        CHECK (resolution IS NULL OR resolution IN ('retry', 'dismiss', 'acknowledge')),
    resolution_reason text,
    resolved_by       text,
    opened_at         timestamptz NOT NULL,
    resolved_at       timestamptz,
    updated_at        timestamptz NOT NULL,
    -- An open entry is unresolved; a closed one says when it closed.
    CHECK (state <> 'open' OR (resolution IS NULL AND resolved_at IS NULL)),
    CHECK (state NOT IN ('resolved', 'superseded') OR resolved_at IS NOT NULL)
);

CREATE INDEX {{t:review_queue}}_by_state ON {{r:review_queue}} (state, entry_id);

-- Running counts of review entries by state, kept by the same fold as the rows they count
-- (a removed media item's rows are subtracted as they cascade away), so the
-- dashboard reads one row instead of counting a table (version 2).
CREATE TABLE {{t:review_queue_counts}} (
    name   text PRIMARY KEY,
    counts text NOT NULL
);
