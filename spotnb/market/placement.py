"""Where to run: zones ranked by the expected cost of the job's remaining work, not by price.

A zone's spot price is only half of what a run there costs: a zone that preempts often makes
the job save more often, lose work at each preemption and restart. With the checkpoint model
of ARCHITECTURE.md ("The checkpoint model"), saving every τ = Daly's interval, the expected
wall time of W seconds of work in a zone with mean time to preemption M and restart time R is
`policy.intervals.expected_total(W, τ, δ, M, R)`; its expected cost is that time at the zone's
spot price. The cheapest zone is the one with the lowest expected cost, so a zone at half the
price with ten times the preemptions can lose (`rank_zones`).

A zone where this job was just preempted, or where an allocation just failed for lack of
capacity, is penalised (SkyPilot's EAGER_NEXT_REGION): each such event in the last minutes
counts as extra hazard, the zone's MTTP divided by 1 + Σ exp(−age / `PENALTY_DECAY`), so
right after a preemption the zone looks as if it preempted twice as often, and the penalty
fades over ~`PENALTY_DECAY` seconds as the market recovers.

Moving the checkpoint counts too (`Transfer`, priced by `spotnb.market.transfer`): the store stays
where it is, so a zone in another region or cloud than the store reads the checkpoint across
at each start there and writes each save back across. Its bytes × the egress $/GB over the
expected number of copies (the restores of the expected starts, the first one only when there
is a checkpoint to restore, plus the saves every τ) is added to the zone's cost, and the
transfer time at an assumed bandwidth is added to its restart time, so two zones at the same
price rank the one beside the store first, and a big checkpoint can make a cheaper far zone
lose. With a store in the zone's region (`Config.regional_stores`, `spotnb.market.regional`) the
checkpoint is copied there once, at the first start, and read and written in the zone after:
only that first restore pays the crossing (`Transfer.per_gb_later`, `seconds_later`).

Used by the controller for `regions="cheapest"` (at every allocation, so a relaunch goes to
the zone that is best then) and by the dry run (the ranked table with each term).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spotnb.policy.intervals import daly_interval, expected_total

__all__ = [
    "PENALTY_DECAY",
    "NOMINAL_WORK",
    "NOMINAL_SAVE",
    "Transfer",
    "ZoneEstimate",
    "rank_zones",
    "penalty",
]

#: seconds over which a preemption or capacity failure in a zone stops counting against it
PENALTY_DECAY = 600.0
#: the work a ranking assumes when the job's remaining work is not known yet (first launch):
#: an hour; the ranking barely depends on it (expected time is nearly linear in the work)
NOMINAL_WORK = 3600.0
#: the save time a ranking assumes before any save was measured
NOMINAL_SAVE = 10.0


@dataclass(frozen=True)
class Transfer:
    """Moving the checkpoint between the store and one zone (`spotnb.market.transfer.transfer_to`)."""

    nbytes: float  # bytes of one checkpoint (the latest one's, or an estimate)
    per_gb: float  # $/GB each way between the store and the zone (0: same region)
    seconds: float  # extra seconds each restore there takes (0 beside the store)
    restore_first: bool = True  # the first start there restores (False before the first save)
    route: str = "same region"  # in words, for the dry run
    per_gb_back: float | None = None  # $/GB of a save written back (None: as `per_gb`)
    # a restore after the first one there: None as the first; a regional store's zone reads the
    # copy its first start made in the zone (`spotnb.market.regional`)
    per_gb_later: float | None = None
    seconds_later: float | None = None

    @property
    def gb(self) -> float:
        return self.nbytes / 1e9


_NO_TRANSFER = Transfer(0.0, 0.0, 0.0, False)


@dataclass(frozen=True)
class ZoneEstimate:
    """One zone's terms: its price, its market, the penalty, moving the checkpoint there, and
    what the work would cost."""

    zone: str
    spot: float  # $/h now
    mttp: float  # seconds, from the job DB (shrunk toward the prior), before the penalty
    restart: float  # seconds: allocation + preparation (+ the checkpoint's transfer time)
    penalty: float  # >= 1: how many times its hazard counts (recent trouble there)
    hours: float  # expected wall hours of the work there, saves, lost work and restarts included
    cost: float  # expected $ of the work there, moving the checkpoint included
    transfer: Transfer = _NO_TRANSFER
    transfer_cost: float = 0.0  # expected $ of moving the checkpoint (restores and saves)
    copies: float = 0.0  # expected checkpoint copies between the store and the zone
    restore_cost: float = 0.0  # $ of the first start's restore (what a move there pays)
    cloud: str = ""  # the zone's cloud, for a placement across clouds

    def describe(self, nominal: bool = False) -> str:
        """One line for the dry run and the log. `nominal`: the work is not the job's own
        (before it ran, its length is unknown) but one hour of training, and the line says so
        rather than read as the job's forecast."""
        extra = f", penalty ×{self.penalty:.2f} (recent trouble)" if self.penalty > 1.005 else ""
        t = self.transfer
        moved = ""
        if t.per_gb_later is not None and (t.per_gb > 0 or t.seconds > 0):  # copied once (regional)
            moved = (
                f" + checkpoint {t.gb:.2f} GB {t.route} once at ${t.per_gb:.3f}/GB"
                f"{'' if t.restore_first else ' (nothing saved yet: no copy)'}, later starts at "
                f"${t.per_gb_later:.3f}/GB, saves at ${t.per_gb_back or 0.0:.3f}/GB "
                f"= ${self.transfer_cost:.4f} "
                f"(+{_duration(t.seconds)} first restore)"
            )
        elif t.per_gb > 0 or t.seconds > 0:
            moved = (
                f" + checkpoint {t.gb:.2f} GB {t.route} at ${t.per_gb:.3f}/GB × {self.copies:.1f} "
                f"copies = ${self.transfer_cost:.4f} (+{_duration(t.seconds)} per restore)"
            )
        per = " per hour of training" if nominal else ""
        return (
            f"${self.spot:.3f}/h × {self.hours:.2f} h{' of wall time' if nominal else ' expected'} "
            f"(MTTP {_duration(self.mttp)}, restart {_duration(self.restart)}{extra}){moved} "
            f"= ${self.cost:.4f}{per}"
        )


def penalty(trouble: Iterable[float], now: float, decay: float = PENALTY_DECAY) -> float:
    """1 + Σ exp(−age/decay) over the times of recent preemptions / capacity failures; an
    event older than five decays (under 1 %) no longer counts, so the zone ties again."""
    return 1.0 + sum(math.exp(-max(0.0, now - t) / decay) for t in trouble if now - t < 5 * decay)


def rank_zones(
    prices: Mapping[str, float],
    markets: Mapping[str, tuple[float, float]],
    *,
    work_s: float | None = None,
    save_s: float | None = None,
    trouble: Mapping[str, Iterable[float]] | None = None,
    now: float = 0.0,
    transfer: Mapping[str, Transfer] | None = None,
    clouds: Mapping[str, str] | None = None,
) -> list[ZoneEstimate]:
    """`prices`: zone → spot $/h; `markets`: zone → (MTTP, restart) seconds; `trouble`: zone →
    times of this job's recent preemptions and capacity failures there; `transfer`: zone →
    moving the checkpoint there (none: beside the store); `clouds`: zone → its cloud (shown).
    Cheapest expected cost first; ties keep the order of `prices` (the user's order); a zone whose
    price is NaN (unknown) last."""
    work = work_s if work_s and work_s > 0 else NOMINAL_WORK
    delta = save_s if save_s is not None and save_s >= 0 else NOMINAL_SAVE
    out: list[ZoneEstimate] = []
    for zone, spot in prices.items():
        mttp, restart = markets[zone]
        move = (transfer or {}).get(zone, _NO_TRANSFER)
        later_s = move.seconds if move.seconds_later is None else move.seconds_later
        first = restart + move.seconds  # the first start there reads the checkpoint across
        restart = restart + later_s  # and each start after a preemption reads it again (or the copy)
        p = penalty((trouble or {}).get(zone, ()), now)
        effective = mttp / p
        if math.isinf(effective):  # a market that never preempts: the work and one start
            wall = work + first
            saves = starts = 0.0
        else:
            tau = max(daly_interval(delta, effective, restart), 1e-3)
            wall = expected_total(work, tau, delta, effective, restart) + first  # + the first start
            saves = work / tau
            starts = max(0.0, wall - first) / effective  # the preemptions' relaunches
        restores = starts + (1.0 if move.restore_first else 0.0)
        copies = saves + restores
        one = move.gb * move.per_gb
        later = move.gb * (move.per_gb if move.per_gb_later is None else move.per_gb_later)
        back = move.per_gb if move.per_gb_back is None else move.per_gb_back
        moving = (one if move.restore_first else 0.0) + later * starts + move.gb * back * saves
        out.append(
            ZoneEstimate(
                zone,
                spot,
                mttp,
                first,
                p,
                wall / 3600.0,
                spot * wall / 3600.0 + moving,
                move,
                moving,
                copies,
                one if move.restore_first else 0.0,
                (clouds or {}).get(zone, ""),
            )
        )
    order = {zone: i for i, zone in enumerate(prices)}
    # a NaN cost (the price unknown) compares as neither less nor more: sorted among the others
    # it would stop a cheaper zone from coming first; it goes last
    unknown = math.isnan
    return sorted(out, key=lambda z: (unknown(z.cost), 0.0 if unknown(z.cost) else z.cost, order[z.zone]))


def _duration(seconds: float) -> str:
    if math.isinf(seconds):
        return "∞"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.1f} s"
