"""How fast the local market starts instances, cold and from its zygote. Prints measured
figures; asserts nothing.

    python benchmarks/bench_instance_start.py [--kills 3] [--repeat 2]

A small job (a linear model, 40 steps) is killed at steps 10, 20, … (`local_schedule`), so it
runs on kills + 1 instances. Each instance's `started.boot_s` (its process start to the agent
ready) and the whole job's wall time are printed for `SPOTNB_LOCAL_ZYGOTE=0` (every instance a
process of its own, importing torch) and the default (instances forked from the market's
zygote). Goal: replacements start in well under
a second, and a job with k preemptions costs about k fewer `import torch`es.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fn(ctx, steps: int = 40) -> int:  # noqa: ANN001 - the job's function
    import torch

    model = torch.nn.Linear(8, 8)
    ctx.track(model=model)
    for step in ctx.steps(steps):
        ctx.log(value=float(step))
    return ctx.step_index


def _run(kills: int, zygote: bool) -> tuple[float, list[float]]:
    import spotnb as spot

    os.environ["SPOTNB_LOCAL_ZYGOTE"] = "1" if zygote else "0"
    t0 = time.perf_counter()
    job = spot.train(
        functools.partial(_fn, steps=10 * (kills + 2)),
        spot.Config(local_schedule=[{"step": 10 * (k + 1)} for k in range(kills)], local_alloc_delay=0.0),
    )
    job.result(timeout=600)
    wall = time.perf_counter() - t0
    boots = [e["boot_s"] for e in job.events if e["kind"] == "started"]
    return wall, boots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("SPOTNB_HOME", tempfile.mkdtemp(prefix="spotnb-bench-"))
    print(f"load average {os.getloadavg()[0]:.1f}; {args.kills} kills, {args.kills + 1} instances per job")
    for zygote in (False, True, False, True)[: 2 * args.repeat]:
        wall, boots = _run(args.kills, zygote)
        name = "zygote" if zygote else "cold  "
        print(
            f"{name}  job {wall:6.2f} s wall   boot_s first {boots[0]:5.2f}  "
            f"replacements median {statistics.median(boots[1:]) if boots[1:] else float('nan'):5.2f}"
        )


if __name__ == "__main__":
    main()
