"""Fixed and thesis policies: a save every N steps, and the adaptive Algorithm 1."""
from __future__ import annotations

import math

from spotnb.policy.base import Observation, Plan, Policy, SaveKind, steps_for

__all__ = ["Static", "Adaptive", "daly_interval"]


def daly_interval(delta: float, mttp: float, restart: float) -> float:
    """τ_opt = sqrt(2·δ·(MTTP + R)) (thesis Eq. 4.5, Daly's first-order estimate)."""
    return math.sqrt(2.0 * max(delta, 0.0) * (mttp + restart))


class Static(Policy):
    """A periodic save every `every` steps and nothing else (plus emergency saves on notice)."""

    name = "static"

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"Static(every=...) needs a positive step count, got {every}")
        self.every = every

    def next_save(self, obs: Observation, last_save_step: int) -> Plan | None:
        return Plan(last_save_step + self.every, SaveKind.PERIODIC)

    def __repr__(self) -> str:
        return f"Static(every={self.every})"


class Adaptive(Policy):
    """Thesis Algorithm 1: user periodic saves; insurance saves at τ_opt only when a notice
    would not leave room for an emergency save."""

    name = "adaptive"

    def next_save(self, obs: Observation, last_save_step: int) -> Plan | None:
        periodic = (Plan(last_save_step + obs.save_every - (last_save_step % obs.save_every),
                         SaveKind.PERIODIC) if obs.save_every else None)
        if self.emergency_expected(obs):
            return periodic
        delta = obs.snapshot_time or obs.state_bytes / 1e9
        tau = daly_interval(delta, obs.mttp, obs.restart_time)
        insurance = Plan(last_save_step + steps_for(tau, obs.step_time), SaveKind.INSURANCE)
        if periodic is None or insurance.step < periodic.step:
            return insurance
        return periodic
