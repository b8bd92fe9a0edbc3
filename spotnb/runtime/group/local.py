"""Several processes per instance (`Config.procs_per_instance`): one replica group.

The agent is local rank 0, the process the controller sees (its events, its beacon, its exit
code). Before it runs the user's function it starts ranks 1..P-1 as its children
(`python -m spotnb.runtime.group.local_rank`), in its own process group, so a preemption (the
market kills the process group, the cloud the VM) takes the whole group. Each child runs the
same function with its own `Context` and writes no events: rank 0 speaks for the group.

Inside the group, torch.distributed is set up as torchrun would (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; gloo on CPU, nccl for CUDA tensors),
and `ctx.replicate` averages the gradients over the group (`Group.average`) before they
cross instances (torchft, `runtime/group/elastic.py`: each rank has its own Manager with
group_rank / group_world_size, and should_commit answers for the group as a whole).

The group lives and dies as one:

- a child killed, crashed or frozen (SIGSTOP past `STOP_GRACE`) ends the group: rank 0's
  watcher kills the others and exits with `EXIT_GROUP_LOST`, which the controller reads as a
  lost instance (the job goes on: peers train on, a replacement heals or restores);
- a child whose function raised ends the group with that error (rank and traceback);
- rank 0 gone (SIGKILL, OOM) takes its children with it (parent-death signal);
- a notice reaches rank 0 only; it travels to the others inside the next gradient
  all-reduce (one more number), so every rank handles it at the same step boundary, and rank
  0's decision (leave, or train on until killed) is broadcast there (`Group.agree`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from spotnb.runtime import logcap

__all__ = ["EXIT_GROUP_LOST", "Group", "LocalGroup", "resolve_procs"]

log = logging.getLogger("spotnb.local_group")

#: the agent's exit code when a process of its group died: the instance is lost to the job
#: (the controller reads it as `lost`, a preemption), never a user error
EXIT_GROUP_LOST = 5
#: seconds a child may stay stopped (SIGSTOP) before the group gives it up
STOP_GRACE = float(os.environ.get("SPOTNB_GROUP_STOP_GRACE", "10"))
#: longest a collective inside the group may wait: long, since rank 0's emergency save runs
#: while the others wait for its decision; dead or frozen members are caught by the watcher
GROUP_TIMEOUT = timedelta(seconds=float(os.environ.get("SPOTNB_GROUP_TIMEOUT", "900")))
#: set in the group's processes: in a child, the pipe's fd its failure report goes to (a pipe,
#: not a file: a group killed whole, as the market and Job.stop do, leaves nothing in /tmp)
ENV = "SPOTNB_LOCAL_GROUP"
#: the most bytes of a report written to the pipe at once (within any pipe's buffer: the
#: child never blocks on a parent that reads only once it exited)
REPORT_MAX = 48 * 1024
_EXITS_OK = (0, 3)  # a child that finished or evacuated with the group


def resolve_procs(setting: int | None) -> int:
    """`Config.procs_per_instance` on the instance: the setting, else the GPU count, else 1."""
    if setting:
        return int(setting)
    try:
        import torch

        return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
    except ImportError:  # pragma: no cover - torch is the runtime's dependency
        return 1


class Group:
    """This process's view of its replica group: torch.distributed and the notice flag."""

    def __init__(self, local_rank: int, local_world_size: int) -> None:
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.pending: Any = None  # rank 0: a notice not yet shared with the group
        self.deliver: Callable[[Any], None] | None = None  # Context: the group saw a notice

    @classmethod
    def from_env(cls) -> Group | None:
        """The group this process belongs to (None: one process per instance)."""
        if not os.environ.get(ENV):
            return None
        return cls(int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]))

    def init(self) -> None:
        """torch.distributed's default group over the instance's processes (env://)."""
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(self.local_rank)
        dist.init_process_group(
            "cpu:gloo,cuda:nccl" if cuda else "gloo",
            init_method="env://",
            rank=self.local_rank,
            world_size=self.local_world_size,
            timeout=GROUP_TIMEOUT,
        )

    def average(self, flat: Any) -> None:
        """Average `flat` over the group in place; one more number carries rank 0's pending
        notice (its seconds left), so every rank learns of it after the same step."""
        import torch
        import torch.distributed as dist

        left = 0.0
        if self.local_rank == 0 and self.pending is not None:
            left = max(1e-3, float(self.pending.deadline - time.time()))
        buf = torch.cat([flat.reshape(-1), torch.tensor([left], dtype=flat.dtype, device=flat.device)])
        dist.all_reduce(buf)
        flat.copy_((buf[:-1] / self.local_world_size).view_as(flat))
        shared = float(buf[-1])
        if shared > 0.0:
            self._noticed(shared)

    def _noticed(self, left: float) -> None:
        from spotnb.runtime.notice import Notice

        notice = self.pending if self.local_rank == 0 else None
        if notice is None:
            notice = Notice(deadline=time.time() + left, source="group", action="rank 0")
        self.pending = None
        if self.deliver is not None:
            self.deliver(notice)

    def decide(self, code: int) -> int:
        """Rank 0's `code` on every rank, with its pending notice (as in `average`): a
        sharded job's per-step word on whether this boundary saves (`Context`)."""
        import torch
        import torch.distributed as dist

        left, mine = 0.0, 0.0
        if self.local_rank == 0:
            mine = float(code)
            if self.pending is not None:
                left = max(1e-3, float(self.pending.deadline - time.time()))
        buf = torch.tensor([left, mine], dtype=torch.float64)
        dist.all_reduce(buf)
        if float(buf[0]) > 0.0:
            self._noticed(float(buf[0]))
        return int(buf[1])

    def agree(self, value: bool) -> bool:
        """Rank 0's `value`, on every rank (the others' argument is ignored)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if value else 0], dtype=torch.int64)
        dist.broadcast(flag, 0)
        return bool(flag.item())

    def same_start(self, module: Any) -> None:
        """Every rank starts from rank 0's parameters and buffers (as DDP does)."""
        import torch
        import torch.distributed as dist

        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, 0)

    def check_step(self, step: int) -> None:
        """After the restore: every rank must resume from the same step."""
        import torch
        import torch.distributed as dist

        mine = torch.tensor([step], dtype=torch.int64)
        high, low = mine.clone(), mine.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        if int(high) != int(low):
            raise RuntimeError(
                f"the processes of this instance restored different steps ({int(low)} and "
                f"{int(high)}): the store changed under them"
            )


class LocalGroup:
    """Rank 0's side: starts the other ranks and watches them (see the module docstring).

    `on_end(code, event)` is called (from the watcher thread) when the group must end because
    of another rank: it writes `event` and exits the process with `code`."""

    def __init__(
        self,
        procs: int,
        argv: list[str],
        key: bytes,
        on_end: Callable[[int, Any], None],
    ) -> None:
        self.procs, self.argv, self.key, self.on_end = procs, argv, key, on_end
        self.children: dict[int, subprocess.Popen] = {}
        self._reports: dict[int, int] = {}  # rank -> read end of the pipe of its report
        self._lock = threading.Lock()
        self._ending = False
        self._lost = threading.Event()  # the watcher is ending the group (and the process)
        self._watcher: threading.Thread | None = None
        self._stopped_since: dict[int, float] = {}

    def start(self) -> None:
        """Set this process up as rank 0 and start ranks 1..P-1. They load the job while rank
        0 waits for the instance before it; none restores before `join` (they wait in
        `Group.init` for rank 0), so they read no checkpoint too early."""
        port = _free_port()
        common = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(self.procs),
            "LOCAL_WORLD_SIZE": str(self.procs),
            ENV: "-1",
        }
        os.environ.update(common, RANK="0", LOCAL_RANK="0")
        for rank in range(1, self.procs):
            env = {**os.environ, **common, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            env["SPOTNB_GROUP_PARENT"] = str(os.getpid())
            read, write = os.pipe()
            env[ENV] = str(write)
            try:
                # its output through this agent, which caps the instance log (`runtime.logcap`)
                proc = subprocess.Popen(
                    [sys.executable, "-m", "spotnb.runtime.group.local_rank", *self.argv],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    cwd=os.getcwd(),
                    pass_fds=(write,),
                )
            finally:
                os.close(write)
            assert proc.stdout is not None and proc.stderr is not None
            logcap.forward(proc.stdout, "stdout", f"spotnb-rank{rank}-stdout")
            logcap.forward(proc.stderr, "stderr", f"spotnb-rank{rank}-stderr")
            os.set_blocking(read, False)
            self._reports[rank] = read
            assert proc.stdin is not None
            proc.stdin.write(self.key.hex().encode() + b"\n")  # never in an environment
            proc.stdin.close()
            self.children[rank] = proc
        self._watcher = threading.Thread(target=self._watch, name="spotnb-group", daemon=True)
        self._watcher.start()

    def join(self) -> Group:
        """Rank 0 joins the group (once the instance before it ended)."""
        group = Group(0, self.procs)
        group.init()
        return group

    def _watch(self) -> None:
        while not self._ending:
            for rank, proc in self.children.items():
                code = proc.poll()
                if code is None:
                    if _stopped(proc.pid):
                        since = self._stopped_since.setdefault(rank, time.monotonic())
                        if time.monotonic() - since >= STOP_GRACE:
                            self._lose(rank, f"was stopped (SIGSTOP) for {STOP_GRACE:.0f} s")
                            return
                    else:
                        self._stopped_since.pop(rank, None)
                elif code not in _EXITS_OK:
                    why = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                    self._lose(rank, why, code)
                    return
            time.sleep(0.1)

    def _lose(self, rank: int, why: str, code: int | None = None) -> None:
        from spotnb.core import protocol as ev

        with self._lock:
            if self._ending:
                return
            self._ending = True
            self._lost.set()
        report = self._report(rank) if code == 1 else None
        self._kill_all()
        if report is not None:
            event: Any = ev.Error(
                message=f"local rank {rank} of {self.procs}: {report.get('message', '')}",
                exc_type=str(report.get("exc_type", "Exception")),
                traceback=str(report.get("traceback", "")),
            )
            self.on_end(1, event)
        else:
            event = ev.JobWarning(
                message=f"local rank {rank} of this instance's {self.procs} processes {why}: the "
                "group leaves as one replica (the job goes on from its peers or the store)"
            )
            self.on_end(EXIT_GROUP_LOST, event)

    def _report(self, rank: int) -> dict[str, Any] | None:
        fd = self._reports.get(rank)
        if fd is None:
            return None
        try:
            data = json.loads(os.read(fd, REPORT_MAX + 1))
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):  # nothing written (BlockingIOError), or cut
            return None

    def settle(self, timeout: float = 5.0) -> None:
        """After rank 0's function raised: if it was because another rank died (its
        collective failed), let the watcher end the group as lost instead of a user error."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._ending:
            if any(p.poll() not in (None, *_EXITS_OK) for p in self.children.values()):
                deadline = max(deadline, time.monotonic() + 1.0)  # the watcher takes it
            time.sleep(0.05)
        self._wait_if_lost()
        with self._lock:
            self._ending = True
        self._wait_if_lost()

    def _wait_if_lost(self) -> None:
        """The watcher is ending the group and will exit the process: do nothing meanwhile
        (another thread must not report the same end differently)."""
        if self._lost.is_set() and threading.current_thread() is not self._watcher:
            threading.Event().wait()

    def end(self, timeout: float = 30.0) -> None:
        """Rank 0 is finishing: wait for the others to finish too, then end stragglers."""
        with self._lock:
            self._ending = True
        self._wait_if_lost()
        deadline = time.monotonic() + timeout
        for proc in self.children.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._kill_all()
        for fd in self._reports.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._reports = {}

    def _kill_all(self) -> None:
        for proc in self.children.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.children.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                log.warning("local rank with pid %d did not end", proc.pid)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped (state T in /proc; False where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False
