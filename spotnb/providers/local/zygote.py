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

__all__ = ["ZYGOTE_ENV", "Forked", "Zygote"]

log = logging.getLogger(__name__)

#: `SPOTNB_LOCAL_ZYGOTE=0`: every instance of the local market starts cold (a process of its own)
ZYGOTE_ENV = "SPOTNB_LOCAL_ZYGOTE"
#: seconds the market waits for the zygote's imports before it starts instances cold
READY_TIMEOUT = 120.0


class Forked:
    """An instance the zygote forked: the part of `subprocess.Popen` the market uses (pid,
    poll, wait, returncode). Its exit status arrives from the zygote, which is its parent."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
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
        if self.returncode is None and self._orphaned and not _alive(self.pid):
            self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"instance {self.pid}", timeout or 0.0)
            self._ended.wait(min(left or 0.05, 0.05) if self._orphaned else left)
        assert self.returncode is not None
        return self.returncode


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


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
                    child = Forked(int(doc["forked"]))
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
        ready = self._ready.wait(READY_TIMEOUT) and not self._dead.is_set()
        if not ready and not self._said_so:
            self._said_so = True
            log.warning(
                "the local market's zygote cannot start instances (exit code %s, see %s): "
                "they start cold, each importing torch",
                self.proc.poll(),
                self.log_path,
            )
        return ready

    def spawn(self, argv: list[str], env: dict[str, str], log_path: str) -> Forked | None:
        """Fork an instance running `spotnb.runtime.agent ARGV` (None: start it cold). Quick
        once `wait_ready` said yes: the answer is a fork's."""
        if not self.wait_ready():
            return None
        request = json.dumps({"argv": argv, "env": env, "log": log_path, "cwd": os.getcwd()})
        with self._asking, self._lock:
            if self._dead.is_set():
                return None
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(request.encode() + b"\n")
                self.proc.stdin.flush()
            except OSError:
                return None
            while not self._forked and not self._dead.is_set():
                self._answer.wait()
            return self._forked.pop(0) if self._forked else None

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
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
