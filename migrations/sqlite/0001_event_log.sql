-- The event log: the only source of truth. Append-only, enforced here by
-- triggers and not only by code: UPDATE and DELETE are refused, and an
-- insert must take the next seq and the next version of its stream, so the
-- log can never have a gap.
CREATE TABLE media_operation_events (
    seq            INTEGER PRIMARY KEY NOT NULL CHECK (seq >= 1),
    stream_id      TEXT    NOT NULL,
    stream_version INTEGER NOT NULL CHECK (stream_version >= 1),
    event_type     TEXT    NOT NULL,
    schema_version INTEGER NOT NULL CHECK (schema_version >= 1),
    payload        TEXT    NOT NULL,
    recorded_at    TEXT    NOT NULL,
    actor          TEXT    NOT NULL,
    correlation_id TEXT    NOT NULL,
    causation_id   TEXT
);

CREATE UNIQUE INDEX media_operation_events_by_stream
    ON media_operation_events (stream_id, stream_version);

CREATE TRIGGER media_operation_events_no_update
BEFORE UPDATE ON media_operation_events
BEGIN
    SELECT RAISE(ABORT, 'media_operation_events is append-only: UPDATE refused');
END;

CREATE TRIGGER media_operation_events_no_delete
BEFORE DELETE ON media_operation_events
BEGIN
    SELECT RAISE(ABORT, 'media_operation_events is append-only: DELETE refused');
END;

CREATE TRIGGER media_operation_events_gap_free
BEFORE INSERT ON media_operation_events
WHEN NEW.seq IS NOT (SELECT COALESCE(MAX(seq), 0) + 1 FROM media_operation_events)
  OR NEW.stream_version IS NOT (
        SELECT COALESCE(MAX(stream_version), 0) + 1
        FROM media_operation_events WHERE stream_id = NEW.stream_id)
BEGIN
    SELECT RAISE(ABORT, 'media_operation_events: seq and stream_version must each be the next one');
END;

-- Where each projection stands: its version and the last seq folded in.
-- A shadow being rebuilt has its own row, named '<projection>__shadow'.
CREATE TABLE projection_positions (
    name     TEXT    PRIMARY KEY NOT NULL,
    version  INTEGER NOT NULL,
    position INTEGER NOT NULL CHECK (position >= 0)
);
