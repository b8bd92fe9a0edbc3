"""The simulator: exact bookkeeping on hand-checked schedules, the thesis model (Eq. 4.4/4.5),
Adaptive's contract, monotonicity in preemptions, and reproducibility."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotnb.market.preempt import Lifetimes, Schedule
from spotnb.policy import Adaptive, Hedged, Static, daly_interval, expected_total
from spotnb.sim import METRICS, Scenario, simulate, simulate_run

BUCKETS = ("compute", "recompute", "save", "alloc", "prep")


def run_once(sc: Scenario, policy, process) -> dict[str, float]:  # type: ignore[no-untyped-def]
    row = simulate_run(sc, policy, process, random.Random(1), random.Random(2))
    return dict(zip(METRICS, row, strict=True))


durations = st.one_of(st.floats(0, 20), st.tuples(st.floats(0, 10), st.floats(10, 30)))
policies = st.sampled_from([Static(13), Static(200), Adaptive(), Hedged()])


# -- exact bookkeeping --------------------------------------------------------------------------
@given(
    steps=st.integers(1, 5000),
    step_time=st.floats(0.01, 5),
    save=st.floats(0.5, 20),
    backup=durations,
    policy=policies,
)
@settings(max_examples=60, deadline=None)
def test_no_preemptions_total_is_compute_plus_saves(steps, step_time, save, backup, policy):
    sc = Scenario(
        steps=steps,
        step_time=step_time,
        save_time=save,
        backup_time=backup,
        alloc_time=(10, 20),
        prep_time=5,
        grace=30,
        mttp=None,
    )
    r = simulate(sc, policy, runs=3, seed=4).mean
    assert r["total"] == pytest.approx(r["compute"] + r["save"])
    assert r["compute"] == pytest.approx(steps * step_time)
    assert r["recompute"] == r["alloc"] == r["prep"] == r["preemptions"] == 0


@given(
    steps=st.integers(10, 3000),
    step_time=st.floats(0.1, 5),
    save=st.floats(0.5, 20),
    backup=durations,
    alloc=durations,
    prep=durations,
    grace=st.floats(0, 150),
    mttp=st.floats(100, 5000),
    policy=policies,
    seed=st.integers(0, 100),
)
@settings(max_examples=60, deadline=None)
def test_buckets_add_up(steps, step_time, save, backup, alloc, prep, grace, mttp, policy, seed):
    sc = Scenario(
        steps=steps,
        step_time=step_time,
        save_time=save,
        backup_time=backup,
        alloc_time=alloc,
        prep_time=prep,
        grace=grace,
        mttp=mttp,
        spot_price=1.0,
        on_demand_price=3.0,
    )
    res = simulate(sc, policy, runs=4, seed=seed, keep_samples=True)
    for row in res.samples or []:
        assert row["total"] == pytest.approx(sum(row[k] for k in BUCKETS))
        assert row["compute"] == pytest.approx(steps * step_time)
        assert min(row[k] for k in BUCKETS) >= -1e-9
        # billed time is at most the wall time minus the unbilled allocation waits, plus the
        # overlap of two VMs (bounded by the grace period per preemption)
        billed = row["cost"] * 3600.0
        assert billed <= row["total"] - row["alloc"] + row["preemptions"] * grace + 1e-6
        assert row["on_demand_cost"] == pytest.approx(steps * step_time * 3.0 / 3600.0)


def test_lost_upload_is_recomputed() -> None:
    """Saves at steps 10 (upload done t=16) and 20 (upload would finish t=27); the kill at t=25
    loses the second one: resume from 10, redo 13 steps."""
    sc = Scenario(steps=100, step_time=1.0, save_time=1.0, backup_time=5.0, grace=0.0)
    r = run_once(sc, Static(10), Lifetimes([25.0]))
    assert r["recompute"] == pytest.approx(13.0)
    assert r["save"] == pytest.approx(2 + 8)  # 2 before the kill, 8 after resuming at step 10
    assert r["total"] == pytest.approx(100 + 13 + 10)
    assert r["preemptions"] == 1


def test_emergency_save_on_notice_then_restart() -> None:
    """Kill at 50, notice at 40 (a step boundary): save 40..42, upload till 45, leave; then
    allocation 5 and preparation 7, resume from step 40 at 57, done at 117."""
    sc = Scenario(
        steps=100, step_time=1.0, save_time=2.0, backup_time=3.0, alloc_time=5.0, prep_time=7.0, grace=10.0
    )
    r = run_once(sc, Adaptive(), Lifetimes([50.0]))
    assert r["emergency_saves"] == 1 and r["saves"] == 0
    assert r["recompute"] == 0
    assert r["total"] == pytest.approx(117.0)
    assert (r["save"], r["alloc"], r["prep"]) == pytest.approx((5.0, 5.0, 7.0))
    # replacement requested at the notice (t=40) is allocated by 45, when the old VM leaves
    h = run_once(sc, Hedged(), Lifetimes([50.0]))
    assert h["alloc"] == 0.0 and h["total"] == pytest.approx(112.0)


def test_notice_mid_step_finishes_the_step() -> None:
    """Steps of 4 s; kill at 50, notice at 40 is a boundary; with grace 12 the notice at 38
    falls inside step 9 (36..40): the save starts at 40."""
    sc = Scenario(steps=50, step_time=4.0, save_time=2.0, backup_time=3.0, grace=12.0)
    r = run_once(sc, Adaptive(), Lifetimes([50.0]))
    assert r["emergency_saves"] == 1 and r["recompute"] == 0
    assert r["total"] == pytest.approx(200 + 5)


def test_emergency_that_does_not_fit_loses_work() -> None:
    """δ + β = 15 > grace 10: no emergency save; everything since the start is redone."""
    sc = Scenario(steps=100, step_time=1.0, save_time=5.0, backup_time=10.0, grace=10.0)
    r = run_once(sc, Static(1000), Lifetimes([50.0]))
    assert r["emergency_saves"] == 0
    assert r["recompute"] == pytest.approx(50.0)
    assert r["total"] == pytest.approx(150.0)


def test_preempted_during_preparation() -> None:
    sc = Scenario(steps=100, step_time=1.0, alloc_time=3.0, prep_time=10.0)
    # lifetimes count from allocation: the 2nd VM (allocated at 23) dies 4 s into its prep
    r = run_once(sc, Static(1000), Lifetimes([20.0, 4.0]))
    assert r["preemptions"] == 2
    assert r["prep"] == pytest.approx(4.0 + 10.0)
    assert r["alloc"] == pytest.approx(6.0)
    assert r["total"] == pytest.approx(100 + 20 + 6 + 14)


# -- monotonicity ---------------------------------------------------------------------------------
@given(
    base=st.lists(st.floats(1, 5000), max_size=6),
    extra=st.lists(st.floats(1, 5000), min_size=1, max_size=4),
    every=st.integers(5, 400),
    save=st.floats(0.5, 30),
    backup=st.floats(0, 30),
    step_time=st.floats(0.5, 5),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_more_preemptions_never_help_pathwise(base, extra, every, save, backup, step_time):
    """Adding kill times to a schedule never lowers recompute or total (Static, no notice).

    Pathwise only with an instant restart: otherwise an extra kill can move the next VM's
    start past a scheduled kill, which then hits no VM (true of a real market too), so the
    claim holds in expectation only (next test)."""
    sc = Scenario(
        steps=1000,
        step_time=step_time,
        save_time=save,
        backup_time=backup,
        alloc_time=0.0,
        prep_time=0.0,
        grace=0.0,
    )
    few = run_once(sc, Static(every), Schedule(base))
    more = run_once(sc, Static(every), Schedule(base + extra))
    assert more["total"] >= few["total"] - 1e-6
    assert more["recompute"] >= few["recompute"] - 1e-6


@pytest.mark.parametrize("policy", ["static:300", "adaptive", "hedged", "daly"])
@given(grace=st.sampled_from([0.0, 30.0, 120.0]), factor=st.floats(1.5, 4.0))
@settings(max_examples=6, deadline=None)
def test_more_preemptions_cost_more_in_expectation(policy, grace, factor):
    sc = Scenario(
        steps=20_000,
        step_time=1.0,
        save_time=10.0,
        backup_time=(10, 30),
        alloc_time=(60, 200),
        prep_time=30.0,
        grace=grace,
        mttp=7200.0,
    )
    runs = 300
    calm = simulate(sc, policy, runs=runs, seed=3)
    rough = simulate(sc.replace(mttp=7200.0 / factor), policy, runs=runs, seed=3)
    assert rough.mean["preemptions"] > calm.mean["preemptions"]
    for key in ("total", "recompute"):
        # "in expectation": allow three standard errors of the difference of the two means
        slack = 3 * math.hypot(rough.std[key], calm.std[key]) / math.sqrt(runs)
        assert rough.mean[key] >= calm.mean[key] - slack


# -- the thesis model ------------------------------------------------------------------------------
THESIS = Scenario(
    steps=360_000,
    step_time=10.0,
    save_time=60.0,
    backup_time=0.0,
    alloc_time=200.0,
    prep_time=100.0,
    grace=0.0,
    mttp=36_000.0,
)


def test_static_matches_eq_4_4() -> None:
    sc, runs = THESIS, 120
    for tau in (1000.0, 2000.0, 4000.0):
        sim = simulate(sc, Static(int(tau / sc.step_time)), runs=runs, seed=11).mean["total"]
        model = expected_total(sc.work, tau, 60.0, 36_000.0, sc.restart_time)
        assert sim == pytest.approx(model, rel=0.03)


def test_best_static_interval_is_near_tau_opt() -> None:
    sc = THESIS
    tau_opt = daly_interval(60.0, 36_000.0, sc.restart_time)
    grid = [tau_opt * f for f in (0.55, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.6, 2.0)]
    totals = {
        tau: simulate(sc, Static(round(tau / sc.step_time)), runs=150, seed=5).mean["total"] for tau in grid
    }
    best = min(totals, key=totals.__getitem__)
    assert abs(best / tau_opt - 1) <= 0.15
    adaptive = simulate(sc, Adaptive(), runs=150, seed=5)
    assert adaptive.mean["insurance_saves"] > 0
    assert adaptive.mean["total"] <= totals[best] * 1.01


def test_adaptive_never_insures_when_emergency_fits() -> None:
    sc = Scenario(
        steps=50_000,
        step_time=1.0,
        save_time=10.0,
        backup_time=(20, 40),
        alloc_time=(86, 243),
        prep_time=60.0,
        grace=120.0,
        mttp=3 * 3600.0,
    )
    feasible = simulate(sc, Adaptive(), runs=200, seed=1, keep_samples=True)
    assert all(r["insurance_saves"] == 0 for r in feasible.samples or [])
    assert feasible.mean["emergency_saves"] > 0 and feasible.mean["recompute"] < 5
    tight = simulate(sc.replace(grace=30.0), Adaptive(), runs=50, seed=1)
    assert tight.mean["insurance_saves"] > 0


def test_hedged_beats_adaptive_when_steps_are_long() -> None:
    """Notices covered 60 % of the time: Hedged insures only the rest; plus pre-allocation."""
    sc = Scenario(
        steps=4000,
        step_time=50.0,
        save_time=20.0,
        backup_time=40.0,
        alloc_time=(86, 243),
        prep_time=120.0,
        grace=90.0,
        mttp=3 * 3600.0,
    )
    a = simulate(sc, "adaptive", runs=400, seed=2).mean
    h = simulate(sc, "hedged", runs=400, seed=2).mean
    assert h["saves"] < a["saves"]
    assert h["total"] < a["total"]


# -- reproducibility -----------------------------------------------------------------------------
def test_seed_reproduces_and_runs_are_independent() -> None:
    sc = Scenario(
        steps=20_000,
        step_time=(0.5, 1.5),
        save_time=(5, 15),
        backup_time=(10, 30),
        alloc_time=(86, 243),
        prep_time=(30, 90),
        grace=30.0,
        mttp=[3600, 7200],
        spot_price=2.3,
        on_demand_price=6.2,
    )
    a = simulate(sc, "adaptive", runs=50, seed=9, keep_samples=True)
    b = simulate(sc, "adaptive", runs=50, seed=9, keep_samples=True)
    c = simulate(sc, "adaptive", runs=50, seed=10)
    assert a.mean == b.mean and a.std == b.std and a.samples == b.samples
    assert a.mean != c.mean
    totals = [r["total"] for r in a.samples or []]
    assert len(set(totals)) == len(totals)
    # a run's draws do not depend on how many runs precede it in the batch
    d = simulate(sc, "adaptive", runs=10, seed=9, keep_samples=True)
    assert d.samples == (a.samples or [])[:10]


def test_overhead_and_costs() -> None:
    sc = Scenario(
        steps=10_000,
        step_time=2.0,
        save_time=10,
        alloc_time=100,
        prep_time=50,
        grace=0,
        mttp=5000,
        spot_price=2.3,
        on_demand_price=6.2,
    )
    r = simulate(sc, "daly", runs=100).mean
    assert r["overhead"] == pytest.approx(r["total"] / 20_000 - 1)
    assert r["on_demand_cost"] == pytest.approx(20_000 * 6.2 / 3600)
    billed = r["total"] - r["alloc"]
    assert r["cost"] == pytest.approx(billed * 2.3 / 3600)
    assert not math.isnan(r["cost"])


def test_scenario_validation_and_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="valid keys"):
        Scenario.from_dict({"steps": 10, "stepz": 1})
    with pytest.raises(ValueError):
        Scenario(steps=10, save_time=(5, 1))
    with pytest.raises(ValueError):
        Scenario(steps=0)
    f = tmp_path / "job.yaml"
    f.write_text(
        "steps: 1000\nstep_time: [0.5, 1.5]\nsave_time: 5\nmttp: 3600\n"
        "alloc_time: [86, 243]\nspot_price: 2.3\non_demand_price: 6.2\n"
    )
    sc = Scenario.load(f)
    assert sc.step_time == (0.5, 1.5) and sc.name == "job"
    g = tmp_path / "job.json"
    g.write_text(sc.to_json())
    assert Scenario.load(g) == sc
    assert Scenario(steps=10, mttp=[[3600, 100.0], [7200, math.inf]]).process().mttp > 100


def test_step_time_per_instance_draws_vm_speeds() -> None:
    sc = Scenario(
        steps=10_000, step_time=(0.5, 1.5), save_time=5, mttp=2000, alloc_time=50, step_time_per="instance"
    )
    res = simulate(sc, "static:500", runs=40, seed=2, keep_samples=True)
    computes = {round(r["compute"], 6) for r in res.samples or []}
    assert len(computes) > 1  # each run's VMs ran at their own speeds
    per_step = simulate(sc.replace(step_time_per="step"), "static:500", runs=5, seed=2).mean
    assert per_step["compute"] == pytest.approx(10_000 * 1.0)
    with pytest.raises(ValueError):
        sc.replace(step_time_per="never")


def test_cli_json_and_table(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from spotnb.sim.cli import main

    f = tmp_path / "s.yaml"
    f.write_text(
        "steps: 5000\nstep_time: 1\nsave_time: 5\nbackup_time: 10\nmttp: 3600\n"
        "alloc_time: [86, 243]\ngrace: 30\nspot_price: 2.3\non_demand_price: 6.2\n"
    )
    assert (
        main(
            [
                "--scenario",
                str(f),
                "--policy",
                "static:100",
                "--policy",
                "adaptive",
                "--policy",
                "on-demand",
                "--runs",
                "5",
                "--seed",
                "3",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [o["policy"] for o in out] == ["static:100", "adaptive", "on-demand"]
    assert set(out[0]) == {"policy", "mean", "std"}
    assert set(METRICS) <= set(out[1]["mean"])
    assert out[2]["mean"]["cost"] == pytest.approx(5000 * 6.2 / 3600)
    assert main(["--scenario", str(f), "--runs", "3"]) == 0
    assert "hedged" in capsys.readouterr().out
    assert main(["--scenario", str(tmp_path / "missing.yaml")]) == 2
    assert main(["--scenario", str(f), "--policy", "bogus"]) == 2


def test_compare_table_and_figure() -> None:
    from spotnb.sim import compare

    sc = Scenario(
        steps=5000,
        step_time=1,
        save_time=5,
        backup_time=10,
        mttp=3600,
        alloc_time=(86, 243),
        grace=30,
        spot_price=2.3,
        on_demand_price=6.2,
    )
    table, fig = compare(sc, ["static:200", "adaptive", "hedged"], runs=10, seed=1)
    assert list(table.index) == ["static:200", "adaptive", "hedged", "on-demand"]
    assert {"compute", "total", "cost", "on_demand_cost", "overhead", "total_std"} <= set(table)
    assert table.loc["on-demand", "total"] == pytest.approx(5000)
    assert [t.name for t in fig.data][:5] == ["compute", "recompute", "save", "alloc", "prep"]
    assert fig.layout.barmode == "stack"


def test_hedged_insures_when_uploads_vary() -> None:
    """Mean δ + β fits the notice, slow uploads do not: Adaptive takes no insurance and
    loses whole VM lifetimes; Hedged insures against the failing share."""
    sc = Scenario(
        steps=30_000,
        step_time=1.0,
        save_time=(15, 25),
        backup_time=(60, 120),
        alloc_time=(86, 243),
        prep_time=(60, 120),
        grace=120.0,
        mttp=3 * 3600.0,
    )
    a = simulate(sc, "adaptive", runs=300, seed=4).mean
    h = simulate(sc, "hedged", runs=300, seed=4).mean
    assert a["insurance_saves"] == 0 and h["insurance_saves"] > 0
    assert h["recompute"] < a["recompute"] and h["total"] < a["total"]


# -- scenario values refused up front, naming the key (issue #29 item 4) ------------------------
BAD_SCENARIOS = [
    ({"steps": 0}, "steps"),
    ({"steps": -5}, "steps"),
    ({"steps": 1.5}, "steps"),
    ({"steps": math.nan}, "steps"),
    ({"steps": math.inf}, "steps"),  # OverflowError, a traceback
    ({"steps": 10**400}, "steps"),  # OverflowError too
    ({"steps": 10**16}, "steps"),  # past a float's exact steps
    ({"steps": True}, "steps"),
    ({"steps": "many"}, "steps"),
    ({"steps": None}, "steps"),
    ({"step_time": "abc"}, "step_time"),
    ({"step_time": 0}, "step_time"),
    ({"step_time": math.nan}, "step_time"),
    ({"step_time": [1]}, "step_time"),
    ({"step_time": [1, 2, 3]}, "step_time"),
    ({"step_time": True}, "step_time"),
    ({"alloc_time": [0, math.inf]}, "alloc_time"),
    ({"save_time": -1}, "save_time"),
    ({"grace": math.inf}, "grace"),
    ({"grace": math.nan}, "grace"),
    ({"grace": "soon"}, "grace"),  # TypeError, a traceback
    ({"spot_price": math.nan}, "spot_price"),
    ({"spot_price": math.inf}, "spot_price"),
    ({"spot_price": -1}, "spot_price"),
    ({"on_demand_price": math.inf}, "on_demand_price"),
    ({"on_demand_price": "free"}, "on_demand_price"),  # TypeError
    ({"mttp": math.nan}, "mttp"),
    ({"mttp": 0}, "mttp"),
    ({"mttp": "often"}, "mttp"),  # TypeError
    ({"mttp": True}, "mttp"),
    ({"mttp": []}, "mttp"),
    ({"mttp": [3600, math.nan]}, "mttp"),
    ({"mttp": [[math.inf, 100]]}, "mttp"),  # a phase that never ends
    ({"mttp": [[0, 100]]}, "mttp"),
    ({"mttp": [[100]]}, "mttp"),
    ({"mttp": [3600], "mttp_phase": math.inf}, "mttp_phase"),
    ({"mttp_phase": 0}, "mttp_phase"),
    # past ~31 years, or phases under a second, the float clock loses them (Piecewise hung)
    ({"alloc_time": 1e10}, "alloc_time"),
    ({"grace": 1e10}, "grace"),
    ({"mttp": [[0.5, 100], [3600, math.inf]]}, "mttp"),
    ({"mttp": [3600] * 100_001}, "mttp"),
    ({"trace_offset": math.nan}, "trace_offset"),
    ({"trace": ""}, "trace"),
    ({"trace": 5}, "trace"),
    ({"trace": "no/such-trace"}, "trace"),
    ({"save_every": 0}, "save_every"),
    ({"save_every": 2.5}, "save_every"),
    ({"save_every": True}, "save_every"),
    ({"step_time_per": "never"}, "step_time_per"),
    ({"initial_start": "yes"}, "initial_start"),
]


@pytest.mark.parametrize(
    "fields, key", BAD_SCENARIOS, ids=[f"{k}={list(f.values())[0]!r}"[:40] for f, k in BAD_SCENARIOS]
)
def test_a_bad_scenario_value_is_refused_naming_its_key(fields: dict, key: str) -> None:
    from spotnb.sim.scenario import ScenarioError

    with pytest.raises(ScenarioError) as info:
        Scenario.from_dict({"steps": 100, **fields})
    assert f"scenario key {key!r}" in str(info.value), str(info.value)


def test_scenario_values_that_mean_something_are_taken() -> None:
    """inf MTTP is no preemptions; YAML 1.1 reads `1e5` as a string, so numeric strings count."""
    never = Scenario(steps=10, mttp=math.inf)
    assert never.mttp is None and never.process().mttp == math.inf
    sc = Scenario.from_dict(
        {"steps": "1e5", "step_time": ["0.5", 1.5], "spot_price": "2.3", "mttp": [3600, math.inf]}
    )
    assert sc.steps == 100_000 and sc.step_time == (0.5, 1.5) and sc.spot_price == 2.3
    assert Scenario(steps=10, name=None).name == ""
    assert Scenario(steps=10, step_time="55").step_time == 55.0  # was read as the range (5, 5)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("   \n# only a comment\n", "empty"),
        ("[]", "mapping"),
        ("steps: [\n", "not valid YAML or JSON"),
        ("{}", "'steps' is missing"),
        ("mttp: 100\n", "'steps' is missing"),
        ("1: 2\nsteps: 3\n", "unknown scenario key"),  # sorted() of int and str keys: TypeError
        ('{"steps": 100, "spot_price": NaN}', "spot_price"),
        ('{"steps": 100, "mttp": -Infinity}', "mttp"),
    ],
)
def test_a_bad_scenario_file_is_refused_naming_the_file(tmp_path, text: str, words: str) -> None:  # type: ignore[no-untyped-def]
    from spotnb.sim.scenario import ScenarioError

    f = tmp_path / "job.yaml"
    f.write_text(text)
    with pytest.raises(ScenarioError) as info:
        Scenario.load(f)
    assert str(f) in str(info.value) and words in str(info.value), str(info.value)
    binary = tmp_path / "job.bin"
    binary.write_bytes(b"\xff\xfe\x00steps")
    with pytest.raises(ScenarioError, match="not a text file"):
        Scenario.load(binary)


# -- `spotnb simulate` is bounded as `spotnb plan` is (spotnb.sim.bounds) ------------------------
def _simulate_cli(tmp_path, text: str, *args: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    import contextlib
    import io

    from spotnb.sim.cli import main

    f = tmp_path / "job.yaml"
    f.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--scenario", str(f), *args])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("engine", ["auto", "event"])
def test_ten_trillion_steps_are_refused_at_once_naming_the_steps_that_fit(engine: str) -> None:
    """It never finished (either engine); now refused before a run starts."""
    import time

    from spotnb.sim.bounds import TooMuchWork

    sc = Scenario(steps=10**13, step_time=1, save_time=5, mttp=3600, alloc_time=60, prep_time=30)
    begun = time.monotonic()
    for policy in ("static:1000", "hedged", "young"):
        with pytest.raises(
            TooMuchWork, match=r"steps: .* past the limit of 1,000,000 a run; lower steps to about [\d,]+"
        ):
            simulate(sc, policy, runs=2, engine=engine)
    calm = Scenario(steps=10**7, step_time=1, save_time=5, mttp=None)  # no preemption, many saves
    with pytest.raises(TooMuchWork, match="lower steps to about"):
        simulate(calm, "static:1", runs=1, engine=engine)
    many = Scenario(steps=100_000, step_time=1, save_time=5, mttp=3600)
    with pytest.raises(TooMuchWork, match=r"past the simulation's limit of 20,000,000; .* or the runs"):
        simulate(many, "static:10", runs=10**6, engine=engine)
    assert time.monotonic() - begun < 2


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"mttp": 0.001, "alloc_time": 60, "prep_time": 30}, "before it is ready to train"),
        ({"mttp": 0.001, "alloc_time": 60}, "before it finishes a step"),
        (
            {"mttp": [0.001, 0.002], "mttp_phase": 60},
            "before it finishes a step",
        ),  # piecewise: its best phase
    ],
)
def test_a_vm_that_dies_before_it_can_progress_is_a_verdict_up_front(fields: dict, words: str) -> None:
    """MTTP 0.001 s hung `spotnb simulate` (the VM preempted in its preparation, for ever)."""
    from spotnb.sim.bounds import NoProgress

    sc = Scenario(steps=1000, step_time=1, save_time=5, **fields)
    for engine in ("auto", "event"):
        with pytest.raises(NoProgress, match=f"no progress: every VM is preempted {words}"):
            simulate(sc, "hedged", runs=2, engine=engine)
    # a job shorter than the MTTP may well end on its first VM: no verdict
    assert simulate(Scenario(steps=10, step_time=0.0001, mttp=0.01), "hedged", runs=2).mean["total"] > 0


@pytest.mark.parametrize("engine", ["auto", "event"])
def test_a_policy_that_never_commits_is_a_verdict_after_a_stall_and_its_row_says_so(engine: str) -> None:
    """Saves 5,000 steps apart on VMs that live a minute: nothing is ever checkpointed and no
    VM lives long enough for the whole job; each engine stops after STALL_EVENTS events."""
    from spotnb.sim.bounds import NoProgress
    from spotnb.sim.compare import run_policies

    sc = Scenario(steps=20_000, step_time=1, save_time=1, mttp=60, alloc_time=10)
    with pytest.raises(
        NoProgress, match=r"no progress: after 20,00\d .* no further than step [\d,]+ of 20,000"
    ):
        simulate(sc, "static:5000", runs=3, engine=engine)
    if engine == "auto":
        stuck, young, od = run_policies(sc, ["static:5000", "young", "on-demand"], runs=3)
        assert stuck.verdict and "no progress" in stuck.verdict and math.isnan(stuck.mean["total"])
        assert young.verdict is None and young.mean["total"] > 0 and od.verdict is None
        with pytest.raises(NoProgress):  # no policy can: the command says why
            run_policies(sc, ["static:5000", "static:9000", "on-demand"], runs=3)


def test_simulate_run_stops_at_its_event_limit() -> None:
    from spotnb.sim.bounds import TooMuchWork

    sc = Scenario(steps=10**6, step_time=1, save_time=1, mttp=3600)
    with pytest.raises(TooMuchWork, match=r"one run of 1,000,000 steps took more than 100 events"):
        simulate_run(sc, Static(10), sc.process(), random.Random(1), random.Random(2), max_events=100)


def test_one_calm_vms_many_saves_run_on_the_event_engine() -> None:
    """The vectorised engine walks one VM's saves column by column: 900,000 saves of a VM that
    is never preempted took it 17 s; "auto" leaves such a run to the event engine (0.5 s)."""
    import time

    sc = Scenario(steps=300_000, step_time=1, save_time=1, mttp=None)
    begun = time.monotonic()
    result = simulate(sc, "static:1", runs=1)
    assert result.engine == "event" and result.mean["saves"] == 299_999
    assert time.monotonic() - begun < 3
    assert simulate(sc.replace(steps=3000), "static:1", runs=1).engine == "batch"


def test_the_simulate_command_ends_with_a_verdict_or_the_fix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = _simulate_cli(tmp_path, "steps: 10000000000000\nmttp: 3600\nsave_time: 5\n")
    assert code == 2 and "spotnb simulate: error: steps:" in err and "lower steps to about" in err
    code, out, err = _simulate_cli(tmp_path, "steps: 1000\nmttp: 0.001\nalloc_time: 60\nprep_time: 30\n")
    assert code == 2 and "no progress: every VM is preempted before it is ready" in err
    text = "steps: 20000\nmttp: 60\nsave_time: 1\nalloc_time: 10\n"
    code, out, err = _simulate_cli(
        tmp_path, text, "--policy", "static:5000", "--policy", "young", "--runs", "3"
    )
    assert code == 0 and err == ""
    row = next(line for line in out.splitlines() if line.startswith("static:5000"))
    assert "no progress" in row
    code, out, _ = _simulate_cli(
        tmp_path, text, "--policy", "static:5000", "--policy", "young", "--runs", "3", "--json"
    )
    import json

    rows = json.loads(out)  # NaN figures are null: valid JSON
    assert (
        "no progress" in rows[0]["verdict"] and rows[0]["mean"]["total"] is None and "verdict" not in rows[1]
    )
