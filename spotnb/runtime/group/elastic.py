"""One replica of a job on several instances: fault-tolerant data parallel on torchft.

torchft's lighthouse (the job's coordinator, `spotnb.runtime.group.lighthouse`) computes every step
which replicas take part (the quorum); each replica's `Manager` reconfigures its process group
around whoever is there, without a restart, and a replica that is behind (a replacement, or
one that sat a step out) receives the live state from a peer before it trains. spotnb maps
that onto `ctx.steps`:

- the quorum is asked for at the top of each step, so `ctx.replica` / `ctx.replicas` say how
  to split that step's global batch among whoever trains it;
- `opt.step()` of the optimizer `ctx.replicate` returns averages the gradients over the quorum
  and applies them only if every member's all-reduce succeeded (`Manager.should_commit`);
- `ctx.steps` advances only on a committed step, so a step whose all-reduce failed (a member
  was killed mid-step) is redone with the new quorum: each step's global batch is applied
  exactly once whatever the membership does.

With `sync="local_sgd:K"` or `"diloco:K"` the replicas train K steps on their own and agree
once per *window*: the quorum is asked at the window's start (so the batch split holds for
the window), the weights (local SGD) or the pseudo-gradient (DiLoCo: an outer Nesterov step,
Douillard et al. 2023) are averaged at its end, and a window that cannot commit is undone
(every tracked object back to its start) and redone with the new quorum: exactly once, per
window. `sync="auto"` starts with ddp and switches at commit points, from the measured cost
of the all-reduce against the step (`spotnb.core.sync.choose_sync`), without a restart.

docs/dev/fleet.md ("Several instances") has the whole picture (what the controller does, who
writes the store's checkpoints, the group loss rate the policies use).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from spotnb.core.sync import SyncSpec, choose_sync

if TYPE_CHECKING:
    from spotnb.runtime.group.local import Group

__all__ = ["Replication", "ReplicatedOptimizer", "GroupOptimizer", "Elastic", "SyncState", "Communicators"]

log = logging.getLogger("spotnb.elastic")

#: Longest a collective or a peer's state transfer may take before the step counts as failed.
COLLECTIVE_TIMEOUT = timedelta(seconds=float(os.environ.get("SPOTNB_COLLECTIVE_TIMEOUT", "30")))
#: Longest a replica waits for a quorum (below `min_instances` it waits for a replacement).
QUORUM_RETRIES = 600
#: Longest a cold-starting replica waits for all its peers before training with fewer: long
#: enough for instances launched together to start a little apart, short enough that a peer
#: preempted while starting (its replacement comes later and heals) does not hold the rest.
COLD_START_WAIT = float(os.environ.get("SPOTNB_COLD_START_WAIT", "5"))
QUORUM_TIMEOUT = timedelta(seconds=float(os.environ.get("SPOTNB_QUORUM_TIMEOUT", "3600")))


class Elastic:
    """What the agent knows of the job's group, from the spec and the incarnation document."""

    def __init__(
        self, *, lighthouse: str, slot: int, instances: int, min_instances: int, join: bool, sync: SyncSpec
    ) -> None:
        self.lighthouse, self.slot, self.instances = lighthouse, slot, instances
        self.min_instances, self.join, self.sync = min_instances, join, sync


#: DiLoCo's outer optimizer (the paper's: Nesterov momentum, lr 0.7, momentum 0.9)
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9
#: the local market's emulated slow link: extra seconds before each all-reduce of this replica
LINK_DELAY_ENV = "SPOTNB_LINK_DELAY"


class SyncState:
    """How the group synchronises now, tracked with the user's objects (checkpointed, and sent
    to a recovering peer with them) so a replacement and a restored job continue in the same
    mode, at the same step, with the same measurements and DiLoCo's outer momentum."""

    def __init__(self, spec: SyncSpec) -> None:
        self.auto = spec.kind == "auto"
        self.mode = "ddp" if self.auto else spec.kind
        self.every = spec.every
        self.step = 0  # the group's committed step
        self.samples: list[tuple[float, float]] = []  # (compute_s, comm_s), the same on every replica
        self.outer: torch.optim.Optimizer | None = None
        self._outer_state: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "every": self.every,
            "step": self.step,
            "samples": list(self.samples),
            "outer": self.outer.state_dict() if self.outer is not None else self._outer_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mode, self.every = str(state["mode"]), int(state["every"])
        self.step = int(state["step"])
        self.samples = [(float(c), float(m)) for c, m in state.get("samples", [])]
        outer = state.get("outer")
        if outer is not None and self.outer is not None:
            self.outer.load_state_dict(outer)
        else:
            self._outer_state = outer

    def outer_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        if self.outer is None:
            self.outer = torch.optim.SGD(params, lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
            if self._outer_state is not None:
                self.outer.load_state_dict(self._outer_state)
                self._outer_state = None
        return self.outer


class Communicators:
    """Stands between torchft's `Manager` and its client (`Manager._client`) so the quorum id
    the Manager sees names one process group for good, even across a lighthouse restart.

    The Manager rebuilds its process group only when the quorum id changes, and names the new
    group's rendezvous after it (`<first member's store>/torchft/<id>`). A restarted lighthouse
    numbers quorums from 1 again, so a number can come back with the same members: a replica
    whose last quorum before the restart was "2" keeps its old group when the new lighthouse's
    "2" comes, while the peers that went through the new "1" build a new group under the old
    name, and the all-reduce hangs until the collective timeout (issue 9).

    So each replica tells its peers, inside its reconfigure handle (which the lighthouse hands
    to every member unchanged), which group it holds; the id passed on to the Manager is:

    - the group every member holds, if they all hold the same one and it was built for this
      lighthouse quorum number and these members (nothing to rebuild);
    - otherwise a new id, a hash of the lighthouse's number and every member's handle.

    Every member computes the same answer from the same quorum. A new id is never one used
    before on a member's store: the handles hash in the groups the members hold, each of which
    was new when built, so the chain never returns to an earlier link. A commit failure still
    rebuilds the group: the lighthouse then bumps its number, which is part of the test."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.held = -1  # the group this replica's process group was last (re)built for
        self._built_for: tuple[int, tuple[str, ...]] = (-1, ())  # (lighthouse number, members)
        self.lighthouse_quorum_id = -1  # the lighthouse's own number, for events and logs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _quorum(self, *, reconfigure_handle: str, **kwargs: Any) -> Any:
        """torchft's `ManagerClient._quorum`, with the handle tagged and the id replaced."""
        handle = json.dumps({**json.loads(reconfigure_handle), "holds": self.held})
        result = self._client._quorum(reconfigure_handle=handle, **kwargs)
        return _Renumbered(result, self.communicator(int(result.quorum_id), list(result.reconfigure_handles)))

    def communicator(self, quorum_id: int, handles: list[str]) -> int:
        """The id of the process group this quorum trains in (see the class docstring)."""
        peers = [json.loads(h) for h in handles]
        members = tuple(str(p["id"]) for p in peers)
        self.lighthouse_quorum_id = quorum_id
        holds = {p.get("holds") for p in peers}
        if self.held >= 0 and holds == {self.held} and self._built_for == (quorum_id, members):
            return self.held
        digest = hashlib.sha256(json.dumps([quorum_id, handles]).encode()).digest()
        new = int.from_bytes(digest[:8], "big") >> 1  # a positive int64: torch's uuid field
        if self.held >= 0:
            log.info(
                "lighthouse quorum %d: process group %x -> %x (members hold %s)",
                quorum_id,
                self.held,
                new,
                sorted(f"{h:x}" if isinstance(h, int) and h >= 0 else "none" for h in holds),
            )
        self.held, self._built_for = new, (quorum_id, members)
        return new


class _Renumbered:
    """torchft's `QuorumResult` with another `quorum_id` (its fields are read-only)."""

    def __init__(self, result: Any, quorum_id: int) -> None:
        self._result, self.quorum_id = result, quorum_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


class Replication:
    """This replica's membership: the torchft Manager, its process group and its own store.

    `state_fn` / `load_fn` give and take the state a recovering peer receives (the tracked
    objects and `ctx.state`); the Manager adds its step.

    With several processes per instance (`group`), each has its own Manager (group_rank,
    group_world_size; rank 0's runs the server the lighthouse talks to) and its own process
    group to the same rank of the other replicas; the group's gradients are averaged inside
    it first, and `should_commit` answers for the group as a whole."""

    def __init__(
        self,
        elastic: Elastic,
        job_id: str,
        state_fn: Callable[[], Any],
        load_fn: Callable[[Any], None],
        group: Group | None = None,
    ) -> None:
        from torch.distributed import TCPStore
        from torchft import Manager, ProcessGroupGloo

        self.elastic = elastic
        self.group = group
        if group is None:
            # the replica group's rendezvous store: one process per instance, so it is private
            self._store: Any = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
            store_addr, store_port, rank, world = "127.0.0.1", int(self._store.port), 0, 1
        else:  # the group's torch.distributed store (rank 0 hosts it, as under torchrun)
            self._store = None
            store_addr, store_port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
            rank, world = group.local_rank, group.local_world_size
        if torch.cuda.is_available():
            from torchft import ProcessGroupBabyNCCL

            pg: Any = ProcessGroupBabyNCCL(timeout=COLLECTIVE_TIMEOUT)
        else:
            pg = ProcessGroupGloo(timeout=COLLECTIVE_TIMEOUT)
        self.manager = Manager(
            pg=pg,
            load_state_dict=load_fn,
            # a windowed peer goes on training while the recovering replica reads: send a copy
            # of the state at the window's start, not the live tensors
            state_dict=lambda: copy.deepcopy(state_fn()) if self.windowed else state_fn(),
            min_replica_size=elastic.min_instances,
            use_async_quorum=False,  # the batch split must be known before the forward pass
            rank=rank,
            world_size=world,
            store_addr=store_addr,
            store_port=store_port,
            lighthouse_addr=elastic.lighthouse,
            replica_id=f"{job_id}-slot{elastic.slot}",
            hostname=os.environ.get("SPOTNB_ADVERTISE_HOST") or socket.gethostname(),
            timeout=COLLECTIVE_TIMEOUT,
            quorum_timeout=QUORUM_TIMEOUT,
            connect_timeout=timedelta(seconds=60),
            init_sync=True,
            # the lighthouse may be restarted under the replicas (it died; the provider starts
            # it again at the same address): keep asking instead of hanging on a lost request
            quorum_retries=QUORUM_RETRIES,
        )
        # quorum ids that survive a lighthouse restart (the Manager has no hook for it)
        self.communicators = Communicators(self.manager._client)
        self.manager._client = self.communicators
        self.replica: int = 0
        self.replicas: int = 1
        self.group_id = -1  # the process group of the last Quorum event (`Communicators`)
        self.committed_this_step: bool | None = None  # None: the optimizer was not stepped
        self.failed_steps = 0
        self._ddp_ok = False
        self.sync = SyncState(elastic.sync)
        self.link_delay = float(os.environ.get(LINK_DELAY_ENV) or 0.0)
        self.params: list[torch.Tensor] = []  # set by ReplicatedOptimizer
        self.buffers: list[torch.Tensor] = []  # the model's float buffers, set by ctx.replicate
        self.local = 0  # steps trained in the current window
        self._window_start: dict[str, Any] | None = None  # the state to return to if it fails
        self._start_params: list[torch.Tensor] = []
        self._snapshot_fn = state_fn
        self._restore_fn = load_fn
        self._t_compute = time.perf_counter()
        self._compute_s = 0.0
        self.last_comm = 0.0
        self.switched: dict[str, Any] | None = None  # set when `auto` changed the mode

    @property
    def step(self) -> int:
        """The group's committed step (what a recovering peer receives with the state)."""
        return self.sync.step

    @property
    def lighthouse_quorum_id(self) -> int:
        """The lighthouse's number for the last quorum (restarts from 1 with the lighthouse)."""
        return self.communicators.lighthouse_quorum_id

    @property
    def windowed(self) -> bool:
        return self.sync.mode != "ddp"

    def set_step(self, step: int) -> None:
        """After a restore from the store: the group's step is the checkpoint's."""
        self.sync.step = step
        self.manager.load_state_dict({"step": step, "batches_committed": 0})

    def begin_step(self, first: bool = False) -> dict[str, Any] | None:
        """Ask for this step's quorum (healing from a peer first if behind). Returns what
        changed, for a `Quorum` event, or None when the membership is the same.

        `first` on a cold start (every instance launched together, none joining live peers):
        wait, up to `COLD_START_WAIT`, until every instance is in the quorum. The lighthouse
        forms a quorum `JOIN_TIMEOUT_MS` after the first request, so replicas that start a
        little apart would otherwise train the first steps in separate groups, which agree on
        the step count but not, to the last bit, on the weights."""
        t0 = time.perf_counter()
        before = self.manager.current_step()
        self.manager.start_quorum()
        if first and not self.elastic.join:
            deadline = time.monotonic() + COLD_START_WAIT
            while self._again(
                self.manager.num_participants() < self.elastic.instances and time.monotonic() < deadline
            ):
                time.sleep(0.05)  # a poll of the lighthouse, which has no "wait for N" request
                self.manager.start_quorum()
        wait_s = time.perf_counter() - t0
        self.committed_this_step = None
        self.local = 0
        if self.windowed:  # what a failed window returns to (ddp never applies a failed step)
            self._window_start = copy.deepcopy(self._snapshot_fn())
            self._start_params = [p.detach().clone() for p in self.params]
        self._t_compute = time.perf_counter()
        self._compute_s = 0.0
        rank = self.manager.participating_rank()
        self.replicas = max(1, self.manager.num_participants())
        self.replica = rank if rank is not None else 0
        healed = self.manager.current_step() != before and before >= 0 and self.manager._healing is False
        group = self.manager._quorum_id  # the process group's id (`Communicators`)
        if group == self.group_id and not healed:
            return None
        self.group_id = group
        return {
            "step": self.step,
            "replicas": self.replicas,
            "replica": rank,
            "quorum_id": self.lighthouse_quorum_id,
            "healed": healed,
            "heal_s": wait_s if healed else None,
            "wait_s": wait_s,
        }

    def _again(self, wanted: bool) -> bool:
        """Every rank of the group asks for a quorum the same number of times (the Manager's
        server waits for all of them): rank 0's clock decides."""
        return self.group.agree(wanted) if self.group is not None else wanted

    @property
    def window_open(self) -> bool:
        """Whether the next step continues the current window (no quorum is asked before it)."""
        return self.windowed and 0 < self.local < self.sync.every

    def end_step(self, last: bool) -> bool | None:
        """After the user's step. ddp: whether the step committed. Windowed: None while the
        window goes on (the step counts locally), then whether the window committed (`last`:
        the job's final step closes the window early). A step without `opt.step()` is a
        mistake spotnb cannot repair (the group would never advance): say so."""
        if self.committed_this_step is None:
            raise RuntimeError(
                "with instances > 1, call opt.step() on the optimizer ctx.replicate() returned "
                "once in every step: it is where the replicas average their gradients and agree "
                "that the step counts"
            )
        self.committed_this_step = None
        if not self.windowed:
            ok = self._ddp_ok
            if ok:
                self.sync.step += 1
                self._decide()
            else:
                self.failed_steps += 1
            return ok
        self.local += 1
        if self.local < self.sync.every and not last:
            return None
        ok = self._sync_window()
        if ok:
            self.sync.step += self.local
            self._decide()
        else:
            self.failed_steps += 1
            self._restore_fn(self._window_start)  # undo the window: it is redone
        self.local = 0
        return ok

    def _stats(self) -> torch.Tensor:
        """This replica's (compute seconds per step, seconds of the last all-reduce): averaged
        with the payload so every replica holds the same figures for `choose_sync`."""
        steps = max(1, self.local if self.windowed else 1)
        return torch.tensor([self._compute_s / steps, self.last_comm], dtype=torch.float64)

    def _allreduce(self, flat: torch.Tensor) -> torch.Tensor:
        """Average `flat` (payload, then the stats) over the quorum; returns the averaged stats."""
        if self.link_delay:
            time.sleep(self.link_delay)  # the local market's emulated slow link (latency)
        stats = self._stats().to(flat.dtype) if self.sync.auto else None
        buf = torch.cat([flat, stats]) if stats is not None else flat
        self.manager.allreduce(buf).wait()
        if stats is not None:
            flat.copy_(buf[: flat.numel()])
            return buf[flat.numel() :].to(torch.float64)
        return torch.zeros(2, dtype=torch.float64)

    def _sample(self, stats: torch.Tensor, t0: float) -> None:
        self.last_comm = time.perf_counter() - t0
        if self.sync.auto and float(stats[0]) > 0.0:
            self.sync.samples = [*self.sync.samples, (float(stats[0]), float(stats[1]))][-8:]

    def _decide(self) -> None:
        """`auto`: after a commit, every replica applies the same rule to the same figures."""
        self.switched = None
        if not self.sync.auto:
            return
        before = (self.sync.mode, self.sync.every)
        after = choose_sync(before[0], before[1], self.sync.samples)
        if after != before:
            compute, comm = self.sync.samples[-1]
            self.sync.mode, self.sync.every = after
            self.sync.samples = []  # measure the new mode afresh
            self.switched = {
                "step": self.sync.step,
                "sync": after[0],
                "every": after[1],
                "was": before[0],
                "compute_s": compute,
                "comm_s": comm,
            }

    def average_gradients_and_commit(self, params: list[torch.Tensor]) -> bool:
        """ddp: all-reduce (average) every gradient over the quorum in one flat buffer, then ask
        the group whether the step counts; a failure anywhere makes every member redo it."""
        self._compute_s += time.perf_counter() - self._t_compute
        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        stats = torch.zeros(2, dtype=torch.float64)
        flat = None
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads] + self._buffer_parts(grads[0].dtype))
            if self.group is not None:
                self.group.average(flat)  # inside the instance first (DDP), then across
            stats = self._allreduce(flat)
            offset = 0
            for p, g in zip(params, grads, strict=True):
                n = g.numel()
                chunk = flat[offset : offset + n].view_as(g)
                if p.grad is None:
                    p.grad = chunk.clone()
                else:
                    p.grad.copy_(chunk)
                offset += n
        ok = bool(self.manager.should_commit())
        if ok and flat is not None:
            self._take_buffers(flat[offset:])
        self._sample(stats, t0)
        self._ddp_ok = ok
        self.committed_this_step = True
        self._t_compute = time.perf_counter()
        self._compute_s = 0.0
        return ok

    def _buffer_parts(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """The model's floating-point buffers (BatchNorm's running statistics), flat, to be
        averaged with the payload: each replica's forward passes saw only its share of the
        batch, so without this the replicas' statistics drift apart (PyTorch's DDP broadcasts
        rank 0's instead; an average keeps every replica's data in them)."""
        return [b.detach().reshape(-1).to(dtype) for b in self.buffers]

    def _take_buffers(self, averaged: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for b in self.buffers:
                n = b.numel()
                b.copy_(averaged[offset : offset + n].view_as(b))
                offset += n

    def local_step(self) -> None:
        """Windowed modes: the user's optimizer stepped locally (nothing leaves the replica)."""
        self.committed_this_step = True

    def _sync_window(self) -> bool:
        """The window's end: local SGD averages the weights, DiLoCo the pseudo-gradients
        (start − now) and takes the outer step from the start; both only if the group commits."""
        self._compute_s += time.perf_counter() - self._t_compute
        t0 = time.perf_counter()
        params = self.params
        if self.sync.mode == "diloco":
            parts = [(s - p.detach()).reshape(-1) for s, p in zip(self._start_params, params, strict=True)]
        else:
            parts = [p.detach().reshape(-1) for p in params]
        flat = torch.cat(parts + self._buffer_parts(parts[0].dtype if parts else torch.float32))
        stats = self._allreduce(flat)
        ok = bool(self.manager.should_commit())
        self._sample(stats, t0)
        if ok:
            self._take_buffers(flat[sum(p.numel() for p in params) :])
            offset = 0
            outer = self.sync.outer_optimizer(params) if self.sync.mode == "diloco" else None
            with torch.no_grad():
                for i, p in enumerate(params):
                    n = p.numel()
                    chunk = flat[offset : offset + n].view_as(p)
                    if outer is not None:
                        p.copy_(self._start_params[i])
                        p.grad = chunk.clone()
                    else:
                        p.copy_(chunk)
                    offset += n
            if outer is not None:
                outer.step()
                outer.zero_grad(set_to_none=True)
        self._t_compute = time.perf_counter()
        self._compute_s = 0.0
        return ok

    def leave(self) -> None:
        """Stop taking part (after a notice, a request to move, or at the end): the lighthouse
        drops this replica from the next quorum without a failed step (its peers wait at most
        `JOIN_TIMEOUT_MS` for it)."""
        try:
            self.manager.shutdown(wait=False)
        except Exception as exc:  # noqa: BLE001 - leaving must not fail the exit
            log.warning("leaving the quorum: %r", exc)


class _WrappedOptimizer(torch.optim.Optimizer):
    """An optimizer that is the user's (its state, groups and state dict are the wrapped
    one's, so `ctx.track` and checkpoints see the user's optimizer) with its own `step`."""

    optim: torch.optim.Optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optim.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optim.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optim.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optim.add_param_group(param_group)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optim!r})"


class GroupOptimizer(_WrappedOptimizer):
    """The user's optimizer on one instance with several processes (`ctx.replicate` with
    instances=1): each `step()` averages the gradients and float buffers over the group (one
    flat all-reduce, as DDP's), then steps. A member that dies ends the group: the job
    restores from the store, so nothing needs a commit protocol here."""

    def __init__(self, optim: torch.optim.Optimizer, group: Group, buffers: list[torch.Tensor]) -> None:
        # deliberately not calling Optimizer.__init__: every attribute is the wrapped one's
        self.optim, self._group, self._buffers = optim, group, buffers

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("optimizers that use a closure (LBFGS) cannot be replicated step by step")
        params = [p for group in self.optim.param_groups for p in group["params"] if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if grads:
            dtype = grads[0].dtype
            flat = torch.cat(
                [g.reshape(-1) for g in grads] + [b.detach().reshape(-1).to(dtype) for b in self._buffers]
            )
            self._group.average(flat)
            offset = 0
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    n = g.numel()
                    chunk = flat[offset : offset + n].view_as(g)
                    if p.grad is None:
                        p.grad = chunk.clone()
                    else:
                        p.grad.copy_(chunk)
                    offset += n
                for b in self._buffers:
                    n = b.numel()
                    b.copy_(flat[offset : offset + n].view_as(b))
                    offset += n
        self.optim.step()


class ReplicatedOptimizer(_WrappedOptimizer):
    """The user's optimizer, stepped only when the whole quorum agrees (ctx.replicate)."""

    def __init__(self, optim: torch.optim.Optimizer, replication: Replication) -> None:
        # deliberately not calling Optimizer.__init__: every attribute is the wrapped one's
        self.optim, self._replication = optim, replication
        replication.params = [p for g in optim.param_groups for p in g["params"] if p.requires_grad]

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("optimizers that use a closure (LBFGS) cannot be replicated step by step")
        rep = self._replication
        params = [p for group in self.optim.param_groups for p in group["params"] if p.requires_grad]
        rep.params = params
        if rep.windowed:
            self.optim.step()
            rep.local_step()
        elif rep.average_gradients_and_commit(params):
            self.optim.step()
