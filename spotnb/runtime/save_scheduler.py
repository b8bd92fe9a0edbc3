"""When `ctx` saves: the step clock, the policy's plan, preemption notices and evacuation.

The Context (`runtime/context.py`) is the surface the user's function calls; at a step boundary
it hands over to the `SaveScheduler`, which decides whether this boundary saves (the policy's
periodic or insurance save, a save asked for from outside, the emergency save a notice leaves
time for), writes the snapshot and, once an emergency save committed, makes the job leave
(`Evacuate`). Notices and save requests arrive on other threads: they only move the next
boundary to "now" (`SaveScheduler.arm`), so the per-step path stays a clock read, two additions
and one comparison (`StepClock.tick`).

What the replicas and ranks of a job on several processes or instances do at those moments
(who writes the store's checkpoint, who decides on a notice) is the group side's
(`runtime/group/peers.py`), which the scheduler asks.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from spotnb.core import protocol as ev
from spotnb.policy.base import PRIOR_MTTP, PRIOR_RESTART, Observation, Plan, Policy, SaveKind
from spotnb.runtime.checkpoint.checkpointer import Checkpointer, emergency_skipped
from spotnb.runtime.checkpoint.incremental import frozen_tensors
from spotnb.runtime.checkpoint.sharded_state import save_state
from spotnb.runtime.notice import Notice

if TYPE_CHECKING:
    from spotnb.runtime.checkpoint.sharded import ShardedCheckpointer
    from spotnb.runtime.group.peers import Peers

__all__ = ["Evacuate", "SaveScheduler", "StepClock", "Tracked", "rng_state", "set_rng_state", "NEVER"]

#: `SaveScheduler.next_save` when no save is planned: the per-step comparison never fires
NEVER = 2**62
#: the save kinds as the numbers rank 0 shares with its group (0: no save at this boundary)
KIND_CODES = list(SaveKind)


class Evacuate(BaseException):
    """Raised out of the user's loop after an emergency checkpoint committed: leave cleanly.

    A BaseException so that a user's `except Exception` does not swallow it."""


def rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from (Python, numpy, torch, CUDA), for a checkpoint:
    a resumed job draws the same numbers the uninterrupted one would have."""
    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back the RNG states `rng_state` took."""
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class Tracked:
    """What a checkpoint holds besides the step: the objects `ctx.track` registered and the
    user's picklable `ctx.state`. One instance is shared by the Context (track, restore), the
    scheduler (saves) and the group side (the state a recovering replica receives)."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}  # name -> object with state_dict/load_state_dict
        self.user: dict[str, Any] = {}  # `ctx.state`
        self.new: set[str] = set()  # tracked names a resumed checkpoint may lack (`track_new`)

    def holds_any(self) -> bool:
        """Whether spotnb has anything to save (else the script saves and calls `backup`)."""
        return bool(self.objects or self.user)

    def full_state(self, step: int) -> dict[str, Any]:
        """The state a checkpoint of `step` holds."""
        return {
            "step": step,
            "rng": rng_state(),
            "user": self.user,
            "objects": {name: obj.state_dict() for name, obj in self.objects.items()},
        }

    def frozen(self) -> set[int]:
        """Storage addresses of tensors no optimizer trains: referenced while unchanged."""
        return frozen_tensors(self.objects.values())

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The tracked optimizers whose `step()` writes their tensors (a wrapper's inner one):
        what a snapshot gates instead of copying their parameters and state."""
        out = []
        for obj in self.objects.values():
            while isinstance(getattr(obj, "optim", None), torch.optim.Optimizer):
                obj = obj.optim
            if isinstance(obj, torch.optim.Optimizer):
                out.append(obj)
        return out

    def state_bytes(self) -> int:
        """The tensors' size: the policy's estimate of a save before the first one."""
        total = 0
        for obj in self.objects.values():
            for v in _tensors(obj.state_dict()):
                total += v.element_size() * v.nelement()
        return total

    def peer_state(self) -> dict[str, Any]:
        """What a recovering peer receives (the Manager adds the step)."""
        return {
            "objects": {name: obj.state_dict() for name, obj in self.objects.items()},
            "user": self.user,
        }

    def load_peer_state(self, state: dict[str, Any]) -> None:
        """Take the state a live peer sent (`peer_state`)."""
        objects = state.get("objects", {})
        for name, obj in self.objects.items():
            if name in objects:
                obj.load_state_dict(objects[name])
        self.user.update(state.get("user", {}))


class StepClock:
    """The step index and where the time went (computing new steps, recomputing lost ones,
    saving): what the policy's plan is sized by and what `ctx.progress()` reports."""

    def __init__(self, slots: Any, high_water: int, started: float) -> None:
        self.step = 0
        self.total: int | None = None  # the loop's number of steps, if known
        self.in_loop = False  # the training loop runs (`ctx.steps`, `ctx.step`, `external_loop`)
        self.high_water = high_water  # highest step any earlier incarnation reported
        self.started = started  # when the Context was made (time.time())
        self.t_last = 0.0
        self.compute_s = self.recompute_s = self.save_s = 0.0
        self.timed_steps = 0
        self._slots = slots  # the beacon's shared slots: [0] is the step the agent reports

    def publish(self) -> None:
        """Show the current step in the beacon."""
        self._slots[0] = self.step

    def restart(self) -> None:
        """Time the next step from now."""
        self.t_last = time.perf_counter()

    def tick(self, committed: bool) -> bool:
        """A step ended: count its time, and (if `committed`) the step. False: the group redoes
        this step, whose time was lost."""
        now = time.perf_counter()
        dt = now - self.t_last
        self.t_last = now
        if not committed:
            self.recompute_s += dt
            self.timed_steps += 1
            return False
        self.step += 1
        self._slots[0] = self.step
        if self.step > self.high_water:
            self.compute_s += dt
        else:
            self.recompute_s += dt
        self.timed_steps += 1
        return True

    @property
    def step_time(self) -> float:
        """Mean seconds a step took so far (0.0 before the first)."""
        steps = self.timed_steps
        return (self.compute_s + self.recompute_s) / steps if steps else 0.0

    def saved_since(self, t0: float) -> None:
        """A save that began at `t0` (perf_counter) ended: it counts as save time, not step time."""
        self.save_s += time.perf_counter() - t0
        self.t_last = time.perf_counter()

    def writing_since_step(self) -> None:
        """The script wrote its own checkpoint since the last step ended (`ctx.backup`): that
        time is save time."""
        self.save_s += time.perf_counter() - self.t_last

    def progress(self) -> dict[str, Any]:
        steps = self.timed_steps
        return {
            "step": self.step,
            "total": self.total,
            "steps_done": steps,
            "compute_s": self.compute_s,
            "recompute_s": self.recompute_s,
            "save_s": self.save_s,
            "step_time": (self.compute_s + self.recompute_s) / steps if steps else None,
        }


class SaveScheduler:
    """Decides at each step boundary whether to save, of what kind, and whether to leave.

    Called from the training thread (`end_step`, `boundary`, `save`), except `receive_notice`,
    `shared_notice` and `request_save`, which any thread may call: they set what the next
    boundary handles and then zero `next_save`, so the training thread's next comparison
    leaves its fast path."""

    def __init__(
        self,
        *,
        checkpointer: Checkpointer,
        policy: Policy,
        emit: Callable[[Any], None],
        flush: Callable[[], None],
        clock: StepClock,
        tracked: Tracked,
        peers: Peers,
        market: dict[str, float],
        save_every: int | None,
        acknowledge: Callable[[], None] | None = None,
    ) -> None:
        self._ckpt = checkpointer
        self._policy = policy
        self._emit, self._flush = emit, flush
        self.clock = clock
        self._tracked = tracked
        self._peers = peers
        self._market = market  # mttp, restart, grace
        self._save_every = save_every
        #: tells the notice watcher the emergency save is in (the agent sets it), or None
        self.acknowledge = acknowledge
        self.plan: Plan | None = None
        self.next_save = NEVER  # the step at which `end_step` leaves its fast path
        self.save_due: SaveKind | None = None  # low-level API: the user saves, we back up
        self.notice: Notice | None = None
        self.notice_handled = False
        self.move_again: Notice | None = None  # a move whose save failed: tried again later
        self.requested: SaveKind | None = None  # a save asked for from outside (rebalance hint)
        self.last_save_step = 0
        self.evacuating = False  # the job leaves: the emergency save committed (or a peer's)
        self.sharded: ShardedCheckpointer | None = None  # the tracked model holds DTensors
        self.sharded_due: SaveKind | None = None  # the save every rank makes at this boundary
        peers.deliver_notices(self.shared_notice)

    # -- the step boundary -----------------------------------------------------------------
    def end_step(self, committed: bool = True, boundary: bool = True) -> None:
        """A step ended: count it, and handle the boundary if a save or a notice is due."""
        if not self.clock.tick(committed):
            return
        if self.sharded is not None and self._peers.group is not None:
            self.share_decision()
        if boundary and self.clock.step >= self.next_save:
            self.boundary()

    def boundary(self) -> None:
        """The boundary a save, a request or a notice asked for: handle each in turn."""
        if self.sharded is not None:
            return self._sharded_boundary()
        if self.move_again is not None and self.notice is None and self.plan_due():
            if not self._peers.pass_notice(self.move_again):  # a group learns it with the next all-reduce
                self.notice = self.move_again  # at a planned save
            self.move_again = None
        if self.notice is not None and not self.notice_handled:
            self.notice_handled = True
            self._on_notice_at_boundary()
        if self.requested is not None:
            kind, self.requested = self.requested, None
            if self._tracked.holds_any():
                self.save(kind)
            else:
                self.due(kind)
        if self.plan is not None and self.clock.step >= self.plan.step:
            if self._tracked.holds_any():
                self.save(self.plan.kind)
            else:
                self.due(self.plan.kind)
                self.last_save_step = self.clock.step
                self.replan()
        self.arm()
        return None

    def plan_due(self) -> bool:
        return self.plan is not None and self.clock.step >= self.plan.step

    def due(self, kind: SaveKind) -> None:
        """Low-level API: ask the script for a save (an emergency request is never downgraded)."""
        if self.save_due != SaveKind.EMERGENCY:
            self.save_due = kind

    def arm(self) -> None:
        """Set the next boundary at which `end_step` leaves its fast path. The watcher thread
        may set a notice at any moment; re-checking after the write means it is never lost
        (the watcher writes `notice` before it zeroes `next_save`)."""
        self.next_save = self.plan.step if self.plan else NEVER
        if (self.notice is not None and not self.notice_handled) or self.requested is not None:
            self.next_save = 0

    def replan(self) -> None:
        """Ask the policy for the next save, after one was made (or planned for the script)."""
        self.plan = self._policy.next_save(self.observation(), self.last_save_step)
        self.arm()

    def restart_at(self, step: int) -> None:
        """A new rendezvous round of a torchrun script begins at `step`, restored by the round:
        it starts saved, so a save asked of the last round is not owed to this one."""
        self.clock.step = self.last_save_step = step
        self.clock.in_loop = False
        self.requested = self.save_due = None

    def observation(self) -> Observation:
        """What the policy decides on: the job's timings, the store's and the market's."""
        clock, ckpt = self.clock, self._ckpt
        return Observation(
            step=clock.step,
            step_time=clock.step_time,
            snapshot_time=ckpt.snapshot_ema,
            upload_time=ckpt.upload_ema,
            mttp=self._market.get("mttp", PRIOR_MTTP),
            restart_time=self._market.get("restart", PRIOR_RESTART),
            grace=self._market.get("grace", 30.0),
            save_every=self._save_every,
            total_steps=clock.total,
            snapshot_sd=ckpt.snapshot_var**0.5,
            upload_sd=ckpt.upload_var**0.5,
            state_bytes=ckpt.last_bytes or self._tracked.state_bytes(),
            save_bytes=ckpt.last_written,
            upload_bps=ckpt.bandwidth,
            age=time.time() - clock.started,
            now=time.time(),
        )

    # -- notices ---------------------------------------------------------------------------
    def _on_notice_at_boundary(self) -> None:
        peers = self._peers
        if peers.group is None:
            return self._handle_notice()
        if peers.local_rank != 0:  # the group does what rank 0 decided at this same step
            if peers.follow_rank0():
                self.evacuating = True
                raise Evacuate()
            return None
        peers.owe_answer()
        self._handle_notice()  # raises Evacuate when it leaves (having told the group)
        peers.answer(False)
        return None

    def _handle_notice(self) -> None:
        notice = self.notice
        assert notice is not None
        step = self.clock.step
        left = notice.deadline - time.time()
        if self._peers.replicas > 1:
            # peers train on: this replica's step is committed, so it leaves the quorum
            # cleanly (no failed step, nothing to save) and a replacement heals from a peer
            self._emit(ev.Evacuating(step=step, time_left=left))
            self._peers.leave_quorum()
            self.evacuate_after_save()
        obs = self.observation()
        tracked = self._tracked
        if tracked.holds_any():  # sized by what it would write: the delta since the last save
            pending = self._ckpt.pending_bytes(tracked.full_state(step), tracked.frozen())
            obs = obs.with_(save_bytes=pending[0])
        moving = notice.source == "move"  # asked to move: no market deadline, always save
        kind = SaveKind.MOVE if moving else SaveKind.EMERGENCY
        if not moving and not self._policy.on_notice(obs, left):
            self._emit(emergency_skipped(obs, step, left))
            return
        self._emit(ev.Evacuating(step=step, time_left=left))
        if tracked.holds_any():
            try:
                self.save(kind, wait=True)
            except Exception as exc:  # noqa: BLE001 - the store failed; keep training until killed
                self._emit(ev.CheckpointFailed(step=step, save_kind=kind, error=repr(exc)))
                if moving:
                    # nothing preempts this instance and its new one waits: try the move again
                    # at the next planned save; until then a real notice (or SIGTERM) must
                    # still be heard, so the move's notice is no longer pending
                    if self.notice is notice:  # (a real one that came meanwhile stays)
                        self.notice = None
                    self.notice_handled = False
                    self.move_again = notice
                    self.arm()
                return
            self.evacuate_after_save()
        else:
            self.due(SaveKind.EMERGENCY)  # the script saves; backup() then evacuates

    def evacuate_after_save(self) -> None:
        """The emergency save is in (or a peer holds the state): say so and leave."""
        self._peers.answer(True)
        self.evacuating = True
        self._emit(ev.Evacuated(step=self.clock.step))
        self._flush()
        if self.acknowledge:
            self.acknowledge()
        raise Evacuate()

    # -- called from other threads ---------------------------------------------------------
    def receive_notice(self, notice: Notice) -> None:
        """Watcher thread: move the next boundary to now. In a group of processes the notice
        waits for the next gradient all-reduce, which shares it (`Group.average`), so that
        every rank handles it at the same step."""
        if self._peers.pass_notice(notice):
            return
        self._set_notice(notice)

    def shared_notice(self, notice: Notice) -> None:
        """The group learnt of a notice in this step's all-reduce: every rank handles it at
        this boundary, also one after an earlier notice (each must answer rank 0's word)."""
        self.notice_handled = False
        self._set_notice(notice)

    def _set_notice(self, notice: Notice) -> None:
        self.notice = notice
        self.next_save = 0

    def request_save(self, kind: SaveKind = SaveKind.INSURANCE) -> None:
        """Any thread: save at the next step boundary (e.g. on a rebalance recommendation,
        when the risk of a preemption rises but no deadline is known yet)."""
        self.requested = kind
        self.next_save = 0

    # -- saves -----------------------------------------------------------------------------
    def save(
        self,
        kind: SaveKind,
        wait: bool = False,
        files: list[tuple[str, str]] | None = None,
        dirs: dict[str, str] | None = None,
    ) -> None:
        """Checkpoint the tracked state (and `files`) of the current step, uploaded in the
        background unless `wait`; plan the next save."""
        if self.sharded is not None:
            if files:
                raise ValueError("ctx.backup(...) of files is not supported with a sharded model")
            self.save_sharded(kind)
            return
        step = self.clock.step
        if not self._peers.writes_checkpoints:
            # one replica writes the store's checkpoints (all hold the same state); the others
            # keep the same plan, so whoever is replica 0 next saves on time
            self.last_save_step = step
            self.replan()
            return
        t0 = time.perf_counter()
        tracked = self._tracked
        frozen = tracked.frozen()  # referenced while unchanged
        snap = self._ckpt.snapshot(
            tracked.full_state(step), step, kind, files, dirs, frozen, tracked.optimizers()
        )
        self.last_save_step = step
        self.replan()  # before the hand-off: once the writer thread runs, it competes for the GIL
        if wait:
            self._ckpt.save_now(snap)
        else:
            self._ckpt.submit(snap)
        self.clock.saved_since(t0)

    def backup(self, files: list[tuple[str, str]], dirs: dict[str, str], wait: bool | None) -> None:
        """`ctx.backup`: the files the script wrote, as the save the policy asked for (or a
        manual one); after a notice it is the emergency save, waited for, and the job leaves."""
        kind = self.save_due or SaveKind.MANUAL
        self.save(kind, files=files, dirs=dirs, wait=bool(wait) or kind == SaveKind.EMERGENCY)
        if kind == SaveKind.EMERGENCY:
            self.evacuate_after_save()
        self.save_due = None

    # -- a sharded model (DTensors): every rank saves its shard ----------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the sharded checkpoint (0 unless the model is sharded)."""
        return self.sharded.rank if self.sharded is not None else 0

    def share_decision(self) -> None:
        """A sharded job: every rank takes part in each save, so rank 0 (whose policy and
        notices decide) tells the group at every step boundary whether this one saves, and
        what kind, together with a pending notice (one small all-reduce; FSDP's own
        collectives carry no word of ours)."""
        group = self._peers.group
        assert group is not None
        kind: SaveKind | None = None
        if group.local_rank == 0:
            if self.move_again is not None and self.notice is None and self.plan_due():
                group.pending, self.move_again = self.move_again, None
            if self.requested is not None:
                kind, self.requested = self.requested, None
            elif self.plan_due():
                assert self.plan is not None
                kind = self.plan.kind
        code = group.decide(KIND_CODES.index(kind) + 1 if kind is not None else 0)
        self.sharded_due = KIND_CODES[code - 1] if code else None
        if self.sharded_due is not None:
            self.next_save = 0

    def _sharded_boundary(self) -> None:
        if self.notice is not None and not self.notice_handled:
            self.notice_handled = True
            self._sharded_notice()
        if self._peers.group is None:  # one process holding DTensors: its own policy decides
            if self.requested is not None:
                self.sharded_due, self.requested = self.requested, None
            elif self.plan_due():
                assert self.plan is not None
                self.sharded_due = self.plan.kind
        if self.sharded_due is not None:
            kind, self.sharded_due = self.sharded_due, None
            self.save_sharded(kind)
        self.arm()

    def _sharded_notice(self) -> None:
        """Rank 0 decides whether to take the emergency save; the group learns the decision
        at this boundary and, if so, saves with it and leaves once it committed."""
        notice = self.notice
        assert notice is not None
        rank0 = self.rank == 0
        moving = notice.source == "move"
        kind = SaveKind.MOVE if moving else SaveKind.EMERGENCY
        save = True
        if rank0:
            step = self.clock.step
            left = notice.deadline - time.time()
            if not moving and not self._policy.on_notice(self.observation(), left):
                self._emit(emergency_skipped(self.observation(), step, left))
                save = False
            else:
                self._emit(ev.Evacuating(step=step, time_left=left))
        if self._peers.group is not None:
            save = self._peers.group.agree(save)
        if not save:
            return
        if self.save_sharded(kind) is not None:
            self.evacuate_after_save()
        if rank0 and moving:  # not committed: try the move again at the next planned save
            if self.notice is notice:
                self.notice = None
            self.notice_handled = False
            self.move_again = notice

    def save_sharded(self, kind: SaveKind) -> Any:
        """Every rank saves its shard: a save the job leaves after (emergency, move) waits
        for the commit and returns the manifest (or None); the others only stall for the copy
        to host RAM and upload in the background (`ShardedCheckpointer.save_async`)."""
        assert self.sharded is not None
        t0 = time.perf_counter()
        step = self.clock.step
        state = save_state(
            self._tracked.objects, {"step": step, "user": self._tracked.user}, rng_state(), self.rank
        )
        manifest: Any
        if kind in (SaveKind.EMERGENCY, SaveKind.MOVE):
            manifest = self.sharded.save(state, step, kind)
        else:
            manifest = self.sharded.save_async(state, step, kind)
        self.last_save_step = step
        self.replan()
        self.clock.saved_since(t0)
        return manifest
