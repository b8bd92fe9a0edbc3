"""One replica of a job on several instances: fault-tolerant data parallel on torchft.

torchft's lighthouse (the job's coordinator, `spotnb.runtime.lighthouse`) computes every step
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

ARCHITECTURE.md, "Several instances", has the whole picture (what the controller does, who
writes the store's checkpoints, the group loss rate the policies use).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from spotnb.sync import SyncSpec

__all__ = ["Replication", "ReplicatedOptimizer", "Elastic"]

log = logging.getLogger("spotnb.elastic")

#: Longest a collective or a peer's state transfer may take before the step counts as failed.
COLLECTIVE_TIMEOUT = timedelta(seconds=float(os.environ.get("SPOTNB_COLLECTIVE_TIMEOUT", "30")))
#: Longest a replica waits for a quorum (below `min_instances` it waits for a replacement).
QUORUM_RETRIES = 600
QUORUM_TIMEOUT = timedelta(seconds=float(os.environ.get("SPOTNB_QUORUM_TIMEOUT", "3600")))


class Elastic:
    """What the agent knows of the job's group, from the spec and the incarnation document."""

    def __init__(
        self, *, lighthouse: str, slot: int, instances: int, min_instances: int, join: bool, sync: SyncSpec
    ) -> None:
        self.lighthouse, self.slot, self.instances = lighthouse, slot, instances
        self.min_instances, self.join, self.sync = min_instances, join, sync


class Replication:
    """This replica's membership: the torchft Manager, its process group and its own store.

    `state_fn` / `load_fn` give and take the state a recovering peer receives (the tracked
    objects and `ctx.state`); the Manager adds its step."""

    def __init__(
        self, elastic: Elastic, job_id: str, state_fn: Callable[[], Any], load_fn: Callable[[Any], None]
    ) -> None:
        from torch.distributed import TCPStore
        from torchft import Manager, ProcessGroupGloo

        self.elastic = elastic
        # the replica group's rendezvous store: one process per instance, so it is private
        self._store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        if torch.cuda.is_available():
            from torchft import ProcessGroupBabyNCCL

            pg: Any = ProcessGroupBabyNCCL(timeout=COLLECTIVE_TIMEOUT)
        else:
            pg = ProcessGroupGloo(timeout=COLLECTIVE_TIMEOUT)
        self.manager = Manager(
            pg=pg,
            load_state_dict=load_fn,
            state_dict=state_fn,
            min_replica_size=elastic.min_instances,
            use_async_quorum=False,  # the batch split must be known before the forward pass
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=self._store.port,
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
        self.replica: int = 0
        self.replicas: int = 1
        self.quorum_id = -1
        self.committed_this_step: bool | None = None  # None: the optimizer was not stepped
        self.failed_steps = 0

    @property
    def step(self) -> int:
        """The group's committed step (what a recovering peer receives with the state)."""
        return self.manager.current_step()

    def set_step(self, step: int) -> None:
        """After a restore from the store: the group's step is the checkpoint's."""
        self.manager.load_state_dict({"step": step, "batches_committed": 0})

    def begin_step(self) -> dict[str, Any] | None:
        """Ask for this step's quorum (healing from a peer first if behind). Returns what
        changed, for a `Quorum` event, or None when the membership is the same."""
        t0 = time.perf_counter()
        before = self.manager.current_step()
        self.manager.start_quorum()
        wait_s = time.perf_counter() - t0
        self.committed_this_step = None
        rank = self.manager.participating_rank()
        self.replicas = max(1, self.manager.num_participants())
        self.replica = rank if rank is not None else 0
        healed = self.manager.current_step() != before and before >= 0 and self.manager._healing is False
        quorum_id = self.manager._quorum_id
        if quorum_id == self.quorum_id and not healed:
            return None
        self.quorum_id = quorum_id
        return {
            "step": self.manager.current_step(),
            "replicas": self.replicas,
            "replica": rank,
            "quorum_id": quorum_id,
            "healed": healed,
            "heal_s": wait_s if healed else None,
            "wait_s": wait_s,
        }

    def end_step(self) -> bool:
        """After the user's step: whether it committed. A step without `opt.step()` is a
        mistake spotnb cannot repair (the group would never advance): say so."""
        if self.committed_this_step is None:
            raise RuntimeError(
                "with instances > 1, call opt.step() on the optimizer ctx.replicate() returned "
                "once in every step: it is where the replicas average their gradients and agree "
                "that the step counts"
            )
        if not self.committed_this_step:
            self.failed_steps += 1
        return self.committed_this_step

    def average_gradients_and_commit(self, params: list[torch.Tensor]) -> bool:
        """All-reduce (average) every gradient over the quorum in one flat buffer, then ask the
        group whether the step counts; a failure anywhere makes every member redo it."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.manager.allreduce(flat).wait()
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
        self.committed_this_step = ok
        return ok

    def leave(self) -> None:
        """Stop taking part (after a notice, or at the end): the lighthouse drops this replica
        from the next quorum without a failed step."""
        try:
            self.manager.shutdown(wait=False)
        except Exception as exc:  # noqa: BLE001 - leaving must not fail the exit
            log.warning("leaving the quorum: %r", exc)


class ReplicatedOptimizer(torch.optim.Optimizer):
    """The user's optimizer, stepped only when the whole quorum agrees (ctx.replicate)."""

    def __init__(self, optim: torch.optim.Optimizer, replication: Replication) -> None:
        # deliberately not calling Optimizer.__init__: every attribute is the wrapped one's
        self.optim, self._replication = optim, replication

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

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("optimizers that use a closure (LBFGS) cannot be replicated step by step")
        params = [p for group in self.optim.param_groups for p in group["params"] if p.requires_grad]
        if self._replication.average_gradients_and_commit(params):
            self.optim.step()

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optim.add_param_group(param_group)

    def __repr__(self) -> str:
        return f"ReplicatedOptimizer({self.optim!r})"
