"""The simulator of jobs on several instances (`spotnb.sim.fleet`) and `spotnb plan`."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

from spotnb.sim.fleet import plan_instances, simulate_fleet
from spotnb.sim.scenario import Scenario


def test_without_preemptions_time_and_cost_follow_from_the_step_time() -> None:
    sc = Scenario(steps=1000, step_time=0.8, spot_price=3.6)
    for n in (1, 2, 4):
        r = simulate_fleet(sc, n, random.Random(0), sync_time=0.1)
        assert r.wall == pytest.approx(1000 / (n / (0.8 + n * 0.1)))
        assert r.cost == pytest.approx(n * r.wall * 3.6 / 3600)
        assert r.preemptions == r.group_losses == 0 and r.recompute == 0


def test_a_cloud_coordinator_is_billed_for_the_whole_run_of_several_instances_only() -> None:
    sc = Scenario(steps=1000, step_time=0.8, spot_price=3.6)
    for n in (1, 4):
        plain = simulate_fleet(sc, n, random.Random(1))
        billed = simulate_fleet(sc, n, random.Random(1), coordinator_price=0.0208)
        extra = plain.wall * 0.0208 / 3600 if n > 1 else 0.0
        assert billed.cost == pytest.approx(plain.cost + extra) and billed.wall == plain.wall


def test_one_instance_loses_the_job_at_every_preemption_several_rarely() -> None:
    sc = Scenario(steps=20_000, step_time=0.5, save_time=2, alloc_time=60, prep_time=120, mttp=1800)
    one = [simulate_fleet(sc, 1, random.Random(i)) for i in range(10)]
    four = [simulate_fleet(sc, 4, random.Random(i)) for i in range(10)]
    # every preemption of the one running instance loses the job (one of a replacement still
    # starting does not: it had nothing to lose)
    assert all(0 < r.group_losses <= r.preemptions for r in one)
    assert sum(r.group_losses for r in one) > 20
    assert sum(r.group_losses for r in four) <= 2
    assert sum(r.recompute for r in four) < sum(r.recompute for r in one) / 10


def test_plan_ranks_counts_by_progress_per_dollar() -> None:
    sc = Scenario(steps=5000, step_time=1.0, alloc_time=60, prep_time=60, mttp=3600, spot_price=1.0)
    rows = plan_instances(sc, [1, 2, 4], runs=5, sync_time=0.2)
    per_dollar = [r["steps_per_dollar"] for r in rows]
    assert per_dollar == sorted(per_dollar, reverse=True)
    assert {r["instances"] for r in rows} == {1, 2, 4}


def test_plan_cli(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("steps: 2000\nstep_time: 1.0\nmttp: 3600\nalloc_time: 60\nspot_price: 1.0\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "spotnb.cli",
            "plan",
            "--scenario",
            str(path),
            "--instances",
            "1,2",
            "--runs",
            "3",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "steps/$" in out and out.count("\n") >= 4
    bad = subprocess.run(
        [sys.executable, "-m", "spotnb.cli", "plan", "--scenario", str(path), "--instances", "0"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--instances" in bad.stderr
    bad_sync = subprocess.run(
        [sys.executable, "-m", "spotnb.cli", "plan", "--scenario", str(path), "--sync", "ddp,fast"],
        capture_output=True,
        text=True,
    )
    assert bad_sync.returncode == 2 and "--sync" in bad_sync.stderr and "local_sgd:K" in bad_sync.stderr


def test_plan_ranks_sync_strategies_behind_a_slow_link() -> None:
    """SPOTNIK's trade in the planner: an all-reduce as long as a step makes ddp pay it every
    step; local SGD pays it every K steps, and `auto` finds that out by itself. With one
    instance there is nothing to synchronise: one row."""
    sc = Scenario(steps=4000, step_time=1.0, alloc_time=60, prep_time=60, mttp=7200, spot_price=1.0)
    rows = plan_instances(sc, [1, 4], runs=4, sync_time=1.0, syncs=("ddp", "local_sgd:16", "auto"))
    by = {(r["instances"], r["sync"]): r for r in rows}
    assert set(by) == {(1, "ddp"), (4, "ddp"), (4, "local_sgd:16"), (4, "auto")}
    assert by[(4, "local_sgd:16")]["wall_s"] < by[(4, "ddp")]["wall_s"] / 2
    assert by[(4, "auto")]["wall_s"] < by[(4, "ddp")]["wall_s"] / 2
    assert rows[0]["sync"] != "ddp"  # best first: a strategy that synchronises less
    # a cheap link: auto stays with ddp and they are the same runs
    cheap = plan_instances(sc, [4], runs=3, sync_time=0.01, syncs=("ddp", "auto"))
    assert cheap[0]["wall_s"] == pytest.approx(cheap[1]["wall_s"])


def test_a_kill_undoes_the_window_in_flight_so_long_windows_lose_more() -> None:
    """Without notice, a failed synchronisation undoes the whole window in flight (the
    runtime restores the window's snapshot): the recompute grows with K."""
    sc = Scenario(steps=20_000, step_time=0.2, save_time=5, alloc_time=10, prep_time=10, mttp=300)
    recompute = {
        sync: sum(simulate_fleet(sc, 3, random.Random(i), sync=sync).recompute for i in range(6))
        for sync in ("ddp", "local_sgd:8", "local_sgd:512")
    }
    assert recompute["ddp"] < recompute["local_sgd:8"] < recompute["local_sgd:512"], recompute


# -- bounded work: issue #29 item 4 ---------------------------------------------------------------
def _plan(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    """`spotnb plan ARGV` in this process: (exit code, stdout, stderr)."""
    import argparse

    from spotnb.sim.cli import add_plan_parser

    parser = argparse.ArgumentParser(prog="spotnb")
    add_plan_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.timeout(20)
def test_instances_preempted_before_they_start_are_a_no_progress_verdict_not_a_hang() -> None:
    """MTTP 0.001 s against a 60 s allocation grew without bound (7.2 GB in 5 minutes): every
    replacement died while it started and the liveput samples piled up forever."""
    from spotnb.sim.fleet import NoProgress

    sc = Scenario(steps=1000, mttp=0.001, alloc_time=60, spot_price=1.0)
    with pytest.raises(
        NoProgress, match=r"no progress: every instance is preempted before it is ready.*MTTP 0\.001 s"
    ):
        plan_instances(sc, [1, 2, 4], runs=2)
    with pytest.raises(NoProgress, match="no progress"):
        simulate_fleet(sc, 2, random.Random(0))
    # no start to survive, but a step of 1 s against a lifetime of 10 ms
    fast = Scenario(steps=1000, mttp=0.01, spot_price=1.0)
    with pytest.raises(NoProgress, match="before it finishes a step"):
        simulate_fleet(fast, 1, random.Random(0), join_time=0.0)


@pytest.mark.timeout(20)
def test_a_stall_the_mttp_does_not_show_ends_after_a_bounded_number_of_events() -> None:
    """Lifetimes half a step long: too long for the up-front verdict, but each kill undoes a
    whole step and the group makes half a step between kills, so the job never gets anywhere."""
    from spotnb.sim.fleet import STALL_EVENTS, NoProgress

    sc = Scenario(steps=1000, mttp=0.5, spot_price=1.0)
    with pytest.raises(NoProgress, match=f"after {STALL_EVENTS + 1:,} events") as info:
        simulate_fleet(sc, 4, random.Random(0), join_time=0.0)
    assert "raise mttp" in str(info.value)


@pytest.mark.timeout(20)
def test_a_count_that_cannot_progress_is_a_row_with_its_verdict_ranked_last(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Lifetimes half a step long: one instance gets there (a kill costs it only the step in
    flight, from its last save), several never do (each kill undoes a step of the group and
    pauses the survivors). The plan says so per count instead of failing as a whole."""
    import json

    sc = Scenario(steps=200, mttp=0.5, spot_price=1.0)
    rows = plan_instances(sc, [1, 2, 4], runs=2, join_time=0.0)
    assert [r["instances"] for r in rows] == [1, 2, 4] and "verdict" not in rows[0]
    assert all(r["verdict"].startswith("no progress") and r["steps_per_dollar"] == 0 for r in rows[1:])
    f = tmp_path / "half.yaml"
    f.write_text("steps: 200\nmttp: 0.5\nspot_price: 1\n")
    code, out, _ = _plan(
        capsys, "--scenario", str(f), "--runs", "2", "--instances", "1,4", "--join-time", "0"
    )
    assert code == 0 and "no progress: after" in out
    code, out, _ = _plan(
        capsys, "--scenario", str(f), "--runs", "2", "--instances", "1,4", "--join-time", "0", "--json"
    )
    assert json.loads(out)[-1]["wall_s"] is None and json.loads(out)[-1]["verdict"]


def test_mttp_inf_means_no_preemptions() -> None:
    """`mttp: .inf` divided by zero (random.expovariate(0)); it is a legitimate scenario."""
    never = Scenario(steps=1000, step_time=0.8, spot_price=3.6, mttp=math.inf)
    assert never.mttp is None
    plain = Scenario(steps=1000, step_time=0.8, spot_price=3.6)
    for n in (1, 3):
        r = simulate_fleet(never, n, random.Random(0))
        assert r.preemptions == 0 and r.wall == simulate_fleet(plain, n, random.Random(0)).wall
    assert plan_instances(never, [1, 2], runs=2)[0]["preemptions"] == 0


@pytest.mark.timeout(20)
def test_a_simulation_too_long_to_run_is_refused_up_front_naming_the_limit() -> None:
    """10**13 steps never finished (a save per step, billions of preemptions)."""
    import time

    from spotnb.sim.fleet import MAX_EVENTS, PLAN_EVENTS, TooMuchWork

    sc = Scenario(steps=10**13, mttp=3600, alloc_time=60, spot_price=1.0)
    began = time.perf_counter()
    with pytest.raises(TooMuchWork, match=f"limit of {PLAN_EVENTS:,}") as info:
        plan_instances(sc, [1, 2], runs=2)
    assert "lower steps to about" in str(info.value)
    with pytest.raises(TooMuchWork, match=f"limit of {MAX_EVENTS:,}"):
        simulate_fleet(sc, 1, random.Random(0))
    assert time.perf_counter() - began < 2
    # --runs in the billions is refused the same way
    small = Scenario(steps=100, spot_price=1.0)
    with pytest.raises(TooMuchWork, match="runs"):
        plan_instances(small, [1], runs=10**9)


@pytest.mark.timeout(20)
def test_a_run_past_its_events_is_stopped_and_liveput_stays_bounded() -> None:
    from spotnb.sim.fleet import MAX_SAMPLES, TooMuchWork

    # an estimate below the truth (recompute): the run itself stops at the cap
    sc = Scenario(steps=5000, step_time=1.0, save_time=1.0, mttp=50, alloc_time=5, spot_price=1.0)
    with pytest.raises(TooMuchWork, match="took more than 850 events"):
        simulate_fleet(sc, 1, random.Random(0), max_events=850)
    # allocations of 10**9 s: a sample a second would be billions of samples
    slow = Scenario(steps=1000, mttp=200, alloc_time=1e9, spot_price=1.0)
    r = simulate_fleet(slow, 1, random.Random(0))
    assert r.preemptions > 0 and r.wall > 1e9
    assert 0 < len(r.liveput) < 2 * MAX_SAMPLES
    assert [t for t, _ in r.liveput] == sorted(t for t, _ in r.liveput)


def test_free_saves_cost_no_event_per_step() -> None:
    """save_time 0 made Daly's interval one step: a loop turn per step of every run. The
    last free save before each event is all that matters, and gives the same figures."""
    sc = Scenario(steps=200_000, step_time=1.0, mttp=600, alloc_time=60, spot_price=1.0)
    r = simulate_fleet(sc, 1, random.Random(0))
    assert r.events < 10 * r.preemptions + 10 < sc.steps / 20
    stepwise = Scenario(steps=2000, step_time=1.0, mttp=300, alloc_time=60, spot_price=1.0)
    a = simulate_fleet(stepwise, 2, random.Random(3))
    b = simulate_fleet(stepwise.replace(save_time=1e-12), 2, random.Random(3))  # a save per step
    assert a.wall == pytest.approx(b.wall, rel=1e-6) and a.recompute == pytest.approx(b.recompute, rel=1e-6)


def test_plan_cli_bad_scenarios_and_flags_exit_2_naming_what_to_fix(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    stall = tmp_path / "stall.yaml"
    stall.write_text("steps: 1000\nmttp: 0.001\nalloc_time: 60\nspot_price: 1\n")
    code, _, err = _plan(capsys, "--scenario", str(stall), "--runs", "2")
    assert code == 2 and "no progress" in err and "Traceback" not in err
    never = tmp_path / "never.yaml"
    never.write_text("steps: 1000\nmttp: .inf\nspot_price: 1\n")
    code, out, _ = _plan(capsys, "--scenario", str(never), "--runs", "2", "--instances", "1,2")
    assert code == 0 and "steps/$" in out
    for text, key in (
        ("steps: 1000\nspot_price: .nan\n", "spot_price"),
        ("steps: 1000\nspot_price: .inf\n", "spot_price"),
        ("steps: 1000\nmttp: .nan\n", "mttp"),
        ("steps: 1e400\n", "steps"),
        ("mttp: 100\n", "steps"),
        ("", "empty"),
        ("steps: [\n", "YAML"),
    ):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        code, _, err = _plan(capsys, "--scenario", str(bad), "--runs", "2")
        assert code == 2 and key in err and "Traceback" not in err, (text, err)
    for flag, value in (("--sync-time", "nan"), ("--join-time", "inf"), ("--coordinator-price", "inf")):
        code, _, err = _plan(capsys, "--scenario", str(never), flag, value)
        assert code == 2 and flag in err, err
    code, _, err = _plan(capsys, "--scenario", str(never), "--instances", "two")
    assert code == 2 and "--instances" in err


def test_plan_json_is_json_when_instances_are_free(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A spot price of 0 makes steps per dollar inf, which json.dumps wrote as `Infinity`."""
    import json

    free = tmp_path / "free.yaml"
    free.write_text("steps: 100\nmttp: 3600\n")
    code, out, _ = _plan(capsys, "--scenario", str(free), "--runs", "2", "--instances", "1", "--json")

    def refuse(word: str) -> None:
        raise AssertionError(f"not JSON: {word}")

    rows = json.loads(out, parse_constant=refuse)
    assert code == 0 and rows[0]["steps_per_dollar"] is None
