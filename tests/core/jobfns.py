"""Training functions the core tests ship to local instances (importable by the agent, since
the tests run from the repository root; cloudpickle ships them by reference or value)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any


def seeded_mlp(ctx: Any, steps: int = 200, width: int = 512, step_delay: float = 0.0) -> dict[str, Any]:
    """An MLP with dropout and Adam: exercises model, optimizer and torch/python RNG restore.

    One intra-op thread: with two, MKL's float results on a heavily loaded CPU differ from an
    idle run in the last bit from the first step on (measured: 16 of 16 concurrent jobs
    diverged at 1 ulp with 2 threads, 0 of 16 with 1, before any preemption), which a
    bit-exact comparison with the reference run would blame on resume."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, width),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 32, generator=g)
        y = x[:, :1] * 2 + random.random() * 0.01  # python RNG is restored too
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
        if step_delay:
            time.sleep(step_delay)
    return {"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "loss": loss.item()}


def slow_steps(ctx: Any, steps: int = 400, step_time: float = 0.02) -> int:
    """Small state, steps of known duration: for notice and breakdown tests."""
    import torch

    model = torch.nn.Linear(8, 8)
    ctx.track(model=model)
    for step in ctx.steps(steps):
        time.sleep(step_time)
        ctx.log(step_value=float(step))
    return ctx.step_index


def fails_at(ctx: Any, step_fail: int = 5) -> None:
    for step in ctx.steps(100):
        if step == step_fail:
            raise ValueError(f"bad batch at step {step}")


def low_level(ctx: Any, steps: int = 60, path: str = "my_ckpt.txt") -> int:
    """The low-level API: the script writes its own checkpoint file and backs it up."""
    import os

    total = 0
    restored = ctx.restore()
    if restored is not None and os.path.exists(path):
        total = int(Path(path).read_text())
    while ctx.step_index < steps:
        with ctx.step() as i:
            total += i
            time.sleep(0.01)
        if ctx.should_save():
            with open(path, "w") as f:
                f.write(str(total))
            ctx.backup(path)
    return total
