-- The log's hash chain (PostgreSQL; numbered in lockstep with
-- migrations/sqlite/0004): every event stores chain_hash, 64 lowercase hex
-- digits of SHA-256 over the hash of the event before it and the event as
-- stored (the rule is opledger_domain::chain). A row changed behind
-- opledger's back, even with its projection rows changed to match, then
-- breaks the chain at its seq, which `opledger replay --verify` names.
--
-- Rows written before this migration get their hashes right after it, from
-- the store (the rule is written once, in Rust), in seq order, under the
-- writers' advisory lock, before any append. Only a prefix of the log that
-- has never been chained is filled; a row without a hash after a chained
-- one stays a break. Text, not bytea: the same column as SQLite's, and
-- what a person compares by eye.
ALTER TABLE media_operation_events ADD COLUMN chain_hash text
    CHECK (chain_hash IS NULL OR length(chain_hash) = 64);

-- New events must carry their hash (NOT VALID: the rows before the fill
-- are not checked; every insert and update is).
ALTER TABLE media_operation_events ADD CONSTRAINT media_operation_events_chained
    CHECK (chain_hash IS NOT NULL) NOT VALID;

-- UPDATE stays refused, but for the one change the fill makes: a missing
-- chain_hash set, every other column as it was. A row trigger (the
-- statement trigger of 0001 refused every UPDATE, even one of no row).
DROP TRIGGER media_operation_events_no_update ON media_operation_events;

CREATE FUNCTION media_operation_events_fill_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.chain_hash IS NULL AND NEW.chain_hash IS NOT NULL
       AND (NEW.seq, NEW.stream_id, NEW.stream_version, NEW.event_type, NEW.schema_version,
            NEW.payload, NEW.recorded_at, NEW.actor, NEW.correlation_id, NEW.causation_id)
           IS NOT DISTINCT FROM
           (OLD.seq, OLD.stream_id, OLD.stream_version, OLD.event_type, OLD.schema_version,
            OLD.payload, OLD.recorded_at, OLD.actor, OLD.correlation_id, OLD.causation_id) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'media_operation_events is append-only: UPDATE refused'
        USING ERRCODE = 'OL001';
END;
$$;

CREATE TRIGGER media_operation_events_no_update
BEFORE UPDATE ON media_operation_events
FOR EACH ROW EXECUTE FUNCTION media_operation_events_fill_only();

-- When the log's integrity was last checked (`opledger replay --verify`),
-- and what the check found. Not a projection: it is not derived from the
-- log, and replay does not rebuild it. One row, replaced by each check.
CREATE TABLE log_verification (
    id                integer     PRIMARY KEY CHECK (id = 1),
    verified_at       timestamptz NOT NULL,
    position          bigint      NOT NULL CHECK (position >= 0),
    head_hash         text,
    broken_at         bigint,
    differing_tables  bigint      NOT NULL CHECK (differing_tables >= 0)
);
