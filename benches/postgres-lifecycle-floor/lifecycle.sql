-- One pgbench transaction script: request, claim and complete TASKS tasks
-- (`pgbench -D tasks=N`), each
-- step its own transaction writing the rows opledger writes for it (see run.sh).
-- The claim takes whichever queued rows no other client holds.
SELECT nextval('shape_block') AS block \gset
BEGIN;
WITH m AS (INSERT INTO media SELECT md5(:block || '-m-' || i)::uuid, '/p/' || :block || '/' || i || '.jpg', 'image', NULL, NULL, now(), now(), 1 FROM generate_series(1, :tasks / 2) i RETURNING id),
ev AS (INSERT INTO media_operation_events SELECT nextval('shape_seq'), 'operation:' || md5(:block || '-t-' || i)::uuid, 1, 'task.requested', 1, '{"task_kind":"metadata","revision":"' || md5(i::text) || md5(i::text) || '","inputs":{"digest":"abc"}}', now(), 'bench', md5(:block::text), NULL, encode(sha256(convert_to(random()::text, 'UTF8')), 'hex') FROM generate_series(1, :tasks) i RETURNING seq),
op AS (INSERT INTO media_operations SELECT md5(:block || '-t-' || i)::uuid, 'metadata', md5(:block || '-m-' || ((i+1)/2))::uuid, NULL, NULL, md5(i::text) || md5(i::text), '{"digest":"abc"}', 'queued', NULL, 0, 0, 0, NULL, NULL, NULL, now(), false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, now(), now(), 1 FROM generate_series(1, :tasks) i RETURNING id),
ps AS (INSERT INTO media_processing_states SELECT md5(:block || '-t-' || i)::uuid, md5(:block || '-m-' || ((i+1)/2))::uuid, CASE WHEN i % 2 = 0 THEN 'metadata' ELSE 'thumbnail' END, 'media', 'queued', 0, md5(i::text) || md5(i::text), '{"digest":"abc"}', '1', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, now(), false, NULL, NULL, now(), 1 FROM generate_series(1, :tasks) i RETURNING 1),
mev AS (INSERT INTO media_operation_events SELECT nextval('shape_seq'), 'media:' || md5(:block || '-m-' || i)::uuid, 1, 'media.registered', 1, '{"path":"/p/' || :block || '/' || i || '.jpg","media_kind":"image"}', now(), 'bench', md5(:block::text), NULL, encode(sha256(convert_to(random()::text, 'UTF8')), 'hex') FROM generate_series(1, :tasks / 2) i RETURNING seq),
cs AS (INSERT INTO entity_capability_states SELECT md5(:block || '-t-' || i)::uuid, md5(:block || '-m-' || ((i+1)/2))::uuid, CASE WHEN i % 2 = 0 THEN 'metadata' ELSE 'thumbnail' END, CASE WHEN i % 2 = 0 THEN 'metadata' ELSE 'thumbnail' END, 'queued', true, '1', NULL, NULL, '1', CASE WHEN i % 2 = 0 THEN 'metadata' ELSE 'thumbnail' END || '@1', NULL, NULL, now(), 1 FROM generate_series(1, :tasks) i RETURNING 1)
SELECT (SELECT count(*) FROM mev), (SELECT count(*) FROM m), (SELECT count(*) FROM ev), (SELECT count(*) FROM op), (SELECT count(*) FROM ps), (SELECT count(*) FROM cs);
UPDATE media_counts SET counts = '{"x":' || :block || '}' WHERE name = 'all';
UPDATE media_operation_counts SET counts = '{"x":' || :block || '}' WHERE name = 'all';
UPDATE entity_capability_counts SET counts = '{"x":' || :block || '}' WHERE name = 'all';
UPDATE projection_positions SET position = position + :tasks * 3 / 2;
COMMIT;
BEGIN;
SELECT quote_literal(coalesce(array_agg(operation_id),'{}')::text) AS ids FROM (SELECT operation_id FROM media_processing_states WHERE status IN ('queued','retry_waiting') ORDER BY priority DESC, available_at, operation_id LIMIT :tasks FOR UPDATE SKIP LOCKED) c \gset
WITH ids AS (SELECT unnest(:ids::uuid[]) AS id),
ps AS (UPDATE media_processing_states p SET status='leased', claimed_revision=requested_revision, claim_token=md5(p.operation_id::text || 'tok'), worker='w1', claimed_at=now(), lease_expires_at=now()+interval '30s', attempt_count=attempt_count+1, updated_at=now(), version=version+1 FROM ids WHERE p.operation_id = ids.id RETURNING 1),
op AS (UPDATE media_operations o SET status='leased', claim_token=md5(o.id::text || 'tok'), worker='w1', lease_expires_at=now()+interval '30s', attempt_count=attempt_count+1, updated_at=now(), version=version+1 FROM ids WHERE o.id = ids.id RETURNING 1),
cs AS (UPDATE entity_capability_states c SET status='running', claimed_version='1', updated_at=now(), version=version+1 FROM ids WHERE c.operation_id = ids.id RETURNING 1),
ev AS (INSERT INTO media_operation_events SELECT nextval('shape_seq'), 'operation:' || id, 2, 'task.claimed', 1, '{"claim_token":"' || md5(id::text || 'tok') || '","worker":"w1","lease_expires_at":"2026-12-02T10:00:00Z","revision":"abc"}', now(), 'w1', md5(id::text), NULL, encode(sha256(convert_to(random()::text, 'UTF8')), 'hex') FROM ids RETURNING 1),
le AS (INSERT INTO task_leases SELECT md5(id::text || 'tok'), id, 'w1', now(), now()+interval '30s', NULL, NULL, NULL, NULL, false FROM ids RETURNING 1)
SELECT (SELECT count(*) FROM ps), (SELECT count(*) FROM op), (SELECT count(*) FROM cs), (SELECT count(*) FROM ev), (SELECT count(*) FROM le);
UPDATE media_operation_counts SET counts = '{"y":' || :block || '}' WHERE name = 'all';
UPDATE entity_capability_counts SET counts = '{"y":' || :block || '}' WHERE name = 'all';
UPDATE projection_positions SET position = position + :tasks;
COMMIT;
BEGIN;
WITH ids AS (SELECT unnest(:ids::uuid[]) AS id),
ps AS (UPDATE media_processing_states p SET status='succeeded', completed_revision=claimed_revision, output='{"width":10}', claimed_revision=NULL, claim_token=NULL, worker=NULL, claimed_at=NULL, lease_expires_at=NULL, updated_at=now(), version=version+1 FROM ids WHERE p.operation_id = ids.id RETURNING 1),
op AS (UPDATE media_operations o SET status='succeeded', claim_token=NULL, worker=NULL, lease_expires_at=NULL, updated_at=now(), version=version+1 FROM ids WHERE o.id = ids.id RETURNING 1),
cs AS (UPDATE entity_capability_states c SET status='succeeded', claimed_version=NULL, produced_version='1', produced_revision='abc', updated_at=now(), version=version+1 FROM ids WHERE c.operation_id = ids.id RETURNING 1),
ev AS (INSERT INTO media_operation_events SELECT nextval('shape_seq'), 'operation:' || id, 3, 'task.completed', 1, '{"claim_token":"' || md5(id::text || 'tok') || '","revision":"abc","output":{"width":10}}', now(), 'w1', md5(id::text), NULL, encode(sha256(convert_to(random()::text, 'UTF8')), 'hex') FROM ids RETURNING 1),
le AS (DELETE FROM task_leases l USING ids WHERE l.operation_id = ids.id RETURNING 1)
SELECT (SELECT count(*) FROM ps), (SELECT count(*) FROM op), (SELECT count(*) FROM cs), (SELECT count(*) FROM ev), (SELECT count(*) FROM le);
UPDATE media_operation_counts SET counts = '{"z":' || :block || '}' WHERE name = 'all';
UPDATE entity_capability_counts SET counts = '{"z":' || :block || '}' WHERE name = 'all';
UPDATE projection_positions SET position = position + :tasks;
COMMIT;
