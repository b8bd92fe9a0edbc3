"""The simulator of jobs on several instances (`spotnb.sim.fleet`) and `spotnb plan`."""

from __future__ import annotations

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
