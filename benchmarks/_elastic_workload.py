"""The workload both sides of benchmarks/bench_elastic.py train: the same model, the same
global batch per step (split among whoever trains the step), the same step time."""

from __future__ import annotations

import time
from typing import Any

import torch

GLOBAL_BATCH = 96
STEP_SLEEP = 0.03  # stands in for the GPU time of a step (this machine has two CPU cores)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )


def batch(step: int, replica: int, replicas: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This replica's share of step `step`'s global batch (the same whatever the membership)."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 64, generator=g)
    y = torch.randint(0, 10, (GLOBAL_BATCH,), generator=g)
    lo, hi = replica * GLOBAL_BATCH // replicas, (replica + 1) * GLOBAL_BATCH // replicas
    return x[lo:hi], y[lo:hi]


def spotnb_fit(ctx: Any, steps: int = 300) -> dict[str, float]:
    """The spotnb side: ctx.replicate over the job's instances."""
    torch.set_num_threads(1)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    loss = torch.tensor(0.0)
    for step in ctx.steps(steps):
        x, y = batch(step, ctx.replica, ctx.replicas)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
        time.sleep(STEP_SLEEP)
    return {"loss": float(loss.item())}


def teacher_batch(step: int, replica: int, replicas: int, size: int = GLOBAL_BATCH) -> tuple[Any, Any]:
    """A learnable task (labels from a fixed random teacher network), for comparing how well
    the sync strategies train, not only how fast: this replica's share of step `step`."""
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(size, 64, generator=g)
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(64, 10, generator=teacher)
    y = (x @ w).argmax(dim=1)
    lo, hi = replica * size // replicas, (replica + 1) * size // replicas
    return x[lo:hi], y[lo:hi]


def spotnb_fit_teacher(ctx: Any, steps: int = 200, step_sleep: float = 0.0) -> dict[str, float]:
    """benchmarks/bench_sync.py: the teacher task, evaluated at the end on a held-out batch."""
    torch.set_num_threads(1)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(steps):
        x, y = teacher_batch(step, ctx.replica, ctx.replicas)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
        if step_sleep:
            time.sleep(step_sleep)
    x, y = teacher_batch(10**9, 0, 1, size=2048)
    with torch.no_grad():
        held_out = torch.nn.functional.cross_entropy(model(x), y).item()
    return {"held_out_loss": held_out}


def spotnb_fit_share(ctx: Any, steps: int = 400, step_time: float = 0.06) -> dict[str, int]:
    """benchmarks/bench_fleet_validation.py: the simulator's model of a step made real — the
    global batch takes `step_time` on one replica, so each of k replicas spends step_time / k."""
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(steps):
        x = torch.ones(4, 16) * (step % 5)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
        time.sleep(step_time / ctx.replicas)
    return {"step": ctx.step_index}
