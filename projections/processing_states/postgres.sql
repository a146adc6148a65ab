-- processing_states, version 5 (PostgreSQL). See media_registry/postgres.sql
-- for the t: and r: placeholders. Each row's task kind is a declared kind of
-- its table's target type: `task_target` is a constant of the table, and
-- (task_kind, task_target) references task_kinds (name, target). Which
-- kinds run on which target is enforced here.
--
-- What keeps claims cheap as finished history grows: claims and recovery
-- read only partial indexes (claimable rows; held claims), whose size is the
-- live queue, not the history. A row leaving the queue leaves a dead entry
-- in the claimable index until VACUUM; the first scan that meets it marks
-- it dead, and a low vacuum scale factor (a fixed share of a table that
-- keeps every finished task would otherwise mean vacuuming ever more
-- rarely) clears them. The fill factor leaves room for a row's next version
-- on its page, so updates that change no indexed column stay there (HOT).
CREATE TABLE {{t:media_processing_states}} (
    operation_id       uuid        PRIMARY KEY,
    media_id           uuid        NOT NULL REFERENCES {{r:media}} (id) ON DELETE CASCADE,
    task_kind          text        NOT NULL,
    task_target        text        NOT NULL DEFAULT 'media' CHECK (task_target = 'media'),
    status             text        NOT NULL CHECK (status IN (
        'pending', 'queued', 'leased', 'running', 'retry_waiting', 'succeeded', 'no_result',
        'missing_confirmed', 'not_applicable', 'blocked', 'failed_retryable', 'failed_terminal',
        'dead_lettered', 'cancelled', 'interrupted', 'skipped')),
    priority           bigint      NOT NULL,
    requested_revision text        NOT NULL,
    inputs             text        NOT NULL,
    task_version       text,
    claimed_revision   text,
    completed_revision text,
    output             text,
    claim_token        text,
    worker             text,
    claimed_at         timestamptz,
    lease_expires_at   timestamptz,
    attempt_count      bigint      NOT NULL CHECK (attempt_count >= 0),
    failure_count      bigint      NOT NULL CHECK (failure_count >= 0 AND failure_count <= attempt_count),
    interruption_count bigint      NOT NULL CHECK (interruption_count >= 0 AND interruption_count <= attempt_count),
    available_at       timestamptz NOT NULL,
    cancel_requested   boolean     NOT NULL,
    last_error         text,
    status_reason      text,
    updated_at         timestamptz NOT NULL,
    version            bigint      NOT NULL CHECK (version >= 1),
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
) WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);

-- Claims: the claimable rows only, in claim order, per kind and version (a
-- claim for given kinds reads one range per version its worker states, or
-- per version queued when it states none), and in claim order across kinds
-- (a claim for any kind reads the first rows in order and stops, instead
-- of sorting the whole queue).
CREATE INDEX {{t:media_processing_states}}_claimable ON {{r:media_processing_states}} (task_kind, task_version, priority DESC, available_at, operation_id)
    WHERE status IN ('queued', 'retry_waiting');
CREATE INDEX {{t:media_processing_states}}_claim_order ON {{r:media_processing_states}} (priority DESC, available_at, operation_id)
    WHERE status IN ('queued', 'retry_waiting');
-- Recovery: held claims by the lease their claim granted.
CREATE INDEX {{t:media_processing_states}}_claimed ON {{r:media_processing_states}} (lease_expires_at) WHERE claim_token IS NOT NULL;
-- No index by status: dashboards read the running counts of media_operations
-- and entity_capability_states, and every status change would rewrite one.

CREATE TABLE {{t:region_processing_states}} (
    operation_id       uuid        PRIMARY KEY,
    region_id          uuid        NOT NULL REFERENCES {{r:media_regions}} (id) ON DELETE CASCADE,
    task_kind          text        NOT NULL,
    task_target        text        NOT NULL DEFAULT 'region' CHECK (task_target = 'region'),
    status             text        NOT NULL CHECK (status IN (
        'pending', 'queued', 'leased', 'running', 'retry_waiting', 'succeeded', 'no_result',
        'missing_confirmed', 'not_applicable', 'blocked', 'failed_retryable', 'failed_terminal',
        'dead_lettered', 'cancelled', 'interrupted', 'skipped')),
    priority           bigint      NOT NULL,
    requested_revision text        NOT NULL,
    inputs             text        NOT NULL,
    task_version       text,
    claimed_revision   text,
    completed_revision text,
    output             text,
    claim_token        text,
    worker             text,
    claimed_at         timestamptz,
    lease_expires_at   timestamptz,
    attempt_count      bigint      NOT NULL CHECK (attempt_count >= 0),
    failure_count      bigint      NOT NULL CHECK (failure_count >= 0 AND failure_count <= attempt_count),
    interruption_count bigint      NOT NULL CHECK (interruption_count >= 0 AND interruption_count <= attempt_count),
    available_at       timestamptz NOT NULL,
    cancel_requested   boolean     NOT NULL,
    last_error         text,
    status_reason      text,
    updated_at         timestamptz NOT NULL,
    version            bigint      NOT NULL CHECK (version >= 1),
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
) WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);

-- Claims: the claimable rows only, in claim order, per kind and version (a
-- claim for given kinds reads one range per version its worker states, or
-- per version queued when it states none), and in claim order across kinds
-- (a claim for any kind reads the first rows in order and stops, instead
-- of sorting the whole queue).
CREATE INDEX {{t:region_processing_states}}_claimable ON {{r:region_processing_states}} (task_kind, task_version, priority DESC, available_at, operation_id)
    WHERE status IN ('queued', 'retry_waiting');
CREATE INDEX {{t:region_processing_states}}_claim_order ON {{r:region_processing_states}} (priority DESC, available_at, operation_id)
    WHERE status IN ('queued', 'retry_waiting');
-- Recovery: held claims by the lease their claim granted.
CREATE INDEX {{t:region_processing_states}}_claimed ON {{r:region_processing_states}} (lease_expires_at) WHERE claim_token IS NOT NULL;
-- No index by status: dashboards read the running counts of media_operations
-- and entity_capability_states, and every status change would rewrite one.
