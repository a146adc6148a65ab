-- The data-model floor of the lifecycle (see run.sh): the real schema without
-- the gap-free trigger, and the sequences and count rows the script uses.
DROP TRIGGER media_operation_events_gap_free ON media_operation_events;
CREATE SEQUENCE shape_block;
CREATE SEQUENCE shape_seq;
INSERT INTO media_counts VALUES ('all','{}') ON CONFLICT DO NOTHING;
-- The two kinds the lifecycle runs, declared as the lifecycle declares them
-- (their rows are what the processing states reference).
INSERT INTO media_operation_events VALUES
    (nextval('shape_seq'), 'task_kinds', 1, 'task_kind_declared', 1, '{}', now(), 'bench', 'kinds', NULL, repeat('0', 64)),
    (nextval('shape_seq'), 'task_kinds', 2, 'task_kind_declared', 1, '{}', now(), 'bench', 'kinds', NULL, repeat('1', 64));
INSERT INTO task_kinds VALUES
    ('metadata', 'media', '1', 'metadata', true, true, '{}', now(), now(), 1),
    ('thumbnail', 'media', '1', 'thumbnail', true, true, '{}', now(), now(), 2);
INSERT INTO media_operation_counts VALUES ('all','{}') ON CONFLICT DO NOTHING;
INSERT INTO entity_capability_counts VALUES ('all','{}') ON CONFLICT DO NOTHING;
