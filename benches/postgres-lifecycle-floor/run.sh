#!/usr/bin/env bash
# The PostgreSQL lifecycle's data-model floor, beside opledger's own figure.
#
# `lifecycle.sql` (a pgbench script) writes, for TASKS tasks at a time,
# exactly the rows opledger's lifecycle writes for them — 3.5 events a task,
# the operation, processing-state and capability rows inserted and then
# rewritten at claim and at completion, a lease row put and removed, the
# count rows and projection positions moved — as plain multi-row statements
# in three transactions (request, claim, complete), on a database with
# opledger's real schema (every index, CHECK and foreign key) but no
# gap-free trigger, no advisory lock, no row loads and no client-side fold.
# Statements go in pgbench's simple protocol, planned with their values
# (measured faster here than prepared generic plans for this script).
#
# With one client this is the floor of any store that writes one
# transaction at a time, as `seq` in commit order requires (see
# crates/store-postgres/src/lib.rs). With more clients the writers overlap,
# ordered by nothing but the count and position rows every transaction
# moves: event seqs come from a sequence and may commit out of order, which
# the log's gap-free trigger refuses (that is why setup.sql drops it). That
# figure bounds even a store that gave up the ordering rule.
#
# Usage: benches/postgres-lifecycle-floor/run.sh [ROUNDS] [SECONDS]
# Env:   OPLEDGER (the binary, default target/release/opledger),
#        SERVER (default postgres://postgres@127.0.0.1:5432),
#        TASKS (tasks per transaction, default "32 128"; opledger's claim
#        batch is set to the same), CLIENTS (default "1 2").
# Prints one JSON object per line. Needs psql, pgbench and jq.
set -euo pipefail
for tool in psql pgbench jq; do
    command -v "$tool" >/dev/null || { echo "run.sh needs $tool on PATH" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-3}
seconds=${2:-8}
opledger=${OPLEDGER:-target/release/opledger}
[ -x "$opledger" ] || { echo "no opledger binary at $opledger (cargo build --release, or set OPLEDGER)" >&2; exit 2; }
server=${SERVER:-postgres://postgres@127.0.0.1:5432}
clients=${CLIENTS:-1 2}
sizes=${TASKS:-32 128}
database=opledger_lifecycle_floor_$$
bench_database=opledger_lifecycle_floor_bench_$$

cleanup() {
    psql "$server/postgres" -qtAc "DROP DATABASE IF EXISTS $database" >/dev/null 2>&1 || true
    psql "$server/postgres" -qtAc "DROP DATABASE IF EXISTS $bench_database" >/dev/null 2>&1 || true
}
trap cleanup EXIT
psql "$server/postgres" -qtAc "CREATE DATABASE $bench_database" >/dev/null

for round in $(seq 1 "$rounds"); do
    for tasks in $sizes; do
        # Each measurement starts from a checkpoint, so none pays for the
        # dirty pages the one before it left (the floor writes a lot of WAL).
        psql "$server/postgres" -qtAc "CHECKPOINT" >/dev/null
        ours=$("$opledger" bench lifecycle --database-url "$server/$bench_database" --workers 16 \
            --claim-batch "$tasks" --json 2>/dev/null | jq -c '.runs[0] | {tasks, workers, claim_batch, tasks_per_sec}')
        echo "{\"round\":$round,\"at\":\"$(date -u +%H:%M:%S)\",\"opledger\":$ours}"
        for count in $clients; do
            psql "$server/postgres" -qtAc "DROP DATABASE IF EXISTS $database" >/dev/null 2>&1
            psql "$server/postgres" -qtAc "CREATE DATABASE $database" >/dev/null
            # opledger creates its schema (migrations and projection tables).
            "$opledger" --database-url "$server/$database" status >/dev/null
            psql "$server/$database" -q -v ON_ERROR_STOP=1 -f "$here/setup.sql" >/dev/null
            psql "$server/postgres" -qtAc "CHECKPOINT" >/dev/null
            tps=$(pgbench "$server/$database" -n -D tasks="$tasks" -f "$here/lifecycle.sql" -c "$count" \
                -j $((count < 2 ? 1 : 2)) -T "$seconds" 2>/dev/null | awk '/^tps/ {print $3}')
            echo "{\"round\":$round,\"floor_tasks_per_transaction\":$tasks,\"floor_clients\":$count,\"floor_tasks_per_sec\":$(awk -v t="$tps" -v n="$tasks" 'BEGIN {printf "%.0f", t * n}')}"
        done
    done
done
