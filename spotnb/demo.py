"""`spotnb demo`: the quickstart. A small real PyTorch model (an MLP on a two-spiral dataset
generated here, no download) trained on the local spot market with injected preemptions."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

__all__ = ["spirals", "fit_spirals", "run_demo"]


def spirals(n: int = 2048, seed: int = 0) -> tuple[Any, Any]:
    """Two interleaved spirals: a classic that a linear model cannot fit but a small MLP can."""
    import torch

    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n // 2, generator=g) * 3 * math.pi + 0.5
    noise = lambda: 0.15 * torch.randn(n // 2, generator=g)  # noqa: E731
    a = torch.stack([t * torch.cos(t) + noise(), t * torch.sin(t) + noise()], 1) / 10
    b = -a
    x = torch.cat([a, b])
    y = torch.cat([torch.zeros(n // 2), torch.ones(n // 2)]).long()
    return x, y


def fit_spirals(ctx: Any, steps: int = 1500, batch: int = 128, step_delay: float = 0.0) -> dict[str, float]:
    """The training function shipped to the instance. Batches depend on the step only, so a
    resumed run sees exactly the batches an uninterrupted one would."""
    import torch

    torch.manual_seed(0)
    x, y = spirals()
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 2),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    ctx.track(model=model, optimizer=opt, scheduler=sched)
    loss = torch.tensor(0.0)
    for step in ctx.steps(steps):
        g = torch.Generator().manual_seed(step)
        idx = torch.randint(0, len(x), (batch,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        ctx.log(loss=loss.item(), lr=sched.get_last_lr()[0])
        if step_delay:
            time.sleep(step_delay)  # stands in for a GPU step's duration
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    return {"loss": float(loss.item()), "accuracy": acc}


def run_demo(steps: int = 1500, step_delay: float = 0.01, out: Any = sys.stdout) -> int:
    import functools

    import spotnb as spot

    config = spot.Config(
        name="spirals-demo",
        provider="local",
        instance_type="g4dn.xlarge",
        save_every=250,
        # by step, not by clock: a notice that came while an instance was still starting
        # would leave nothing to save, and the story would not be the one told
        local_schedule=[
            {"step": steps // 6, "notice": True},
            {"step": steps // 3, "notice": True},
            {"step": steps * 2 // 3, "phase": "step"},
        ],
        local_grace=2.5,
        notice_poll=0.2,
        checkpoint="hedged",
    )
    print("spotnb demo: an MLP on two spirals, on the local spot market (3 preemptions injected)", file=out)
    job = spot.train(functools.partial(fit_spirals, steps=steps, step_delay=step_delay), config)
    print(f"job {job.id} submitted; following it (Ctrl-C leaves it running)", file=out)
    from spotnb.views.widget.text import TextView

    TextView(job, file=out, interval=2.0)
    job.wait()
    try:
        result = job.result()
    except spot.SpotnbError as exc:
        print(f"job ended {job.status}: {exc}", file=out)
        return 1
    print(f"\nresult: {result}", file=out)
    print(job.breakdown().table(), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(run_demo(steps=int(os.environ.get("SPOTNB_DEMO_STEPS", "1500"))))
