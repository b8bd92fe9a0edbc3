"""Placement and migration policies across zones, DeepSpotCloud-style (plain script; prints,
asserts nothing). Results and how to read them: benchmarks/MIGRATION.md.

    python benchmarks/bench_migration.py                 # 24 h job, 200 runs per policy
    python benchmarks/bench_migration.py --runs 50 --hours 8
    python benchmarks/bench_migration.py --prices my_prices.csv   # replay a price history
    python benchmarks/bench_migration.py --billing 1h    # every zone bills whole hours

Five zones, one per bundled preemption trace (real preemptions: the Bamboo and Parcae traces,
each replayed from a random offset), each with its own spot price over time. With `--prices`
the zones are the file's (rows `seconds,zone,price`) and each takes the traces in turn;
without it the prices are SYNTHETIC (`spotnb.sim.zones.random_prices`: a mean-reverting walk,
±35 % around p3.2xlarge's spot price, changing every ~2 h) — no spot price history is
bundled, so the migration gains below are what spotnb's policies make of such prices, not a
measurement of any cloud's. Every policy of one run sees the same prices and the same
preemption draws (same seed); the decisions are the controller's own code.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from spotnb.billing import CONTINUOUS, Billing, parse_billing
from spotnb.prices import lookup_price
from spotnb.sim.zones import SimZone, load_prices, random_prices, simulate_zones
from spotnb.traces import bundled_traces, load_trace

HOUR = 3600.0


def zones_for(
    seed: int, hours: float, spot: float, prices: dict | None, billing: Billing = CONTINUOUS
) -> list[SimZone]:
    rng = random.Random(seed)
    traces = [load_trace(name) for name in bundled_traces()]
    names = list(prices) if prices else [t.name for t in traces]
    out = []
    for i, name in enumerate(names):
        trace = traces[i % len(traces)]
        process = trace.process(offset=rng.uniform(0, trace.span))
        series = prices[name] if prices else random_prices(spot, rng, 20 * hours * HOUR)
        out.append(SimZone(name, series, process, restart=rng.uniform(120, 300), billing=billing))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--hours", type=float, default=24.0, help="compute the job needs")
    ap.add_argument("--delta", type=float, default=60.0, help="seconds per save")
    ap.add_argument("--prices", help="CSV seconds,zone,price to replay instead of synthetic prices")
    ap.add_argument(
        "--billing",
        help="how every zone bills an instance: '1h' (whole hours), or increment,minimum ('30s,1m'); "
        "default continuously",
    )
    args = ap.parse_args()
    billing = CONTINUOUS
    if args.billing:
        inc, _, minimum = args.billing.partition(",")
        billing = parse_billing("--billing", {"increment": inc, "minimum": minimum or inc})
    price = lookup_price("p3.2xlarge")
    assert price is not None
    prices = load_prices(args.prices) if args.prices else None
    work = args.hours * HOUR
    policies = ("never", "on-interrupt", "best-price", "billing-aware")
    rows: dict[str, list] = {p: [] for p in policies}
    t0 = time.perf_counter()
    for seed in range(args.runs):
        zones = zones_for(seed, args.hours, price.spot, prices, billing)
        for policy in policies:
            rows[policy].append(simulate_zones(zones, policy, work, delta=args.delta, seed=seed))
    od = simulate_zones(
        zones_for(0, args.hours, price.spot, prices), "on-demand", work, on_demand=price.on_demand
    )
    took = time.perf_counter() - t0
    base = statistics.mean(r.cost for r in rows["never"])
    base_t = statistics.mean(r.wall for r in rows["never"])
    count = len(zones_for(0, 1, 1, prices))
    print(
        f"{args.runs} runs of a {args.hours:g} h job (δ = {args.delta:g} s) over {count} "
        f"zones, {'prices from ' + args.prices if prices else 'SYNTHETIC prices'}, billed "
        f"{billing.describe()}, in {took:.1f} s"
    )
    print(
        f"{'policy':<14}{'cost $':>9}{'÷ never':>9}{'÷ on-demand':>13}{'time h':>8}{'÷ never':>9}"
        f"{'moves':>7}{'preempt.':>10}{'lost h':>8}"
    )
    for policy in policies:
        rs = rows[policy]
        cost = statistics.mean(r.cost for r in rs)
        wall = statistics.mean(r.wall for r in rs)
        print(
            f"{policy:<14}{cost:>9.2f}{cost / base:>9.3f}{cost / od.cost:>13.3f}{wall / HOUR:>8.2f}"
            f"{wall / base_t:>9.3f}{statistics.mean(r.moves for r in rs):>7.1f}"
            f"{statistics.mean(r.preemptions for r in rs):>10.1f}"
            f"{statistics.mean(r.lost for r in rs) / HOUR:>8.2f}"
        )
    print(
        f"{'on-demand':<14}{od.cost:>9.2f}{od.cost / base:>9.3f}{1.0:>13.3f}{od.wall / HOUR:>8.2f}"
        f"{od.wall / base_t:>9.3f}{0:>7.1f}{0:>10.1f}{0:>8.2f}"
    )


if __name__ == "__main__":
    main()
