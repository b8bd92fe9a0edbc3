"""Where to run and when to move, simulated: one job on one spot instance at a time across
several zones, each with its own price over time and its own preemptions (issue 10's
DeepSpotCloud-style table: `benchmarks/bench_migration.py`).

The decisions are the controller's own code — `spotnb.market.placement.rank_zones` picks a zone at
each (re)launch, `spotnb.market.migration.best_move` behind `MoveGate` decides a voluntary move — so
the table measures the policies spotnb runs, not a model of them. The run itself is the checkpoint model of
ARCHITECTURE.md at the level of zones (the step-level engine, `spotnb.sim.engine`, is for one
market): the job needs `work` seconds of compute; in a zone with mean time to preemption M it
saves every τ = Daly(δ, M, R), each save pausing training for δ; a preemption loses the work
since the last committed save and the job restarts (R seconds, billed) in the zone the policy
picks. Each instance is billed at its zone's price of each moment over its billed time:
continuously by default, or in the zone's increments with its minimum (`SimZone.billing`).

Policies (`Config.migrate`):

- ``never``: start in the best zone at t = 0 and always relaunch there;
- ``on-interrupt``: relaunch in the zone best at that moment (the default);
- ``best-price``: also look at the prices every `check_s` and move when `best_move` says so and
  has said so for the move's payback time (`MoveGate`, as the controller) —
  the new instance starts first (R, billed at its price, while the old one trains on: the two
  overlap), then the old one saves (δ) and the new one takes over with nothing lost. If the old
  instance is preempted during the overlap, the new one is its replacement, as in the runtime.
- ``billing-aware``: best-price's decisions, each move started (`migration.move_start`, as the
  controller) so that the old instance leaves just before the end of its billing increment
  (`SimZone.billing`); no move when the work ends within the paid time.
- ``on-demand``: the work and one start at the on-demand price, never preempted (the baseline).

Prices: a zone's price is a step function `[(t, $/h), ...]` — replayed from a file
(`load_prices`: rows of `seconds,zone,price`) or drawn by `random_prices` (a mean-reverting
walk, for when no price history is at hand: say so next to any figure made with it).
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from spotnb.core.billing import CONTINUOUS, Billing
from spotnb.market.migration import MoveGate, best_move, move_start
from spotnb.market.placement import rank_zones
from spotnb.market.preempt import PreemptionProcess
from spotnb.policy.intervals import daly_interval

__all__ = [
    "POLICIES",
    "SimZone",
    "ZoneRun",
    "load_prices",
    "random_prices",
    "simulate_zones",
]

POLICIES = ("never", "on-interrupt", "best-price", "billing-aware", "on-demand")


@dataclass
class SimZone:
    """One zone: its spot price over time (seconds from the job's start, $/h), its preemptions,
    and the time an instance takes to be allocated and restore there."""

    name: str
    prices: Sequence[tuple[float, float]]
    process: PreemptionProcess
    restart: float = 120.0
    billing: Billing = CONTINUOUS

    def tail(self, launched: float, end: float) -> float:
        """$ billed after an instance launched at `launched` ended at `end`: the rest of its
        last increment, or of its minimum (`Billing.billed`), at the prices then."""
        return self.cost(end, launched + self.billing.billed(end - launched))

    def __post_init__(self) -> None:
        if not self.prices or self.prices[0][0] > 0:
            raise ValueError(f"zone {self.name}: prices must start at time 0")
        self._times = [float(t) for t, _ in self.prices]

    def price(self, t: float) -> float:
        """$/h at `t`."""
        return float(self.prices[bisect.bisect_right(self._times, t) - 1][1])

    def cost(self, a: float, b: float) -> float:
        """$ of one instance from `a` to `b`, billed per second at the price of each moment."""
        if b <= a:
            return 0.0
        total, i = 0.0, bisect.bisect_right(self._times, a) - 1
        t = a
        while t < b:
            end = self._times[i + 1] if i + 1 < len(self._times) else math.inf
            upto = min(end, b)
            total += (upto - t) * float(self.prices[i][1]) / 3600.0
            t, i = upto, i + 1
        return total


@dataclass(frozen=True)
class ZoneRun:
    """One simulated run of a policy."""

    policy: str
    cost: float  # $
    wall: float  # seconds from submission to the last step
    moves: int
    preemptions: int
    lost: float  # seconds of work lost to preemptions and redone


def load_prices(path: str | Path) -> dict[str, list[tuple[float, float]]]:
    """A price history to replay: CSV rows `seconds,zone,price` ($/h; a header row is skipped),
    seconds from the start of the replay. Each zone's first price must be at 0."""
    out: dict[str, list[tuple[float, float]]] = {}
    with open(path, newline="") as fh:
        for row in csv.reader(fh):
            if not row or row[0].strip().startswith("#"):
                continue
            try:
                t, zone, price = float(row[0]), row[1].strip(), float(row[2])
            except (ValueError, IndexError):
                if not out:
                    continue  # a header
                raise ValueError(f"{path}: a row must be seconds,zone,price, got {row!r}") from None
            out.setdefault(zone, []).append((t, price))
    for zone, series in out.items():
        series.sort()
        if series[0][0] > 0:
            raise ValueError(f"{path}: zone {zone}'s prices must start at 0 s")
    return out


def random_prices(
    base: float, rng: random.Random, horizon: float, change_s: float = 7200.0, spread: float = 0.35
) -> list[tuple[float, float]]:
    """A synthetic spot price: it changes at exponential intervals (mean `change_s`) by a walk
    that reverts to `base`, staying within base·(1 ± spread) — the shape of AWS spot prices
    since the 2017 pricing change (slow drifts, no auctions). Not real data."""
    lo, hi = base * (1 - spread), base * (1 + spread)
    t, price = 0.0, base * (1 + spread * (2 * rng.random() - 1))
    out = [(0.0, price)]
    while t < horizon:
        t += rng.expovariate(1.0 / change_s)
        price += 0.5 * (base - price) + base * spread * 0.6 * (2 * rng.random() - 1)
        price = min(hi, max(lo, price))
        out.append((t, price))
    return out


def _markets(zones: Mapping[str, SimZone]) -> dict[str, tuple[float, float]]:
    return {name: (z.process.mttp, z.restart) for name, z in zones.items()}


def _best(zones: Mapping[str, SimZone], t: float, work: float, delta: float) -> str:
    prices = {name: z.price(t) for name, z in zones.items()}
    return rank_zones(prices, _markets(zones), work_s=work, save_s=delta)[0].zone


def simulate_zones(
    zones: Sequence[SimZone],
    policy: str,
    work: float,
    *,
    delta: float = 30.0,
    on_demand: float | None = None,
    check_s: float = 300.0,
    seed: int = 0,
    limit: float | None = None,
) -> ZoneRun:
    """One run of `policy` (one of `POLICIES`) over `zones` for `work` seconds of compute,
    saves taking `delta` seconds. `on_demand`: the on-demand $/h (for the "on-demand" policy).
    `limit`: give up after this much wall time (default 50 × the work)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    by_name = {z.name: z for z in zones}
    if policy == "on-demand":
        if on_demand is None:
            raise ValueError("the on-demand policy needs on_demand= ($/h)")
        start = min(z.restart for z in zones)
        return ZoneRun(policy, (work + start) * on_demand / 3600.0, work + start, 0, 0, 0.0)
    rng = random.Random(seed)
    procs = {name: z.process.fresh() for name, z in by_name.items()}
    limit = limit if limit is not None else 50.0 * work
    done = cost = lost = 0.0
    moves = preemptions = 0
    home = _best(by_name, 0.0, work, delta)
    gate = MoveGate()

    def relaunch_zone(at: float) -> str:
        return home if policy == "never" else _best(by_name, at, work - done, delta)

    # the instance the job runs on (or starts on): zone, launched, ready, kill
    zone, launched = home, 0.0
    ready, kill = by_name[zone].restart, procs[zone].next_preemption(0.0, rng)
    t = 0.0
    while t < limit:
        z = by_name[zone]
        if kill <= ready:  # preempted while starting: start again
            cost += z.cost(launched, kill) + z.tail(launched, kill)
            preemptions += 1
            t = kill
            zone, launched = relaunch_zone(t), t
            ready, kill = t + by_name[zone].restart, procs[zone].next_preemption(t, rng)
            continue
        cost += z.cost(launched, ready)
        t = ready
        tau = max(daly_interval(delta, z.process.mttp, z.restart), 1.0)
        since = 0.0  # work since the last committed save
        next_check = t + check_s if policy in ("best-price", "billing-aware") else math.inf
        pending: tuple[str, float, float, float] | None = None  # zone, launched, ready, kill
        moved = False
        while True:
            events = [t + tau - since, t + work - done - since, next_check]
            if pending is not None:
                events.append(pending[2])
            upto = min(events)
            if kill <= upto:  # preempted while training: the work since the last save is lost
                cost += z.cost(t, kill) + z.tail(launched, kill)
                lost += since + (kill - t)
                preemptions += 1
                t = kill
                break
            cost += z.cost(t, upto)
            since += upto - t
            t = upto
            if done + since >= work - 1e-9:
                cost += z.tail(launched, t)
                if pending is not None:  # not needed after all
                    p = by_name[pending[0]]
                    cost += p.cost(pending[1], t) + p.tail(pending[1], t)
                return ZoneRun(policy, cost, t, moves, preemptions, lost)
            save_due = since >= tau - 1e-9
            switch = pending is not None and t >= pending[2] - 1e-9
            if save_due or switch:
                if switch and pending is not None and pending[3] <= pending[2]:
                    # the new instance was preempted while starting: the move is abandoned
                    p = by_name[pending[0]]
                    cost += p.cost(pending[1], pending[3]) + p.tail(pending[1], pending[3])
                    preemptions += 1
                    pending, switch = None, False
                    if not save_due:
                        continue
                if kill <= t + delta:  # preempted during the save
                    cost += z.cost(t, kill) + z.tail(launched, kill)
                    lost += since + (kill - t)
                    preemptions += 1
                    t = kill
                    break
                cost += z.cost(t, t + delta)
                t += delta
                done, since = done + since, 0.0
                if switch and pending is not None:  # the new instance takes over
                    new_zone, new_launched, _, new_kill = pending
                    cost += z.tail(launched, t)  # the old one's last increment
                    moves += 1
                    # billed from its launch (the next pass bills it up to now, `ready`)
                    zone, launched, ready, kill = new_zone, new_launched, t, new_kill
                    pending, moved = None, True
                    break
            if t >= next_check:
                next_check = t + check_s
                if pending is None:
                    ranked = rank_zones(
                        {name: s.price(t) for name, s in by_name.items()},
                        _markets(by_name),
                        work_s=work - done - since,
                        save_s=delta,
                    )
                    timed = policy == "billing-aware"
                    move = gate.admit(best_move(ranked, zone, delta), t, keep=timed)
                    if move is not None and timed:
                        begin = move_start(
                            z.billing,
                            launched,
                            t,
                            by_name[move.there.zone].restart + delta,
                            work - done - since,
                        )
                        if begin is None or begin > t + 1e-9:  # stay, or wait for the boundary
                            if begin is not None:
                                next_check = min(next_check, begin)
                            move = None
                        else:
                            gate.reset()
                    if move is not None:
                        there = by_name[move.there.zone]
                        pending = (
                            there.name,
                            t,
                            t + there.restart,
                            procs[there.name].next_preemption(t, rng),
                        )
        if moved:  # the new instance trains from the move's save (unless it is gone already)
            if kill <= t:
                gone = by_name[zone]
                cost += gone.cost(launched, t) + gone.tail(launched, t)
                preemptions += 1
                zone, launched = relaunch_zone(t), t
                ready, kill = t + by_name[zone].restart, procs[zone].next_preemption(t, rng)
            continue
        if pending is not None and pending[3] > t:
            # the old one was preempted during the move: the new one is its replacement
            zone, launched, ready, kill = pending[0], pending[1], max(pending[2], t), pending[3]
            continue
        if pending is not None:
            p = by_name[pending[0]]
            cost += p.cost(pending[1], pending[3]) + p.tail(pending[1], pending[3])
        zone, launched = relaunch_zone(t), t
        ready, kill = t + by_name[zone].restart, procs[zone].next_preemption(t, rng)
    return ZoneRun(policy, cost, t, moves, preemptions, lost)
