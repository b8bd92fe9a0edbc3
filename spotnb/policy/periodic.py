"""Classic interval policies: Young's and Daly's formulas, re-evaluated after every save.

They save at their interval whether or not a notice would leave room for an emergency save
(that is what `Adaptive` adds); on a notice they still do the emergency save when it fits.
"""

from __future__ import annotations

from abc import abstractmethod

from spotnb.policy.base import BatchPlan, Observation, Plan, Policy, SaveKind, steps_for
from spotnb.policy.intervals import daly2_interval, daly_interval, young_interval
from spotnb.policy.static import FOREVER, periodic_plan, snapshot_estimate

__all__ = ["Young", "Daly"]


class _Interval(Policy):
    """A save every `interval(obs)` seconds of compute, and at the user's `save_every`."""

    @abstractmethod
    def interval(self, obs: Observation) -> float:
        """Seconds of compute between saves, from the latest averages."""

    def next_save(self, obs: Observation, last_save_step: int) -> Plan | None:
        plan = Plan(last_save_step + steps_for(self.interval(obs), obs.step_time), SaveKind.INSURANCE)
        periodic = periodic_plan(obs, last_save_step)
        return periodic if periodic is not None and periodic.step <= plan.step else plan

    def stationary_until(self, obs: Observation) -> int:
        return 0 if obs.save_every else FOREVER

    def batch_plan(self, obs: Observation) -> BatchPlan | None:
        rules = self._notice_rules(obs, _Interval)
        if rules is None or obs.save_every or self._overrides(_Interval, "next_save"):
            return None
        stride = steps_for(self.interval(obs), obs.step_time)
        return BatchPlan(stride, SaveKind.INSURANCE, FOREVER, *rules)


class Young(_Interval):
    """τ = sqrt(2·δ·MTTP) (Young 1974)."""

    name = "young"

    def interval(self, obs: Observation) -> float:
        return young_interval(snapshot_estimate(obs), obs.mttp)


class Daly(_Interval):
    """Daly's estimate: order 1 is Eq. 4.5's form τ = sqrt(2·δ·(MTTP + R)); order 2 is Daly's
    higher-order expansion, which matters when δ is not small against MTTP."""

    name = "daly"

    def __init__(self, order: int = 1) -> None:
        if order not in (1, 2):
            raise ValueError(f"Daly(order=...) is 1 or 2, got {order}")
        self.order = order
        self.name = "daly" if order == 1 else "daly2"

    def interval(self, obs: Observation) -> float:
        delta = snapshot_estimate(obs)
        if self.order == 1:
            return daly_interval(delta, obs.mttp, obs.restart_time)
        return daly2_interval(delta, obs.mttp)

    def __repr__(self) -> str:
        return "Daly()" if self.order == 1 else "Daly(order=2)"
