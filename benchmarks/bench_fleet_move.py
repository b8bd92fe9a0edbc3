"""Moving the replicas of a job on several instances to a cheaper zone, one run on the local market.

    python benchmarks/bench_fleet_move.py [--steps 800] [--instances 2]

The job (`tests/support/movefns.paced_dp`: exact data parallel, its first replicas paced so the
moves happen before it ends) starts in zone-a ($0.10/h); zone-b drops from $0.30/h to
$0.005/h 4 s into the market; `migrate="best-price"` moves each replica in turn. Printed, per
move: the new instance's start until it trained (allocation, boot, join and heal), the hand-over
(its first committed step until the old replica is gone), the seconds both were billed, the
heal; the survivors' quorum wait after each leave (the lighthouse's join timeout: the price of
a leave, against a step); the quorum sizes during the moves; the spend against staying in
zone-a. One run on one machine (two shared cores here): the starts dominate and vary with load.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import spotnb as spot  # noqa: E402
from tests.support import jobfns  # noqa: E402
from tests.support.movefns import paced_dp  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--instances", type=int, default=2)
    args = parser.parse_args()
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": [[0, 0.30], ["4s", 0.005]]}}
    t0 = time.time()
    job = spot.train(
        functools.partial(paced_dp, steps=args.steps, first=args.instances, slow=0.06),
        spot.Config(
            ship_modules=["tests.support.jobfns", "tests.support.movefns"],
            instances=args.instances,
            local_regions=zones,
            regions="cheapest",
            migrate="best-price",
            local_alloc_delay=0.1,
        ),
    )
    result = job.result(timeout=600)
    wall = time.time() - t0
    events = job.events

    def by(kind: str, n: int | None = None) -> list:
        return [e for e in events if e["kind"] == kind and (n is None or e["incarnation"] == n)]

    incs = job.state.incs
    exact = result["weights"] == jobfns.exact_dp_expected(args.steps)
    print(f"wall {wall:.1f} s; final weights equal a calm run's: {exact}")
    moves = by("moving")
    for m in moves:
        old, new = incs[m["incarnation"]], incs[m["to_incarnation"]]
        if new.ready is None or old.end is None or new.allocated is None:
            print(f"slot {m['slot']}: the move did not complete")
            continue
        heal = by("quorum", new.n)[0]["heal_s"] or 0.0
        print(
            f"slot {m['slot']} (#{old.n} -> #{new.n}): start {new.ready - m['t']:.2f} s, hand-over "
            f"{old.end - new.ready:.2f} s, both billed {old.end - new.allocated:.2f} s, heal {heal:.3f} s; "
            f"expected saving ${m['saving']:.6f} net of ${m['move_cost']:.6f}"
        )
    waits = []
    for e in by("evacuated"):
        after = [q for q in by("quorum") if q["t"] >= e["t"] and q["incarnation"] != e["incarnation"]]
        waits += [q["wait_s"] for q in after[: args.instances - 1]]
    if waits:
        print(
            f"survivors' quorum wait after a leave: median {statistics.median(waits):.2f} s, "
            f"max {max(waits):.2f} s"
        )
    if moves:
        sizes = [q["replicas"] for q in by("quorum") if q["t"] >= moves[0]["t"]]
        print(f"quorum sizes during the moves: min {min(sizes)}, max {max(sizes)} (N = {args.instances})")
    b = job.breakdown()
    end = max(inc.end or 0.0 for inc in incs.values())
    staying = sum((end - (incs[n].allocated or end)) * 0.10 / 3600 for n in range(1, args.instances + 1))
    print(
        f"spot cost ${b.spot_cost:.6f} against ${staying:.6f} staying in zone-a: {b.spot_cost / staying:.2f}x"
    )


if __name__ == "__main__":
    main()
