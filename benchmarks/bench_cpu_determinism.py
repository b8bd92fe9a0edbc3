"""Is a CPU training step bit-reproducible under load? Prints, for N concurrent local-market
jobs with no preemption, how many logged a loss curve that differs from the same loop run
alone in this process: with PyTorch's default intra-op threads and with one thread.

Why it matters: spotnb's exact-resume guarantee compares a preempted run with an
uninterrupted one. When the arithmetic itself is not reproducible (MKL on a loaded CPU with
more than one thread), the two differ from the first step, before any preemption, and a
bit-exact test would blame resume. Seen here: 16 of 16 jobs diverged (1 ulp) with 2 threads,
0 of 16 with one.

    SPOTNB_HOME=$(mktemp -d) python benchmarks/bench_cpu_determinism.py --jobs 16
"""

from __future__ import annotations

import argparse
import functools
import random
from typing import Any

import spotnb as spot


def fit(ctx: Any, threads: int = 0, steps: int = 30) -> int:
    import random as rnd

    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    rnd.seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 512),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 1),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(steps):
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(step))
        y = x[:, :1] * 2 + rnd.random() * 0.01
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
    return torch.get_num_threads()


class _Alone:
    """The same loop in this process, unloaded: the reference curve."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def track(self, **_: Any) -> None:
        pass

    def steps(self, n: int) -> range:
        return range(n)

    def log(self, loss: float) -> None:
        self.losses.append(loss)


def run(threads: int, jobs: int) -> tuple[int, int]:
    alone = _Alone()
    fit(alone, threads=threads)
    config = spot.Config(checkpoint="static:1000", local_alloc_delay=0.01)
    started = [spot.train(functools.partial(fit, threads=threads), config) for _ in range(jobs)]
    diverged, used = 0, 0
    for job in started:
        used = job.result(timeout=900)
        diverged += [v for _, v in job.metrics["loss"]] != alone.losses
    return diverged, used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    args = parser.parse_args()
    random.seed(0)
    for threads in (0, 1):
        diverged, used = run(threads, args.jobs)
        label = "default threads" if not threads else "1 thread"
        print(
            f"{label:>16} ({used} in the jobs): {diverged}/{args.jobs} jobs diverged from the "
            f"unloaded run ({diverged / args.jobs:.0%})"
        )


if __name__ == "__main__":
    main()
