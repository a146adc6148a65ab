-- processing_states, version 5 (SQLite). See media_registry/sqlite.sql for
-- the t: and r: placeholders. Each row's task kind is a declared kind of
-- its table's target type: `task_target` is a constant of the table, and
-- (task_kind, task_target) references task_kinds (name, target). Which
-- kinds run on which target is enforced here.
CREATE TABLE {{t:media_processing_states}} (
    operation_id       TEXT    PRIMARY KEY NOT NULL,
    media_id           TEXT    NOT NULL REFERENCES {{r:media}} (id) ON DELETE CASCADE,
    task_kind          TEXT    NOT NULL,
    task_target        TEXT    NOT NULL DEFAULT 'media' CHECK (task_target = 'media'),
    status             TEXT    NOT NULL CHECK (status IN (
        'pending', 'queued', 'leased', 'running', 'retry_waiting', 'succeeded', 'no_result',
        'missing_confirmed', 'not_applicable', 'blocked', 'failed_retryable', 'failed_terminal',
        'dead_lettered', 'cancelled', 'interrupted', 'skipped')),
    priority           INTEGER NOT NULL,
    requested_revision TEXT    NOT NULL,
    inputs             TEXT    NOT NULL,
    task_version       TEXT,
    claimed_revision   TEXT,
    completed_revision TEXT,
    output             TEXT,
    claim_token        TEXT,
    worker             TEXT,
    claimed_at         TEXT,
    lease_expires_at   TEXT,
    attempt_count      INTEGER NOT NULL CHECK (attempt_count >= 0),
    failure_count      INTEGER NOT NULL CHECK (failure_count >= 0 AND failure_count <= attempt_count),
    interruption_count INTEGER NOT NULL CHECK (interruption_count >= 0 AND interruption_count <= attempt_count),
    available_at       TEXT    NOT NULL,
    cancel_requested   INTEGER NOT NULL CHECK (cancel_requested IN (0, 1)),
    last_error         TEXT,
    status_reason      TEXT,
    updated_at         TEXT    NOT NULL,
    version            INTEGER NOT NULL CHECK (version >= 1),
    UNIQUE (media_id, task_kind),
    FOREIGN KEY (task_kind, task_target) REFERENCES {{r:task_kinds}} (name, target),
    -- A claimed task has a token, a worker, a claim time, a lease and the
    -- revision it runs; an unclaimed one has none of them.
    CHECK ((status IN ('leased', 'running')) = (claim_token IS NOT NULL)),
    CHECK ((claim_token IS NULL) = (worker IS NULL)),
    CHECK ((claim_token IS NULL) = (claimed_at IS NULL)),
    CHECK ((claim_token IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((claim_token IS NULL) = (claimed_revision IS NULL)),
    -- Output belongs to a completed revision.
    CHECK (output IS NULL OR completed_revision IS NOT NULL)
);

-- Claims: the claimable rows only, in claim order, per kind and version
-- (claims that name kinds read one range per version the worker states,
-- or per version queued when it states none) and across kinds (claims
-- that take any), so a claim reads the head of the queue instead of
-- sorting all of it.
CREATE INDEX {{t:media_processing_states}}_claimable ON {{r:media_processing_states}} (task_kind, task_version, priority DESC, available_at, operation_id)
    WHERE status IN ('queued', 'retry_waiting');
CREATE INDEX {{t:media_processing_states}}_claimable_any ON {{r:media_processing_states}} (priority DESC, available_at, operation_id)
    WHERE status IN ('queued', 'retry_waiting');
-- Recovery: held claims by the lease their claim granted.
CREATE INDEX {{t:media_processing_states}}_claimed ON {{r:media_processing_states}} (lease_expires_at) WHERE claim_token IS NOT NULL;
-- No index by status: dashboards read the running counts of media_operations
-- and entity_capability_states, and every status change would rewrite one.

CREATE TABLE {{t:region_processing_states}} (
    operation_id       TEXT    PRIMARY KEY NOT NULL,
    region_id          TEXT    NOT NULL REFERENCES {{r:media_regions}} (id) ON DELETE CASCADE,
    task_kind          TEXT    NOT NULL,
    task_target        TEXT    NOT NULL DEFAULT 'region' CHECK (task_target = 'region'),
    status             TEXT    NOT NULL CHECK (status IN (
        'pending', 'queued', 'leased', 'running', 'retry_waiting', 'succeeded', 'no_result',
        'missing_confirmed', 'not_applicable', 'blocked', 'failed_retryable', 'failed_terminal',
        'dead_lettered', 'cancelled', 'interrupted', 'skipped')),
    priority           INTEGER NOT NULL,
    requested_revision TEXT    NOT NULL,
    inputs             TEXT    NOT NULL,
    task_version       TEXT,
    claimed_revision   TEXT,
    completed_revision TEXT,
    output             TEXT,
    claim_token        TEXT,
    worker             TEXT,
    claimed_at         TEXT,
    lease_expires_at   TEXT,
    attempt_count      INTEGER NOT NULL CHECK (attempt_count >= 0),
    failure_count      INTEGER NOT NULL CHECK (failure_count >= 0 AND failure_count <= attempt_count),
    interruption_count INTEGER NOT NULL CHECK (interruption_count >= 0 AND interruption_count <= attempt_count),
    available_at       TEXT    NOT NULL,
    cancel_requested   INTEGER NOT NULL CHECK (cancel_requested IN (0, 1)),
    last_error         TEXT,
    status_reason      TEXT,
    updated_at         TEXT    NOT NULL,
    version            INTEGER NOT NULL CHECK (version >= 1),
    UNIQUE (region_id, task_kind),
    FOREIGN KEY (task_kind, task_target) REFERENCES {{r:task_kinds}} (name, target),
    -- A claimed task has a token, a worker, a claim time, a lease and the
    -- revision it runs; an unclaimed one has none of them.
    CHECK ((status IN ('leased', 'running')) = (claim_token IS NOT NULL)),
    CHECK ((claim_token IS NULL) = (worker IS NULL)),
    CHECK ((claim_token IS NULL) = (claimed_at IS NULL)),
    CHECK ((claim_token IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((claim_token IS NULL) = (claimed_revision IS NULL)),
    -- Output belongs to a completed revision.
    CHECK (output IS NULL OR completed_revision IS NOT NULL)
);

-- Claims: the claimable rows only, in claim order, per kind and version
-- (claims that name kinds read one range per version the worker states,
-- or per version queued when it states none) and across kinds (claims
-- that take any), so a claim reads the head of the queue instead of
-- sorting all of it.
CREATE INDEX {{t:region_processing_states}}_claimable ON {{r:region_processing_states}} (task_kind, task_version, priority DESC, available_at, operation_id)
    WHERE status IN ('queued', 'retry_waiting');
CREATE INDEX {{t:region_processing_states}}_claimable_any ON {{r:region_processing_states}} (priority DESC, available_at, operation_id)
    WHERE status IN ('queued', 'retry_waiting');
-- Recovery: held claims by the lease their claim granted.
CREATE INDEX {{t:region_processing_states}}_claimed ON {{r:region_processing_states}} (lease_expires_at) WHERE claim_token IS NOT NULL;
-- No index by status: dashboards read the running counts of media_operations
-- and entity_capability_states, and every status change would rewrite one.
