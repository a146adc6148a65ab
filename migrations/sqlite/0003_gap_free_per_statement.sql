-- Numbered in lockstep with migrations/postgres/0003, which moves
-- PostgreSQL's gap-free check from every row to every statement. SQLite has
-- no statement triggers, and its row trigger (0001) costs two index probes
-- inside the engine, with no interpreter between: it stays as it is.
SELECT 1;
