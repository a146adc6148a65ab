-- The authenticated principal that took a claim (the HTTP service's token
-- name): only it may report on the claim through the service. NULL for
-- claims taken where callers are not told apart (the CLI, the library).
-- (PostgreSQL; numbered in lockstep with migrations/sqlite.)
ALTER TABLE task_leases ADD COLUMN principal text;
