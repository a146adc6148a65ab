-- Idempotent retries (numbered in lockstep with migrations/postgres/0005):
-- a command issued with a caller-chosen request id (`--request-id` on the
-- command line, `Idempotency-Key` over HTTP) is recorded here in the same
-- transaction as its events, with a fingerprint of what it asked and the
-- answer it got. A retry with the same id finds the row first, inside its
-- own write transaction, and answers the recorded answer without appending
-- anything; the same id with another command (another fingerprint) is
-- refused as a conflict.
--
-- Not a projection: nothing in the log derives it (a request id is the
-- caller's, not an event's), so replay does not rebuild it and
-- `replay --verify` does not compare it. Rows older than the retention
-- (seven days by default) are swept by recovery, through the index below.
CREATE TABLE command_requests (
    request_id   TEXT    PRIMARY KEY NOT NULL CHECK (length(request_id) BETWEEN 1 AND 200),
    command      TEXT    NOT NULL,
    fingerprint  TEXT    NOT NULL CHECK (length(fingerprint) = 64),
    answer       TEXT    NOT NULL,
    first_seq    INTEGER,
    last_seq     INTEGER,
    recorded_at  TEXT    NOT NULL,
    CHECK ((first_seq IS NULL) = (last_seq IS NULL)),
    CHECK (first_seq IS NULL OR (first_seq >= 1 AND first_seq <= last_seq))
) WITHOUT ROWID;

CREATE INDEX command_requests_by_recorded ON command_requests (recorded_at);
