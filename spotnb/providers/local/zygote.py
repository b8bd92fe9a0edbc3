"""The market's side of its zygote (`spotnb/runtime/zygote.py`): start it, ask it for an
instance, and hand out a `Popen`-like handle whose exit status the zygote reports.

Instances forked from one process that imported torch once start in milliseconds instead of
2–3 CPU seconds each; a job's replacements, a fleet's instances and the test suite's hundreds
of instances share that one import. Anything the zygote cannot serve (it did not start, it
died, an instance's environment differs from the one it was started with) is started cold,
as before, so the zygote only ever makes a start faster.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from spotnb.runtime.zygote import claim as take_claim

__all__ = ["ZYGOTE_ENV", "Forked", "Zygote"]

log = logging.getLogger(__name__)

#: `SPOTNB_LOCAL_ZYGOTE=0`: every instance of the local market starts cold (a process of its own)
ZYGOTE_ENV = "SPOTNB_LOCAL_ZYGOTE"
#: seconds the market waits for the zygote's imports before it starts instances cold
READY_TIMEOUT = 120.0
#: seconds the market waits for the zygote's answer to a request (a fork's: milliseconds)
ANSWER_TIMEOUT = 30.0


class Forked:
    """An instance the zygote forked: the part of `subprocess.Popen` the market uses (pid,
    poll, wait, returncode). Its exit status arrives from the zygote, which is its parent."""

    def __init__(self, pid: int, parent: int | None = None) -> None:
        self.pid, self.parent = pid, parent
        self.returncode: int | None = None
        self._ended = threading.Event()
        self._orphaned = False

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def _orphan(self) -> None:
        """The zygote died first: its instance was reparented, and only whether it still runs
        can be known (an ended one reads as SIGKILLed)."""
        self._orphaned = True
        self._ended.set()

    def poll(self) -> int | None:
        if self.returncode is None:
            state, ppid, status = _stat(self.pid)
            if state == "Z" and status is not None and (self._orphaned or ppid == self.parent):
                # ended, and its parent has not reaped it: a zygote that is stopped (or slow to
                # answer) must not hide an instance's end, nor its exit status, from the market
                self.returncode = os.waitstatus_to_exitcode(status)
            elif self._orphaned and state in ("", "Z", "X"):
                self.returncode = -signal.SIGKILL  # reaped by its new parent: status unknown
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"instance {self.pid}", timeout or 0.0)
            self._ended.wait(min(left or 0.05, 0.05))  # poll reads /proc: no wake-up for that
        assert self.returncode is not None
        return self.returncode


def _adopt(claim: str) -> Forked | None:
    """After a request the zygote did not answer: the child it forked, if it did (it named
    itself in the claim file), now an orphan; None: no child will run (the market's claim
    came first), start the instance cold."""
    if take_claim(claim, "market"):
        return None
    try:
        with open(claim, encoding="ascii") as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return None
    child = Forked(pid)
    child._orphan()
    log.warning("the local market's zygote forked instance %d and went silent: it runs on", pid)
    return child


def _stat(pid: int) -> tuple[str, int, int | None]:
    """(state, parent pid, wait status) of `pid` from /proc (the status is a zombie's; Linux
    3.5+); ("", 0, None) when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return "", 0, None
    try:
        status = int(fields[49]) if fields[0] == b"Z" and len(fields) > 49 else None
        return fields[0].decode(), int(fields[1]), status
    except (ValueError, IndexError):
        return "", 0, None


class Zygote:
    """One market's zygote process. `spawn` blocks until the zygote is ready (the first
    instance waits for the imports, as a cold one would) and returns None when it cannot serve."""

    def __init__(self, env: dict[str, str], job_id: str, log_path: str) -> None:
        self.env, self.log_path = env, log_path
        self._said_so = False
        self._lock = threading.Lock()
        self._asking = threading.Lock()  # one request at a time: answers come in order
        self._ready = threading.Event()
        self._dead = threading.Event()
        self._forked: list[Forked | None] = []  # answers to requests, in order
        self._answer = threading.Condition(self._lock)
        self._children: dict[int, Forked] = {}
        # `--job`: the command line says whose instances its children are (LocalProvider.reclaim)
        with open(log_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spotnb.runtime.zygote", "--job", job_id],
                env={**env, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        threading.Thread(target=self._read, name="spotnb-zygote", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                doc = json.loads(line)
                if "ready" in doc:
                    self._ready.set()
                elif "forked" in doc:
                    child = Forked(int(doc["forked"]), parent=self.proc.pid)
                    with self._lock:
                        self._children[child.pid] = child
                        self._forked.append(child)
                        self._answer.notify_all()
                elif "exit" in doc:
                    with self._lock:
                        found = self._children.pop(int(doc["exit"]), None)
                    if found is not None:
                        found._exited(int(doc["code"]))
        except (OSError, ValueError) as exc:
            log.warning("the local market's zygote answered badly: %r", exc)
        finally:
            with self._lock:
                self._dead.set()
                for child in self._children.values():
                    child._orphan()
                self._children.clear()
                self._answer.notify_all()
            self._ready.set()

    def wait_ready(self) -> bool:
        """Until the zygote has imported what an instance needs (False: it cannot serve)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._ready.wait(0.05):
            if self._stopped() or time.monotonic() > deadline:
                with self._lock:
                    self._retire("did not become ready")
                break
        ready = self._ready.is_set() and not self._dead.is_set()
        if not ready and not self._said_so:
            self._said_so = True
            log.warning(
                "the local market's zygote cannot start instances (exit code %s, see %s): "
                "they start cold, each importing torch",
                self.proc.poll(),
                self.log_path,
            )
        return ready

    def spawn(self, argv: list[str], env: dict[str, str], log_path: str, claim: str) -> Forked | None:
        """Fork an instance running `spotnb.runtime.agent ARGV` (None: start it cold). Quick
        once `wait_ready` said yes: the answer is a fork's. `claim`: a path of the market's
        no other request uses (`runtime/zygote.py`): without an answer, the child the zygote
        may have forked is adopted or ends before it runs anything, never left unknown."""
        if not self.wait_ready():
            return None
        doc = {"argv": argv, "env": env, "log": log_path, "cwd": os.getcwd(), "claim": claim}
        request = json.dumps(doc)
        with self._asking, self._lock:
            if self._dead.is_set():
                return None
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(request.encode() + b"\n")
                self.proc.stdin.flush()
            except OSError:
                pass  # it died: the claim says whether it forked first
            deadline = time.monotonic() + ANSWER_TIMEOUT
            while not self._forked and not self._dead.is_set():
                if self._stopped() or time.monotonic() > deadline:
                    self._retire("did not answer a request")
                    break
                self._answer.wait(0.05)
            if self._forked:
                return self._forked.pop(0)
        return _adopt(claim)

    def _stopped(self) -> bool:
        """The zygote is stopped (SIGSTOP, a debugger): it neither forks nor reports."""
        return _stat(self.proc.pid)[0] in ("T", "t")

    def _retire(self, why: str) -> None:
        """With `_lock` held: a zygote that does not answer serves no more (its instances live
        on; their ends are read from /proc, `Forked.poll`); killed, so that it never forks for
        a request the market gave up on."""
        if self._dead.is_set():
            return
        self._dead.set()
        for child in self._children.values():
            child._orphan()
        self._children.clear()
        log.warning("the local market's zygote %s (stopped or stuck): instances start cold", why)
        try:
            self.proc.kill()
        except OSError:
            pass

    def close(self) -> None:
        """End the zygote (its instances are the market's to end, and were)."""
        with self._lock:
            stdin = self.proc.stdin
            self.proc.stdin = None
        if stdin is not None:
            try:
                stdin.close()
            except OSError:
                pass
        if self._stopped():  # it would never read the end of its stdin
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
