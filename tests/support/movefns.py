"""Job functions of tests/control/test_fleet_moves.py (shipped by value to the instances)."""

from __future__ import annotations

from typing import Any

from tests.support import jobfns


def paced_dp(ctx: Any, steps: int, first: int, slow: float) -> dict[str, Any]:
    """`jobfns.exact_dp`, each step `slow` seconds longer in incarnations 1..`first` (the
    replicas launched with the job) and not in their successors."""
    import time

    import torch

    torch.set_num_threads(1)
    width = 8
    model = torch.nn.Linear(width, 1, bias=False).double()
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(steps):
        r, n = ctx.replica, ctx.replicas
        mine = [i for i in range(width) if i % n == r]
        x = torch.zeros(len(mine), width, dtype=torch.float64)
        for row, i in enumerate(mine):
            x[row, i] = float(jobfns.exact_c(step, i))
        loss = -(model(x).sum() * n / width) if mine else model.weight.sum() * 0.0
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=float(loss.item()), replicas=n)
        if ctx.incarnation <= first:
            time.sleep(slow)
    weights = model.weight.detach().flatten().tolist()
    ctx.log(final=sum(w * (k + 1) for k, w in enumerate(weights)))
    return {"weights": weights, "step": ctx.step_index}
