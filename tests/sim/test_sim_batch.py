"""The vectorised engine (`spotnb.sim.batch`): it agrees with the event-by-event reference in
distribution, reproduces per run whatever the batch, falls back where it does not apply, and the
policies' `batch_plan` says exactly what their `next_save` does."""

from __future__ import annotations

import math

import pytest

from spotnb.policy import Adaptive, Daly, Hedged, Static, Young
from spotnb.policy.base import Observation, SaveKind
from spotnb.sim import Scenario, simulate
from spotnb.sim.batch import plan_for

GPU = Scenario(
    steps=20_000,
    step_time=(0.8, 1.2),
    save_time=(15, 25),
    backup_time=(60, 120),
    alloc_time=(86, 243),
    prep_time=(60, 120),
    grace=30.0,
    mttp=2 * 3600.0,
    spot_price=2.3,
    on_demand_price=6.2,
)
SCENARIOS = {
    "insurance": GPU,
    "emergency-mostly-fits": GPU.replace(grace=120.0),
    "long-steps": Scenario(
        steps=2000,
        step_time=50.0,
        save_time=20.0,
        backup_time=40.0,
        alloc_time=(86, 243),
        prep_time=120.0,
        grace=90.0,
        mttp=3 * 3600.0,
    ),
    "fast-restarts-overlap": Scenario(
        steps=20_000,
        step_time=(0.5, 1.5),
        save_time=(2, 4),
        backup_time=(3, 30),
        alloc_time=(2, 8),
        prep_time=(2, 6),
        grace=30.0,
        mttp=300.0,
        initial_start=True,
    ),
}
KEYS = (
    "total",
    "recompute",
    "save",
    "alloc",
    "prep",
    "preemptions",
    "cost",
    "saves",
    "insurance_saves",
    "emergency_saves",
)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("policy", ["static:400", "adaptive", "hedged", "young"])
def test_batch_agrees_with_event_engine(name, policy) -> None:  # type: ignore[no-untyped-def]
    sc, runs = SCENARIOS[name], 1500
    ref = simulate(sc, policy, runs=runs, seed=21, engine="event")
    fast = simulate(sc, policy, runs=runs, seed=21)
    assert (ref.engine, fast.engine) == ("event", "batch")
    for key in KEYS:
        se = math.hypot(ref.std[key], fast.std[key]) / math.sqrt(runs)
        diff = abs(fast.mean[key] - ref.mean[key])
        assert diff <= 4.5 * se + 1e-9 * max(1.0, abs(ref.mean[key])), (
            key,
            ref.mean[key],
            fast.mean[key],
            se,
        )


def test_batch_exact_without_preemptions() -> None:
    sc = Scenario(steps=10_007, step_time=0.5, save_time=(1, 3), backup_time=2.0, grace=30.0)
    fast = simulate(sc, Static(100), runs=5, seed=2, keep_samples=True)
    assert fast.engine == "batch"
    for row in fast.samples or []:
        assert row["saves"] == 100 and row["preemptions"] == 0
        assert row["compute"] == pytest.approx(10_007 * 0.5)
        assert row["total"] == pytest.approx(row["compute"] + row["save"])
        assert 100 <= row["save"] <= 300


def test_batch_buckets_add_up_and_stay_non_negative() -> None:
    for name, sc in SCENARIOS.items():
        for policy in ("static:50", "hedged", Hedged(prealloc=False, end_aware=False)):
            res = simulate(sc, policy, runs=40, seed=5, keep_samples=True)
            assert res.engine == "batch"
            for row in res.samples or []:
                parts = [row[k] for k in ("compute", "recompute", "save", "alloc", "prep")]
                assert row["total"] == pytest.approx(sum(parts)), name
                assert min(parts) >= -1e-9
                billed = row["cost"] * 3600.0 / (sc.spot_price or 1.0)
                if sc.spot_price:
                    assert billed <= row["total"] - row["alloc"] + row["preemptions"] * sc.grace


def test_batch_seed_reproduces_and_runs_do_not_depend_on_the_batch() -> None:
    sc = SCENARIOS["fast-restarts-overlap"]
    a = simulate(sc, "hedged", runs=300, seed=9, keep_samples=True)
    b = simulate(sc, "hedged", runs=300, seed=9, keep_samples=True)
    c = simulate(sc, "hedged", runs=300, seed=10)
    d = simulate(sc, "hedged", runs=7, seed=9, keep_samples=True)
    assert a.engine == "batch" and a.samples == b.samples and a.mean == b.mean
    assert a.mean != c.mean
    assert d.samples == (a.samples or [])[:7]
    totals = [r["total"] for r in a.samples or []]
    assert len(set(totals)) == len(totals)


def test_event_driven_cost_does_not_grow_with_steps() -> None:
    """A job of 10^12 steps with 10 saves and ~3 preemptions: only feasible event-driven."""
    sc = Scenario(
        steps=10**12,
        step_time=1e-6,
        save_time=5.0,
        backup_time=10.0,
        alloc_time=50.0,
        prep_time=20.0,
        grace=30.0,
        mttp=4e5,
    )
    res = simulate(sc, Static(10**11), runs=20, seed=1)
    assert res.engine == "batch" and 1.0 < res.mean["preemptions"] < 10.0


def test_fallback_to_event_engine() -> None:
    piecewise = GPU.replace(mttp=[3600.0, 7200.0])
    assert simulate(piecewise, "adaptive", runs=2).engine == "event"
    per_vm = GPU.replace(step_time_per="instance")
    assert simulate(per_vm, "adaptive", runs=2).engine == "event"
    periodic = GPU.replace(save_every=500)
    assert simulate(periodic, "adaptive", runs=2).engine == "event"
    assert simulate(GPU, Hedged(hazard=lambda obs: 1e-4), runs=2).engine == "event"

    class Eager(Static):
        def on_notice(self, obs: Observation, time_left: float) -> bool:
            return True

    assert simulate(GPU, Eager(100), runs=2).engine == "event"
    with pytest.raises(ValueError, match="vectorised"):
        simulate(piecewise, "adaptive", runs=2, engine="batch")
    with pytest.raises(ValueError, match="engine"):
        simulate(GPU, "adaptive", runs=2, engine="gpu")


@pytest.mark.parametrize(
    "policy", [Static(37), Adaptive(), Hedged(), Hedged(prealloc=False), Daly(), Daly(order=2), Young()]
)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_batch_plan_is_what_next_save_does(policy, name) -> None:  # type: ignore[no-untyped-def]
    """The contract of `BatchPlan`, checked against the policy itself at many steps."""
    sc = SCENARIOS[name]
    plan = plan_for(sc, policy)
    assert plan is not None
    from spotnb.sim.batch import mean_obs

    obs = mean_obs(sc, sc.process())
    for last in sorted(
        {0, 1, 13, 999, sc.steps // 2, sc.steps - 700, sc.steps - 300, sc.steps - 50, sc.steps - 2}
    ):
        if last < 0:
            continue
        o = obs.with_(step=last, age=17.0, now=1234.0)
        got = policy.next_save(o, last)
        if plan.stride is None or last + plan.stride > plan.last_step:
            assert got is None, (last, got)
        else:
            assert got is not None and got.step == last + plan.stride and got.kind == plan.kind
        for left in (plan.notice_margin - 1e-6, plan.notice_margin + 1e-6, 10.0, 200.0):
            if math.isfinite(left):
                assert policy.on_notice(o, left) == (left > plan.notice_margin)
        assert policy.allocate_on_notice(o) == plan.allocate_on_notice
    assert plan.kind in (SaveKind.PERIODIC, SaveKind.INSURANCE)
