"""How the sync strategies pay behind a slow link: one run, printed side by side.

Two instances on the local market; instance 1 sits behind an emulated slow link
(`local_link_delay`: extra latency before each of its all-reduces, as for a replacement that
landed in another region). The same model and global batches train with `sync="ddp"` (an
all-reduce every step), `"local_sgd:K"`, `"diloco:K"` and `"auto"` (starts with ddp, switches
when it measures the all-reduce against the step). Printed: wall time, steps/s, the held-out
loss at the end (what the staleness of local steps costs), and for auto when it switched.

    python benchmarks/bench_sync.py [--steps 200] [--delay 0.15] [--every 16]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))


def run(sync: str, steps: int, delay: float, step_sleep: float) -> dict[str, Any]:
    from _elastic_workload import spotnb_fit_teacher

    import spotnb as spot

    config = spot.Config(
        instances=2,
        sync=sync,
        local_link_delay={1: delay} if delay else None,
        local_alloc_delay=0.1,
        checkpoint="static:1000000",
        ship_modules=["_elastic_workload"],
    )
    job = spot.train(functools.partial(spotnb_fit_teacher, steps=steps, step_sleep=step_sleep), config)
    result = job.result(timeout=1800)
    events = job.events
    first = min(e["t"] for e in events if e["kind"] == "ready")
    done = max(e["t"] for e in events if e["kind"] == "done")
    switches = [
        f"{e['was']}→{e['sync']}:{e['every']} at step {e['step']}" for e in events if e["kind"] == "sync"
    ]
    return {
        "train_s": done - first,
        "steps_per_s": steps / (done - first),
        "held_out_loss": result["held_out_loss"],
        "switches": switches,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--delay", type=float, default=0.15, help="slow link: seconds per all-reduce")
    ap.add_argument("--every", type=int, default=16, help="K of local_sgd / diloco")
    ap.add_argument("--step-sleep", type=float, default=0.02, help="stands in for GPU time per step")
    args = ap.parse_args()
    rows = {}
    for sync in ("ddp", f"local_sgd:{args.every}", f"diloco:{args.every}", "auto"):
        t0 = time.time()
        rows[sync] = run(sync, args.steps, args.delay, args.step_sleep)
        rows[sync]["wall_s"] = time.time() - t0
    base = rows["ddp"]["train_s"]
    print(f"2 instances, {args.steps} steps, instance 1 behind a {args.delay * 1000:.0f} ms link")
    print(f"{'sync':<14} {'train s':>8} {'steps/s':>8} {'÷ ddp time':>10} {'held-out loss':>14}")
    for sync, r in rows.items():
        print(
            f"{sync:<14} {r['train_s']:>8.1f} {r['steps_per_s']:>8.2f} {r['train_s'] / base:>10.2f} "
            f"{r['held_out_loss']:>14.3f}"
        )
    for s in rows["auto"]["switches"]:
        print(f"auto: {s}")
    no_link = run("ddp", args.steps, 0.0, args.step_sleep)
    print(
        f"ddp without the slow link: {no_link['train_s']:.1f} s, held-out loss {no_link['held_out_loss']:.3f}"
    )


if __name__ == "__main__":
    main()
