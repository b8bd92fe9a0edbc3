"""`ctx`, the object the user's function receives on the instance.

The per-step path (`ctx.steps`, `ctx.step`, `ctx.log`) does a clock read, two additions and
one comparison; everything else (saves, notices, the policy) happens only at the boundary the
policy asked for, or when the notice watcher moves that boundary to "now".

`Context` is the surface the user calls; it holds two collaborators: the save scheduler
(`runtime/save_scheduler.py`: the step clock, the policy's plan, notices, evacuation) and the
group side (`runtime/group/peers.py`: the processes and instances it trains with). Restoring
the newest checkpoint into the tracked objects is its own.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from spotnb.core import protocol as ev
from spotnb.policy.base import Policy, SaveKind
from spotnb.runtime.beacon import Beacon, Phase
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.checkpoint.sharded_state import apply_loaded, load_template
from spotnb.runtime.group.elastic import Elastic
from spotnb.runtime.group.local import Group
from spotnb.runtime.group.peers import SHARDED_ELASTIC, SYNC_KEY, GroupFinished, Peers, holds_dtensors
from spotnb.runtime.notice import Notice
from spotnb.runtime.save_scheduler import Evacuate, SaveScheduler, StepClock, Tracked, set_rng_state

__all__ = ["Context", "CheckpointMismatch", "Evacuate", "GroupFinished", "ctx", "set_current", "backup_files"]

log = logging.getLogger(__name__)

_RESERVED = frozenset({"step", "t", "incarnation", "replica"})  # row keys spotnb fills in


class CheckpointMismatch(RuntimeError):
    """The checkpoint being restored lacks state for a name the function tracks."""


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
        if torch.cuda.is_available():
            self.device = torch.device("cuda", group.local_rank if group is not None else 0)
        else:
            self.device = torch.device("cpu")
        self._tracked = Tracked()  # the objects `track` registered and `state`, saved together
        self._ckpt = checkpointer
        self._emit = emit
        self._beacon = beacon
        self._high_water = high_water  # highest step any earlier incarnation reported
        self._checkpointed = checkpointed  # an earlier incarnation committed a checkpoint
        self._restored = False
        self._ready_sent = False
        self._started = time.time()
        self.rows: collections.deque[dict[str, Any]] = collections.deque()
        self._clock = StepClock(beacon.slots, high_water, self._started)
        self._peers = Peers(job_id=job_id, tracked=self._tracked, emit=emit, elastic=elastic, group=group)
        self._saves = SaveScheduler(
            checkpointer=checkpointer,
            policy=policy,
            emit=emit,
            flush=flush,
            clock=self._clock,
            tracked=self._tracked,
            peers=self._peers,
            market=market,
            save_every=save_every,
            acknowledge=acknowledge,
        )

    # -- public API ------------------------------------------------------------------------
    @property
    def state(self) -> dict[str, Any]:
        """The user's own picklable extras, saved with every checkpoint and restored."""
        return self._tracked.user

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        self._tracked.user = value

    @property
    def total(self) -> int | None:
        """The number of steps of the loop, if known (`ctx.steps(n)`, `external_loop(total)`)."""
        return self._clock.total

    @total.setter
    def total(self, value: int | None) -> None:
        self._clock.total = value

    @property
    def step_index(self) -> int:
        """Steps completed so far (the index of the next step)."""
        return self._clock.step

    @property
    def replica(self) -> int:
        """This replica's index in the current step's quorum (0 on a one-instance job)."""
        return self._peers.replica

    @property
    def replicas(self) -> int:
        """How many replicas train the current step (1 on a one-instance job). It may change
        between steps: split each step's global batch by `replica` / `replicas`."""
        return self._peers.replicas

    @property
    def local_rank(self) -> int:
        """This process's rank among the instance's processes (`Config.procs_per_instance`;
        0 with one process). Split each replica's share of the batch by `local_rank` /
        `local_world_size`: the group averages its gradients before they cross instances."""
        return self._peers.local_rank

    @property
    def local_world_size(self) -> int:
        """How many processes of this instance train together (1 with one process)."""
        return self._peers.local_world_size

    def replicate(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        """Data parallel over the job's live instances (`Config.instances`): returns the model
        and an optimizer whose `step()` averages the gradients over the step's quorum and
        applies them only when every member's all-reduce succeeded. On a one-instance job it
        returns both unchanged, so the same function runs either way. Call it once, before
        `ctx.track` and the loop."""
        if self._peers.replicated:
            raise RuntimeError(
                "ctx.replicate() was already called: call it once, with the model and its optimizer"
            )
        if self._tracked.objects or self._clock.in_loop or self._restored:
            raise RuntimeError(
                "ctx.replicate(model, opt) must come before ctx.track(...) and the training loop: "
                "a replica that joins late receives the tracked state from a peer, so the group "
                "must exist before the state is registered"
            )
        return self._peers.replicate(model, optimizer)

    def track(self, **stateful: Any) -> None:
        """Register objects with `state_dict`/`load_state_dict` (model, optimizer, scheduler,
        GradScaler, a stateful data loader ...). They are saved at every checkpoint and
        restored, with the RNG states and the step, before the first step runs."""
        if self._clock.in_loop or self._restored:
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
            self._tracked.objects[name] = obj

    def track_new(self, **stateful: Any) -> None:
        """`track`, for objects the checkpoint being resumed does not hold (an EMA model added
        before `spot.resume`): they start fresh. Without this, a checkpoint that lacks a tracked
        name refuses to restore: resuming a model under a new name would train it from scratch
        while the job says "resumed"."""
        self.track(**stateful)
        self._tracked.new |= set(stateful)

    def restore(self) -> int | None:
        """Load the newest verified checkpoint into the tracked objects (done for you at the
        first step). Returns the restored step, or None on a fresh start."""
        if self._restored:
            return self.resumed_from
        self._restored = True
        t0 = time.perf_counter()
        self._detect_sharded()
        if self._saves.sharded is not None:
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
        for name, obj in self._tracked.objects.items():
            if name in objects:
                obj.load_state_dict(objects[name])
            elif name != SYNC_KEY:  # a checkpoint of a one-instance run has none: ddp goes on
                self._emit(
                    ev.JobWarning(
                        message=f"checkpoint {manifest.seq} has no state for "
                        f"tracked object {name!r}; it starts fresh (ctx.track_new)"
                    )
                )
        set_rng_state(state["rng"])
        self.state.update(state.get("user", {}))
        self._ckpt.adopt(self._tracked.full_state(self._clock.step), self._tracked.frozen())  # not rehashed
        return self._resumed(int(state["step"]), manifest, t0)

    def _check_names(self, manifest: Any, step: int, objects: dict[str, Any]) -> None:
        """Refuse to restore a checkpoint that lacks a name this function tracks (unless it was
        tracked with `track_new`): the function was changed, and its model would start from
        scratch under a job that says it resumed. Names only the checkpoint holds are left
        behind with a warning."""
        held = sorted(k for k in objects if k != SYNC_KEY)
        tracked = sorted(k for k in self._tracked.objects if k != SYNC_KEY)
        missing = [k for k in tracked if k not in objects and k not in self._tracked.new]
        if missing:
            raise CheckpointMismatch(
                f"checkpoint {manifest.seq} (step {step}) holds {held} but this function tracks "
                f"{tracked}: {missing} would start from scratch while the job resumes at step "
                f"{step}. Track the same names as the run that saved it (ctx.track(...)), or, "
                f"to start {missing} fresh on purpose, register them with ctx.track_new(...)"
            )
        left = [k for k in held if k not in self._tracked.objects]
        if left:
            self._emit(
                ev.JobWarning(
                    message=f"checkpoint {manifest.seq} also holds {left}, which this function "
                    "does not track: that state is left behind"
                )
            )

    def _resumed(self, step: int, manifest: Any, t0: float) -> int:
        """The job goes on from `step` of `manifest` (restored since `t0`): say so."""
        self._clock.step = self._saves.last_save_step = step
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
        saved and restored by every rank in DCP's format (`runtime/checkpoint/sharded_state.py`)."""
        if self._saves.sharded is not None or not holds_dtensors(self._tracked.objects):
            return
        if self._peers.elastic is not None:
            raise RuntimeError(SHARDED_ELASTIC)
        from spotnb.runtime.checkpoint.sharded import ShardedCheckpointer

        self._saves.sharded = ShardedCheckpointer(self._ckpt)

    def _restore_sharded(self, t0: float) -> int | None:
        """Every rank loads the newest sharded checkpoint that verifies on all of them,
        resharded to this group's layout."""
        sharded = self._saves.sharded
        assert sharded is not None
        rank = self._saves.rank
        self._beacon.set_phase(Phase.RESTORE)
        try:
            found = sharded.load_with(lambda keys: load_template(self._tracked.objects, keys, rank))
        finally:
            self._beacon.set_phase(Phase.IDLE)
        if found is None:
            self._nothing_restored()
            return None
        manifest, loaded = found
        shared, rng = apply_loaded(self._tracked.objects, loaded, rank)
        if rng is not None:
            set_rng_state(rng)
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
        if self._peers.rep is not None:
            yield from self._peers.steps(n, self._saves, self._first_quorum)
            return
        clock = self._clock
        step = clock.step
        while step < n:
            yield step
            self._end_step()
            step = clock.step
        clock.in_loop = False
        self.wait_saves()

    def wait_saves(self) -> None:
        """Wait until a sharded save still uploading in the background has committed (or
        failed): the job's last checkpoint is in before its result (the agent calls this too,
        for a function that leaves its loop early)."""
        if self._saves.sharded is not None:
            self._saves.sharded.wait()

    def _first_quorum(self, changed: dict[str, Any] | None) -> None:
        """After the first quorum: a replica that came to join live peers but found none ahead
        of the store (they died meanwhile) restores from the store like a cold start; then it
        is ready."""
        rep = self._peers.rep
        assert rep is not None
        clock = self._clock
        healed = bool(changed and changed.get("healed"))
        if not healed and not self._restored:
            self.restore()
            if clock.step > rep.step:
                rep.set_step(clock.step)
        self._restored = True
        clock.step = rep.step
        self._saves.last_save_step = max(self._saves.last_save_step, clock.step)
        self._ready_sent = True
        self._emit(ev.Ready(prep_s=time.time() - self._started, step=clock.step, total=clock.total))
        self._saves.replan()
        clock.restart()

    @contextmanager
    def step(self) -> Iterator[int]:
        """One step, for loops spotnb does not drive (`with ctx.step(): ...`)."""
        if not self._clock.in_loop:
            self._begin_loop(None)
        if self._saves.evacuating:
            raise Evacuate()
        yield self._clock.step
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
        if self._peers.local_rank != 0:
            return  # rank 0 logs for the group (every rank holds the same model)
        metrics["step"] = self._clock.step
        metrics["t"] = time.time()
        if self._peers.rep is not None:
            metrics["replica"] = self._peers.rep.replica
        self.rows.append(metrics)

    def should_save(self) -> bool:
        """True when the policy wants a save now (insurance, periodic or emergency) and no
        state is tracked, i.e. the script writes its own checkpoint files and calls backup()."""
        return self._saves.save_due is not None

    def save(self, kind: str = "manual", wait: bool = False) -> None:
        """Checkpoint the tracked state now (uploaded in the background unless `wait`)."""
        self._saves.save(SaveKind(kind), wait=wait)

    def backup(self, *paths: str, wait: bool | None = None) -> None:
        """Upload files or whole folders the script wrote (with the step and RNG state) as one
        checkpoint; on restore they are put back at the same paths, and a folder is made what
        it was (files written into it after the checkpoint go). Files an earlier checkpoint
        already holds are not uploaded again. Waits for the upload after a notice."""
        if self._clock.in_loop:  # since the last step ended, the script was writing its checkpoint
            self._clock.writing_since_step()
        files, dirs = backup_files(paths)
        self._saves.backup(files, dirs, wait)

    @property
    def notice(self) -> Notice | None:
        """The pending preemption notice, if any."""
        return self._saves.notice

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
        if not self._clock.in_loop:
            raise RuntimeError("ctx.step_done() outside a loop: call ctx.external_loop(total) first")
        self._end_step()

    def warn(self, message: str) -> None:
        """Tell the notebook something the user must know (a warning event, shown at once),
        e.g. that an integration cannot resume exactly."""
        self._emit(ev.JobWarning(message=message))

    def progress(self) -> dict[str, Any]:
        return self._clock.progress()

    # -- step boundaries -------------------------------------------------------------------
    def _begin_loop(self, total: int | None) -> None:
        clock, peers = self._clock, self._peers
        if total is not None:
            clock.total = total
        self._detect_sharded()
        peers.check_loop(sharded=self._saves.sharded is not None)
        if peers.rep is not None:
            # a cold start restores from the store now; a replica joining live peers waits for
            # its first quorum, which brings the live state (ready is said after it)
            if not peers.joining and not self._restored:
                self.restore()
                peers.rep.set_step(clock.step)
                self._restored = True
            clock.in_loop = True
            return
        if not self._restored:
            self.restore()
            peers.check_step(clock.step)
        clock.in_loop = True
        if not self._ready_sent:
            self._ready_sent = True
            self._emit(ev.Ready(prep_s=time.time() - self._started, step=clock.step, total=clock.total))
        self._saves.replan()
        clock.restart()

    def _end_step(self, committed: bool = True, boundary: bool = True) -> None:
        self._saves.end_step(committed, boundary)

    # -- called from other threads (the agent's notice watcher, a rebalance hint) ----------
    def _receive_notice(self, notice: Notice) -> None:
        """Watcher thread: move the next boundary to now (`SaveScheduler.receive_notice`)."""
        self._saves.receive_notice(notice)

    def _request_save(self, kind: SaveKind = SaveKind.INSURANCE) -> None:
        """Any thread: save at the next step boundary (`SaveScheduler.request_save`)."""
        self._saves.request_save(kind)


def backup_files(paths: tuple[str, ...]) -> tuple[list[tuple[str, str]], dict[str, str]]:
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


def set_current(context: Context | None) -> None:
    """Make `context` the one `ctx()` returns in this process (the agent, for its function)."""
    global _current
    _current = context


def ctx() -> Context:
    """The Context of the job this process runs: the object the function received, for code
    deep inside it that was not handed `ctx` (`spotnb.ctx()` calls this where a function runs,
    and returns a `ScriptContext` in a script). Raises SpotnbError outside a job."""
    if _current is None:
        from spotnb.errors import SpotnbError
        from spotnb.runtime.script.client import OUTSIDE_JOB

        raise SpotnbError(OUTSIDE_JOB)
    return _current
