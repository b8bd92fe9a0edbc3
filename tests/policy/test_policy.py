"""Checkpoint policies: the formulas, the decisions, the name registry, and purity."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotnb.policy import (
    Adaptive,
    Daly,
    Hedged,
    Observation,
    Plan,
    Policy,
    SaveKind,
    Static,
    Young,
    daly2_interval,
    daly_interval,
    emergency_feasible,
    expected_total,
    policy_names,
    resolve_policy,
    steps_for,
    unprotected_fraction,
    young_interval,
)


def obs(**kw: object) -> Observation:
    base = dict(
        step=0,
        step_time=1.0,
        snapshot_time=10.0,
        upload_time=20.0,
        mttp=3 * 3600.0,
        restart_time=200.0,
        grace=30.0,
    )
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
        assert tau2 == pytest.approx(math.sqrt(2 * delta * mttp) * (1 + math.sqrt(x) / 3 + x / 9) - delta)
    else:
        assert tau2 == mttp


def test_daly2_tends_to_young_for_small_delta() -> None:
    assert daly2_interval(1e-3, 1e6) / young_interval(1e-3, 1e6) == pytest.approx(1, rel=1e-3)
    assert daly2_interval(500, 200) == 200  # δ ≥ 2M


@given(delta=st.floats(1, 300), mttp=st.floats(3600, 1e6), r=st.floats(0, 1e3))
def test_daly_minimises_eq_4_4(delta: float, mttp: float, r: float) -> None:
    """Eq. 4.5 is (to first order) the minimiser of Eq. 4.4; the exact one is
    sqrt(2δ(M+R) + δ²)."""
    exact = math.sqrt(2 * delta * (mttp + r) + delta**2)
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
    assert Young().next_save(o, 0) == Plan(steps_for(young_interval(10, o.mttp), 3.0), SaveKind.INSURANCE)
    assert Daly().next_save(o, 7).step == 7 + steps_for(daly_interval(10, o.mttp, 200), 3.0)
    assert Daly(order=2).next_save(o, 0).step == steps_for(daly2_interval(10, o.mttp), 3.0)
    with pytest.raises(ValueError):
        Daly(order=3)


def test_emergency_feasible_uses_state_size_before_measurement() -> None:
    o = obs(snapshot_time=0.0, upload_time=0.0, state_bytes=int(5e9))  # 5 s + 100 s
    assert not emergency_feasible(o, 30.0)
    assert emergency_feasible(o, 200.0)


@given(grace=st.floats(0, 300), step=st.floats(0.01, 100), d=st.floats(0, 50), b=st.floats(0, 100))
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


@pytest.mark.parametrize(
    "policy", [Static(7), Young(), Daly(), Adaptive(), Hedged(end_aware=False), Hedged()]
)
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
    code = (
        "import sys, spotnb.policy, spotnb.market.preempt, spotnb.sim, spotnb.traces; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas', 'plotly')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# -- short-lived instances (issue 14, item 5: a livelock under load) -------------------------
def _livelock_obs(**kw: object) -> Observation:
    """What the runtime saw in the livelock: 6 s lives, start-up longer than that, a 1 s
    grace, a small state whose save was never measured (so it looked free)."""
    base = dict(
        step=0,
        step_time=0.05,
        snapshot_time=0.0,
        upload_time=0.0,
        mttp=6.0,
        restart_time=7.0,
        grace=1.0,
        state_bytes=4_000_000,
    )
    base.update(kw)
    return Observation(**base)  # type: ignore[arg-type]


def test_hedged_saves_right_after_the_first_step_when_lives_are_shorter_than_start_up() -> None:
    from spotnb.policy.hedged import short_lived

    o = _livelock_obs()
    assert short_lived(o)
    assert Hedged().next_save(o, 0) == Plan(1, SaveKind.INSURANCE)
    assert Hedged().next_save(o.with_(step=30), 30) == Plan(31, SaveKind.INSURANCE)  # a resume
    # before the first step is timed, the job's length is no reason to skip it
    assert Hedged().next_save(o.with_(step_time=0.0, total_steps=400), 0) == Plan(1, SaveKind.INSURANCE)
    # the guessed save must not pass for an emergency save that would abandon the insurance
    assert not Hedged().on_notice(o.with_(step=1), 1.0)


def test_hedged_then_saves_at_a_sane_interval() -> None:
    # after one measured save: the Daly interval with every preemption unprotected, and never
    # more often than one upload takes
    o = _livelock_obs(step=1, snapshot_time=0.005, upload_time=2.0)
    plan = Hedged().next_save(o, 1)
    tau = max(daly_interval(0.005, 6.0, 7.0), 2.0)
    assert plan == Plan(1 + steps_for(tau, 0.05), SaveKind.INSURANCE)
    o = _livelock_obs(step=1, snapshot_time=0.05, upload_time=0.01, step_time=0.01)
    plan = Hedged().next_save(o, 1)
    assert plan == Plan(1 + steps_for(daly_interval(0.05, 6.0, 7.0), 0.01), SaveKind.INSURANCE)
    # an emergency save measured to fit is still taken
    assert Hedged().on_notice(o, 1.0)


def test_hedged_is_unchanged_where_instances_live_long() -> None:
    # a 1 s grace that the measured save fits, and lives far longer than start-up: no insurance
    o = _livelock_obs(mttp=3600.0, restart_time=7.0, snapshot_time=0.01, upload_time=0.1)
    assert Hedged().next_save(o, 0) is None and Hedged().on_notice(o, 1.0)
    # unmeasured, on a normal market: no first-step save either (no cost for ordinary jobs)
    o = _livelock_obs(mttp=3 * 3600.0, restart_time=170.0, grace=120.0)
    assert Hedged().next_save(o, 0) is None
    assert Hedged().batch_plan(o.with_(snapshot_time=0.01, upload_time=0.1)) is not None
    assert Hedged().batch_plan(_livelock_obs()) is None  # the simulator asks event by event


def _wide_linear(ctx, steps: int = 400, step_time: float = 0.05) -> int:
    """4 MB of state and steps of known length: with a slow upload, no save fits a 1 s grace."""
    import time as _time

    import torch

    model = torch.nn.Linear(1000, 1000)
    ctx.track(model=model)
    for _ in ctx.steps(steps):
        _time.sleep(step_time)
    return ctx.step_index


@pytest.mark.timeout(900)
def test_short_lived_instances_with_slow_start_up_make_progress() -> None:
    """The livelock, small. Allocation takes 20 s, so the controller's R (request to ready)
    exceeds the 21 s mean life; the grace is 1 s and the 4 MB state takes 2 s to upload, so
    no emergency save can finish. Before the fix Hedged trusted the notice (the size-based
    guess of the save fits 1 s), took no insurance, and every incarnation began at step 0
    (one of 15 jobs under load: 150 launches, never a checkpoint). Now the first save comes
    right after the first step, and a preemption no longer takes everything with it."""
    import time

    import spotnb as spot

    config = spot.Config(
        checkpoint="hedged",
        local_mttp=21.0,
        local_grace=1.0,
        local_alloc_delay=20.0,
        local_upload_bps=2e6,
        local_seed=3,
        ship_modules=[__name__],
    )
    job = spot.train(_wide_linear, config)
    try:
        deadline = time.time() + 600  # lives that outlast a loaded box's start-up are random
        while time.time() < deadline and job.status not in ("succeeded", "failed"):
            if any(e["kind"] == "checkpoint" for e in job.events):
                break
            time.sleep(0.5)
        saved = [e for e in job.events if e["kind"] == "checkpoint"]
        assert saved, [e["kind"] for e in job.events]
        assert saved[0]["save_kind"] == "insurance" and saved[0]["step"] <= 2, saved[0]
    finally:
        job.stop()
