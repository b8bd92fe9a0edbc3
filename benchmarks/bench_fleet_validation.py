"""The fleet simulator (`spotnb.sim.fleet`, behind `spotnb plan`) against real runs of the
local market: same scenario, means side by side (the issue's goal: within 10 %).

1. A calm run (no preemptions) measures what the simulator takes as inputs: the per-step
   overhead of the all-reduce and quorum (`sync_time`), allocation and preparation times.
2. `--runs` local-market runs with exponential preemptions (`local_mttp`) per instance.
3. The simulator, same parameters, many runs.

Printed: wall time (first step to done), preemptions and instance-seconds per run, local
mean ± standard error against the simulator's mean, and their ratio.

    python benchmarks/bench_fleet_validation.py [--instances 3] [--mttp 12] [--steps 400] [--runs 6]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))


def local_run(instances: int, steps: int, step_time: float, mttp: float | None, seed: int) -> dict[str, Any]:
    from _elastic_workload import spotnb_fit_share

    import spotnb as spot

    config = spot.Config(
        instances=instances,
        local_mttp=mttp,
        local_grace=0,  # kills without notice, as the simulator models them
        local_seed=seed,
        local_alloc_delay=0.2,
        ship_modules=["_elastic_workload"],
    )
    job = spot.train(functools.partial(spotnb_fit_share, steps=steps, step_time=step_time), config)
    job.result(timeout=1800)
    ev = job.events
    first = min(e["t"] for e in ev if e["kind"] == "ready")
    done = min(e["t"] for e in ev if e["kind"] == "done")
    allocs = [e["alloc_s"] for e in ev if e["kind"] == "allocated"]
    preps = [e["prep_s"] for e in ev if e["kind"] == "ready"]
    b = job.breakdown()
    # kill → the replacement in the same slot trains: detection, allocation, start, heal
    slot = {e["incarnation"]: e["slot"] for e in ev if e["kind"] == "allocating"}
    ready = sorted((e["t"], slot.get(e["incarnation"])) for e in ev if e["kind"] == "ready")
    replace = [
        next(t for t, k in ready if k == slot.get(e["incarnation"]) and t > e["t"]) - e["t"]
        for e in ev
        if e["kind"] == "preempted" and any(k == slot.get(e["incarnation"]) and t > e["t"] for t, k in ready)
    ]
    return {
        "replace": replace,
        "wall": done - first,
        # the simulator starts with every instance up: count what happens from the first step
        "preemptions": sum(1 for e in ev if e["kind"] == "preempted" and e["t"] >= first),
        "alloc": statistics.mean(allocs),
        "prep": statistics.mean(preps),
        "instance_s": b.total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--mttp", type=float, default=12.0, help="seconds, per instance")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--step-time", type=float, default=0.06, help="global step on one replica, s")
    ap.add_argument("--runs", type=int, default=6)
    args = ap.parse_args()
    from spotnb.sim.fleet import simulate_fleet
    from spotnb.sim.scenario import Scenario

    calm = local_run(args.instances, args.steps, args.step_time, None, 0)
    sync = max(0.0, calm["wall"] / args.steps - args.step_time / args.instances)
    print(
        f"calm run: {calm['wall']:.1f} s for {args.steps} steps on {args.instances} instances → "
        f"overhead {sync * 1000:.1f} ms/step; allocation {calm['alloc']:.2f} s, "
        f"preparation {calm['prep']:.2f} s"
    )
    runs = [
        local_run(args.instances, args.steps, args.step_time, args.mttp, 100 + i) for i in range(args.runs)
    ]
    alloc = statistics.mean(r["alloc"] for r in runs)
    prep = statistics.mean(r["prep"] for r in runs)
    replaced = [x for r in runs for x in r["replace"]]
    replace = statistics.mean(replaced) if replaced else alloc + prep
    join = max(0.05, replace - alloc - prep)  # what allocation and start do not explain
    print(f"a replacement trains {replace:.2f} s after the kill (allocation {alloc:.2f}, start {prep:.2f})")
    sc = Scenario(
        steps=args.steps,
        step_time=args.step_time,
        alloc_time=alloc,
        prep_time=prep,
        mttp=args.mttp,
        spot_price=3600.0,  # $1 per instance-second: cost = instance-seconds
        save_time=0.01,
    )
    sims = [
        simulate_fleet(sc, args.instances, random.Random(i), sync_time=sync, join_time=join)
        for i in range(400)
    ]
    rows = [
        ("wall s (first step → done)", [r["wall"] for r in runs], [s.wall for s in sims]),
        ("preemptions", [float(r["preemptions"]) for r in runs], [float(s.preemptions) for s in sims]),
    ]
    print(f"\n{args.runs} local runs vs 400 simulated, mttp {args.mttp:.0f} s per instance")
    print(f"{'':<28} {'local mean ± se':>18} {'simulated':>10} {'sim ÷ local':>12}")
    for name, loc, sim in rows:
        m = statistics.mean(loc)
        se = statistics.stdev(loc) / math.sqrt(len(loc)) if len(loc) > 1 else 0.0
        s = statistics.mean(sim)
        print(f"{name:<28} {m:>10.2f} ± {se:<6.2f} {s:>10.2f} {s / m if m else math.nan:>12.2f}")


if __name__ == "__main__":
    main()
