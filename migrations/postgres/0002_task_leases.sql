-- Claim liveness: what heartbeats and progress reports change between
-- events (PostgreSQL; numbered in lockstep with migrations/sqlite). Not a
-- projection (it is not derived from the log, and replay does not rebuild
-- it), so it lives with the durable schema. A row exists from a claim until
-- its outcome is recorded; readers join it to the processing states by
-- claim token.
--
-- The hottest table: every heartbeat rewrites a row. Neither column a
-- heartbeat changes is indexed, so with free room on the page (fillfactor)
-- the update is HOT: no index writes, and the old version is pruned on the
-- page without waiting for VACUUM. Rows live only as long as their claims,
-- so the table stays small; vacuuming it often is cheap and keeps it so.
CREATE TABLE task_leases (
    claim_token         text        PRIMARY KEY,
    operation_id        uuid        NOT NULL,
    worker              text        NOT NULL,
    heartbeat_at        timestamptz NOT NULL,
    lease_expires_at    timestamptz NOT NULL,
    phase               text,
    processed           bigint      CHECK (processed IS NULL OR processed >= 0),
    total               bigint      CHECK (total IS NULL OR total >= 0),
    progressed_at       timestamptz,
    progress_unrecorded boolean     NOT NULL DEFAULT false
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 500);

CREATE INDEX task_leases_by_operation ON task_leases (operation_id);
