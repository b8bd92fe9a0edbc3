"""Run the job's script (`spot.run("train.py", args=[...])`) on the instance, with the same
guarantees as a function: backed-up folders restored before it starts, a preemption notice
delivered the way HPC schedulers do (SIGTERM, as SLURM and submitit send it, plus a notice
file with the deadline), the emergency checkpoint it makes before the deadline, a relaunch
after a preemption, and its exit code for success or failure.

Why a child process, not `runpy` in the agent's process:

- **The SIGTERM contract.** A script installs its own SIGTERM handler (that is the
  convention). In the agent's process it would replace the agent's, so a soft shutdown could
  no longer be read as a notice, and the agent could not tell the notice's SIGTERM from its
  own. In a child, the agent keeps its handler and signals exactly the script.
- **A script may end its process** (`os._exit` after saving, a segfault in an extension, the
  OOM killer): the agent survives it, reports the exit code and the script's last stderr
  lines, and tells a preemption from a failure. In-process, such an exit would take the event
  log and the job's key with it, and the controller would see a crash.
- **A fresh interpreter, `sys.argv` as given**: `python train.py args` exactly (its
  `__main__`, its `sys.path[0]`, multiprocessing that re-imports `__main__`), not a module
  run inside another program that already imported torch and holds threads.
- **The job key stays in the agent.** Checkpoints are signed there; the script never sees the
  key (the agent removed it from the environment before starting anything).

`spotnb.ctx()` in the script reaches the agent's real `Context` over a private Unix socket
(`script_client.ScriptContext`; the server is `CtxServer` here), so `ctx.log`, `ctx.backup`,
`ctx.should_save`, `ctx.restore`, `ctx.steps` and `ctx.step` behave as in a function. As for a
function, the instance is `ready` at the script's first step boundary: its start-up (the
interpreter, `import torch`, loading its own checkpoint) is preparation in the ledger, not
training time that no step accounts for. A script that marks no steps is ready at its first
`ctx.log`, and one that never calls `spotnb.ctx()` after `PLAIN_READY_S`.

How an incarnation ends:

- exit 0, no notice delivered: done; the result is what the script passed to
  `ctx.set_result` (None without).
- `ctx.backup(...)` after a notice: that backup is the emergency checkpoint; once it is
  committed the script is made to exit (`Evacuate`) and the instance is `evacuated`.
- the script got SIGTERM (a notice) and ended any other way: a preemption, never a failure.
  Without a backup after the notice the next instance resumes from the last one; the agent
  then stays until the deadline (the market ends it), so the lost work is counted as lost.
- any other exit: the job fails with the script's exit code and the tail of its stderr.
- still running `PAST_DEADLINE_S` after the notice's deadline (it ignored the SIGTERM, is
  stopped, never steps again) on an instance that was not ended: killed, a preemption.

Whatever the script leaves running when it exits (a worker it did not wait for) is killed
then: the agent is a child subreaper, so those orphans become its children and are found.

On several instances (`Config.instances > 1`) the child is torchrun, which runs the script's
workers (`spotnb.runtime.group.torchrun`): the restore happens at each rendezvous round
(`Rounds`, asked by the workers), a notice first asks the group's rank 0 for a checkpoint
(`NoticeBoard`), a worker's `failed.json` ends the incarnation as the script's failure, and a
torchrun that lost its rendezvous (the coordinator restarted) is started again.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spotnb.core import protocol as ev
from spotnb.core.files import remove_orphaned
from spotnb.core.signing import KEY_ENV
from spotnb.core.spec import ScriptSpec
from spotnb.policy.base import SaveKind
from spotnb.runtime import logcap
from spotnb.runtime.context import Context, Evacuate
from spotnb.runtime.group.torchrun import FAILED_FILE_ENV, NoticeBoard, Rounds, TorchrunGroup
from spotnb.runtime.script.client import NOTICE_ENV, RESULT_ENV, SOCKET_ENV, WORKDIR_ENV, encode

__all__ = ["ScriptRunner", "ScriptFailed", "ScriptResult", "CtxServer", "STDERR_TAIL"]

log = logging.getLogger("spotnb.agent.script")

STDERR_TAIL = 16 * 1024  # bytes of the script's stderr kept for the failure event
#: times in a row the agent starts torchrun again after it lost its rendezvous (the coordinator
#: restarted) before the instance gives up as failed
TORCHRUN_RELAUNCHES = 5
#: a torchrun that ran this long before it lost its rendezvous starts the count again
RELAUNCH_RESET_S = 120.0
#: the share of a notice's grace left when a group member signals torchrun without the group's
#: checkpoint (its workers then have that long to end)
GROUP_NOTICE_MARGIN = 0.25
#: seconds the agent waits past a notice's deadline for the market to end the instance after
#: the script left without an emergency backup (then it reports the evacuation itself)
PAST_DEADLINE_S = 10.0
#: seconds a process of the group (torchrun or a worker) may stay stopped (SIGSTOP) before its
#: agent kills it: its peers would wait in their collective for the script's whole timeout
#: (30 min by default); killed, it is a lost worker and torchrun starts a new round
STOP_GRACE = float(os.environ.get("SPOTNB_GROUP_STOP_GRACE", "10"))
#: seconds after which a script that has not called spotnb.ctx() is said `ready` (it knows
#: nothing of spotnb and marks no steps: its job then reads running); a script that uses
#: spotnb.ctx() is ready at its first step (or its first ctx.log, if it marks none)
PLAIN_READY_S = 60.0

# The child's first moments: die with the agent (PR_SET_PDEATHSIG survives exec), then become
# `python script args` (a fresh interpreter, nothing of spotnb imported). Not preexec_fn: that
# is unsafe in a process with threads, and the agent has several.
_BOOT = (
    "import os, signal, sys\n"
    "try:\n"
    "    import ctypes\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except Exception:\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(70)\n"
    "os.execv(sys.executable, [sys.executable] + sys.argv[2:])\n"
)


class ScriptFailed(Exception):
    """The script exited with a non-zero code (or was killed) without a preemption notice."""

    def __init__(self, message: str, tail: str, exc_type: str) -> None:
        super().__init__(message)
        self.tail, self.exc_type = tail, exc_type


@dataclass(frozen=True)
class ScriptResult:
    """The pickled result the script set (`ctx.set_result`), or the pickle of None."""

    pickled: bytes
    #: whether this is the job's result (False: another instance's rank 0 writes it)
    primary: bool = True


class CtxServer:
    """Serves `ScriptContext` calls from the script on the agent's real Context. One thread per
    connection (a script's signal handler opens a second one); calls into the Context run one
    at a time, as they would in a function's single training thread."""

    def __init__(
        self, ctx: Context, path: str, emit: Callable[[ev.Event], None], rounds: Rounds | None = None
    ) -> None:
        self.ctx, self.path, self._emit = ctx, path, emit
        self._rounds = rounds  # a script on several instances: its workers' round starts
        self.connected = threading.Event()  # the script asked for spotnb.ctx() at least once
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        self._next = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        os.chmod(path, 0o600)
        self._sock.listen(16)
        self._closed = False
        threading.Thread(target=self._accept, name="spotnb-ctx-server", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connected.set()
            threading.Thread(target=self._serve, args=(conn,), name="spotnb-ctx-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                try:
                    request = json.loads(line)
                    reply = self.handle(request)
                except Exception as exc:  # noqa: BLE001 - the script gets the error, the agent goes on
                    reply = {"error": {"type": type(exc).__name__, "message": str(exc)}}
                try:
                    conn.sendall(json.dumps(reply, default=encode).encode() + b"\n")
                except OSError:
                    return

    def say_ready(self) -> None:
        """Say `ready` now, unless the Context already did (at the script's first step)."""
        with self._lock:
            self._ready()

    def _ready(self) -> None:
        ctx = self.ctx
        if not ctx._ready_sent:
            ctx._ready_sent = True
            self._emit(ev.Ready(prep_s=time.time() - ctx._started, step=ctx.step_index, total=ctx.total))

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        with self._lock:
            if self.ctx._saves.evacuating:
                return {"evacuate": True}
            try:
                return self._dispatch(op, request)
            except Evacuate:
                return {"evacuate": True}

    def _dispatch(self, op: Any, request: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        if op == "group_round" and self._rounds is not None:
            return self._rounds.handle(request)
        if op == "group_backup_skipped":  # a rank other than 0 answered should_save(): asked
            ctx._saves.save_due = None
            return {}
        if op == "attr":
            name = str(request.get("name", ""))
            if name.startswith("_") or not hasattr(ctx, name):
                raise AttributeError(f"the job's context has no attribute {name!r}")
            value = getattr(ctx, name)
            return {"callable": True} if callable(value) else {"value": value}
        if op == "call":
            name = str(request.get("name", ""))
            if name.startswith("_") or not callable(getattr(ctx, name, None)):
                raise AttributeError(f"the job's context has no method {name!r}")
            if name == "backup":
                self._before_backup()
            elif name == "log":
                self._ready()  # metrics before any step: a script that marks no steps trains
            result = getattr(ctx, name)(*request.get("args", []), **request.get("kwargs", {}))
            if hasattr(result, "__next__") or hasattr(result, "__enter__"):
                self._next += 1
                self._handles[self._next] = result
                return {"handle": self._next}
            return {"value": result}
        handle = self._handles.get(int(request.get("handle", -1)))
        if handle is None:
            raise ValueError(f"no such iterator or context manager: {request.get('handle')!r}")
        if op == "next":
            try:
                return {"value": next(handle)}
            except StopIteration:
                self._handles.pop(int(request["handle"]), None)
                return {"stop": True}
        if op == "enter":
            return {"value": handle.__enter__()}
        if op == "exit":
            self._handles.pop(int(request["handle"]), None)
            if request.get("raised"):  # the script's block raised: the step does not count
                try:
                    handle.__exit__(RuntimeError, RuntimeError("the script's block raised"), None)
                except RuntimeError:
                    pass
            else:
                handle.__exit__(None, None, None)
            return {}
        if op == "close":
            self._handles.pop(int(request["handle"]), None)
            if hasattr(handle, "close"):
                handle.close()
            return {}
        raise ValueError(f"unknown request {op!r}")

    def _before_backup(self) -> None:
        """A backup after a notice is the emergency checkpoint, wherever the script makes it
        (its SIGTERM handler has no step boundary to wait for): it is waited for, and once it
        is committed the script is made to leave."""
        ctx = self.ctx
        notice = ctx.notice
        if notice is None:
            return
        if not ctx._saves.notice_handled:
            ctx._saves.notice_handled = True
            self._emit(ev.Evacuating(step=ctx.step_index, time_left=notice.deadline - time.time()))
        ctx._saves.due(SaveKind.EMERGENCY)


class ScriptRunner:
    """Runs the script of one incarnation in a child process; see the module's docstring."""

    def __init__(
        self,
        ctx: Context,
        script: ScriptSpec,
        emit: Callable[[ev.Event], None],
        *,
        job_id: str,
        incarnation: int,
        group: TorchrunGroup | None = None,
    ) -> None:
        self.ctx, self.script, self._emit = ctx, script, emit
        self.job_id, self.incarnation = job_id, incarnation
        self.group = group  # several instances: torchrun runs the script (`torchrun_group`)
        self.signalled = False  # the script was sent SIGTERM for a notice
        self._notice_written = False
        self._board = NoticeBoard(group, ctx) if group is not None else None
        self._posted: float | None = None  # when this instance's notice was told to the group
        self._looked = 0.0
        self.group_saved = False  # the group committed a checkpoint after this instance's notice
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._rounds: Rounds | None = None
        self._stopped_since: dict[int, float] = {}  # pid of a stopped process -> since when
        self._frozen_look = 0.0

    def _stuck(self) -> str | None:
        """Why the script's rounds are going nowhere (`Rounds.stuck`), or None."""
        return self._rounds.stuck if self._rounds is not None else None

    def run(self) -> ScriptResult:
        """Restore, start the script, forward a notice, and read how it ended: returns the
        result, or raises Evacuate (preempted) or ScriptFailed."""
        remove_orphaned(tempfile.gettempdir(), _SCRATCH)  # an instance the market SIGKILLed left its own
        # 0700: only this user reaches the socket; the agent's pid in the name tells when it is dead
        tmp = tempfile.mkdtemp(prefix=f"{_SCRATCH}{os.getpid()}-")
        rounds = Rounds(self.ctx, self._emit, self.job_id) if self.group is not None else None
        self._rounds = rounds
        server = CtxServer(self.ctx, os.path.join(tmp, "ctx.sock"), self._emit, rounds)
        if self._board is not None:
            self._board.start()
        ended = False  # for the job (done or failed), not for this instance alone (Evacuate)
        try:
            result = self._run(tmp, server)
            ended = True
            return result
        except ScriptFailed:
            ended = True
            raise
        finally:
            if self._board is not None:
                self._board.stop()
            if rounds is not None and ended:
                rounds.close()
            server.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def _run(self, tmp: str, server: CtxServer) -> ScriptResult:
        ctx = self.ctx
        if self.group is None:
            # the backed-up folders are back before the script looks for them; `ready` (the
            # first step is about to run) is said at the script's first step boundary, as a
            # function's is, so its start-up (its interpreter, `import torch`, loading its
            # checkpoint) is preparation, not training time that no step accounts for
            ctx.restore()
        else:
            # on several instances each rendezvous round restores the checkpoint rank 0 chose,
            # and `ready` is said now (the fleet counts a replica from it)
            server.say_ready()
        self.notice_file = os.path.join(tmp, "notice.json")
        result_file = os.path.join(tmp, "result.pkl")
        self.failed_file = os.path.join(tmp, "failed.json")
        env = {
            **os.environ,
            SOCKET_ENV: server.path,
            NOTICE_ENV: self.notice_file,
            RESULT_ENV: result_file,
            WORKDIR_ENV: os.getcwd(),
            "SPOTNB_JOB_ID": self.job_id,
            "SPOTNB_INCARNATION": str(self.incarnation),
        }
        env.pop("SPOTNB_BEACON", None)  # the local market's view of the agent, not the script's
        env.pop(KEY_ENV, None)  # the agent dropped it at start; never hand it on regardless
        env.setdefault("PYTHONUNBUFFERED", "1")  # its prints reach the instance log as they happen
        if self.group is None:
            code = self._start(self._argv([self.script.path, *self.script.args]), env, server)
            return self._ended(code, result_file)
        env.update(self.group.env())
        env[FAILED_FILE_ENV] = self.failed_file
        lost = 0  # torchrun's rendezvous lost in a row (each start that lasted resets it)
        while True:
            try:
                epoch = self.group.epoch()
            except RuntimeError as exc:
                raise ScriptFailed(str(exc), self.tail(), "CoordinatorLost") from None
            command = self.group.command(epoch, self.script.path, self.script.args)
            started = time.monotonic()
            code = self._start(self._argv(command[1:]), env, server)
            if code == 0 or self.signalled or ctx.notice is not None or ctx._saves.evacuating:
                break
            lost = 1 if time.monotonic() - started > RELAUNCH_RESET_S else lost + 1
            if os.path.exists(self.failed_file) or lost > TORCHRUN_RELAUNCHES or self._stuck():
                break
            # torchrun itself gave up (its rendezvous store vanished: the coordinator restarted,
            # or its restarts ran out): a new rendezvous, with the coordinator's new epoch
            log.warning("torchrun exited with %d without a script failure; starting it again", code)
            self._emit(
                ev.JobWarning(
                    message=f"torchrun on this instance lost its rendezvous (exit code {code}); "
                    "starting it again with the coordinator"
                )
            )
        return self._ended(code, result_file)

    def _argv(self, command: list[str]) -> list[str]:
        return [sys.executable, "-c", _BOOT, str(os.getpid()), *command]

    def _start(self, argv: list[str], env: dict[str, str], server: CtxServer) -> int:
        """Run one child to its end (forwarding a notice); its exit code."""
        ctx = self.ctx
        _become_subreaper()  # what the script leaves behind is reparented here, to be ended
        before = _children(os.getpid())
        # both streams through the agent, which caps the instance log (`runtime.logcap`)
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        begun = time.monotonic()
        assert proc.stdout is not None
        out = logcap.forward(proc.stdout, "stdout", "spotnb-script-stdout")
        pump = threading.Thread(target=self._pump, args=(proc,), name="spotnb-script-stderr", daemon=True)
        pump.start()
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if (
                    not ctx._ready_sent
                    and not server.connected.is_set()
                    and time.monotonic() - begun >= PLAIN_READY_S
                ):
                    server.say_ready()  # it does not use spotnb: its steps are not seen
                notice = ctx.notice
                # on several instances the group saves first (`_group_notice`)
                if notice is not None and not self.signalled and (self.group is None or self._group_notice()):
                    self._deliver(proc, server)
                if self.group is not None and ctx._saves.evacuating:
                    proc.kill()  # rank 0 ran here and made the emergency checkpoint: leave now
                if notice is not None and time.time() > notice.deadline + PAST_DEADLINE_S:
                    # it ignored the SIGTERM (or is stopped, or never steps) and the instance
                    # was not ended at the deadline: it must not train on unseen; a preemption
                    proc.kill()
                if self.group is not None and (os.path.exists(self.failed_file) or self._stuck()):
                    proc.kill()  # the script failed: torchrun must not start it again
                if self.group is not None:
                    self._end_frozen(proc.pid)
        finally:
            _end_leftovers(before | {proc.pid})
            _become_subreaper(False)  # nothing of the script is left to adopt
        pump.join(timeout=5)
        out.join(timeout=5)
        return code

    def _end_frozen(self, root: int) -> None:
        """Kill a process of the group (torchrun or a worker) stopped for `STOP_GRACE`."""
        now = time.monotonic()
        if now - self._frozen_look < 0.25:
            return
        self._frozen_look = now
        stopped = {pid for pid in _descendants(root) if _stopped(pid)}
        for pid in list(self._stopped_since):
            if pid not in stopped:
                del self._stopped_since[pid]
        for pid in stopped:
            since = self._stopped_since.setdefault(pid, now)
            if now - since < STOP_GRACE:
                continue
            del self._stopped_since[pid]
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self._emit(
                ev.JobWarning(
                    message=f"a process of the script's group (pid {pid}) was stopped (SIGSTOP) for "
                    f"{STOP_GRACE:.0f} s: killed, so that its peers do not wait for it; the group "
                    "starts a new round"
                )
            )

    def _group_notice(self) -> bool:
        """A notice on an instance of a group: tell the group (its rank 0 saves at its next
        step boundary, wherever it runs), and say whether to signal torchrun now: once a
        checkpoint newer than the notice is committed, or `GROUP_NOTICE_MARGIN` of the grace
        before the deadline (the workers need a moment to end)."""
        notice = self.ctx.notice
        assert notice is not None and self._board is not None
        now = time.time()
        if self._posted is None:
            self._write_notice()
            self._posted = now
            if not self._board.post():
                log.warning("the coordinator cannot be reached: the group is not asked to save")
        if now - self._looked >= 0.25:
            self._looked = now
            try:
                newest = next(iter(self.ctx._ckpt.list_manifests()), None)
            except OSError:
                newest = None
            if newest is not None and newest.created >= self._posted:
                self.group_saved = True
                return True
        grace = max(notice.deadline - self._posted, 0.0)
        return now >= notice.deadline - GROUP_NOTICE_MARGIN * grace

    def _write_notice(self) -> None:
        notice = self.ctx.notice
        assert notice is not None
        if self._notice_written:
            return
        doc = {
            "deadline": notice.deadline,
            "time_left": notice.deadline - time.time(),
            "source": notice.source,
            "action": notice.action,
        }
        tmp = f"{self.notice_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, self.notice_file)
        self._notice_written = True

    def _deliver(self, proc: subprocess.Popen, server: CtxServer) -> None:
        """Write the notice file, then SIGTERM the script: unless it uses spotnb.ctx() and has
        no SIGTERM handler (the default action would kill it before it could save; it learns
        of the notice from ctx.should_save() at its next step instead). Asked again at every
        tick until it is signalled: a handler installed after the notice still gets it."""
        self._write_notice()
        if server.connected.is_set() and not _catches(proc.pid, signal.SIGTERM):
            return
        try:
            proc.send_signal(signal.SIGTERM)
            self.signalled = True
        except ProcessLookupError:
            pass

    def _pump(self, proc: subprocess.Popen) -> None:
        """The script's stderr to the agent's (the instance log), keeping the tail."""
        assert proc.stderr is not None
        out = getattr(sys.stderr, "buffer", None)
        while chunk := proc.stderr.read1(65536):  # type: ignore[attr-defined]
            if out is not None:
                try:
                    out.write(chunk)
                    out.flush()
                except (OSError, ValueError):
                    out = None
            logcap.wrote(len(chunk))
            self._tail.append(chunk)
            self._tail_size += len(chunk)
            while self._tail_size - len(self._tail[0]) >= STDERR_TAIL:
                self._tail_size -= len(self._tail.popleft())

    def tail(self) -> str:
        return b"".join(self._tail)[-STDERR_TAIL:].decode("utf-8", "replace")

    def _ended(self, code: int, result_file: str) -> ScriptResult:
        ctx = self.ctx
        if ctx._saves.evacuating:  # the emergency backup is committed (Evacuated was written)
            raise Evacuate()
        if self.signalled or (code != 0 and ctx.notice is not None):
            if self.group_saved:  # the group's rank 0 saved after the notice: nothing is lost
                self._emit(ev.Evacuated(step=ctx.step_index))
                raise Evacuate()
            self._left_on_notice(code)
            raise Evacuate()
        if code == 0:
            if os.path.exists(result_file):
                with open(result_file, "rb") as f:
                    return ScriptResult(f.read())
            import cloudpickle

            # on several instances only rank 0's agent holds the job's result
            return ScriptResult(cloudpickle.dumps(None), primary=self.group is None)
        if self.group is not None and os.path.exists(self.failed_file):
            raise self._group_failure()
        stuck = self._stuck()
        if stuck is not None:
            raise ScriptFailed(f"{self.script.path}: {stuck}", self.tail(), "ScriptStuck")
        tail = self.tail()
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        last = next((line for line in reversed(tail.strip().splitlines()) if line.strip()), "")
        exc_type = last.split(":", 1)[0].strip() if ":" in last and " " not in last.split(":", 1)[0] else ""
        message = f"{self.script.path} {how}" + (f": {last.strip()}" if last else "")
        raise ScriptFailed(message, tail, exc_type or "ScriptFailed")

    def _group_failure(self) -> ScriptFailed:
        """The script failed on a rank of this instance (the wrapper's `failed.json`)."""
        with open(self.failed_file, encoding="utf-8") as f:
            doc = json.load(f)
        text = str(doc.get("traceback", ""))
        last = next((line for line in reversed(text.strip().splitlines()) if line.strip()), "")
        head = last.split(":", 1)[0].strip()
        exc_type = head if ":" in last and " " not in head else "ScriptFailed"
        message = f"{self.script.path} failed on rank {doc.get('rank')}" + (
            f": {last.strip()}" if last else ""
        )
        return ScriptFailed(message, text[-STDERR_TAIL:], exc_type)

    def _left_on_notice(self, code: int) -> None:
        """The script ended after the notice without an emergency backup: not a failure. Stay
        until the market ends the instance at the deadline (the work since the last backup is
        lost and counted so); past it (a notice that did not end the instance), report the
        evacuation ourselves so that the job goes on elsewhere."""
        ctx = self.ctx
        notice = ctx.notice
        self._emit(
            ev.JobWarning(
                message=f"the script ended after the preemption notice (exit code {code}) without "
                "ctx.backup() after it: the next instance resumes from its last backup",
            )
        )
        deadline = (notice.deadline if notice is not None else time.time()) + PAST_DEADLINE_S
        while time.time() < deadline:
            time.sleep(0.2)
        self._emit(ev.Evacuated(step=ctx.step_index))


_SCRATCH = "spotnb-script-"


def _become_subreaper(on: bool = True) -> None:
    """Orphans of the script (a worker it did not wait for, a `&` in a shell it ran) become
    the agent's children instead of init's, so `_end_leftovers` finds them (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, int(on))  # PR_SET_CHILD_SUBREAPER
    except Exception:  # noqa: BLE001 - elsewhere the market's kill of the group ends them
        pass


def _child_map() -> dict[int, list[int]]:
    """Every process's children, by parent pid (from /proc; empty where it cannot be read)."""
    parents: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return parents
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
            parents.setdefault(int(fields[1]), []).append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return parents


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid`."""
    return set(_child_map().get(pid, []))


def _descendants(root: int) -> set[int]:
    """`root` and every process below it."""
    parents = _child_map()
    found, todo = {root}, [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped (state T; not t, a debugger's stop; False where /proc cannot
    say)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _end_leftovers(keep: set[int]) -> None:
    """Kill (and reap) the processes the script left running: nothing of the job may go on
    after it, holding its stderr pipe, the GPU or the instance's files. Rounds, because a
    killed process's own children are then reparented here too."""
    for _ in range(100):
        left = _children(os.getpid()) - keep
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in left:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:  # not ours to reap after all
                keep.add(pid)
    log.warning("the script's leftover processes kept multiplying; some may still run")


def _catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (Linux: SigCgt in /proc). Where that
    cannot be read, assume it does: SIGTERM is the convention."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return True


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
