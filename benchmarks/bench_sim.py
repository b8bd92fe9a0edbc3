"""Simulator throughput, and the policy-gain table (plain script; prints, asserts nothing).

    python benchmarks/bench_sim.py            # throughput
    python benchmarks/bench_sim.py --gains    # markdown table for benchmarks/POLICY_GAINS.md

1. Job-runs per second for a 100,000-step job with MTTP = 3 h (goal >= 10,000 runs/s, one core).
2. Milliseconds per run for a 30-day job with ~10,000 preemptions (goal <= 10 ms per run).

Each line says which engine ran ("batch": vectorised, "event": run by run); `--event` times
the event-by-event reference engine on the same scenarios for comparison.
"""

from __future__ import annotations

import sys
import time

from spotnb.policy import Hedged, Static
from spotnb.sim import Scenario, example_scenario, simulate

GPU = dict(
    step_time=(0.8, 1.2),
    save_time=(15, 25),
    backup_time=(60, 120),
    alloc_time=(86, 243),
    prep_time=(60, 120),
    mttp=3 * 3600.0,
    spot_price=2.3,
    on_demand_price=6.2,
)


ENGINE = "event" if "--event" in sys.argv else "auto"


def rate(scenario: Scenario, policy: str, runs: int) -> tuple[float, dict[str, float], str]:
    simulate(scenario, policy, runs=max(1, runs // 20), engine=ENGINE)  # warm up
    t0 = time.perf_counter()
    res = simulate(scenario, policy, runs=runs, seed=1, engine=ENGINE)
    return (time.perf_counter() - t0) / runs, res.mean, res.engine


def main() -> None:
    print("1) 100,000 steps, MTTP 3 h")
    for grace, label in (
        (30.0, "Azure grace 30 s: insurance saves"),
        (120.0, "AWS grace 120 s: emergency saves only"),
    ):
        sc = Scenario(steps=100_000, grace=grace, **GPU)  # type: ignore[arg-type]
        for policy in ("static:1000", "adaptive", "hedged"):
            per_run, mean, engine = rate(sc, policy, 20_000)
            print(
                f"   {label:<40} {policy:<12} {1 / per_run:9,.0f} runs/s [{engine}]  "
                f"({mean['preemptions']:.1f} preemptions, {mean['saves']:.0f} saves per run)"
            )
    print("2) 30-day job, ~10,000 preemptions")
    sc = Scenario(
        steps=30 * 86_400,
        step_time=1.0,
        save_time=2.0,
        backup_time=3.0,
        alloc_time=(2, 8),
        prep_time=(2, 6),
        grace=30.0,
        mttp=255.0,
    )
    for policy in ("adaptive", "hedged", "static:600"):
        per_run, mean, engine = rate(sc, policy, 100)
        print(
            f"   {policy:<12} {per_run * 1e3:7.2f} ms/run [{engine}]  "
            f"({mean['preemptions']:,.0f} "
            f"preemptions, {mean['saves']:,.0f} saves, total {mean['total'] / 86400:.1f} d)"
        )


def gains(runs: int = 2000, seed: int = 0) -> None:
    """Hedged vs Adaptive (and the best static interval, by grid search) on the bundled
    scenarios; same seed for all, so every policy faces the same preemptions."""
    print(
        "| scenario | adaptive total (h) | hedged total (h) | time saved | adaptive $ | "
        "hedged $ | hedged w/o prealloc (h) | best static (h) | on-demand $ |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("gpu-azure", "gpu-aws", "long-steps", "p3-trace"):
        sc = example_scenario(name)
        a = simulate(sc, "adaptive", runs=runs, seed=seed).mean
        h = simulate(sc, "hedged", runs=runs, seed=seed).mean
        hn = simulate(sc, Hedged(prealloc=False), runs=runs, seed=seed).mean
        best = min(simulate(sc, Static(n), runs=runs // 4, seed=seed).mean["total"] for n in _grid(sc))
        print(
            f"| {name} | {a['total'] / 3600:.2f} | {h['total'] / 3600:.2f} | "
            f"{(1 - h['total'] / a['total']) * 100:.1f} % | {a['cost']:.2f} | {h['cost']:.2f} | "
            f"{hn['total'] / 3600:.2f} | {best / 3600:.2f} | {a['on_demand_cost']:.2f} |"
        )


def _grid(sc: Scenario) -> list[int]:
    steps = sc.steps
    return sorted({max(1, int(steps / k)) for k in (2, 5, 10, 20, 40, 70, 100, 150, 200, 300, 500, 1000)})


if __name__ == "__main__":
    if "--gains" in sys.argv:
        gains()
    else:
        main()
