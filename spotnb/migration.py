"""When a running job should move to another zone (`Config.migrate="best-price"`).

DeepSpotCloud's *best price* heuristic, on the expected costs of `spotnb.placement`: with W
seconds of work left, staying costs what the work costs here (`rank_zones`' estimate without
the first start: the job already runs here); moving costs what the work costs there, plus the
move itself — the save before leaving (δ at this zone's price: training pauses for it) and the
new instance's start (its restart time at the new price, in the new zone's estimate) — plus
moving the checkpoint (nothing yet: the store stays where it is and the new zone reads it;
see the README's "Placement and migration"). The job moves when

    saving = stay − (there + δ·p_here)  >  MIN_GAIN · stay

i.e. when the expected saving over the remaining work exceeds the cost of the move by a margin
(prices wobble; a move for 1 % is noise and a chain of such moves costs more than it saves).

Billing boundaries (DeepSpotCloud's third heuristic) are not modelled: the three clouds bill
Linux VMs by the second (AWS and GCP after the first minute), so no moment of the hour is
cheaper to leave at.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotnb.placement import NOMINAL_SAVE, ZoneEstimate

__all__ = ["MIN_GAIN", "Move", "best_move"]

#: the share of staying's expected cost a move must save, after paying for itself
MIN_GAIN = 0.05


@dataclass(frozen=True)
class Move:
    """A move worth making: from `here` to `there`, saving `saving` $ net of `cost` $."""

    here: ZoneEstimate
    there: ZoneEstimate
    stay: float  # $ the remaining work is expected to cost here
    cost: float  # $ of the move: the save here and the start there
    saving: float  # $ expected to be saved by moving, the move paid

    def reason(self) -> str:
        """The two zones' terms in words, for the event feed."""
        return (
            f"{self.there.zone} at ${self.there.spot:.3f}/h against ${self.here.spot:.3f}/h here: "
            f"the remaining work is expected to cost ${self.stay:.4f} here and "
            f"${self.stay - self.saving - self.cost:.4f} there, and the move ${self.cost:.4f} "
            "(a save here, a start there)"
        )


def best_move(ranked: list[ZoneEstimate], here: str | None, save_s: float | None) -> Move | None:
    """The move to make now, if any. `ranked`: `rank_zones` over the candidate zones with the
    job's remaining work; `here`: the zone the job runs in; `save_s`: the time of one save
    (snapshot + upload; None: not measured yet)."""
    current = next((z for z in ranked if z.zone == here), None)
    if current is None or not ranked or ranked[0].zone == here:
        return None
    there = ranked[0]
    delta = save_s if save_s is not None and save_s >= 0 else NOMINAL_SAVE
    stay = current.cost - current.spot * current.restart / 3600.0  # no new start to pay here
    start_there = there.spot * there.restart / 3600.0
    work_there = there.cost - start_there
    cost = current.spot * delta / 3600.0 + start_there
    saving = stay - work_there - cost
    if saving <= MIN_GAIN * stay:
        return None
    return Move(current, there, stay, cost, saving)
