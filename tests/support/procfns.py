"""Job functions for `test_procs.py` (shipped by value: `Config.ship_modules`)."""

from __future__ import annotations

import os
import time
from typing import Any


def exact_c(step: int, i: int) -> int:
    return (step % 7) + i + 1


def expected(steps: int, width: int = 8) -> list[float]:
    """The weights after `steps` steps, each step's global batch applied exactly once."""
    return [sum(exact_c(s, i) for s in range(steps)) / width for i in range(width)]


def group_dp(
    ctx: Any, steps: int, out: str, step_delay: float = 0.02, width: int = 8, fail: int | None = None
) -> dict[str, Any]:
    """`jobfns.exact_dp` over every process of every instance: the global batch of a step is
    split by (replica, local rank), every value a multiple of 1/8, so the final weights say to
    the bit whether each step was applied exactly once. Every rank saves its final weights to
    `out/<incarnation>-<local rank>.pt`. Ranks other than 0 start from different weights
    (ctx.replicate must give them rank 0's). `fail`: local rank 1 raises at that step."""
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Linear(width, 1, bias=False).double()
    torch.nn.init.constant_(model.weight, float(ctx.local_rank))  # rank 0: zeros
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(steps):
        if step == fail and ctx.local_rank == 1:
            raise ValueError(f"rank 1 cannot go on at step {step}")
        shards = ctx.replicas * ctx.local_world_size
        me = ctx.replica * ctx.local_world_size + ctx.local_rank
        mine = [i for i in range(width) if i % shards == me]
        x = torch.zeros(len(mine), width, dtype=torch.float64)
        for row, i in enumerate(mine):
            x[row, i] = float(exact_c(step, i))
        loss = -(model(x).sum() * shards / width) if mine else model.weight.sum() * 0.0
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=float(loss.item()), replicas=ctx.replicas)
        if step_delay:
            time.sleep(step_delay)
    weights = model.weight.detach().clone()
    torch.save(weights, os.path.join(out, f"{ctx.incarnation}-{ctx.local_rank}.pt"))
    return {"weights": weights.flatten().tolist(), "step": ctx.step_index, "ranks": ctx.local_world_size}


def sharded_mlp(
    ctx: Any, steps: int, out: str, step_delay: float = 0.02, hold_at: int | None = None
) -> dict[str, Any]:
    """A small MLP sharded over the instance's processes with FSDP2's `fully_shard` (gloo,
    CPU), trained with Adam on batches drawn from each rank's own RNG (seeded differently per
    rank), so an exact resume needs the shards, the optimizer's state and every rank's RNG.
    Every rank saves the full weights at the end to `out/<incarnation>-<local rank>.pt`.
    `hold_at`: in the first incarnation every rank waits at that step until the market kills
    the instance (at most 120 s; for a kill without notice: a notice reaches rank 0 only), so a
    kill scheduled there lands there, not a few steps (and saves) later on a loaded machine."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial weights on every rank, before sharding
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(100 + ctx.local_rank)  # each rank draws its own batches
    model, opt = ctx.replicate(model, opt)  # returns a sharded model unchanged
    ctx.track(model=model, optimizer=opt)
    for _step in ctx.steps(steps):
        x = torch.randn(4, 8)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=float(loss.item()))
        if step_delay:
            time.sleep(step_delay)
        if _step == hold_at and ctx.incarnation == 1:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # the market's kill ends the wait
                time.sleep(0.01)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    torch.save(full, os.path.join(out, f"{ctx.incarnation}-{ctx.local_rank}.pt"))
    return {"step": ctx.step_index, "ranks": ctx.local_world_size}


def crash_rank1(ctx: Any, at: int) -> None:
    """Local rank 1's process dies at step `at` without a word (a segfault in an extension,
    say), every incarnation."""
    import torch

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(at + 10):
        if step == at and ctx.local_rank == 1:
            os._exit(139)
        time.sleep(0.02)
