"""Fixed policies and those of the checkpoint model (ARCHITECTURE.md): a save every N steps
(with or without emergency saves), and the adaptive Algorithm 1."""

from __future__ import annotations

import math
from collections.abc import Callable

from spotnb.policy.base import (
    BatchPlan,
    Observation,
    Plan,
    Policy,
    SaveKind,
    snapshot_estimate,
    steps_for,
    upload_estimate,
)
from spotnb.policy.intervals import daly_interval

#: A step no job reaches: the `until` of a plan that never ends on its own.
FOREVER = 2**62

__all__ = [
    "FOREVER",
    "Static",
    "Periodic",
    "Adaptive",
    "daly_interval",
    "snapshot_estimate",
    "upload_estimate",
    "periodic_plan",
]


def periodic_plan(obs: Observation, last_save_step: int) -> Plan | None:
    """The user's next `save_every` boundary (aligned to multiples, as the checkpoint model does)."""
    if not obs.save_every:
        return None
    every = obs.save_every
    return Plan(last_save_step + every - (last_save_step % every), SaveKind.PERIODIC)


class Static(Policy):
    """A periodic save every `every` steps and nothing else (plus emergency saves on notice)."""

    name = "static"

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"Static(every=...) needs a positive step count, got {every}")
        self.every = int(every)

    def next_save(self, obs: Observation, last_save_step: int) -> Plan | None:
        return Plan(last_save_step + self.every, SaveKind.PERIODIC)

    def stationary_until(self, obs: Observation) -> int:
        return FOREVER

    def batch_plan(self, obs: Observation) -> BatchPlan | None:
        rules = self._notice_rules(obs, Static)
        if rules is None or self._overrides(Static, "next_save"):
            return None
        return BatchPlan(self.every, SaveKind.PERIODIC, FOREVER, *rules)

    def __repr__(self) -> str:
        return f"Static(every={self.every})"


class Periodic(Static):
    """A save every `every` steps and nothing else, not even on a notice: the VM trains on
    until it is killed. The periodic baseline (benchmarks/TABLE_6_2.md compares Adaptive with it); `Static`
    is the same interval plus the emergency save whenever it fits, so it cannot stand in."""

    name = "periodic"

    def on_notice(self, obs: Observation, time_left: float) -> bool:
        return False

    def batch_plan(self, obs: Observation) -> BatchPlan | None:
        cls = type(self)
        if (
            self._overrides(Periodic, "next_save", "on_notice")
            or cls.allocate_on_notice is not Policy.allocate_on_notice
        ):
            return None
        return BatchPlan(self.every, SaveKind.PERIODIC, FOREVER, math.inf, False)

    def __repr__(self) -> str:
        return f"Periodic(every={self.every})"


class Adaptive(Policy):
    """Algorithm 1 of the checkpoint model (ARCHITECTURE.md): user periodic saves; insurance
    saves at τ_opt = sqrt(2δ(MTTP+R)),
    rescheduled after every save with the latest averages, only when a notice would not leave
    room for an emergency save (T_step + δ + β ≥ T_grace)."""

    name = "adaptive"

    def __init__(self, hazard: Callable[[Observation], float] | None = None) -> None:
        #: optional rate per second replacing `obs.mttp` (e.g. `spotnb.market.forecast.forecast_hazard`)
        self.hazard = hazard

    def market_mttp(self, obs: Observation) -> float:
        if self.hazard is None:
            return obs.mttp
        rate = self.hazard(obs)
        return 1.0 / rate if rate > 0 else math.inf

    def next_save(self, obs: Observation, last_save_step: int) -> Plan | None:
        periodic = periodic_plan(obs, last_save_step)
        if self.emergency_expected(obs):
            return periodic
        mttp = self.market_mttp(obs)
        if math.isinf(mttp):
            return periodic
        tau = daly_interval(snapshot_estimate(obs), mttp, obs.restart_time)
        insurance = Plan(last_save_step + steps_for(tau, obs.step_time), SaveKind.INSURANCE)
        if periodic is None or insurance.step < periodic.step:
            return insurance
        return periodic

    def stationary_until(self, obs: Observation) -> int:
        if obs.save_every or self.hazard is not None:  # periodic saves align to multiples
            return 0
        return FOREVER

    def batch_plan(self, obs: Observation) -> BatchPlan | None:
        rules = self._notice_rules(obs, Adaptive)
        if (
            rules is None
            or obs.save_every
            or self.hazard is not None
            or self._overrides(Adaptive, "next_save", "emergency_expected", "market_mttp")
        ):
            return None
        if self.emergency_expected(obs):
            return BatchPlan(None, SaveKind.INSURANCE, FOREVER, *rules)
        tau = daly_interval(snapshot_estimate(obs), obs.mttp, obs.restart_time)
        return BatchPlan(steps_for(tau, obs.step_time), SaveKind.INSURANCE, FOREVER, *rules)

    def __repr__(self) -> str:
        return f"Adaptive(hazard={self.hazard!r})" if self.hazard is not None else "Adaptive()"
