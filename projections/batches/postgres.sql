-- batches, version 3 (PostgreSQL). See media_registry/postgres.sql for the
-- t: and r: placeholders. Progress columns are exact counts of the batch's
-- items; the CHECKs keep them consistent with each other.
CREATE TABLE {{t:batches}} (
    batch_id         uuid        PRIMARY KEY,
    name             text        NOT NULL,
    batch_kind       text        NOT NULL,
    task_kinds       text        NOT NULL,
    status           text        NOT NULL CHECK (status IN (
        'running', 'cancelling', 'completed', 'completed_with_failures', 'cancelled')),
    cancel_requested boolean     NOT NULL,
    total            bigint      NOT NULL CHECK (total >= 0),
    settled          bigint      NOT NULL CHECK (settled >= 0 AND settled <= total),
    succeeded        bigint      NOT NULL CHECK (succeeded >= 0),
    failed           bigint      NOT NULL CHECK (failed >= 0),
    skipped          bigint      NOT NULL CHECK (skipped >= 0),
    cancelled        bigint      NOT NULL CHECK (cancelled >= 0),
    blocked          bigint      NOT NULL CHECK (blocked >= 0),
    remaining        bigint      NOT NULL CHECK (remaining >= 0),
    resumes          bigint      NOT NULL CHECK (resumes >= 0),
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    version          bigint      NOT NULL CHECK (version >= 1),
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
    item_key     text        PRIMARY KEY,
    batch_id     uuid        NOT NULL REFERENCES {{r:batches}} (batch_id) ON DELETE CASCADE,
    operation_id uuid        NOT NULL,
    position     bigint      NOT NULL CHECK (position >= 0),
    label        text        NOT NULL,
    outcome      text        CHECK (outcome IS NULL OR outcome IN ('succeeded', 'failed', 'skipped', 'cancelled', 'blocked')),
    last_status  text,
    reason       text,
    runs         bigint      NOT NULL CHECK (runs >= 1),
    settled_at   timestamptz,
    history      text        NOT NULL,
    updated_at   timestamptz NOT NULL,
    UNIQUE (batch_id, operation_id),
    UNIQUE (batch_id, position),
    CHECK ((outcome IS NULL) = (settled_at IS NULL))
);

-- Completion reconciliation finds an operation's batches.
CREATE INDEX {{t:batch_items}}_by_operation ON {{r:batch_items}} (operation_id);
