-- Claim liveness: what heartbeats and progress reports change between
-- events. Not a projection (it is not derived from the log, and replay does
-- not rebuild it), so it lives with the durable schema. A row exists from a
-- claim until its outcome is recorded; readers join it to the processing
-- states by claim token.
CREATE TABLE task_leases (
    claim_token         TEXT    PRIMARY KEY NOT NULL,
    operation_id        TEXT    NOT NULL,
    worker              TEXT    NOT NULL,
    heartbeat_at        TEXT    NOT NULL,
    lease_expires_at    TEXT    NOT NULL,
    phase               TEXT,
    processed           INTEGER CHECK (processed IS NULL OR processed >= 0),
    total               INTEGER CHECK (total IS NULL OR total >= 0),
    progressed_at       TEXT,
    progress_unrecorded INTEGER NOT NULL DEFAULT 0 CHECK (progress_unrecorded IN (0, 1))
) WITHOUT ROWID;

CREATE INDEX task_leases_by_operation ON task_leases (operation_id);
