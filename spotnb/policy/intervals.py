"""Closed-form checkpoint intervals (seconds of compute between saves).

Kept apart from the policies so the simulator, the notebook and the tests can evaluate the
formulas directly and compare them with what the policies schedule.
"""

from __future__ import annotations

import math

__all__ = ["young_interval", "daly_interval", "daly2_interval", "expected_total"]


def young_interval(delta: float, mttp: float) -> float:
    """Young (1974): τ = sqrt(2·δ·MTTP). Ignores the restart time."""
    return math.sqrt(2.0 * max(delta, 0.0) * mttp)


def daly_interval(delta: float, mttp: float, restart: float) -> float:
    """τ_opt = sqrt(2·δ·(MTTP + R)) (Eq. 4.5 in ARCHITECTURE.md: Daly's first-order estimate)."""
    return math.sqrt(2.0 * max(delta, 0.0) * (mttp + restart))


def daly2_interval(delta: float, mttp: float) -> float:
    """Daly (2006) higher-order estimate, better when δ is not small against MTTP:
    τ = sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M, else τ = M."""
    delta = max(delta, 0.0)
    if math.isinf(mttp):
        return math.inf
    if delta >= 2.0 * mttp:
        return mttp
    x = delta / (2.0 * mttp)
    return math.sqrt(2.0 * delta * mttp) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def expected_total(work: float, tau: float, delta: float, mttp: float, restart: float) -> float:
    """Eq. 4.4 (ARCHITECTURE.md, "The checkpoint model"): expected wall time of `work` seconds
    of compute saved every `tau` seconds,
    Poisson preemptions (mean `mttp`) landing mid-segment, each costing half a segment plus R:

        T(τ) = T_p + (T_p/τ)·δ + [½(τ+δ) + R]·(T_p/τ)·(τ+δ)/MTTP
    """
    segments = work / tau
    lost_per_preemption = 0.5 * (tau + delta) + restart
    return work + segments * delta + lost_per_preemption * segments * (tau + delta) / mttp
