-- The gap-free check once per INSERT statement instead of once per row
-- (PostgreSQL; numbered in lockstep with migrations/sqlite). The row trigger
-- of 0001 ran two MAX queries through PL/pgSQL for every event; a batch of
-- 32 events paid 64 of them, and that was the costliest statement of a claim
-- or a completion. The same rule, checked over the statement's rows at once:
--
-- * the rows' seqs are contiguous, the first one follows the highest seq
--   below it, and no seq above the last one exists;
-- * per stream, in seq order each row's version is the one before plus 1,
--   the first follows the stream's highest version below it, and no
--   version above the last one exists.
--
-- The queries read committed rows and this transaction's own (a fresh
-- snapshot per query), so seq N+1 still cannot be inserted while N may
-- commit: the seq below it is not visible yet and the check fails, as
-- before. A failed check raises SQLSTATE OL002 and the whole statement is
-- undone (an AFTER trigger's error aborts the statement that fired it).
DROP TRIGGER media_operation_events_gap_free ON media_operation_events;
DROP FUNCTION media_operation_events_next_only();

CREATE FUNCTION media_operation_events_next_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    first_seq    bigint;
    last_seq     bigint;
    row_count    bigint;
    below        bigint;
    above        bigint;
    bad_stream   text;
    first_version bigint;
BEGIN
    SELECT MIN(seq), MAX(seq), COUNT(*) INTO first_seq, last_seq, row_count FROM inserted;
    IF row_count = 0 THEN
        RETURN NULL;
    END IF;
    SELECT COALESCE(MAX(seq), 0) INTO below FROM media_operation_events WHERE seq < first_seq;
    SELECT MAX(seq) INTO above FROM media_operation_events WHERE seq > last_seq;
    IF last_seq - first_seq + 1 <> row_count OR below <> first_seq - 1 OR above IS NOT NULL THEN
        RAISE EXCEPTION 'media_operation_events: seq must be the next one (got seqs % to % in % rows; the highest seq before them is %)',
                        first_seq, last_seq, row_count, below
            USING ERRCODE = 'OL002';
    END IF;
    IF row_count = 1 THEN
        -- One row (a lone command's event): two index probes, no window
        -- query to plan.
        SELECT stream_id, stream_version INTO bad_stream, first_version FROM inserted;
        SELECT COALESCE(MAX(stream_version), 0) INTO below FROM media_operation_events
            WHERE stream_id = bad_stream AND stream_version < first_version;
        SELECT MAX(stream_version) INTO above FROM media_operation_events
            WHERE stream_id = bad_stream AND stream_version > first_version;
        IF below <> first_version - 1 OR above IS NOT NULL THEN
            RAISE EXCEPTION 'media_operation_events: stream_version must be the next one of stream % in seq order', bad_stream
                USING ERRCODE = 'OL002';
        END IF;
        RETURN NULL;
    END IF;
    SELECT stream_id INTO bad_stream FROM (
        SELECT stream_id, stream_version,
               lag(stream_version) OVER (PARTITION BY stream_id ORDER BY seq) AS previous,
               row_number() OVER (PARTITION BY stream_id ORDER BY seq) AS position_in_stream,
               max(stream_version) OVER (PARTITION BY stream_id) AS last_version
        FROM inserted
    ) AS rows_by_stream
    WHERE (position_in_stream > 1 AND stream_version <> previous + 1)
       OR (position_in_stream = 1 AND stream_version - 1 <> (
               SELECT COALESCE(MAX(e.stream_version), 0) FROM media_operation_events AS e
               WHERE e.stream_id = rows_by_stream.stream_id AND e.stream_version < rows_by_stream.stream_version))
       OR (position_in_stream = 1 AND EXISTS (
               SELECT 1 FROM media_operation_events AS e
               WHERE e.stream_id = rows_by_stream.stream_id AND e.stream_version > rows_by_stream.last_version))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'media_operation_events: stream_version must be the next one of stream % in seq order', bad_stream
            USING ERRCODE = 'OL002';
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER media_operation_events_gap_free
AFTER INSERT ON media_operation_events
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT EXECUTE FUNCTION media_operation_events_next_only();
