"""Checkpoint policies: the formulas, the decisions, the name registry, and purity."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotnb.policy import (Adaptive, Daly, Hedged, Observation, Plan, Policy, SaveKind, Static,
                           Young, daly2_interval, daly_interval, emergency_feasible,
                           expected_total, policy_names, resolve_policy, steps_for,
                           unprotected_fraction, young_interval)


def obs(**kw: object) -> Observation:
    base = dict(step=0, step_time=1.0, snapshot_time=10.0, upload_time=20.0, mttp=3 * 3600.0,
                restart_time=200.0, grace=30.0)
    base.update(kw)
    return Observation(**base)  # type: ignore[arg-type]


# -- formulas ---------------------------------------------------------------------------------
@given(delta=st.floats(0.1, 1e3), mttp=st.floats(60, 1e6), r=st.floats(0, 1e4))
def test_interval_formulas(delta: float, mttp: float, r: float) -> None:
    assert young_interval(delta, mttp) == pytest.approx(math.sqrt(2 * delta * mttp))
    assert daly_interval(delta, mttp, r) == pytest.approx(math.sqrt(2 * delta * (mttp + r)))
    assert daly_interval(delta, mttp, r) >= young_interval(delta, mttp)
    tau2 = daly2_interval(delta, mttp)
    if delta < 2 * mttp:
        x = delta / (2 * mttp)
        assert tau2 == pytest.approx(math.sqrt(2 * delta * mttp) * (1 + math.sqrt(x) / 3 + x / 9)
                                     - delta)
    else:
        assert tau2 == mttp


def test_daly2_tends_to_young_for_small_delta() -> None:
    assert daly2_interval(1e-3, 1e6) / young_interval(1e-3, 1e6) == pytest.approx(1, rel=1e-3)
    assert daly2_interval(500, 200) == 200  # δ ≥ 2M


@given(delta=st.floats(1, 300), mttp=st.floats(3600, 1e6), r=st.floats(0, 1e3))
def test_daly_minimises_eq_4_4(delta: float, mttp: float, r: float) -> None:
    """Eq. 4.5 is (to first order) the minimiser of Eq. 4.4; the exact one is
    sqrt(2δ(M+R) + δ²)."""
    exact = math.sqrt(2 * delta * (mttp + r) + delta ** 2)
    f = lambda tau: expected_total(1e6, tau, delta, mttp, r)  # noqa: E731
    assert f(exact) <= f(exact * 1.05) and f(exact) <= f(exact * 0.95)
    assert daly_interval(delta, mttp, r) == pytest.approx(exact, rel=delta / mttp + 1e-9)


# -- decisions --------------------------------------------------------------------------------
def test_static_saves_every_n() -> None:
    assert Static(50).next_save(obs(), 120) == Plan(170, SaveKind.PERIODIC)
    with pytest.raises(ValueError):
        Static(0)


def test_adaptive_no_insurance_when_emergency_feasible() -> None:
    o = obs(grace=120.0, snapshot_time=10.0, upload_time=20.0, step_time=5.0)
    assert Adaptive().emergency_expected(o)
    assert Adaptive().next_save(o, 0) is None
    assert Adaptive().next_save(o.with_(save_every=100), 130) == Plan(200, SaveKind.PERIODIC)


def test_adaptive_insures_at_tau_opt_when_emergency_infeasible() -> None:
    o = obs(grace=30.0, snapshot_time=10.0, upload_time=25.0, step_time=2.0)
    tau = daly_interval(10.0, o.mttp, o.restart_time)
    plan = Adaptive().next_save(o, 40)
    assert plan == Plan(40 + steps_for(tau, 2.0), SaveKind.INSURANCE)
    # the user's periodic save comes first when it is due earlier, and aligns to multiples
    assert Adaptive().next_save(o.with_(save_every=100), 40) == Plan(100, SaveKind.PERIODIC)


def test_adaptive_reschedules_with_latest_averages() -> None:
    o = obs(grace=0.0)
    short = Adaptive().next_save(o.with_(snapshot_time=5.0), 0)
    long = Adaptive().next_save(o.with_(snapshot_time=50.0), 0)
    assert short is not None and long is not None and short.step < long.step


def test_young_and_daly_plans() -> None:
    o = obs(grace=0.0, step_time=3.0)
    assert Young().next_save(o, 0) == Plan(steps_for(young_interval(10, o.mttp), 3.0),
                                           SaveKind.INSURANCE)
    assert Daly().next_save(o, 7).step == 7 + steps_for(daly_interval(10, o.mttp, 200), 3.0)
    assert Daly(order=2).next_save(o, 0).step == steps_for(daly2_interval(10, o.mttp), 3.0)
    with pytest.raises(ValueError):
        Daly(order=3)


def test_emergency_feasible_uses_state_size_before_measurement() -> None:
    o = obs(snapshot_time=0.0, upload_time=0.0, state_bytes=int(5e9))  # 5 s + 100 s
    assert not emergency_feasible(o, 30.0)
    assert emergency_feasible(o, 200.0)


@given(grace=st.floats(0, 300), step=st.floats(0.01, 100), d=st.floats(0, 50),
       b=st.floats(0, 100))
def test_unprotected_fraction_bounds(grace: float, step: float, d: float, b: float) -> None:
    o = obs(grace=grace, step_time=step, snapshot_time=d, upload_time=b)
    p = unprotected_fraction(o)
    assert 0.0 <= p <= 1.0
    if step + d + b + 0.5 < grace:
        assert p == 0.0
    if d + b + 0.5 >= grace:
        assert p == 1.0


def test_hedged_interval_between_none_and_adaptive() -> None:
    hedged, adaptive = Hedged(end_aware=False), Adaptive()
    # all notices uncovered: same as Adaptive
    o = obs(grace=10.0)
    assert hedged.next_save(o, 0) == adaptive.next_save(o, 0)
    # all covered: no insurance, like Adaptive
    o = obs(grace=120.0, step_time=1.0)
    assert hedged.next_save(o, 0) is None and adaptive.next_save(o, 0) is None
    # step too long for certain coverage: Adaptive insures fully, Hedged less often
    o = obs(grace=60.0, step_time=40.0, snapshot_time=10.0, upload_time=20.0)
    a, h = adaptive.next_save(o, 0), hedged.next_save(o, 0)
    assert a is not None and h is not None and h.step > a.step
    p = unprotected_fraction(o)
    assert h.step == steps_for(daly_interval(10.0, o.mttp / p, o.restart_time), 40.0)
    assert hedged.allocate_on_notice(o) and not adaptive.allocate_on_notice(o)


def test_hedged_skips_a_save_right_before_the_end() -> None:
    o = obs(grace=0.0, total_steps=10_000)
    tau_steps = steps_for(daly_interval(10.0, o.mttp, o.restart_time), 1.0)
    assert Hedged().next_save(o, 0) == Plan(tau_steps, SaveKind.INSURANCE)
    assert Hedged().next_save(o, 10_000 - tau_steps - 1) is None
    assert Hedged(end_aware=False).next_save(o, 10_000 - tau_steps - 1) is not None


@pytest.mark.parametrize("policy", [Static(7), Young(), Daly(), Adaptive(),
                                    Hedged(end_aware=False), Hedged()])
@given(last=st.integers(0, 10**6), grace=st.sampled_from([0.0, 45.0, 200.0]))
@settings(max_examples=30)
def test_stationary_until_is_honest(policy: Policy, last: int, grace: float) -> None:
    """Where a policy claims a fixed stride, asking it again gives the shifted plan."""
    o = obs(grace=grace, step_time=2.0, step=0, total_steps=2 * 10**6)
    first = policy.next_save(o, 0)
    until = policy.stationary_until(o)
    if first is None or first.step + last > until:
        return
    again = policy.next_save(o.with_(step=last), last)
    assert again == Plan(first.step + last, first.kind)


# -- names ------------------------------------------------------------------------------------
def test_registry_names() -> None:
    assert set(policy_names()) >= {"static", "young", "daly", "daly2", "adaptive", "hedged"}
    assert isinstance(resolve_policy("static:25"), Static)
    assert resolve_policy("static:25").every == 25
    assert isinstance(resolve_policy("young"), Young)
    assert resolve_policy("daly2").order == 2
    assert isinstance(resolve_policy(" Adaptive "), Adaptive)
    assert isinstance(resolve_policy("hedged"), Hedged)
    p = Hedged(prealloc=False)
    assert resolve_policy(p) is p


@pytest.mark.parametrize("bad", ["static", "static:x", "nope", "young:3", 3])
def test_registry_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        resolve_policy(bad)


def test_policy_import_is_pure() -> None:
    code = ("import sys, spotnb.policy, spotnb.preempt, spotnb.sim, spotnb.traces; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas', 'plotly')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
