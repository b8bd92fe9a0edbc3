"""Trace loaders (Bamboo, Parcae), MTTP with censoring, bundled files and licences."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from spotnb.market.preempt import PreemptionProcess
from spotnb.sim import Scenario, simulate
from spotnb.traces import BUNDLED, bundled_traces, detect_format, load_trace, parse, trace_process
from tests.support.paths import REPO

DATA = REPO / "spotnb" / "traces" / "data"


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_traces_load(name: str) -> None:
    tr = load_trace(name)
    assert tr.removals > 0 and tr.span > 0 and 0 < tr.mttp < math.inf
    assert list(tr.times) == sorted(tr.times)
    assert tr.mttp == pytest.approx(tr.exposure / tr.removals)
    assert isinstance(trace_process(name), PreemptionProcess)


def test_licences_are_shipped() -> None:
    for folder in ("bamboo", "parcae"):
        text = (DATA / folder / "LICENSE").read_text()
        assert "MIT License" in text
    assert set(bundled_traces()) == set(BUNDLED)


def test_bamboo_and_parcae_p3_agree() -> None:
    """Same AWS p3 events in two formats: same removals, exposure and MTTP."""
    a, b = load_trace("bamboo/p3"), load_trace("parcae/p3")
    assert a.fmt == "bamboo-events" and b.fmt == "parcae-counts"
    assert a.removals == b.removals == 167
    assert a.mttp == pytest.approx(b.mttp)
    # censoring: the MLE exceeds the mean of completed lifetimes (the README's ~1.5 h)
    observed = a.observed_mean_lifetime()
    assert observed is not None and observed < a.mttp
    assert observed / 3600 == pytest.approx(1.5, abs=0.1)


def test_censored_mle_by_hand(tmp_path: Path) -> None:
    # node1 lives 100 s (removed), node2 300 s (removed), node3 added at 0, alive at 400 s
    f = tmp_path / "toy.csv"
    f.write_text(
        "0,add,node1\r\n0,add,node2\r\n0,add,node3\r\n100000,remove,node1\r\n"
        "300000,remove,node2\r\n400000,add,node4\r\n"
    )
    tr = load_trace(f)
    assert tr.removals == 2
    assert tr.exposure == pytest.approx(100 + 300 + 400)
    assert tr.mttp == pytest.approx(400.0)
    assert sorted(tr.lifetimes or []) == [(0.0, False), (100.0, True), (300.0, True), (400.0, False)]


def test_count_formats(tmp_path: Path) -> None:
    f = tmp_path / "counts.csv"
    f.write_text("0,1\n0,2\n1000,1\n3000,2\n4000,0\n")
    tr = load_trace(f)
    assert tr.removals == 3 and sum(tr.added) == 3
    assert tr.exposure == pytest.approx(2 * 1 + 1 * 2 + 2 * 1)
    g = tmp_path / "gcp.txt"
    # the GCP logs echo each reading; earlier timestamps after later ones are clamped
    g.write_text(
        "2021-12-10, 13:07:45, 3\n2021-12-10, 13:08:45, 3\n2021-12-10, 13:09:45, 3\n"
        "2021-12-10, 13:08:45, 2\n2021-12-10, 13:09:45, 2\n2021-12-10, 13:10:45, 2\n"
    )
    tr = load_trace(g)
    assert tr.removals == 1 and tr.start is not None
    assert list(tr.times) == sorted(tr.times)
    assert detect_format(g.read_text()) == "bamboo-counts"


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="bundled"):
        load_trace("bamboo/nope")
    f = tmp_path / "bad.csv"
    f.write_text("hello world\n")
    with pytest.raises(ValueError, match="unrecognised"):
        load_trace(f)
    with pytest.raises(ValueError):
        parse("0,remove,node1\n")


def test_hazard_profiles_are_consistent() -> None:
    tr = load_trace("bamboo/p3")
    by_time = tr.hazard_by_time(3600.0)
    assert len(by_time) == math.ceil(tr.span / 3600.0)
    by_age = tr.hazard_by_age(1800.0)
    assert by_age is not None and all(r >= 0 for r in by_age)
    assert load_trace("parcae/p3").hazard_by_age() is None
    # the piecewise process keeps the trace's overall rate
    assert tr.piecewise(3600.0).mttp == pytest.approx(tr.mttp, rel=0.05)


def test_replay_mean_lifetime_near_mttp() -> None:
    tr = load_trace("bamboo/p3")
    proc, rng = tr.process(), random.Random(0)
    lives = [proc.next_preemption(s * 37.0, rng) - s * 37.0 for s in range(3000)]
    assert sum(lives) / len(lives) == pytest.approx(tr.mttp, rel=0.15)


def test_scenario_with_trace_runs() -> None:
    sc = Scenario(
        steps=20_000,
        step_time=2.0,
        save_time=10,
        backup_time=20,
        alloc_time=(86, 243),
        prep_time=60,
        grace=30,
        trace="bamboo/p3",
        spot_price=2.3,
        on_demand_price=6.2,
    )
    r = simulate(sc, "adaptive", runs=20, seed=1).mean
    assert r["preemptions"] > 0
    assert r["total"] > sc.work
