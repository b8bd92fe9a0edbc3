"""A script on several instances (`spot.run(script, config=Config(instances=N))`): what the agent
of each instance starts is torch's elastic launcher (`python -m torch.distributed.run`, i.e.
torchrun), which starts the script's workers through `spotnb.runtime.group.torchrun_worker`.

- **Rendezvous.** `--rdzv-backend=c10d` in the store the job's coordinator hosts
  (`spotnb.runtime.group.lighthouse.rendezvous_endpoint`), joined as a client (`is_host=false`): the
  coordinator outlives every spot instance, so no preemption takes the rendezvous with it.
  `--nnodes=min_instances:instances`: the group trains with whoever is there, at least
  `min_instances`.
- **A preempted instance.** Its peers' collectives fail, their workers exit, torchrun restarts
  them in a new rendezvous round without it (torchrun's model: every worker restarts; each
  round starts from the newest checkpoint, which rank 0 chooses for all). The controller
  refills the slot; when the replacement's torchrun arrives, the running ones see a node
  waiting and restart the workers once more, with it.
- **Rounds are cheap to fail.** `--max-restarts` is generous (`MAX_RESTARTS`): a lost peer is
  not a reason to give up. A *script* failure is told apart by the worker wrapper (an
  exception that is not the collective's), which writes `failed.json` for the agent: the job
  then fails at once with the script's traceback instead of restarting it.
- **The coordinator died.** Its store is empty when it is started again; torchrun's agents
  lose their rendezvous and exit. The run id carries the coordinator's epoch (a key it writes
  when it starts), so the agent starts torchrun again in a fresh rendezvous with the new one
  (`ScriptRunner`), and the workers restore from the store as in any round.
- **A notice.** Rank 0 may run on another instance, so the noticed agent asks the whole group
  for a checkpoint (`NoticeBoard`) and signals its torchrun only once one newer than the notice
  is committed (or near the deadline): the survivors then restart from it, nothing lost.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from spotnb.runtime.group.lighthouse import EPOCH_KEY, rendezvous_endpoint

__all__ = [
    "TorchrunGroup",
    "Rounds",
    "NoticeBoard",
    "group_from",
    "FAILED_FILE_ENV",
    "MAX_RESTARTS",
    "STUCK_ROUNDS",
]

#: restarts of the workers one torchrun may make (each lost peer costs one on each survivor)
MAX_RESTARTS = 1000
#: the file the worker wrapper writes when the script itself failed (not a lost peer)
FAILED_FILE_ENV = "SPOTNB_TORCHRUN_FAILED"
#: the rendezvous timing: how long a round waits for more nodes once min_instances joined
#: (a replacement still booting joins the round after), and how fast a dead node is dropped
LAST_CALL_S = float(os.environ.get("SPOTNB_RDZV_LAST_CALL", "2"))
KEEP_ALIVE_S = float(os.environ.get("SPOTNB_RDZV_KEEP_ALIVE", "1"))
JOIN_TIMEOUT_S = 600
#: how long an agent waits for the coordinator's store (a cloud's coordinator VM may be booting,
#: or being replaced after it died) before the instance gives up as failed
COORDINATOR_WAIT_S = float(os.environ.get("SPOTNB_COORDINATOR_WAIT", "900"))
#: rendezvous rounds in a row that start from where the one before started (no step counted,
#: no new checkpoint) before the script is taken to be failing, not losing peers: an error of
#: its own that reads as a lost peer (its data server refuses, a timeout) would otherwise
#: restart it MAX_RESTARTS times. A lost peer costs a round or two, each after some steps.
STUCK_ROUNDS = int(os.environ.get("SPOTNB_STUCK_ROUNDS", "20"))


@dataclass(frozen=True)
class TorchrunGroup:
    """The torchrun settings of one instance of the job (from the spec and the incarnation)."""

    job_id: str
    endpoint: str  # host:port of the coordinator's rendezvous store
    min_nodes: int
    max_nodes: int
    procs: int

    def epoch(self, timeout: float = COORDINATOR_WAIT_S) -> str:
        """The coordinator's current epoch, waiting while it is (re)starting."""
        from torch.distributed import TCPStore

        host, port = self.endpoint.rsplit(":", 1)
        host = host.strip("[]")
        deadline = time.monotonic() + timeout
        while True:
            try:
                store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
                return store.get(EPOCH_KEY).decode()
            except (RuntimeError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the job's coordinator does not answer at {self.endpoint} "
                        f"after {timeout:.0f} s (its rendezvous store)"
                    ) from None
                time.sleep(1.0)

    def command(self, epoch: str, script: str, args: list[str]) -> list[str]:
        """`python -m torch.distributed.run ... -m spotnb.runtime.group.torchrun_worker script args`."""
        conf = (
            f"is_host=false,last_call_timeout={LAST_CALL_S:g},join_timeout={JOIN_TIMEOUT_S},"
            f"keep_alive_interval={max(1, round(KEEP_ALIVE_S))},keep_alive_max_attempt=3"
        )
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={self.min_nodes}:{self.max_nodes}",
            f"--nproc-per-node={self.procs}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.job_id}.{epoch}",
            f"--rdzv-conf={conf}",
            f"--local-addr={self.local_addr()}",
            f"--max-restarts={MAX_RESTARTS}",
            "--monitor-interval=0.2",
            "-m",
            "spotnb.runtime.group.torchrun_worker",
            script,
            *args,
        ]

    def local_addr(self) -> str:
        """The address of this instance the others reach (the one it reaches the coordinator
        from), so that the round's store, hosted by rank 0, is not looked up by host name."""
        import socket

        host = self.endpoint.rsplit(":", 1)[0].strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((host, 9))  # a UDP connect sends nothing: it only picks the route
                return str(probe.getsockname()[0])
            except OSError:
                return socket.getfqdn()

    def env(self) -> dict[str, str]:
        """What torchrun itself needs in its environment (the workers inherit it)."""
        return {
            # the workers' store is made by rank 0 each round (torch's shared agent store keeps
            # the first round's address on nodes that were not rank 0, which breaks a round
            # after a preemption); the wrapper hosts it (`torchrun_worker`)
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }


def group_from(spec: dict[str, Any], inc: dict[str, Any], job_id: str) -> TorchrunGroup | None:
    """The group of a job on several instances, or None for one instance."""
    instances = int(spec.get("instances", 1))
    if instances <= 1:
        return None
    return TorchrunGroup(
        job_id=job_id,
        endpoint=rendezvous_endpoint(str(inc["lighthouse"])),
        min_nodes=int(spec.get("min_instances", 1)),
        max_nodes=instances,
        procs=int(spec.get("procs_per_instance") or _gpus() or 1),
    )


def _gpus() -> int:
    """The instance's GPU count (Config.procs_per_instance's default), 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class Rounds:
    """The agent's side of a rendezvous round's start: the worker wrappers of this instance
    ask it to restore the checkpoint of the round (rank 0's asks it to choose one). Every
    instance of the round restores the same checkpoint: the backed-up folders are made what
    that checkpoint holds (files written since go), and the context's step is the
    checkpoint's. A disk several instances share (the local market) or several workers of
    one instance share is restored once per round: a lock file and a round marker beside it,
    in the temporary folder, keyed by the job and the working directory, removed when the
    script ends for the job (`close`)."""

    def __init__(self, ctx: Any, emit: Any, job_id: str) -> None:
        import threading

        self.ctx, self._emit, self.job_id = ctx, emit, job_id
        self._lock = threading.Lock()
        self._replies: dict[str, dict[str, Any]] = {}
        self._last: tuple[Any, int] | None = None  # the checkpoint and step the last round began at
        self._stuck = 0  # rounds in a row that began where the one before began
        self._rounds = 0  # rounds this instance took part in (the event feed tells a restart)
        #: why the script is failing (`STUCK_ROUNDS`), for the runner to end it; None: it is not
        self.stuck: str | None = None

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        nonce = str(request.get("round", ""))
        if not nonce:
            raise ValueError("group_round: no round given")
        with self._lock:
            if nonce not in self._replies:
                reached = self.ctx.step_index  # what the last round counted (local rank 0's steps)
                self._rounds += 1
                reply = self._restore(bool(request.get("choose")), request.get("seq"), nonce)
                self._replies = {nonce: reply}
                self._count(reached, reply)
            return self._replies[nonce]

    def _count(self, reached: int, reply: dict[str, Any]) -> None:
        """A round began: count it as stuck if neither a step nor a checkpoint came since the
        last one began (see `STUCK_ROUNDS`)."""
        began = (reply["seq"], int(reply["step"]))
        if self._last is not None and began[0] == self._last[0] and reached <= self._last[1]:
            self._stuck += 1
        else:
            self._stuck = 0
        self._last = began
        if self._stuck + 1 >= STUCK_ROUNDS and self.stuck is None:
            self.stuck = (
                f"{self._stuck + 1} rendezvous rounds in a row ended before a step or a checkpoint "
                "(each with an error that reads as a lost peer): the script cannot make progress; "
                "its error is below"
            )

    def _base(self) -> str:
        """The lock file's and the round marker's path, less the suffix (`.lock`, `.round`)."""
        import hashlib
        import tempfile

        where = hashlib.sha256(os.getcwd().encode()).hexdigest()[:12]
        return os.path.join(tempfile.gettempdir(), f"spotnb-rounds-{self.job_id}-{where}")

    def close(self) -> None:
        """The script ended for the job (done or failed, not preempted: then the group goes on
        and a round may hold the lock): no round follows, so the lock file and the marker go
        rather than stay in the temporary folder for good. Every instance of the group does it
        (on a shared disk the first one removes them)."""
        base = self._base()
        for suffix in (".lock", ".round", ".round.tmp"):
            try:
                os.unlink(base + suffix)
            except OSError:
                pass

    def _restore(self, choose: bool, seq: Any, nonce: str) -> dict[str, Any]:
        import fcntl

        from spotnb.core import protocol as ev

        ctx = self.ctx
        ckpt = ctx._ckpt
        t0 = time.perf_counter()
        if choose:  # a save this instance's rank 0 handed off last round commits first
            ckpt.wait(timeout=120)
        base = self._base()
        found = None
        with open(f"{base}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(f"{base}.round", encoding="utf-8") as f:
                    on_disk = f.read() == nonce
            except OSError:
                on_disk = False
            manifests = ckpt.list_manifests()
            if not choose:
                manifests = [m for m in manifests if seq is not None and m.seq == int(seq)]
            for manifest in manifests:
                if on_disk or ckpt._load(manifest) is not None:
                    found = manifest
                    break
            if not choose and seq is not None and found is None:
                raise RuntimeError(
                    f"checkpoint {seq}, which rank 0 chose for this round, cannot be restored "
                    "on this instance (pruned or damaged meanwhile); the round starts again"
                )
            with open(f"{base}.round.tmp", "w", encoding="utf-8") as f:
                f.write(nonce)
            os.replace(f"{base}.round.tmp", f"{base}.round")
        step = found.step if found is not None else 0
        ctx._saves.restart_at(step)  # a save asked of the last round: this one starts saved
        ctx.resumed_from = step if found is not None else None
        ctx._restored = True
        if found is not None:
            self._emit(
                ev.Resumed(
                    from_step=step,
                    seq=found.seq,
                    save_kind=found.kind,
                    restore_s=time.perf_counter() - t0,
                    group_round=self._rounds,
                )
            )
        return {"seq": found.seq if found is not None else None, "step": step}


#: the coordinator-store counter of notices: each one asks the group for a checkpoint
NOTICES_KEY = "spotnb/notices"


class NoticeBoard:
    """A preemption notice on one instance asks the *group* for a checkpoint: rank 0 (wherever
    it runs) must write it, so the noticed agent counts the notice up in the coordinator's
    store and every agent's watcher, seeing the count grow, asks its context for a save at the
    next step boundary (`ctx.should_save()` turns true; rank 0's `ctx.backup` is the one that
    counts). The noticed instance leaves once a checkpoint newer than its notice is committed,
    or shortly before its deadline (`ScriptRunner`)."""

    def __init__(self, group: TorchrunGroup, ctx: Any) -> None:
        import threading

        self.group, self.ctx = group, ctx
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="spotnb-notices", daemon=True)

    def _client(self) -> Any:
        from torch.distributed import TCPStore

        host, port = self.group.endpoint.rsplit(":", 1)
        return TCPStore(host.strip("[]"), int(port), is_master=False, timeout=timedelta(seconds=5))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def post(self) -> bool:
        """Tell the group (False if the coordinator cannot be reached now)."""
        try:
            self._client().add(NOTICES_KEY, 1)
            return True
        except (RuntimeError, OSError):
            return False

    def _watch(self) -> None:
        from spotnb.core.protocol import SaveKind

        store, seen = None, None
        while not self._stop.wait(0.2):
            try:
                if store is None:
                    store, seen = self._client(), None
                count = int(store.add(NOTICES_KEY, 0))
            except (RuntimeError, OSError):  # the coordinator is (re)starting: a new count
                store = None
                continue
            if seen is not None and count > seen:
                self.ctx._request_save(SaveKind.INSURANCE)
            seen = count
