"""A worker that sleeps instead of working: for load tests and the
service's process tests. It logs to files what it started and every report
the service acknowledged (a 2xx), one line each, flushed at once, so a test
can compare them with the log after killing processes.

    python3 sleepy_worker.py --url http://127.0.0.1:8080 --token TOKEN \
        --kinds metadata --name w1 --sleep-ms 10 --acked acked.txt
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from opledger_worker import Client, Worker  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", default=os.environ.get("OPLEDGER_TOKEN", ""))
    parser.add_argument("--kinds", default="",
                        help="comma-separated task kinds, each KIND or KIND=VERSION (empty: any)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--sleep-ms", type=int, default=0, help="time each task takes")
    parser.add_argument("--first-sleep-ms", type=int, default=None, help="time the first task takes")
    parser.add_argument("--lease-ms", type=int, default=60000)
    parser.add_argument("--wait-ms", type=int, default=10000)
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--started", help="append 'OPERATION' here as each task starts")
    parser.add_argument("--acked", help="append 'OPERATION OUTCOME' here for each acknowledged report")
    args = parser.parse_args()

    started = open(args.started, "a", buffering=1) if args.started else None
    acked = open(args.acked, "a", buffering=1) if args.acked else None
    ran = {"count": 0}

    def handler(task):
        if started:
            started.write(task.operation_id + "\n")
            started.flush()
        pause = args.sleep_ms
        if ran["count"] == 0 and args.first_sleep_ms is not None:
            pause = args.first_sleep_ms
        ran["count"] += 1
        deadline = time.monotonic() + pause / 1000.0
        while time.monotonic() < deadline:
            task.check_cancel()
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return {"worker": args.name, "attempt": task.attempt}

    def reported(task, outcome, answer):
        if acked:
            acked.write("%s %s\n" % (task.operation_id, outcome))
            acked.flush()

    def log(message):
        sys.stderr.write("[%s] %s\n" % (args.name, message))
        sys.stderr.flush()

    named = [kind for kind in args.kinds.split(",") if kind]
    # KIND=VERSION states the version its code implements.
    if any("=" in kind for kind in named):
        if not all("=" in kind for kind in named):
            parser.error("--kinds: state a version for every kind or for none")
        kinds = dict(kind.split("=", 1) for kind in named)
    else:
        kinds = named
    worker = Worker(Client(args.url, args.token), kinds, handler, worker_name=args.name,
                    lease_ms=args.lease_ms, wait_ms=args.wait_ms, limit=args.limit,
                    on_reported=reported, log=log)
    worker.run()
    log("stopped after %d tasks" % ran["count"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
