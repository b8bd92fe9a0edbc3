"""Where the time and the money went, computed from what the reducer knows of each instance.

`spotnb.core.state.JobState.breakdown()` calls `compute_breakdown` with one `Span` per incarnation;
the widget, `job.breakdown()`, the CLI, the panel and the job DB all read it there, so they
report the same figures. Wall time from the first launch to the end is split, moment by
moment, into one category with priority running > preparation > allocation > other, so an
allocation overlapped with the previous instance's grace period is not counted twice and
the categories add up to the total. A job on several instances has one such lane per
instance (`Span.slot`): its figures are instance-seconds, and the total is lanes × wall time,
plus the overlap of each replica move: the new instance (`Span.replaces`) has a lane of its
own until the instance it replaces ends, since both are billed then.

- compute: first-time steps; recompute: steps redone after a preemption plus the lost tail
  of a killed instance (time after its last report); save: blocking snapshot time and
  emergency saves; prep: instance start to first step (process start, imports, restore);
  alloc: waiting for an instance; other: gaps (backoff after capacity errors, the end).
- spot cost: what the market bills each instance (`spotnb.core.billing.charge`): its time from
  allocation to end rounded to the market's increment, at least its minimum (`Span.billing`),
  at its spot price — piecewise where its zone's price changed while it ran (`Span.prices`:
  the local market's schedule, or the prices the controller saw); one price where that is all
  spotnb knows.
- on-demand cost: the job's compute time at the on-demand price of the same instance type.
- coordinator cost: a job on several instances on a cloud also pays for a small on-demand
  coordinator (torchft's lighthouse, which must outlive every spot instance). It is its own
  line (`Overhead`, from the coordinator's start to its end at its on-demand price): not spot
  compute, not in the on-demand baseline of the training work (an on-demand run of the same
  work would not need it), but in `total_cost`, the job's whole spend, which the savings are
  measured from, so the figure the user reads includes what the job really cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from spotnb.core.billing import CONTINUOUS, Billing, charge
from spotnb.core.protocol import Progress

__all__ = ["Breakdown", "Span", "Overhead", "compute_breakdown", "coordinator_overheads", "CATEGORIES"]

CATEGORIES = ("compute", "recompute", "save", "alloc", "prep", "other")
_PRIORITY = {"running": 3, "prep": 2, "alloc": 1}


@dataclass
class Breakdown:
    compute: float = 0.0
    recompute: float = 0.0
    save: float = 0.0
    alloc: float = 0.0
    prep: float = 0.0
    other: float = 0.0
    total: float = 0.0
    preemptions: int = 0
    incarnations: int = 0
    step: int = 0
    total_steps: int | None = None
    spot_cost: float = 0.0
    on_demand_cost: float = 0.0
    spot_price: float | None = None
    on_demand_price: float | None = None
    coordinator_cost: float = 0.0  # the on-demand coordinator of a job on several instances
    coordinator_price: float | None = None  # its $/h (None: the job has no coordinator)
    #: $ of checkpoints moved between regions (Config.regional_stores: copies, restores read
    #: across and saves written across; `checkpoint_placed` events)
    transfer_cost: float = 0.0
    #: instances side by side (a job on several instances): above 1 the seconds are
    #: instance-seconds, and the total is about `lanes` × the wall time
    lanes: int = 1

    @property
    def unit(self) -> str:
        """What the seconds count: "s", or "instance-s" for a job on several instances (so a
        3-minute job on three instances does not read as 9 minutes of wall time)."""
        return "s" if self.lanes <= 1 else "instance-s"

    @property
    def total_cost(self) -> float:
        """Everything the job spent: its spot instances plus its coordinator (an overhead)."""
        return self.spot_cost + self.coordinator_cost + self.transfer_cost

    @property
    def savings(self) -> float:
        """Fraction saved against on-demand (0.7 = 70 % cheaper), from the job's whole spend
        (`total_cost`, coordinator included); 0 before any compute."""
        return 1.0 - self.total_cost / self.on_demand_cost if self.on_demand_cost > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_cost": self.total_cost, "savings": self.savings}

    def table(self) -> str:
        """A plain-text table for terminals and logs."""
        lines = [f"{'category':<10} {'seconds' if self.lanes <= 1 else 'instance-s':>10} {'share':>7}"]
        for cat in CATEGORIES:
            val = getattr(self, cat)
            share = val / self.total if self.total else 0.0
            lines.append(f"{cat:<10} {val:>10.2f} {share:>6.1%}")
        wall = "" if self.lanes <= 1 else f"  ({self.lanes} instances side by side)"
        lines.append(f"{'total':<10} {self.total:>10.2f}{wall}")
        lines.append(
            f"preemptions {self.preemptions}, instances {self.incarnations}, "
            f"steps {self.step}" + (f"/{self.total_steps}" if self.total_steps else "")
        )
        if self.coordinator_price is not None:
            lines.append(
                f"coordinator ${self.coordinator_cost:.4f} (on demand, ${self.coordinator_price:.4f}/h; "
                f"spot instances ${self.spot_cost:.4f})"
            )
        if self.transfer_cost:
            lines.append(f"checkpoint transfer between regions ${self.transfer_cost:.4f}")
        spent = "total" if self.coordinator_price is not None or self.transfer_cost else "spot cost"
        lines.append(
            f"{spent} ${self.total_cost:.4f}  vs on-demand ${self.on_demand_cost:.4f} for the same "
            f"{self.compute / 60:.1f} {'min' if self.lanes <= 1 else 'instance-min'} of training"
            + (f"  ({self.savings:.0%} less)" if self.savings >= 0 else f"  ({-self.savings:.0%} more)")
        )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            "Breakdown("
            + ", ".join(f"{c}={getattr(self, c):.2f}" for c in CATEGORIES)
            + f", total={self.total:.2f}, preemptions={self.preemptions}, "
            f"spot_cost={self.spot_cost:.4f}, on_demand_cost={self.on_demand_cost:.4f}"
            + (
                f", coordinator_cost={self.coordinator_cost:.4f}"
                if self.coordinator_price is not None
                else ""
            )
            + ")"
        )


@dataclass(frozen=True)
class Span:
    """One instance as the ledger sees it: when it was asked for, allocated (billing starts),
    ready (first step), ended, whether a preemption ended it, its latest time accounts and
    its prices ($/h)."""

    n: int
    asked: float | None
    allocated: float | None
    ready: float | None
    end: float | None
    preempted: bool
    progress: Progress | None
    spot: float
    on_demand: float
    slot: int = 0  # the lane: one per instance of a job on several instances
    billing: Billing = CONTINUOUS  # how its market bills its time
    prices: tuple[tuple[float, float], ...] = ()  # its zone's price changes (wall time, $/h)
    replaces: int | None = None  # a replica move's new instance: the incarnation it replaces


@dataclass(frozen=True)
class Overhead:
    """A machine the job pays for that trains nothing (today: the on-demand coordinator of a
    job on several instances), billed from `start` to `end` (None: to the job's end) at
    `price` $/h. It takes no lane and no category: it is money, not instance-seconds."""

    name: str
    start: float
    end: float | None
    price: float


#: an hourly price above this is not a machine's (the same bound as the local zones' prices)
MAX_HOURLY = 1000.0


def _number(value: Any) -> float | None:
    """A finite float, or None (text, bool, NaN, inf, too big)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def coordinator_overheads(infos: Iterable[dict[str, Any]]) -> list[Overhead]:
    """The coordinators named in the instances' `info` (a cloud provider records there which
    coordinator each instance trained with: `{"coordinator": {"id", "started", "price"}}`), one
    `Overhead` each. A coordinator replaced by a newer one (it died) is billed until the newer
    one started; the newest until the job's end."""
    seen: dict[str, tuple[float, float]] = {}
    for info in infos:
        c = info.get("coordinator") if isinstance(info, dict) else None
        if not isinstance(c, dict) or not c.get("id"):
            continue
        started, price = _number(c.get("started")), _number(c.get("price", 0.0))
        # an event from a corrupt or foreign writer: a coordinator without a readable start or
        # an hourly price of a real machine is not billed (rather than breaking every view)
        if started is None or price is None or not 0.0 <= price < MAX_HOURLY:
            continue
        seen[str(c["id"])] = (started, price)
    ordered = sorted(seen.items(), key=lambda kv: kv[1][0])
    return [
        Overhead("coordinator", started, ordered[k + 1][1][0] if k + 1 < len(ordered) else None, price)
        for k, (_, (started, price)) in enumerate(ordered)
    ]


def compute_breakdown(
    spans: Iterable[Span],
    start: float | None,
    end: float | None,
    now: float | None = None,
    overheads: Iterable[Overhead] = (),
) -> Breakdown:
    """Split the wall time from `start` (first submission or allocation) to `end` (the job's
    last end, None while it runs: then `now`) into the categories, and price it; `overheads`
    (the coordinator) are priced on their own line."""
    out = Breakdown()
    incs = {s.n: s for s in spans}
    if start is None:
        return out
    now = time.time() if now is None else now
    stop = end if end is not None else now
    _price_overheads(out, overheads, stop)
    intervals: list[tuple[float, float, str, int]] = []
    for n, inc in incs.items():
        inc_end = inc.end if inc.end is not None else stop
        if inc.asked is not None:
            intervals.append((inc.asked, inc.allocated or inc_end, "alloc", n))
        if inc.allocated is not None:
            intervals.append((inc.allocated, inc.ready or inc_end, "prep", n))
            out.spot_cost += charge(
                inc.allocated, max(inc.allocated, inc_end), inc.spot, inc.billing, inc.prices
            )
        if inc.ready is not None:
            intervals.append((inc.ready, inc_end, "running", n))
    # one lane per instance slot: on several instances the categories are instance-seconds
    # (each lane split moment by moment as above), so they still add up to the total; a
    # replica move's new instance has its own lane until the one it replaces ends
    lanes = sorted({inc.slot for inc in incs.values()}) or [0]
    by_lane: dict[tuple[int, int], list[tuple[float, float, str, int]]] = {}
    extra = 0.0  # instance-seconds of the move overlaps' lanes
    for iv in intervals:
        inc = incs[iv[3]]
        old = incs.get(inc.replaces) if inc.replaces is not None else None
        if old is None or old.slot != inc.slot:
            by_lane.setdefault((inc.slot, -1), []).append(iv)
            continue
        cut = old.end if old.end is not None else stop
        a, b, cat, n = iv
        if a < cut:
            by_lane.setdefault((inc.slot, n), []).append((a, min(b, cut), cat, n))
        if b > cut:
            by_lane.setdefault((inc.slot, -1), []).append((max(a, cut), b, cat, n))
    visible: dict[tuple[str, int], float] = {}
    for (_, owner), ivs in by_lane.items():
        if owner >= 0:  # an overlap lane: from the new instance's first interval to the cut
            lo = max(start, min(a for a, _, _, _ in ivs))
            hi = min(stop, max(b for _, b, _, _ in ivs))
            swept = _sweep(ivs, lo, hi) if hi > lo else {}
            extra += max(0.0, hi - lo)
        else:
            swept = _sweep(ivs, start, stop)
        for key, sec in swept.items():
            visible[key] = visible.get(key, 0.0) + sec
    for n, inc in incs.items():
        out.incarnations += inc.allocated is not None
        out.alloc += visible.get(("alloc", n), 0.0)
        out.prep += visible.get(("prep", n), 0.0)
        running = visible.get(("running", n), 0.0)
        p = inc.progress
        c, rc, s = (p.compute_s, p.recompute_s, p.save_s) if p is not None else (0.0, 0.0, 0.0)
        accounted = c + rc + s
        if accounted > running > 0:  # clock slack between processes: scale to the wall time
            c, rc, s = (x * running / accounted for x in (c, rc, s))
            accounted = running
        lost = max(0.0, running - accounted)
        if inc.preempted:
            rc += lost  # the killed instance's work since its last report is lost
        elif inc.end is None:
            c += lost  # still running: work not reported yet
        else:
            out.other += lost  # writing the result, waiting for uploads at the end
        out.compute += c
        out.recompute += rc
        out.save += s
        out.on_demand_cost += c / 3600.0 * inc.on_demand
    out.total = max(0.0, stop - start) * len(lanes) + extra
    out.lanes = len(lanes)
    out.other += max(0.0, out.total - sum(getattr(out, k) for k in CATEGORIES))
    return out


def _price_overheads(out: Breakdown, overheads: Iterable[Overhead], stop: float) -> None:
    """Add each overhead's billed time (its start to its end, or `stop`) at its on-demand price
    to the coordinator line; never to the spot cost or the on-demand baseline."""
    for item in overheads:
        billed = max(0.0, min(item.end if item.end is not None else stop, stop) - item.start)
        out.coordinator_cost += billed / 3600.0 * item.price
        out.coordinator_price = item.price


def _sweep(
    intervals: list[tuple[float, float, str, int]], start: float, stop: float
) -> dict[tuple[str, int], float]:
    """Length of each interval not hidden by a higher-priority one, clipped to [start, stop]."""
    points = sorted({start, stop, *(max(start, min(stop, x)) for a, b, _, _ in intervals for x in (a, b))})
    out: dict[tuple[str, int], float] = {}
    for lo, hi in zip(points, points[1:], strict=False):
        if hi <= lo:
            continue
        mid = (lo + hi) / 2
        best = None
        for a, b, cat, n in intervals:
            if a <= mid < b and (
                best is None
                or _PRIORITY[cat] > _PRIORITY[best[0]]
                or (_PRIORITY[cat] == _PRIORITY[best[0]] and n > best[1])
            ):
                best = (cat, n)
        if best is not None:
            out[best] = out.get(best, 0.0) + hi - lo
    return out
