"""A worker client for the opledger HTTP service, standard library only.

`Client` speaks every route of the work protocol over one keep-alive
connection per thread. `Worker` runs a handler for claimed tasks: it
long-polls claims, heartbeats on a thread while the handler runs (and tells
the handler when a cancel was requested), reports progress, completes or
fails, and stops cleanly on SIGTERM or Ctrl-C: the task in hand is finished
and reported, claims taken after the signal are released, then `run`
returns.

    from opledger_worker import Client, Worker, NoResult

    def thumbnail(task):
        task.progress("resize", 0, 1)
        ...
        return {"bytes": 1234}

    Worker(Client("http://127.0.0.1:8080", TOKEN), {"thumbnail": "3"}, thumbnail).run()

The worker states the version of each kind its code implements
(`{"thumbnail": "3"}`, or a list of versions): it is offered only tasks
requested at one of them, and each task says the version it was requested
at (`task.kind_version`). A worker given a plain list of kinds states no
version and is offered any: the unsafe legacy mode, in which old code may
run work requested for a newer version of its kind.

Reports are fenced by the service: a report on a claim that no longer
holds its task (it expired and was recovered, or was cancelled) is refused
with `ApiError(status=409)` and changes nothing.
"""

import http.client
import json
import os
import signal
import socket
import threading
import time
import urllib.parse

__all__ = ["ApiError", "Cancelled", "Client", "NoResult", "Task", "Worker"]


class ApiError(Exception):
    """The service refused a call: its status and the error body's fields."""

    def __init__(self, status, code, message, details=None):
        super().__init__("%s %s: %s" % (status, code, message))
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}


class NoResult(Exception):
    """Raised by a handler that ran and found nothing to produce."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class Cancelled(Exception):
    """Raised by `Task.check_cancel` once a cancel of the task was requested."""


class Client:
    """Every route of the work protocol, one keep-alive connection per thread."""

    def __init__(self, base_url, token, timeout=60.0):
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https"):
            raise ValueError("base_url must be http:// or https://, not %r" % base_url)
        self._scheme = url.scheme
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._prefix = url.path.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._local = threading.local()

    def _connection(self, timeout):
        connection = getattr(self._local, "connection", None)
        if connection is None:
            kind = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            connection = kind(self._host, self._port, timeout=timeout)
            self._local.connection = connection
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        return connection

    def close(self):
        """Closes this thread's connection."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def call(self, method, path, body=None, timeout=None):
        """One request; the decoded JSON answer, or `ApiError`. A kept-alive
        connection the service closed meanwhile is reopened once (the
        request had not been sent on it)."""
        timeout = self._timeout if timeout is None else timeout
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            connection = self._connection(timeout)
            try:
                connection.request(method, self._prefix + path, body=data, headers=headers)
                response = connection.getresponse()
                raw = response.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as error:
                self.close()
                if attempt == 2:
                    raise error
            except Exception:
                self.close()
                raise
        if response.getheader("Connection", "").lower() == "close":
            self.close()
        try:
            answer = json.loads(raw.decode("utf-8")) if raw else None
        except ValueError:
            answer = None
        if 200 <= response.status < 300:
            return answer
        error = (answer or {}).get("error", {}) if isinstance(answer, dict) else {}
        raise ApiError(
            response.status,
            error.get("code", "unknown"),
            error.get("message", raw[:200].decode("utf-8", "replace")),
            error.get("details"),
        )

    # Asking for work.

    def request_task(self, kind, media_id=None, region_id=None, inputs=None, priority=0):
        body = {"kind": kind, "inputs": inputs or {}, "priority": priority}
        if media_id is not None:
            body["media_id"] = str(media_id)
        if region_id is not None:
            body["region_id"] = str(region_id)
        return self.call("POST", "/api/v1/tasks", body)

    def request_tasks(self, requests):
        """Many requests in one transaction: one answer or error per item."""
        return self.call("POST", "/api/v1/task-requests", {"requests": list(requests)})["items"]

    def cancel(self, operation_id, reason=None):
        """Cancels a task (admin)."""
        body = {"reason": reason} if reason else {}
        return self.call("POST", "/api/v1/operations/%s/cancel" % operation_id, body)

    # Taking and holding work.

    def claim(self, worker, kinds=(), lease_ms=60000, limit=1, wait_ms=0, versions=None):
        """Up to `limit` claims; waits up to `wait_ms` for one (a long-poll).

        `versions` maps a kind of `kinds` to the versions of it this worker
        implements (a string or a list): only tasks requested at one of them
        are offered."""
        body = {"worker": worker, "kinds": list(kinds), "lease_ms": lease_ms, "limit": limit, "wait_ms": wait_ms}
        if versions:
            body["versions"] = {
                kind: [stated] if isinstance(stated, str) else list(stated) for kind, stated in versions.items()
            }
        return self.call("POST", "/api/v1/claims", body, timeout=self._timeout + wait_ms / 1000.0)["claims"]

    def _on(self, token, action, body, revision, worker):
        if revision is not None:
            body["revision"] = revision
        if worker is not None:
            body["worker"] = worker
        return self.call("POST", "/api/v1/claims/%s/%s" % (urllib.parse.quote(token, safe=""), action), body)

    def heartbeat(self, token, lease_ms=None, revision=None, worker=None):
        """`{"lease_expires_at", "cancel_requested"}`."""
        body = {"lease_ms": lease_ms} if lease_ms is not None else {}
        return self._on(token, "heartbeat", body, revision, worker)

    def progress(self, token, phase, processed, total=None, revision=None, worker=None):
        body = {"phase": phase, "processed": processed}
        if total is not None:
            body["total"] = total
        return self._on(token, "progress", body, revision, worker)

    # Ending work.

    def complete(self, token, output=None, revision=None, worker=None):
        return self._on(token, "complete", {"output": output}, revision, worker)

    def no_result(self, token, reason, revision=None, worker=None):
        return self._on(token, "complete", {"no_result": reason}, revision, worker)

    def fail(self, token, error, terminal=False, revision=None, worker=None):
        return self._on(token, "fail", {"error": error, "terminal": terminal}, revision, worker)

    def release(self, token, reason=None, revision=None, worker=None):
        body = {"reason": reason} if reason else {}
        return self._on(token, "release", body, revision, worker)

    def ack_cancel(self, token, revision=None, worker=None):
        return self._on(token, "ack-cancel", {}, revision, worker)

    def report(self, reports):
        """Many outcomes in one transaction; one answer or error per item."""
        return self.call("POST", "/api/v1/reports", {"reports": list(reports)})["items"]

    def status(self):
        return self.call("GET", "/api/v1/status")


class Task:
    """A claimed task as the handler sees it: the claim's fields
    (`task.inputs`, `task.path`, `task.task_kind`, ...), progress, and
    whether a cancel was requested."""

    PROGRESS_EVERY = 0.25

    def __init__(self, worker, claim):
        self.claim = claim
        self._worker = worker
        self._cancelled = threading.Event()
        self._lost = threading.Event()
        self._last_progress = (None, 0.0)

    def __getattr__(self, name):
        try:
            return self.claim[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def cancelled(self):
        """A cancel was requested: stop, remove temporary outputs, return."""
        return self._cancelled.is_set()

    @property
    def lost(self):
        """The claim no longer holds the task (its lease ended): its result
        will be refused."""
        return self._lost.is_set()

    def check_cancel(self):
        """Raises `Cancelled` once a cancel was requested."""
        if self._cancelled.is_set():
            raise Cancelled()

    def progress(self, phase, processed, total=None):
        """Reports progress, at most every 250 ms within a phase."""
        last_phase, last_at = self._last_progress
        now = time.monotonic()
        if phase == last_phase and now - last_at < self.PROGRESS_EVERY and processed != total:
            return
        self._last_progress = (phase, now)
        try:
            self._worker.client.progress(
                self.claim_token, phase, processed, total, revision=self.revision, worker=self._worker.name
            )
        except ApiError as error:
            if error.status == 409:
                self._lost.set()
            else:
                raise


class Worker:
    """Runs `handler(task)` for each claimed task of `kinds`.

    `kinds` maps each kind to the version (or list of versions) of it the
    handler implements, e.g. `{"embedding": "2"}`: only tasks requested at
    those versions are claimed. A plain list of kinds claims any version
    (unsafe: old code may run work requested for a newer version).

    The handler returns the output (a JSON object: a dict), raises `NoResult(reason)`
    when it found nothing to produce, raises `Cancelled` (or returns) once
    `task.cancelled`, and raises anything else to fail the task (retried as
    the kind declares; `terminal_errors` lists exception types that fail it
    for good).
    """

    def __init__(self, client, kinds, handler, worker_name=None, lease_ms=60000, wait_ms=10000,
                 heartbeat_every=None, limit=1, terminal_errors=(), on_reported=None, log=None):
        self.client = client
        self.kinds = list(kinds)
        self.versions = dict(kinds) if isinstance(kinds, dict) else None
        self.handler = handler
        self.name = worker_name or "%s-%d" % (socket.gethostname(), os.getpid())
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.heartbeat_every = heartbeat_every if heartbeat_every is not None else lease_ms / 3000.0
        self.limit = limit
        self.terminal_errors = tuple(terminal_errors)
        self.on_reported = on_reported
        self.log = log or (lambda message: None)
        self._stopping = threading.Event()

    def stop(self):
        """Asks the worker to stop after the task in hand."""
        self._stopping.set()

    @property
    def stopping(self):
        return self._stopping.is_set()

    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stop())

    def run(self):
        """Claims and runs tasks until stopped; returns the number run."""
        self._install_signals()
        ran = 0
        pause = 0.1
        while not self.stopping:
            try:
                claims = self.client.claim(self.name, self.kinds, self.lease_ms, self.limit, self.wait_ms,
                                           versions=self.versions)
                pause = 0.1
            except (ApiError, OSError, http.client.HTTPException) as error:
                if isinstance(error, ApiError) and error.status in (400, 401, 403, 422):
                    raise
                # The service is restarting or unreachable: try again soon.
                self.log("claim failed (%s); retrying in %.1fs" % (error, pause))
                self._stopping.wait(pause)
                pause = min(pause * 2, 5.0)
                continue
            for index, claim in enumerate(claims):
                if self.stopping:
                    for unrun in claims[index:]:
                        self._give_back(unrun)
                    break
                self._run_one(claim)
                ran += 1
        return ran

    def _give_back(self, claim):
        try:
            self.client.release(claim["claim_token"], "worker stopping", revision=claim["revision"], worker=self.name)
        except (ApiError, OSError, http.client.HTTPException) as error:
            self.log("release of %s failed: %s" % (claim["operation_id"], error))

    def _heartbeats(self, task, done):
        # Its own connection: the handler's progress uses the worker's.
        while not done.wait(self.heartbeat_every):
            try:
                answer = self.client.heartbeat(task.claim_token, revision=task.revision, worker=self.name)
                if answer.get("cancel_requested"):
                    task._cancelled.set()
            except ApiError as error:
                if error.status == 409:
                    task._lost.set()
                    return
            except (OSError, http.client.HTTPException) as error:
                self.log("heartbeat failed: %s" % error)
        self.client.close()

    def _run_one(self, claim):
        task = Task(self, claim)
        done = threading.Event()
        beating = threading.Thread(target=self._heartbeats, args=(task, done), daemon=True)
        beating.start()
        try:
            try:
                output = self.handler(task)
                outcome = ("ack_cancel",) if task.cancelled else ("complete", output)
            except NoResult as empty:
                outcome = ("no_result", empty.reason)
            except Cancelled:
                outcome = ("ack_cancel",)
            except self.terminal_errors as error:
                outcome = ("fail", "%s: %s" % (type(error).__name__, error), True)
            except Exception as error:  # the handler's failure is the task's
                outcome = ("fail", "%s: %s" % (type(error).__name__, error), False)
        finally:
            done.set()
            beating.join()
        self._report(task, outcome)

    def _report(self, task, outcome):
        token, fence = task.claim_token, {"revision": task.revision, "worker": self.name}
        calls = {
            "complete": lambda: self.client.complete(token, outcome[1], **fence),
            "no_result": lambda: self.client.no_result(token, outcome[1], **fence),
            "fail": lambda: self.client.fail(token, outcome[1], outcome[2], **fence),
            "ack_cancel": lambda: self.client.ack_cancel(token, **fence),
        }
        pause = 0.1
        # Stopping, it gives an unreachable service a moment, not minutes.
        for attempt in range(8):
            if attempt >= 3 and self.stopping:
                break
            try:
                answer = calls[outcome[0]]()
            except ApiError as error:
                if error.status == 503:
                    time.sleep(pause)
                    pause *= 2
                    continue
                # 409: the claim was lost (recovered or cancelled); nothing changed.
                self.log("%s of %s refused: %s" % (outcome[0], task.operation_id, error))
                return
            except (OSError, http.client.HTTPException) as error:
                # Unknown whether it was recorded: a retry is fenced, so it is safe.
                self.log("%s of %s: %s; retrying" % (outcome[0], task.operation_id, error))
                time.sleep(pause)
                pause *= 2
                continue
            if self.on_reported is not None:
                self.on_reported(task, outcome[0], answer)
            return
        self.log("%s of %s given up; recovery requeues it when the lease ends" % (outcome[0], task.operation_id))
