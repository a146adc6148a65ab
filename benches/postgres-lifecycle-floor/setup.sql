-- The data-model floor of the lifecycle (see run.sh): the real schema without
-- the gap-free trigger, and the sequences and count rows the script uses.
DROP TRIGGER media_operation_events_gap_free ON media_operation_events;
CREATE SEQUENCE shape_block;
CREATE SEQUENCE shape_seq;
INSERT INTO media_counts VALUES ('all','{}') ON CONFLICT DO NOTHING;
INSERT INTO media_operation_counts VALUES ('all','{}') ON CONFLICT DO NOTHING;
INSERT INTO entity_capability_counts VALUES ('all','{}') ON CONFLICT DO NOTHING;
