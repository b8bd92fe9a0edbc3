"""Preemption processes shared by the simulator and the local injector."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotnb.market.preempt import (
    Exponential,
    Lifetimes,
    Never,
    Piecewise,
    PreemptionProcess,
    Schedule,
    TraceReplay,
)


def lifetimes(proc: PreemptionProcess, n: int, seed: int = 0, start: float = 0.0) -> list[float]:
    rng = random.Random(seed)
    return [proc.next_preemption(start, rng) - start for _ in range(n)]


def test_exponential_mean_and_seed() -> None:
    proc = Exponential(3600.0)
    xs = lifetimes(proc, 20_000)
    assert statistics.mean(xs) == pytest.approx(3600.0, rel=0.03)
    assert xs == lifetimes(proc, 20_000)
    assert proc.mttp == 3600.0
    with pytest.raises(ValueError):
        Exponential(0)


def test_never_and_lifetimes() -> None:
    assert Never().next_preemption(5.0, random.Random()) == math.inf
    proc = Lifetimes([10.0, 20.0])
    rng = random.Random()
    assert [proc.next_preemption(100.0, rng) for _ in range(3)] == [110.0, 120.0, math.inf]
    fresh = proc.fresh()
    assert fresh.next_preemption(0.0, rng) == 10.0


def test_schedule_kills_at_first_time_after_start() -> None:
    proc = Schedule([30.0, 10.0, 50.0])
    rng = random.Random()
    assert proc.next_preemption(0.0, rng) == 10.0
    assert proc.next_preemption(10.0, rng) == 30.0
    assert proc.next_preemption(60.0, rng) == math.inf


@given(mttp=st.floats(10, 1e5), start=st.floats(0, 1e6))
@settings(max_examples=20, deadline=None)
def test_piecewise_with_one_rate_is_exponential(mttp: float, start: float) -> None:
    xs = lifetimes(Piecewise([mttp, mttp, mttp], phase=mttp / 3), 4000, start=start)
    assert min(xs) > 0
    assert statistics.mean(xs) == pytest.approx(mttp, rel=0.08)


def test_piecewise_rates_by_phase() -> None:
    """Phases 0–1 h MTTP 1 h, 1–2 h never: kills land in the first hour of each cycle, and the
    long-run MTTP is the cycle over the integrated hazard."""
    proc = Piecewise([3600.0, math.inf], phase=3600.0)
    assert proc.mttp == pytest.approx(7200.0)
    rng = random.Random(3)
    for start in (0.0, 1800.0, 3600.0, 5000.0, 7200.0 * 10 + 100):
        for _ in range(200):
            t = proc.next_preemption(start, rng)
            assert t > start and (t % 7200.0) < 3600.0
    with pytest.raises(ValueError):
        Piecewise([])
    with pytest.raises(ValueError):
        Piecewise([100.0], durations=[1.0, 2.0])


def test_piecewise_pairs_and_mean_rate() -> None:
    proc = Piecewise([1000.0, 4000.0], durations=[1000.0, 3000.0])
    # hazard per cycle: 1000/1000 + 3000/4000 = 1.75 over 4000 s
    assert proc.mttp == pytest.approx(4000.0 / 1.75)
    # chained draws are the Poisson process itself: events per second → the cycle's mean rate
    rng, t, n = random.Random(1), 0.0, 0
    while n < 20_000:
        t = proc.next_preemption(t, rng)
        n += 1
    assert n / t == pytest.approx(1.75 / 4000.0, rel=0.03)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "mttps, durations",
    [
        ([1e-300, 3600], [1e15, 3600]),  # a phase's hazard overflows: 0 cycles x inf made NaN
        ([math.inf, 1e15], [1e15, 3600]),  # far out on the clock the 3600 s phase vanished
        ([60, math.inf], [1e-300, 3600]),  # the rounding left more than a tiny cycle uses up
    ],
)
def test_piecewise_draws_end_for_extreme_phases(mttps: list[float], durations: list[float]) -> None:
    """Each of these looped for ever (found by feeding `spotnb plan` extreme scenarios)."""
    p, rng = Piecewise(mttps, durations), random.Random(0)
    for start in (0.0, 1.0, 1e15, 1e15 + 10):
        for _ in range(20):
            t = p.next_preemption(start, rng)
            assert t >= start and not math.isnan(t)


def test_trace_replay_certain_and_cycling() -> None:
    # one instance, removed at 100 s of a 1000 s trace: a VM is always killed at 100 mod 1000
    proc = TraceReplay([100.0], [1], [1], span=1000.0)
    rng = random.Random()
    assert proc.next_preemption(0.0, rng) == 100.0
    assert proc.next_preemption(100.0, rng) == 1100.0
    assert proc.next_preemption(2500.0, rng) == 3100.0
    shifted = TraceReplay([100.0], [1], [1], span=1000.0, offset=50.0)
    assert shifted.next_preemption(0.0, rng) == 50.0
    assert TraceReplay([], [], [], span=10.0).next_preemption(0.0, rng) == math.inf


def test_trace_replay_probability_is_k_over_n() -> None:
    proc = TraceReplay([10.0, 20.0], [4, 3], [1, 3], span=100.0)
    rng = random.Random(5)
    first = [proc.next_preemption(0.0, rng) for _ in range(8000)]
    share = sum(1 for t in first if t == 10.0) / len(first)
    assert share == pytest.approx(0.25, abs=0.02)
    assert set(first) == {10.0, 20.0}
