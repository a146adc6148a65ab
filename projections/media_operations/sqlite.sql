-- media_operations, version 6 (SQLite). See media_registry/sqlite.sql for
-- the t: and r: placeholders.
CREATE TABLE {{t:media_operations}} (
    id                 TEXT    PRIMARY KEY NOT NULL,
    kind               TEXT    NOT NULL,
    media_id           TEXT,
    region_id          TEXT,
    path               TEXT,
    revision           TEXT,
    inputs             TEXT    NOT NULL,
    status             TEXT    NOT NULL CHECK (status IN (
        'pending', 'queued', 'leased', 'running', 'retry_waiting', 'succeeded', 'no_result',
        'missing_confirmed', 'not_applicable', 'blocked', 'failed_retryable', 'failed_terminal',
        'dead_lettered', 'cancelled', 'interrupted', 'skipped')),
    stage              TEXT    CHECK (stage IS NULL OR stage IN (
        'discovered', 'settling', 'waiting_for_lock', 'queued', 'hashing', 'parsing', 'scoring',
        'registered', 'queued_identity', 'completed')),
    priority           INTEGER NOT NULL,
    attempt_count      INTEGER NOT NULL CHECK (attempt_count >= 0),
    interruption_count INTEGER NOT NULL CHECK (interruption_count >= 0),
    claim_token        TEXT,
    worker             TEXT,
    lease_expires_at   TEXT,
    available_at       TEXT,
    cancel_requested   INTEGER NOT NULL CHECK (cancel_requested IN (0, 1)),
    phase              TEXT,
    processed          INTEGER CHECK (processed IS NULL OR processed >= 0),
    total              INTEGER CHECK (total IS NULL OR total >= 0),
    last_error         TEXT,
    status_reason      TEXT,
    blocked_on         TEXT,
    blocked_on_status  TEXT    CHECK (blocked_on_status IS NULL OR blocked_on_status IN (
        'not_applicable', 'pending', 'queued', 'running', 'succeeded', 'no_result', 'missing_confirmed',
        'blocked', 'failed_retryable', 'failed_terminal', 'skipped', 'stale')),
    created_at         TEXT    NOT NULL,
    updated_at         TEXT    NOT NULL,
    version            INTEGER NOT NULL CHECK (version >= 1),
    -- A claimed operation has a token, a worker and a lease; any other has none.
    CHECK ((status IN ('leased', 'running')) = (claim_token IS NOT NULL)),
    CHECK ((claim_token IS NULL) = (worker IS NULL)),
    CHECK ((claim_token IS NULL) = (lease_expires_at IS NULL)),
    -- Only file ingestions carry a stage.
    CHECK ((kind = 'ingestion.file') = (stage IS NOT NULL)),
    -- Only a blocked operation waits for a need (version 5), and only a need
    -- has a standing.
    CHECK (blocked_on IS NULL OR status = 'blocked'),
    CHECK (blocked_on IS NOT NULL OR blocked_on_status IS NULL)
);

-- No index by status (dropped in version 3): dashboards read the running
-- counts below, and every status change would rewrite an index entry.
--
-- Listings (version 6): every operation newest first, those of one kind,
-- those of one media item, each walked in (created_at, id) order from a
-- keyset position (`ops list`). Their columns never change after an
-- operation is created, so no status change rewrites an entry; a filter on
-- status is checked on the rows the walk passes (docs/queries.md,
-- "The query layer").
CREATE INDEX {{t:media_operations}}_by_created ON {{r:media_operations}} (created_at, id);
CREATE INDEX {{t:media_operations}}_by_kind ON {{r:media_operations}} (kind, created_at, id);
CREATE INDEX {{t:media_operations}}_by_media ON {{r:media_operations}} (media_id, created_at, id) WHERE media_id IS NOT NULL;

-- File ingestions by the file they ingest (version 4): an ingest looks up
-- the files of its folder by path instead of reading every ingestion. Only
-- rows that name a path are indexed; tasks name a media item instead.
CREATE INDEX {{t:media_operations}}_by_path ON {{r:media_operations}} (path) WHERE path IS NOT NULL;

-- Running counts of operations by status, kept by the same fold as the rows they count,
-- so the dashboard reads a row instead of counting a table (version 2).
CREATE TABLE {{t:media_operation_counts}} (
    name   TEXT    PRIMARY KEY NOT NULL,
    counts TEXT    NOT NULL
) WITHOUT ROWID;
