-- The log's hash chain (numbered in lockstep with migrations/postgres/0004):
-- every event stores chain_hash, 64 lowercase hex digits of SHA-256 over
-- the hash of the event before it and the event as stored (the rule is
-- opledger_domain::chain). A row changed behind opledger's back, even with
-- its projection rows changed to match, then breaks the chain at its seq,
-- which `opledger replay --verify` names.
--
-- Rows written before this migration get their hashes right after it: SQL
-- has no SHA-256 here, so the store fills them in seq order when it opens
-- the ledger for writing (before any append), in one transaction. Only a
-- prefix of the log that has never been chained is filled (its first row
-- has no hash); a row without a hash after a chained one stays a break.
ALTER TABLE media_operation_events ADD COLUMN chain_hash TEXT
    CHECK (chain_hash IS NULL OR length(chain_hash) = 64);

-- New events must carry their hash.
CREATE TRIGGER media_operation_events_chained
BEFORE INSERT ON media_operation_events
WHEN NEW.chain_hash IS NULL
BEGIN
    SELECT RAISE(ABORT, 'media_operation_events: chain_hash is required');
END;

-- UPDATE stays refused, but for the one change the fill makes: a missing
-- chain_hash set, every other column as it was.
DROP TRIGGER media_operation_events_no_update;

CREATE TRIGGER media_operation_events_no_update
BEFORE UPDATE ON media_operation_events
WHEN NOT (OLD.chain_hash IS NULL AND NEW.chain_hash IS NOT NULL
          AND NEW.seq IS OLD.seq AND NEW.stream_id IS OLD.stream_id
          AND NEW.stream_version IS OLD.stream_version AND NEW.event_type IS OLD.event_type
          AND NEW.schema_version IS OLD.schema_version AND NEW.payload IS OLD.payload
          AND NEW.recorded_at IS OLD.recorded_at AND NEW.actor IS OLD.actor
          AND NEW.correlation_id IS OLD.correlation_id AND NEW.causation_id IS OLD.causation_id)
BEGIN
    SELECT RAISE(ABORT, 'media_operation_events is append-only: UPDATE refused');
END;

-- When the log's integrity was last checked (`opledger replay --verify`),
-- and what the check found. Not a projection: it is not derived from the
-- log, and replay does not rebuild it. One row, replaced by each check.
CREATE TABLE log_verification (
    id                INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    verified_at       TEXT    NOT NULL,
    position          INTEGER NOT NULL CHECK (position >= 0),
    head_hash         TEXT,
    broken_at         INTEGER,
    differing_tables  INTEGER NOT NULL CHECK (differing_tables >= 0)
);
