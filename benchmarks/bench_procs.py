"""Several processes per instance (`Config.procs_per_instance`): what the group costs and gives.

    python benchmarks/bench_procs.py [--steps 200] [--procs 2]

One instance of the local market trains the same MLP on the same global batch per step, once
with one process and once with `--procs` processes (each takes its share of the batch, one
intra-op thread each, gradients averaged over the group every step). Printed: start-up (the
instance's launch to `ready`: the other ranks' imports and torch.distributed's rendezvous),
the steady step time (median of the progress events between ready and done) and the ratios.
One run on one machine; on two shared cores a second process cannot give twice the speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def mlp(ctx: Any, steps: int, batch: int = 512, width: int = 512) -> float:
    """An MLP on a batch that is a function of the step; each rank takes its slice of it."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    share = batch // ctx.local_world_size
    loss = torch.zeros(())
    for step in ctx.steps(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(batch, width, generator=g)[ctx.local_rank * share : (ctx.local_rank + 1) * share]
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=float(loss))
    return float(loss)


def run(procs: int, steps: int) -> dict[str, float]:
    import functools

    import spotnb as spot

    job = spot.train(
        functools.partial(mlp, steps=steps),
        spot.Config(procs_per_instance=procs, local_alloc_delay=0.1, checkpoint="static:100000"),
    )
    job.result(timeout=600)
    events = list(job.events)
    launched = next(e["t"] for e in events if e["kind"] == "launched")
    ready = next(e["t"] for e in events if e["kind"] == "ready")
    times = [r["t"] for e in events if e["kind"] == "metrics" for r in e["rows"] if "loss" in r]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return {"startup_s": ready - launched, "step_s": statistics.median(gaps) if gaps else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--procs", type=int, default=2)
    args = parser.parse_args()
    t0 = time.time()
    one = run(1, args.steps)
    many = run(args.procs, args.steps)
    print(f"{'':24}{'1 process':>12}{f'{args.procs} processes':>14}{'ratio':>8}")
    for key, label in (("startup_s", "start-up (launch→ready)"), ("step_s", "step time (median)")):
        print(f"{label:24}{one[key]:>11.3f}s{many[key]:>13.3f}s{many[key] / one[key]:>8.2f}")
    print(f"(whole benchmark {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
