"""The group side of `ctx`: the processes and instances one job's function trains with.

A job may train on several processes of one instance (`Config.procs_per_instance`: a local
`Group`, rank 0 deciding for the others), on several instances (`Config.instances`: an
`Elastic` group whose step quorum may change, `Replication`), or both. `Peers` is what the
Context and its save scheduler ask about them: who writes the store's checkpoint (replica 0,
local rank 0), how a notice reaches every rank at the same step, what rank 0 tells its group
on a notice, and the step loop of a replicated job (a step the quorum could not commit is
yielded again). On a one-process, one-instance job every answer is the trivial one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from spotnb.core import protocol as ev
from spotnb.runtime.checkpoint.sharded_state import has_dtensors
from spotnb.runtime.group.elastic import Elastic, GroupOptimizer, ReplicatedOptimizer, Replication
from spotnb.runtime.group.local import Group
from spotnb.runtime.notice import Notice

if TYPE_CHECKING:
    from spotnb.runtime.save_scheduler import SaveScheduler, Tracked

__all__ = ["Peers", "GroupFinished", "SYNC_KEY", "NOTICE_MARGIN_S", "SHARDED_ELASTIC", "holds_dtensors"]

#: the tracked entry holding a replicated job's sync mode, step and DiLoCo outer momentum
SYNC_KEY = "_spotnb_sync"
#: seconds a replica keeps free before a notice's deadline when it finishes its window first
NOTICE_MARGIN_S = 3.0
SHARDED_ELASTIC = (
    "a sharded model (DTensor parameters, e.g. FSDP's fully_shard) trains on one instance's "
    "processes (procs_per_instance) only: set instances=1, or shard within the instance and "
    "replicate an unsharded model across instances"
)


class GroupFinished(BaseException):
    """Raised out of `ctx.steps` in a replica that joined a job on several instances when its
    peers had already trained the last step: it has nothing to train, and the user's code
    after the loop (which may read loop variables) must not run on it. The agent reports it
    done without a result (its peers return the job's)."""


def holds_dtensors(tracked: dict[str, Any]) -> bool:
    """Whether a tracked model holds DTensors. A DTensor exists only once some code imported
    torch.distributed.tensor (FSDP2, the user's own import, an unpickled one): until then the
    answer is no, without importing it here, which would add a second to every instance's
    start (the import costs a third of torch's)."""
    return "torch.distributed.tensor" in sys.modules and has_dtensors(tracked)


class Peers:
    """This process's place among the job's processes (`group`) and instances (`elastic`)."""

    def __init__(
        self,
        *,
        job_id: str,
        tracked: Tracked,
        emit: Callable[[Any], None],
        elastic: Elastic | None = None,
        group: Group | None = None,
    ) -> None:
        self.job_id = job_id
        self._tracked = tracked
        self._emit = emit
        self.group = group  # the instance's processes (Config.procs_per_instance > 1), or None
        self.elastic = elastic  # this job trains on several instances (None: one)
        self.rep: Replication | None = None  # set by `replicate` on a job of several instances
        self.replicated = False  # `ctx.replicate` was called
        self._window_compute = 0.0  # compute seconds counted when the current window began
        self._owes = False  # rank 0 has yet to tell its group what it does on a notice

    # -- who this process is ---------------------------------------------------------------
    @property
    def replica(self) -> int:
        return self.rep.replica if self.rep is not None else 0

    @property
    def replicas(self) -> int:
        return self.rep.replicas if self.rep is not None else 1

    @property
    def local_rank(self) -> int:
        return self.group.local_rank if self.group is not None else 0

    @property
    def local_world_size(self) -> int:
        return self.group.local_world_size if self.group is not None else 1

    @property
    def writes_checkpoints(self) -> bool:
        """One replica's rank 0 writes the store's checkpoints: all hold the same state."""
        return not ((self.rep is not None and self.rep.replica != 0) or self.local_rank != 0)

    @property
    def joining(self) -> bool:
        """This replica came to join live peers (it receives their state at its first quorum)."""
        return bool(self.elastic is not None and self.elastic.join)

    # -- set-up ----------------------------------------------------------------------------
    def replicate(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        """`ctx.replicate` once the Context found the call in time: check the arguments and
        wrap the optimizer for this job's processes and instances."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"ctx.replicate(model, ...): expected a torch.nn.Module, got {type(model).__name__}"
            )
        if not isinstance(optimizer, torch.optim.Optimizer):
            got = type(optimizer).__name__
            raise TypeError(f"ctx.replicate(..., optimizer): expected a torch.optim.Optimizer, got {got}")
        if holds_dtensors({"model": model}):
            if self.elastic is not None:
                raise RuntimeError(SHARDED_ELASTIC)
            self.replicated = True  # FSDP already reduces the gradients over the group
            return model, optimizer
        self.replicated = True
        if self.group is not None:
            self.group.same_start(model)  # as DDP does: every rank from rank 0's weights
        if self.elastic is None:
            if self.group is None:
                return model, optimizer
            buffers = [b for b in model.buffers() if b.is_floating_point()]
            return model, GroupOptimizer(optimizer, self.group, buffers)
        tracked = self._tracked
        self.rep = Replication(
            self.elastic, self.job_id, tracked.peer_state, tracked.load_peer_state, group=self.group
        )
        tracked.objects[SYNC_KEY] = self.rep.sync  # checkpointed and sent to peers with the rest
        self.rep.buffers = [b for b in model.buffers() if b.is_floating_point()]
        return model, ReplicatedOptimizer(optimizer, self.rep)

    def check_loop(self, sharded: bool) -> None:
        """The loop begins: a job of several processes or instances must have replicated."""
        if self.group is not None and not self.replicated and not sharded:
            raise RuntimeError(
                f"this job runs {self.group.local_world_size} processes per instance: call "
                "model, opt = ctx.replicate(model, opt) before ctx.track(...) and the loop, so "
                "they train one model together (or set procs_per_instance=1)"
            )
        if self.elastic is not None and self.rep is None:
            raise RuntimeError(
                f"this job runs on {self.elastic.instances} instances: call "
                "model, opt = ctx.replicate(model, opt) before ctx.track(...) and the loop, so "
                "the instances train one model together (or set instances=1)"
            )

    def check_step(self, step: int) -> None:
        """Every process of the instance restored the same step."""
        if self.group is not None:
            self.group.check_step(step)

    # -- notices ---------------------------------------------------------------------------
    def deliver_notices(self, deliver: Callable[[Notice], None]) -> None:
        """Where the group hands a notice it learnt in a step's all-reduce."""
        if self.group is not None:
            self.group.deliver = deliver

    def pass_notice(self, notice: Notice) -> bool:
        """A group of processes shares a notice with its next all-reduce, so that every rank
        handles it at the same step: False without a group (handle it here)."""
        if self.group is None:
            return False
        self.group.pending = notice
        return True

    def follow_rank0(self) -> bool:
        """A rank other than 0, at a notice: whether rank 0 leaves (then this one leaves too,
        and its replica leaves the quorum)."""
        assert self.group is not None
        if self.group.agree(False):
            if self.rep is not None:
                self.rep.leave()
            return True
        return False

    def owe_answer(self) -> None:
        """Rank 0 handles a notice: its group waits for word whether it leaves."""
        self._owes = True

    def answer(self, leave: bool) -> None:
        """Rank 0: tell the group, once per notice, whether it leaves now."""
        if self.group is not None and self._owes:
            self._owes = False
            self.group.agree(leave)

    def leave_quorum(self) -> None:
        """This replica leaves its step quorum cleanly (the others train on)."""
        assert self.rep is not None
        self.rep.leave()

    # -- the step loop of a replicated job -------------------------------------------------
    def steps(
        self, n: int, saves: SaveScheduler, first_quorum: Callable[[dict[str, Any] | None], None]
    ) -> Iterator[int]:
        """`ctx.steps` on a job of several instances: each step (or window of local steps)
        is committed by the quorum; one it could not commit is yielded again. `first_quorum`
        is the Context's (it restores, if the quorum brought no live state, and says ready)."""
        rep = self.rep
        assert rep is not None
        clock = saves.clock
        first = True
        while True:
            if not rep.window_open:  # ddp: every step; local SGD / DiLoCo: every window
                changed = rep.begin_step(first=first)
                if first:
                    first_quorum(changed)
                if changed is not None:
                    self._emit(ev.Quorum(**changed))
                if first:
                    first = False
                    if rep.step >= n and self.joining:
                        clock.in_loop = False
                        rep.leave()
                        raise GroupFinished()
                clock.step = rep.step
                self._window_compute = clock.compute_s
            if clock.step >= n:
                break
            clock.publish()
            yield clock.step
            self._end_step(rep.end_step(last=clock.step + 1 >= n), saves)
        clock.step = rep.step
        clock.in_loop = False
        rep.leave()

    def _end_step(self, outcome: bool | None, saves: SaveScheduler) -> None:
        """`outcome`: None, a step inside a window (it counts locally; saves wait for the
        window's end, a notice too unless the window cannot end before the deadline); True,
        the step or window committed; False, the group redoes it (a window's time so far is
        recompute)."""
        rep = self.rep
        assert rep is not None
        clock = saves.clock
        if outcome is None:
            saves.end_step(boundary=self._must_leave_mid_window(saves))
            return
        if outcome is False and rep.windowed:
            lost = clock.compute_s - self._window_compute
            clock.compute_s -= lost
            clock.recompute_s += lost
        if outcome and rep.windowed:
            saves.end_step(committed=True, boundary=False)  # the window's last step
            clock.step = rep.step
            clock.publish()
            if clock.step >= saves.next_save:
                saves.boundary()
        else:
            saves.end_step(committed=outcome)
        if outcome and rep.switched is not None and rep.replica == 0:
            self._emit(ev.SyncChanged(**rep.switched))

    def _must_leave_mid_window(self, saves: SaveScheduler) -> bool:
        """A notice inside a window: stay to its end (no failed window) when it ends before the
        deadline with room to spare, else leave now (the peers redo the window)."""
        rep = self.rep
        notice = saves.notice
        if rep is None or notice is None or saves.notice_handled:
            return False
        clock = saves.clock
        step_time = (clock.compute_s + clock.recompute_s) / max(1, clock.timed_steps)
        need = (rep.sync.every - rep.local) * step_time + rep.last_comm + NOTICE_MARGIN_S
        return need >= notice.deadline - time.time()
