-- The event log: the only source of truth (PostgreSQL; numbered in lockstep
-- with migrations/sqlite). Append-only, enforced here by triggers and not
-- only by code: UPDATE, DELETE and TRUNCATE are refused, and an insert must
-- take the next seq and the next version of its stream, so the log can never
-- have a gap.
--
-- payload is text, not jsonb: jsonb reorders keys and drops duplicate ones,
-- and the stored text must be exactly what was written. recorded_at is
-- timestamptz, which keeps microseconds exactly. stream_id compares bytes
-- (COLLATE "C"): it is an identifier, not prose, and memcmp is cheaper.
CREATE TABLE media_operation_events (
    seq            bigint      PRIMARY KEY CHECK (seq >= 1),
    stream_id      text        COLLATE "C" NOT NULL,
    stream_version bigint      NOT NULL CHECK (stream_version >= 1),
    event_type     text        NOT NULL,
    schema_version integer     NOT NULL CHECK (schema_version >= 1),
    payload        text        NOT NULL,
    recorded_at    timestamptz NOT NULL,
    actor          text        NOT NULL,
    correlation_id text        NOT NULL,
    causation_id   text
);

CREATE UNIQUE INDEX media_operation_events_by_stream
    ON media_operation_events (stream_id, stream_version);

-- SQLSTATE OL001 (a class of our own): the log is append-only. The store
-- maps it like SQLite's trigger refusals.
CREATE FUNCTION media_operation_events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'media_operation_events is append-only: % refused', TG_OP
        USING ERRCODE = 'OL001';
END;
$$;

-- Statement-level, so even an UPDATE or DELETE that matches no row is refused.
CREATE TRIGGER media_operation_events_no_update
BEFORE UPDATE ON media_operation_events
FOR EACH STATEMENT EXECUTE FUNCTION media_operation_events_refuse_change();

CREATE TRIGGER media_operation_events_no_delete
BEFORE DELETE ON media_operation_events
FOR EACH STATEMENT EXECUTE FUNCTION media_operation_events_refuse_change();

CREATE TRIGGER media_operation_events_no_truncate
BEFORE TRUNCATE ON media_operation_events
FOR EACH STATEMENT EXECUTE FUNCTION media_operation_events_refuse_change();

-- SQLSTATE OL002: an insert that is not the next seq or the next stream
-- version. The check reads committed rows (and this transaction's own), so
-- seq N+1 can only be inserted once N is visible: even a writer that skips
-- the store's advisory lock cannot make readers see N+1 while N may still
-- commit; it gets this error or a unique violation instead.
CREATE FUNCTION media_operation_events_next_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    next_seq     bigint;
    next_version bigint;
BEGIN
    SELECT COALESCE(MAX(seq), 0) + 1 INTO next_seq FROM media_operation_events;
    SELECT COALESCE(MAX(stream_version), 0) + 1 INTO next_version
        FROM media_operation_events WHERE stream_id = NEW.stream_id;
    IF NEW.seq IS DISTINCT FROM next_seq OR NEW.stream_version IS DISTINCT FROM next_version THEN
        RAISE EXCEPTION 'media_operation_events: seq and stream_version must each be the next one (got seq %, stream % version %; next are seq % and version %)',
                        NEW.seq, NEW.stream_id, NEW.stream_version, next_seq, next_version
            USING ERRCODE = 'OL002';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER media_operation_events_gap_free
BEFORE INSERT ON media_operation_events
FOR EACH ROW EXECUTE FUNCTION media_operation_events_next_only();

-- Where each projection stands: its version and the last seq folded in.
-- A shadow being rebuilt has its own row, named '<projection>__shadow'.
CREATE TABLE projection_positions (
    name     text   PRIMARY KEY,
    version  bigint NOT NULL,
    position bigint NOT NULL CHECK (position >= 0)
);
