"""Placement and migration policies across zones, DeepSpotCloud-style (plain script; prints,
asserts nothing). Results and how to read them: benchmarks/MIGRATION.md.

    python benchmarks/bench_migration.py                 # 24 h job, 200 runs per policy
    python benchmarks/bench_migration.py --runs 50 --hours 8
    python benchmarks/bench_migration.py --prices my_prices.csv   # replay a price history
    python benchmarks/bench_migration.py --billing 1h    # every zone bills whole hours
    python benchmarks/bench_migration.py --flapping      # prices that flip: the move gate's rules

Five zones, one per bundled preemption trace (real preemptions: the Bamboo and Parcae traces,
each replayed from a random offset), each with its own spot price over time. With `--prices`
the zones are the file's (rows `seconds,zone,price`) and each takes the traces in turn;
without it the prices are SYNTHETIC (`spotnb.sim.zones.random_prices`: a mean-reverting walk,
±35 % around p3.2xlarge's spot price, changing every ~2 h) — no spot price history is
bundled, so the migration gains below are what spotnb's policies make of such prices, not a
measurement of any cloud's. Every policy of one run sees the same prices and the same
preemption draws (same seed); the decisions are the controller's own code.

`--flapping` (issue #29, item 8): two zones whose prices swap $0.02/h and $0.30/h, a
local-market-like job (3 s starts, 0.5 s saves, a look a second, no preemptions), 10 minutes of
work. For each price schedule it prints moves, cost and wall time of never moving, of
best-price with the payback rule alone (`MoveGate(hysteresis=False)`, the rule before the price
history) and of best-price with the history (`MoveGate()`, the rule now).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import spotnb.sim.zones as sim_zones
from spotnb.core.billing import CONTINUOUS, Billing, parse_billing
from spotnb.market.migration import MoveGate
from spotnb.market.preempt import Never
from spotnb.market.prices import lookup_price
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


LOW, HIGH = 0.02, 0.30


def _swaps(flips: list[float], horizon: float) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """zone-a's and zone-b's prices: zone-a cheap first, the two swapping at each time of `flips`."""
    a, b, cheap_a = [(0.0, LOW)], [(0.0, HIGH)], True
    for t in flips:
        if t >= horizon:
            break
        cheap_a = not cheap_a
        a.append((t, LOW if cheap_a else HIGH))
        b.append((t, HIGH if cheap_a else LOW))
    return a, b


def flapping_schedules(horizon: float, seed: int) -> dict[str, list[float]]:
    """Times of the flips of each schedule."""
    rng = random.Random(seed)
    every = lambda p, upto=horizon: [p * k for k in range(1, int(upto / p) + 1)]  # noqa: E731
    random_flips, t = [], 0.0
    while t < horizon:
        t += rng.expovariate(1 / 6.0)
        random_flips.append(t)
    return {
        "every 6 s": every(6.0),
        "every 2 s": every(2.0),
        "random, mean 6 s": random_flips,
        "every 6 s, then b for good": every(6.0, 126.0),  # 21 flips: zone-b cheap from 126 s on
        "every 12 s": every(12.0),
        "every 60 s": every(60.0),
    }


def _run_flapping(flips: list[float], rule: str, work: float, horizon: float) -> sim_zones.ZoneRun:
    a, b = _swaps(flips, horizon)
    zones = [
        SimZone("zone-a", a, Never(), restart=3.0),
        SimZone("zone-b", b, Never(), restart=3.0),
    ]
    if rule == "never":
        return simulate_zones(zones, "never", work, delta=0.5, check_s=1.0)
    original = sim_zones.MoveGate
    sim_zones.MoveGate = functools.partial(MoveGate, hysteresis=rule == "history")  # type: ignore[misc]
    try:
        return simulate_zones(zones, "best-price", work, delta=0.5, check_s=1.0)
    finally:
        sim_zones.MoveGate = original  # type: ignore[misc]


def flapping(runs: int) -> None:
    work, horizon = 600.0, 3000.0
    rules = ("never", "payback", "history")
    print(
        f"a {work:g} s job over zone-a and zone-b swapping ${LOW}/h and ${HIGH}/h (3 s starts, "
        f"0.5 s saves, a look a second); random schedules: mean of {runs} seeds"
    )
    print(f"{'schedule':<28}{'rule':<10}{'moves':>7}{'cost $':>10}{'÷ never':>9}{'time s':>8}")
    for name in flapping_schedules(horizon, 0):
        rows: dict[str, list[sim_zones.ZoneRun]] = {r: [] for r in rules}
        for seed in range(runs if name.startswith("random") else 1):
            flips = flapping_schedules(horizon, seed)[name]
            for rule in rules:
                rows[rule].append(_run_flapping(flips, rule, work, horizon))
        base = statistics.mean(r.cost for r in rows["never"])
        for rule in rules:
            rs = rows[rule]
            cost = statistics.mean(r.cost for r in rs)
            print(
                f"{name:<28}{rule:<10}{statistics.mean(r.moves for r in rs):>7.1f}{cost:>10.5f}"
                f"{cost / base if base and not math.isnan(base) else float('nan'):>9.3f}"
                f"{statistics.mean(r.wall for r in rs):>8.1f}"
            )


def flapping_local(period: float, steps: int) -> None:
    """One job per rule on the real local market (one instance, driven from this process so
    that the rule can be swapped): zone prices swapping every `period` s."""
    import spotnb as spot
    import spotnb.control.moves as moves
    from tests.support import jobfns

    horizon = 600.0
    a, b = _swaps([period * k for k in range(1, int(horizon / period))], horizon)
    zones = {
        "zone-a": {"price": [[f"{t:g}s", p] for t, p in a]},
        "zone-b": {"price": [[f"{t:g}s", p] for t, p in b]},
    }
    print(f"the local market, one instance, {steps} steps of ~10 ms, prices swapping every {period:g} s")
    print(f"{'rule':<10}{'moves':>7}{'spot $':>10}{'time s':>8}")
    original = moves.MoveGate
    for rule in ("never", "payback", "history"):
        moves.MoveGate = functools.partial(MoveGate, hysteresis=rule == "history")  # type: ignore[misc]
        try:
            t0 = time.time()
            job = spot.train(
                functools.partial(jobfns.seeded_mlp, steps=steps, width=32, step_delay=0.01),
                spot.Config(
                    ship_modules=["tests.support.jobfns"],
                    local_regions=zones,
                    regions="cheapest",
                    migrate="never" if rule == "never" else "best-price",
                    checkpoint="static:200",
                ),
                detach=False,
            )
            job.result(timeout=600)
            wall = time.time() - t0
        finally:
            moves.MoveGate = original  # type: ignore[misc]
        moves = sum(1 for e in job.events if e["kind"] == "moving")
        print(f"{rule:<10}{moves:>7}{job.breakdown().spot_cost:>10.5f}{wall:>8.1f}")


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
    ap.add_argument("--flapping", action="store_true", help="prices that flip: the move gate's rules")
    ap.add_argument(
        "--local", type=int, metavar="STEPS", help="with --flapping: also one real local-market job per rule"
    )
    args = ap.parse_args()
    if args.flapping:
        flapping(args.runs if args.runs != 200 else 20)
        if args.local:
            flapping_local(6.0, args.local)
        return
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
