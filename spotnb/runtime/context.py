"""`ctx`, the object the user's function receives on the instance.

The per-step path (`ctx.steps`, `ctx.step`, `ctx.log`) does a clock read, two additions and
one comparison; everything else (saves, notices, the policy) happens only at the boundary the
policy asked for, or when the notice watcher moves that boundary to "now".
"""

from __future__ import annotations

import collections
import logging
import os
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from spotnb.core import protocol as ev
from spotnb.policy.base import PRIOR_MTTP, PRIOR_RESTART, Observation, Plan, Policy, SaveKind
from spotnb.runtime.beacon import Beacon, Phase
from spotnb.runtime.checkpoint.checkpointer import Checkpointer, emergency_skipped
from spotnb.runtime.checkpoint.incremental import frozen_tensors
from spotnb.runtime.checkpoint.sharded_state import apply_loaded, has_dtensors, load_template, save_state
from spotnb.runtime.group.elastic import Elastic, GroupOptimizer, ReplicatedOptimizer, Replication
from spotnb.runtime.group.local import Group
from spotnb.runtime.notice import Notice

if TYPE_CHECKING:
    # torch.distributed.checkpoint costs an instance as much start-up as torch itself (0.9 of
    # 3 CPU seconds): imported only by a job whose model holds DTensors (`_detect_sharded`)
    from spotnb.runtime.checkpoint.sharded import ShardedCheckpointer

__all__ = ["Context", "CheckpointMismatch", "Evacuate", "ctx"]

log = logging.getLogger(__name__)

_NEVER = 2**62
_SHARDED_ELASTIC = (
    "a sharded model (DTensor parameters, e.g. FSDP's fully_shard) trains on one instance's "
    "processes (procs_per_instance) only: set instances=1, or shard within the instance and "
    "replicate an unsharded model across instances"
)
#: the save kinds as the numbers rank 0 shares with its group (0: no save at this boundary)
_KIND_CODES = list(SaveKind)
_RESERVED = frozenset({"step", "t", "incarnation", "replica"})  # row keys spotnb fills in
#: the tracked entry holding a replicated job's sync mode, step and DiLoCo outer momentum
SYNC_KEY = "_spotnb_sync"


class CheckpointMismatch(RuntimeError):
    """The checkpoint being restored lacks state for a name the function tracks."""


#: seconds a replica keeps free before a notice's deadline when it finishes its window first
NOTICE_MARGIN_S = 3.0


class Evacuate(BaseException):
    """Raised out of the user's loop after an emergency checkpoint committed: leave cleanly.

    A BaseException so that a user's `except Exception` does not swallow it."""


class GroupFinished(BaseException):
    """Raised out of `ctx.steps` in a replica that joined a job on several instances when its
    peers had already trained the last step: it has nothing to train, and the user's code
    after the loop (which may read loop variables) must not run on it. The agent reports it
    done without a result (its peers return the job's)."""


def _sharded(tracked: dict[str, Any]) -> bool:
    """Whether a tracked model holds DTensors. A DTensor exists only once some code imported
    torch.distributed.tensor (FSDP2, the user's own import, an unpickled one): until then the
    answer is no, without importing it here, which would add a second to every instance's
    start (the import costs a third of torch's)."""
    return "torch.distributed.tensor" in sys.modules and has_dtensors(tracked)


def _rng_state() -> dict[str, Any]:
    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Context:
    """Step boundaries, metrics, tracked state and saves for one incarnation of a job."""

    def __init__(
        self,
        *,
        job_id: str,
        incarnation: int,
        checkpointer: Checkpointer,
        policy: Policy,
        emit: Any,
        flush: Any,
        beacon: Beacon,
        market: dict[str, float],
        save_every: int | None = None,
        high_water: int = 0,
        acknowledge: Any = None,
        checkpointed: bool = False,
        elastic: Elastic | None = None,
        group: Group | None = None,
    ) -> None:
        self.job_id = job_id
        self.incarnation = incarnation
        self.resumed_from: int | None = None
        self._group = group  # the instance's processes (Config.procs_per_instance > 1), or None
        if torch.cuda.is_available():
            self.device = torch.device("cuda", group.local_rank if group is not None else 0)
        else:
            self.device = torch.device("cpu")
        self.total: int | None = None
        self.state: dict[str, Any] = {}  # the user's own picklable extras, saved too
        self._tracked: dict[str, Any] = {}
        self._new: set[str] = set()  # tracked names a resumed checkpoint may lack (`track_new`)
        self._ckpt = checkpointer
        self._policy = policy
        self._emit, self._flush = emit, flush
        self._beacon = beacon
        self._slots = beacon.slots
        self._market = market  # mttp, restart, grace
        self._save_every = save_every
        self._high_water = high_water  # highest step any earlier incarnation reported
        self._checkpointed = checkpointed  # an earlier incarnation committed a checkpoint
        self._acknowledge = acknowledge
        self._step = 0
        self._restored = False
        self._ready_sent = False
        self._started = time.time()
        self._t_last = 0.0
        self._compute_s = self._recompute_s = self._save_s = 0.0
        self._timed_steps = 0
        self._plan: Plan | None = None
        self._next_save = _NEVER
        self._save_due: SaveKind | None = None  # low-level API: the user saves, we back up
        self._notice: Notice | None = None
        self._notice_handled = False
        self._move_again: Notice | None = None  # a move whose save failed: tried again later
        self._requested: SaveKind | None = None  # a save asked for from outside (rebalance hint)
        self._last_save_step = 0
        self._evacuating = False
        self._in_loop = False
        self.rows: collections.deque[dict[str, Any]] = collections.deque()
        self._elastic = elastic  # this job trains on several instances (None: one)
        self._rep: Replication | None = None
        self._replicated = False
        self._window_compute = 0.0  # compute seconds counted when the current window began
        self._group_owes = False  # rank 0 has yet to tell its group what it does on a notice
        self._sharded: ShardedCheckpointer | None = None  # the tracked model holds DTensors
        self._sharded_due: SaveKind | None = None  # the save every rank makes at this boundary
        if group is not None:
            group.deliver = self._shared_notice

    # -- public API ------------------------------------------------------------------------
    @property
    def step_index(self) -> int:
        """Steps completed so far (the index of the next step)."""
        return self._step

    @property
    def replica(self) -> int:
        """This replica's index in the current step's quorum (0 on a one-instance job)."""
        return self._rep.replica if self._rep is not None else 0

    @property
    def replicas(self) -> int:
        """How many replicas train the current step (1 on a one-instance job). It may change
        between steps: split each step's global batch by `replica` / `replicas`."""
        return self._rep.replicas if self._rep is not None else 1

    @property
    def local_rank(self) -> int:
        """This process's rank among the instance's processes (`Config.procs_per_instance`;
        0 with one process). Split each replica's share of the batch by `local_rank` /
        `local_world_size`: the group averages its gradients before they cross instances."""
        return self._group.local_rank if self._group is not None else 0

    @property
    def local_world_size(self) -> int:
        """How many processes of this instance train together (1 with one process)."""
        return self._group.local_world_size if self._group is not None else 1

    def replicate(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        """Data parallel over the job's live instances (`Config.instances`): returns the model
        and an optimizer whose `step()` averages the gradients over the step's quorum and
        applies them only when every member's all-reduce succeeded. On a one-instance job it
        returns both unchanged, so the same function runs either way. Call it once, before
        `ctx.track` and the loop."""
        if self._replicated:
            raise RuntimeError(
                "ctx.replicate() was already called: call it once, with the model and its optimizer"
            )
        if self._tracked or self._in_loop or self._restored:
            raise RuntimeError(
                "ctx.replicate(model, opt) must come before ctx.track(...) and the training loop: "
                "a replica that joins late receives the tracked state from a peer, so the group "
                "must exist before the state is registered"
            )
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"ctx.replicate(model, ...): expected a torch.nn.Module, got {type(model).__name__}"
            )
        if not isinstance(optimizer, torch.optim.Optimizer):
            got = type(optimizer).__name__
            raise TypeError(f"ctx.replicate(..., optimizer): expected a torch.optim.Optimizer, got {got}")
        if _sharded({"model": model}):
            if self._elastic is not None:
                raise RuntimeError(_SHARDED_ELASTIC)
            self._replicated = True  # FSDP already reduces the gradients over the group
            return model, optimizer
        self._replicated = True
        if self._group is not None:
            self._group.same_start(model)  # as DDP does: every rank from rank 0's weights
        if self._elastic is None:
            if self._group is None:
                return model, optimizer
            buffers = [b for b in model.buffers() if b.is_floating_point()]
            return model, GroupOptimizer(optimizer, self._group, buffers)
        self._rep = Replication(
            self._elastic, self.job_id, self._peer_state, self._load_peer_state, group=self._group
        )
        self._tracked[SYNC_KEY] = self._rep.sync  # checkpointed and sent to peers with the rest
        self._rep.buffers = [b for b in model.buffers() if b.is_floating_point()]
        return model, ReplicatedOptimizer(optimizer, self._rep)

    def _peer_state(self) -> dict[str, Any]:
        """What a recovering peer receives (the Manager adds the step)."""
        return {
            "objects": {name: obj.state_dict() for name, obj in self._tracked.items()},
            "user": self.state,
        }

    def _load_peer_state(self, state: dict[str, Any]) -> None:
        objects = state.get("objects", {})
        for name, obj in self._tracked.items():
            if name in objects:
                obj.load_state_dict(objects[name])
        self.state.update(state.get("user", {}))

    def track(self, **stateful: Any) -> None:
        """Register objects with `state_dict`/`load_state_dict` (model, optimizer, scheduler,
        GradScaler, a stateful data loader ...). They are saved at every checkpoint and
        restored, with the RNG states and the step, before the first step runs."""
        if self._in_loop or self._restored:
            raise RuntimeError(
                "ctx.track() must be called before ctx.restore() and the training "
                "loop, or the objects would start fresh while the step resumes"
            )
        for name, obj in stateful.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(
                    f"ctx.track({name}=...): {type(obj).__name__} has no state_dict()/"
                    "load_state_dict(); put plain values in ctx.state instead"
                )
            self._tracked[name] = obj

    def track_new(self, **stateful: Any) -> None:
        """`track`, for objects the checkpoint being resumed does not hold (an EMA model added
        before `spot.resume`): they start fresh. Without this, a checkpoint that lacks a tracked
        name refuses to restore: resuming a model under a new name would train it from scratch
        while the job says "resumed"."""
        self.track(**stateful)
        self._new |= set(stateful)

    def restore(self) -> int | None:
        """Load the newest verified checkpoint into the tracked objects (done for you at the
        first step). Returns the restored step, or None on a fresh start."""
        if self._restored:
            return self.resumed_from
        self._restored = True
        t0 = time.perf_counter()
        self._detect_sharded()
        if self._sharded is not None:
            return self._restore_sharded(t0)
        self._beacon.set_phase(Phase.RESTORE)
        try:
            found = self._ckpt.load_latest()
        finally:
            self._beacon.set_phase(Phase.IDLE)
        if found is None:
            self._nothing_restored()
            return None
        manifest, state = found
        objects = state.get("objects", {})
        self._check_names(manifest, int(state["step"]), objects)
        for name, obj in self._tracked.items():
            if name in objects:
                obj.load_state_dict(objects[name])
            elif name != SYNC_KEY:  # a checkpoint of a one-instance run has none: ddp goes on
                self._emit(
                    ev.JobWarning(
                        message=f"checkpoint {manifest.seq} has no state for "
                        f"tracked object {name!r}; it starts fresh (ctx.track_new)"
                    )
                )
        _set_rng_state(state["rng"])
        self.state.update(state.get("user", {}))
        self._ckpt.adopt(self._full_state(), frozen_tensors(self._tracked.values()))  # not rehashed
        return self._resumed(int(state["step"]), manifest, t0)

    def _check_names(self, manifest: Any, step: int, objects: dict[str, Any]) -> None:
        """Refuse to restore a checkpoint that lacks a name this function tracks (unless it was
        tracked with `track_new`): the function was changed, and its model would start from
        scratch under a job that says it resumed. Names only the checkpoint holds are left
        behind with a warning."""
        held = sorted(k for k in objects if k != SYNC_KEY)
        tracked = sorted(k for k in self._tracked if k != SYNC_KEY)
        missing = [k for k in tracked if k not in objects and k not in self._new]
        if missing:
            raise CheckpointMismatch(
                f"checkpoint {manifest.seq} (step {step}) holds {held} but this function tracks "
                f"{tracked}: {missing} would start from scratch while the job resumes at step "
                f"{step}. Track the same names as the run that saved it (ctx.track(...)), or, "
                f"to start {missing} fresh on purpose, register them with ctx.track_new(...)"
            )
        left = [k for k in held if k not in self._tracked]
        if left:
            self._emit(
                ev.JobWarning(
                    message=f"checkpoint {manifest.seq} also holds {left}, which this function "
                    "does not track: that state is left behind"
                )
            )

    def _resumed(self, step: int, manifest: Any, t0: float) -> int:
        """The job goes on from `step` of `manifest` (restored since `t0`): say so."""
        self._step = self._last_save_step = step
        self.resumed_from = step
        self._emit(
            ev.Resumed(
                from_step=step, seq=manifest.seq, save_kind=manifest.kind, restore_s=time.perf_counter() - t0
            )
        )
        return step

    def _nothing_restored(self) -> None:
        if self._high_water > 0 and self._checkpointed:
            # an earlier incarnation got this far, yet nothing restores: say so, loudly
            self._emit(
                ev.JobWarning(
                    message=f"no checkpoint could be restored although an earlier instance reached "
                    f"step {self._high_water}: every checkpoint is missing or failed verification, "
                    "so training restarts from step 0",
                    restart_from_zero=True,
                    high_water=self._high_water,
                )
            )

    def _detect_sharded(self) -> None:
        """A tracked model with DTensor parameters (FSDP2 inside the instance's group) is
        saved and restored by every rank in DCP's format (`runtime/sharded_state.py`)."""
        if self._sharded is not None or not _sharded(self._tracked):
            return
        if self._elastic is not None:
            raise RuntimeError(_SHARDED_ELASTIC)
        from spotnb.runtime.checkpoint.sharded import ShardedCheckpointer

        self._sharded = ShardedCheckpointer(self._ckpt)

    def _rank(self) -> int:
        return self._sharded.rank if self._sharded is not None else 0

    def _restore_sharded(self, t0: float) -> int | None:
        """Every rank loads the newest sharded checkpoint that verifies on all of them,
        resharded to this group's layout."""
        assert self._sharded is not None
        rank = self._rank()
        self._beacon.set_phase(Phase.RESTORE)
        try:
            found = self._sharded.load_with(lambda keys: load_template(self._tracked, keys, rank))
        finally:
            self._beacon.set_phase(Phase.IDLE)
        if found is None:
            self._nothing_restored()
            return None
        manifest, loaded = found
        shared, rng = apply_loaded(self._tracked, loaded, rank)
        if rng is not None:
            _set_rng_state(rng)
        else:
            log.warning(
                "checkpoint %d was written by fewer processes: rank %d keeps a fresh RNG", manifest.seq, rank
            )
        self.state.update(shared.get("user", {}))
        return self._resumed(int(shared["step"]), manifest, t0)

    def steps(self, n: int) -> Iterator[int]:
        """Yield step indices from the restored step up to `n`, marking each boundary. On a
        job with several instances a step is yielded again if the group could not commit it
        (a member died mid-step): its global batch is applied exactly once."""
        self._begin_loop(n)
        if self._rep is not None:
            yield from self._replicated_steps(n)
            return
        step = self._step
        while step < n:
            yield step
            self._end_step()
            step = self._step
        self._in_loop = False
        self.wait_saves()

    def wait_saves(self) -> None:
        """Wait until a sharded save still uploading in the background has committed (or
        failed): the job's last checkpoint is in before its result (the agent calls this too,
        for a function that leaves its loop early)."""
        if self._sharded is not None:
            self._sharded.wait()

    def _replicated_steps(self, n: int) -> Iterator[int]:
        rep = self._rep
        assert rep is not None
        first = True
        while True:
            if not rep.window_open:  # ddp: every step; local SGD / DiLoCo: every window
                changed = rep.begin_step(first=first)
                if first:
                    self._first_quorum(changed)
                if changed is not None:
                    self._emit(ev.Quorum(**changed))
                if first:
                    first = False
                    if rep.step >= n and self._elastic_join():
                        self._in_loop = False
                        rep.leave()
                        raise GroupFinished()
                self._step = rep.step
                self._window_compute = self._compute_s
            if self._step >= n:
                break
            self._slots[0] = self._step
            yield self._step
            self._end_replicated_step(rep.end_step(last=self._step + 1 >= n))
        self._step = rep.step
        self._in_loop = False
        rep.leave()

    def _end_replicated_step(self, outcome: bool | None) -> None:
        """`outcome`: None, a step inside a window (it counts locally; saves wait for the
        window's end, a notice too unless the window cannot end before the deadline); True,
        the step or window committed; False, the group redoes it (a window's time so far is
        recompute)."""
        rep = self._rep
        assert rep is not None
        if outcome is None:
            self._end_step(boundary=self._must_leave_mid_window())
            return
        if outcome is False and rep.windowed:
            lost = self._compute_s - self._window_compute
            self._compute_s -= lost
            self._recompute_s += lost
        if outcome and rep.windowed:
            self._end_step(committed=True, boundary=False)  # the window's last step
            self._step = rep.step
            self._slots[0] = self._step
            if self._step >= self._next_save:
                self._boundary()
        else:
            self._end_step(committed=outcome)
        if outcome and rep.switched is not None and rep.replica == 0:
            self._emit(ev.SyncChanged(**rep.switched))

    def _must_leave_mid_window(self) -> bool:
        """A notice inside a window: stay to its end (no failed window) when it ends before the
        deadline with room to spare, else leave now (the peers redo the window)."""
        rep = self._rep
        notice = self._notice
        if rep is None or notice is None or self._notice_handled:
            return False
        step_time = (self._compute_s + self._recompute_s) / max(1, self._timed_steps)
        need = (rep.sync.every - rep.local) * step_time + rep.last_comm + NOTICE_MARGIN_S
        return need >= notice.deadline - time.time()

    def _first_quorum(self, changed: dict[str, Any] | None) -> None:
        """After the first quorum: a replica that came to join live peers but found none ahead
        of the store (they died meanwhile) restores from the store like a cold start; then it
        is ready."""
        rep = self._rep
        assert rep is not None
        healed = bool(changed and changed.get("healed"))
        if not healed and not self._restored:
            self.restore()
            if self._step > rep.step:
                rep.set_step(self._step)
        self._restored = True
        self._step = rep.step
        self._last_save_step = max(self._last_save_step, self._step)
        self._ready_sent = True
        self._emit(ev.Ready(prep_s=time.time() - self._started, step=self._step, total=self.total))
        self._replan()
        self._t_last = time.perf_counter()

    @contextmanager
    def step(self) -> Iterator[int]:
        """One step, for loops spotnb does not drive (`with ctx.step(): ...`)."""
        if not self._in_loop:
            self._begin_loop(None)
        if self._evacuating:
            raise Evacuate()
        yield self._step
        self._end_step()

    def log(self, **metrics: Any) -> None:
        """Record metrics for the current step; they reach the notebook within about a second.

        Values are numbers (Python, numpy or one-element tensors). `step`, `t`, `incarnation`
        and `replica` are recorded for you and refused as metric names: a metric of that name
        would silently replace the step or the time of every row. A value JSON cannot carry
        (NaN, an infinity, a number beyond float range) arrives as a gap plus one warning per
        metric naming the step, never as an error in the notebook."""
        if not _RESERVED.isdisjoint(metrics):
            bad = sorted(_RESERVED.intersection(metrics))
            raise ValueError(
                f"ctx.log({bad[0]}=...): {', '.join(map(repr, bad))} "
                f"{'is' if len(bad) == 1 else 'are'} recorded with every row for you; "
                f"name the metric differently, e.g. ctx.log(my_{bad[0]}=...)"
            )
        if self._group is not None and self._group.local_rank != 0:
            return  # rank 0 logs for the group (every rank holds the same model)
        metrics["step"] = self._step
        metrics["t"] = time.time()
        if self._rep is not None:
            metrics["replica"] = self._rep.replica
        self.rows.append(metrics)

    def should_save(self) -> bool:
        """True when the policy wants a save now (insurance, periodic or emergency) and no
        state is tracked, i.e. the script writes its own checkpoint files and calls backup()."""
        return self._save_due is not None

    def save(self, kind: str = "manual", wait: bool = False) -> None:
        """Checkpoint the tracked state now (uploaded in the background unless `wait`)."""
        self._save(SaveKind(kind), wait=wait)

    def backup(self, *paths: str, wait: bool | None = None) -> None:
        """Upload files or whole folders the script wrote (with the step and RNG state) as one
        checkpoint; on restore they are put back at the same paths, and a folder is made what
        it was (files written into it after the checkpoint go). Files an earlier checkpoint
        already holds are not uploaded again. Waits for the upload after a notice."""
        kind = self._save_due or SaveKind.MANUAL
        if self._in_loop:  # since the last step ended, the script was writing its checkpoint
            self._save_s += time.perf_counter() - self._t_last
        files, dirs = _backup_files(paths)
        self._save(kind, files=files, dirs=dirs, wait=bool(wait) or kind == SaveKind.EMERGENCY)
        if kind == SaveKind.EMERGENCY:
            self._evacuate_after_save()
        self._save_due = None

    @property
    def notice(self) -> Notice | None:
        """The pending preemption notice, if any."""
        return self._notice

    # -- loops spotnb does not drive (framework integrations) ------------------------------
    #: metric names `log` refuses (spotnb fills them in); drop them from a framework's logs
    RESERVED_METRICS: frozenset[str] = _RESERVED

    def external_loop(self, total: int | None = None) -> None:
        """Start a training loop that a framework drives (a Trainer's callbacks), not
        `ctx.steps`: restores the newest checkpoint if `restore()` was not called, says the job
        is ready and plans the first save. `total` is the number of steps if known. Then call
        `step_done()` after every optimizer step, and save when `should_save()` says so."""
        self._begin_loop(total)

    def step_done(self) -> None:
        """One step of an `external_loop` finished: the step index moves on, and at the
        boundary the policy or a notice asked for, `should_save()` turns true (the framework
        writes its checkpoint and hands it to `backup`, which leaves after a notice)."""
        if not self._in_loop:
            raise RuntimeError("ctx.step_done() outside a loop: call ctx.external_loop(total) first")
        self._end_step()

    def warn(self, message: str) -> None:
        """Tell the notebook something the user must know (a warning event, shown at once),
        e.g. that an integration cannot resume exactly."""
        self._emit(ev.JobWarning(message=message))

    # -- step boundaries -------------------------------------------------------------------
    def _begin_loop(self, total: int | None) -> None:
        if total is not None:
            self.total = total
        self._detect_sharded()
        if self._group is not None and not self._replicated and self._sharded is None:
            raise RuntimeError(
                f"this job runs {self._group.local_world_size} processes per instance: call "
                "model, opt = ctx.replicate(model, opt) before ctx.track(...) and the loop, so "
                "they train one model together (or set procs_per_instance=1)"
            )
        if self._elastic is not None and self._rep is None:
            raise RuntimeError(
                f"this job runs on {self._elastic.instances} instances: call "
                "model, opt = ctx.replicate(model, opt) before ctx.track(...) and the loop, so "
                "the instances train one model together (or set instances=1)"
            )
        if self._rep is not None:
            # a cold start restores from the store now; a replica joining live peers waits for
            # its first quorum, which brings the live state (ready is said after it)
            if not self._elastic_join() and not self._restored:
                self.restore()
                self._rep.set_step(self._step)
                self._restored = True
            self._in_loop = True
            return
        if not self._restored:
            self.restore()
            if self._group is not None:
                self._group.check_step(self._step)
        self._in_loop = True
        if not self._ready_sent:
            self._ready_sent = True
            self._emit(ev.Ready(prep_s=time.time() - self._started, step=self._step, total=self.total))
        self._replan()
        self._t_last = time.perf_counter()

    def _elastic_join(self) -> bool:
        return bool(self._elastic is not None and self._elastic.join)

    def _end_step(self, committed: bool = True, boundary: bool = True) -> None:
        now = time.perf_counter()
        dt = now - self._t_last
        self._t_last = now
        if not committed:  # the group redoes this step: its time was lost
            self._recompute_s += dt
            self._timed_steps += 1
            return
        self._step += 1
        self._slots[0] = self._step
        if self._step > self._high_water:
            self._compute_s += dt
        else:
            self._recompute_s += dt
        self._timed_steps += 1
        if self._sharded is not None and self._group is not None:
            self._share_decision()
        if boundary and self._step >= self._next_save:
            self._boundary()

    def _share_decision(self) -> None:
        """A sharded job: every rank takes part in each save, so rank 0 (whose policy and
        notices decide) tells the group at every step boundary whether this one saves, and
        what kind, together with a pending notice (one small all-reduce; FSDP's own
        collectives carry no word of ours)."""
        group = self._group
        assert group is not None
        kind: SaveKind | None = None
        if group.local_rank == 0:
            if self._move_again is not None and self._notice is None and self._plan_due():
                group.pending, self._move_again = self._move_again, None
            if self._requested is not None:
                kind, self._requested = self._requested, None
            elif self._plan_due():
                assert self._plan is not None
                kind = self._plan.kind
        code = group.decide(_KIND_CODES.index(kind) + 1 if kind is not None else 0)
        self._sharded_due = _KIND_CODES[code - 1] if code else None
        if self._sharded_due is not None:
            self._next_save = 0

    def _sharded_boundary(self) -> None:
        if self._notice is not None and not self._notice_handled:
            self._notice_handled = True
            self._sharded_notice()
        if self._group is None:  # one process holding DTensors: its own policy decides
            if self._requested is not None:
                self._sharded_due, self._requested = self._requested, None
            elif self._plan_due():
                assert self._plan is not None
                self._sharded_due = self._plan.kind
        if self._sharded_due is not None:
            kind, self._sharded_due = self._sharded_due, None
            self._save_sharded(kind)
        self._arm()

    def _sharded_notice(self) -> None:
        """Rank 0 decides whether to take the emergency save; the group learns the decision
        at this boundary and, if so, saves with it and leaves once it committed."""
        notice = self._notice
        assert notice is not None
        rank0 = self._rank() == 0
        moving = notice.source == "move"
        kind = SaveKind.MOVE if moving else SaveKind.EMERGENCY
        save = True
        if rank0:
            left = notice.deadline - time.time()
            if not moving and not self._policy.on_notice(self._observation(), left):
                self._emit(emergency_skipped(self._observation(), self._step, left))
                save = False
            else:
                self._emit(ev.Evacuating(step=self._step, time_left=left))
        if self._group is not None:
            save = self._group.agree(save)
        if not save:
            return
        if self._save_sharded(kind) is not None:
            self._evacuate_after_save()
        if rank0 and moving:  # not committed: try the move again at the next planned save
            if self._notice is notice:
                self._notice = None
            self._notice_handled = False
            self._move_again = notice

    def _save_sharded(self, kind: SaveKind) -> Any:
        """Every rank saves its shard: a save the job leaves after (emergency, move) waits
        for the commit and returns the manifest (or None); the others only stall for the copy
        to host RAM and upload in the background (`ShardedCheckpointer.save_async`)."""
        assert self._sharded is not None
        t0 = time.perf_counter()
        rank = self._rank()
        state = save_state(self._tracked, {"step": self._step, "user": self.state}, _rng_state(), rank)
        manifest: Any
        if kind in (SaveKind.EMERGENCY, SaveKind.MOVE):
            manifest = self._sharded.save(state, self._step, kind)
        else:
            manifest = self._sharded.save_async(state, self._step, kind)
        self._last_save_step = self._step
        self._replan()
        self._save_s += time.perf_counter() - t0
        self._t_last = time.perf_counter()  # the save is not step time
        return manifest

    def _boundary(self) -> None:
        if self._sharded is not None:
            return self._sharded_boundary()
        if self._move_again is not None and self._notice is None and self._plan_due():
            if self._group is not None:  # the group learns it with the next all-reduce
                self._group.pending, self._move_again = self._move_again, None
            else:
                self._notice, self._move_again = self._move_again, None  # at a planned save
        if self._notice is not None and not self._notice_handled:
            self._notice_handled = True
            self._on_notice_at_boundary()
        if self._requested is not None:
            kind, self._requested = self._requested, None
            if self._tracked or self.state:
                self._save(kind)
            else:
                self._due(kind)
        if self._plan is not None and self._step >= self._plan.step:
            if self._tracked or self.state:
                self._save(self._plan.kind)
            else:
                self._due(self._plan.kind)
                self._last_save_step = self._step
                self._replan()
        self._arm()

    def _plan_due(self) -> bool:
        return self._plan is not None and self._step >= self._plan.step

    def _due(self, kind: SaveKind) -> None:
        """Low-level API: ask the script for a save (an emergency request is never downgraded)."""
        if self._save_due != SaveKind.EMERGENCY:
            self._save_due = kind

    def _arm(self) -> None:
        """Set the next boundary at which `_end_step` leaves its fast path. The watcher thread
        may set a notice at any moment; re-checking after the write means it is never lost
        (the watcher writes `_notice` before it zeroes `_next_save`)."""
        self._next_save = self._plan.step if self._plan else _NEVER
        if (self._notice is not None and not self._notice_handled) or self._requested is not None:
            self._next_save = 0

    def _on_notice_at_boundary(self) -> None:
        group = self._group
        if group is None:
            return self._handle_notice()
        if group.local_rank != 0:  # the group does what rank 0 decided at this same step
            if group.agree(False):
                if self._rep is not None:
                    self._rep.leave()
                self._evacuating = True
                raise Evacuate()
            return None
        self._group_owes = True
        self._handle_notice()  # raises Evacuate when it leaves (having told the group)
        self._answer_group(False)
        return None

    def _answer_group(self, leave: bool) -> None:
        """Rank 0: tell the group, once per notice, whether it leaves now."""
        if self._group is not None and self._group_owes:
            self._group_owes = False
            self._group.agree(leave)

    def _handle_notice(self) -> None:
        notice = self._notice
        assert notice is not None
        left = notice.deadline - time.time()
        if self._rep is not None and self._rep.replicas > 1:
            # peers train on: this replica's step is committed, so it leaves the quorum
            # cleanly (no failed step, nothing to save) and a replacement heals from a peer
            self._emit(ev.Evacuating(step=self._step, time_left=left))
            self._rep.leave()
            self._evacuate_after_save()
        obs = self._observation()
        if self._tracked or self.state:  # sized by what it would write: the delta since the last save
            pending = self._ckpt.pending_bytes(self._full_state(), frozen_tensors(self._tracked.values()))
            obs = obs.with_(save_bytes=pending[0])
        moving = notice.source == "move"  # asked to move: no market deadline, always save
        kind = SaveKind.MOVE if moving else SaveKind.EMERGENCY
        if not moving and not self._policy.on_notice(obs, left):
            self._emit(emergency_skipped(obs, self._step, left))
            return
        self._emit(ev.Evacuating(step=self._step, time_left=left))
        if self._tracked or self.state:
            try:
                self._save(kind, wait=True)
            except Exception as exc:  # noqa: BLE001 - the store failed; keep training until killed
                self._emit(ev.CheckpointFailed(step=self._step, save_kind=kind, error=repr(exc)))
                if moving:
                    # nothing preempts this instance and its new one waits: try the move again
                    # at the next planned save; until then a real notice (or SIGTERM) must
                    # still be heard, so the move's notice is no longer pending
                    if self._notice is notice:  # (a real one that came meanwhile stays)
                        self._notice = None
                    self._notice_handled = False
                    self._move_again = notice
                    self._arm()
                return
            self._evacuate_after_save()
        else:
            self._due(SaveKind.EMERGENCY)  # the script saves; backup() then evacuates

    def _evacuate_after_save(self) -> None:
        self._answer_group(True)
        self._evacuating = True
        self._emit(ev.Evacuated(step=self._step))
        self._flush()
        if self._acknowledge:
            self._acknowledge()
        raise Evacuate()

    def _save(
        self,
        kind: SaveKind,
        wait: bool = False,
        files: list[tuple[str, str]] | None = None,
        dirs: dict[str, str] | None = None,
    ) -> None:
        if self._sharded is not None:
            if files:
                raise ValueError("ctx.backup(...) of files is not supported with a sharded model")
            self._save_sharded(kind)
            return
        if (self._rep is not None and self._rep.replica != 0) or (
            self._group is not None and self._group.local_rank != 0
        ):
            # one replica writes the store's checkpoints (all hold the same state); the others
            # keep the same plan, so whoever is replica 0 next saves on time
            self._last_save_step = self._step
            self._replan()
            return
        t0 = time.perf_counter()
        frozen = frozen_tensors(self._tracked.values())  # referenced while unchanged
        snap = self._ckpt.snapshot(
            self._full_state(), self._step, kind, files, dirs, frozen, self._optimizers()
        )
        self._last_save_step = self._step
        self._replan()  # before the hand-off: once the writer thread runs, it competes for the GIL
        if wait:
            self._ckpt.save_now(snap)
        else:
            self._ckpt.submit(snap)
        self._save_s += time.perf_counter() - t0
        self._t_last = time.perf_counter()  # the save is not step time

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        """The tracked optimizers whose `step()` writes their tensors (a wrapper's inner one):
        what a snapshot gates instead of copying their parameters and state."""
        out = []
        for obj in self._tracked.values():
            while isinstance(getattr(obj, "optim", None), torch.optim.Optimizer):
                obj = obj.optim
            if isinstance(obj, torch.optim.Optimizer):
                out.append(obj)
        return out

    def _full_state(self) -> dict[str, Any]:
        return {
            "step": self._step,
            "rng": _rng_state(),
            "user": self.state,
            "objects": {name: obj.state_dict() for name, obj in self._tracked.items()},
        }

    def _replan(self) -> None:
        self._plan = self._policy.next_save(self._observation(), self._last_save_step)
        self._arm()

    def _observation(self) -> Observation:
        steps = self._timed_steps
        return Observation(
            step=self._step,
            step_time=(self._compute_s + self._recompute_s) / steps if steps else 0.0,
            snapshot_time=self._ckpt.snapshot_ema,
            upload_time=self._ckpt.upload_ema,
            mttp=self._market.get("mttp", PRIOR_MTTP),
            restart_time=self._market.get("restart", PRIOR_RESTART),
            grace=self._market.get("grace", 30.0),
            save_every=self._save_every,
            total_steps=self.total,
            snapshot_sd=self._ckpt.snapshot_var**0.5,
            upload_sd=self._ckpt.upload_var**0.5,
            state_bytes=self._ckpt.last_bytes or self._state_bytes(),
            save_bytes=self._ckpt.last_written,
            upload_bps=self._ckpt.bandwidth,
            age=time.time() - self._started,
            now=time.time(),
        )

    def _state_bytes(self) -> int:
        total = 0
        for obj in self._tracked.values():
            for v in _tensors(obj.state_dict()):
                total += v.element_size() * v.nelement()
        return total

    # -- called from other threads ---------------------------------------------------------
    def _receive_notice(self, notice: Notice) -> None:
        """Watcher thread: move the next boundary to now. In a group of processes the notice
        waits for the next gradient all-reduce, which shares it (`Group.average`), so that
        every rank handles it at the same step."""
        if self._group is not None:
            self._group.pending = notice
            return
        self._set_notice(notice)

    def _shared_notice(self, notice: Notice) -> None:
        """The group learnt of a notice in this step's all-reduce: every rank handles it at
        this boundary, also one after an earlier notice (each must answer rank 0's word)."""
        self._notice_handled = False
        self._set_notice(notice)

    def _set_notice(self, notice: Notice) -> None:
        self._notice = notice
        self._next_save = 0

    def _request_save(self, kind: SaveKind = SaveKind.INSURANCE) -> None:
        """Any thread: save at the next step boundary (e.g. on a rebalance recommendation,
        when the risk of a preemption rises but no deadline is known yet)."""
        self._requested = kind
        self._next_save = 0

    def progress(self) -> dict[str, Any]:
        steps = self._timed_steps
        return {
            "step": self._step,
            "total": self.total,
            "steps_done": steps,
            "compute_s": self._compute_s,
            "recompute_s": self._recompute_s,
            "save_s": self._save_s,
            "step_time": (self._compute_s + self._recompute_s) / steps if steps else None,
        }


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _backup_files(paths: tuple[str, ...]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """`ctx.backup`'s paths as (file, manifest name) pairs, a folder's files (recursively, in
    a stable order; symbolic links to folders are not followed) under one name prefix, and
    {prefix: folder} for the folders. A path that does not exist is a clear error."""
    files: list[tuple[str, str]] = []
    dirs: dict[str, str] = {}
    for i, path in enumerate(paths):
        prefix = f"files/{i}-{os.path.basename(os.path.normpath(path)) or 'root'}"
        if os.path.isdir(path):
            dirs[prefix] = path
            for top, subdirs, names in os.walk(path):
                subdirs.sort()
                for name in sorted(names):
                    full = os.path.join(top, name)
                    if os.path.isfile(full):  # named by number: any file name is a safe one
                        files.append((full, f"{prefix}/{len(files):06d}"))
        elif os.path.isfile(path):
            files.append((path, prefix))
        else:
            raise FileNotFoundError(f"ctx.backup({path!r}): no such file or folder (cwd {os.getcwd()})")
    return files, dirs


_current: Context | None = None  # the Context of the function this process runs (set by the agent)


def _set_current(context: Context | None) -> None:
    global _current
    _current = context


def ctx() -> Context:
    """The Context of the job this process runs: the object the function received, for code
    deep inside it that was not handed `ctx` (`spotnb.ctx()` calls this where a function runs,
    and returns a `ScriptContext` in a script). Raises SpotnbError outside a job."""
    if _current is None:
        from spotnb.errors import SpotnbError
        from spotnb.runtime.script.client import _OUTSIDE

        raise SpotnbError(_OUTSIDE)
    return _current
