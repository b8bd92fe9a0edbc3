"""Moving a running job to a cheaper zone (`Config.migrate`, issue 10), on the local market's
emulated zones: real processes, a real save before leaving, a real restore in the new zone."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import spotnb as spot
from spotnb.market.migration import MIN_GAIN, best_move
from spotnb.market.placement import rank_zones
from spotnb.views.widget.figures import timeline_traces
from spotnb.views.widget.text import event_line
from tests.support import jobfns
from tests.support.jobs import assert_matches_reference

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


def _kinds(job: spot.Job, kind: str) -> list[dict[str, Any]]:
    return [e for e in job.events if e["kind"] == kind]


def test_a_running_job_moves_to_the_zone_that_became_cheaper_finishes_exactly_and_pays_less(
    reference,
) -> None:
    """zone-a costs $0.10/h; zone-b $0.30/h at first and $0.02/h from 1 s on. The job starts
    in zone-a; once its remaining work is known the controller sees that moving pays, starts
    an instance in zone-b, and only then asks the first instance to save and leave. The first
    instance holds at step 60 until it is asked (so the test does not race the boot)."""
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": [[0, 0.30], ["1s", 0.02]]}}
    job = spot.train(
        functools.partial(jobfns.seeded_mlp, step_delay=0.01, hold_at=60),
        spot.Config(
            ship_modules=SHIP,
            local_regions=zones,
            regions="cheapest",
            migrate="best-price",
            checkpoint="static:20",
        ),
    )
    assert_matches_reference(job, reference)
    assert [e["region"] for e in _kinds(job, "allocated")] == ["zone-a", "zone-b"]
    (moving,) = _kinds(job, "moving")
    assert (moving["from_region"], moving["to_region"]) == ("zone-a", "zone-b")
    assert moving["saving"] > 0 and moving["move_cost"] > 0
    # a move, not a preemption: the first instance saved and exited as moved
    assert not _kinds(job, "preempted")
    (first_end,) = [e for e in _kinds(job, "exited") if e["incarnation"] == 1]
    assert first_end["reason"] == "moved"
    assert job.breakdown().preemptions == 0
    (move_save,) = [e for e in _kinds(job, "checkpoint") if e["save_kind"] == "move"]
    assert move_save["incarnation"] == 1 and move_save["step"] <= 61  # by the hold at the latest
    # the new instance resumed from the move's save: no step trained twice
    (resumed,) = _kinds(job, "resumed")
    assert resumed["incarnation"] == 2 and resumed["from_step"] == move_save["step"]
    assert job.breakdown().recompute == pytest.approx(0.0, abs=1e-9)
    # what staying would have cost: zone-a's instance billed until the job ended
    incs = job.state.incs
    end = max(inc.end or 0.0 for inc in incs.values())
    staying = (end - (incs[1].asked or 0.0)) * 0.10 / 3600
    assert job.breakdown().spot_cost < staying
    # shown: the move in the feed with its saving, on the timeline where it happened
    line = event_line(moving)
    assert line is not None and "zone-a to zone-b" in line and f"{moving['saving']:.4f}" in line
    traces = dict(timeline_traces(job.state))
    assert any("moves to zone-b" in text for text in traces["tl:move"]["text"])
    # and the prices the controller saw, over time: zone-b from $0.30/h down to $0.02/h
    b = [price for _, price in job.state.zone_prices["zone-b"]]
    assert b[0] == pytest.approx(0.30) and b[-1] == pytest.approx(0.02)
    assert traces["tl:price:zone-b"]["y"][-1] == pytest.approx(0.02)


def test_migrate_never_relaunches_where_it_ran() -> None:
    """The same market as the relaunch test of test_local_regions (zone-b becomes cheaper
    after 0.5 s), but migrate="never": the relaunch after the preemption goes back to zone-a
    (the first instance holds at step 30 until the kill: its steps are faster than the
    market's look at them)."""
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": [[0, 0.30], ["500ms", 0.02]]}}
    job = spot.train(
        functools.partial(jobfns.seeded_mlp, steps=60, width=32, hold_at=30),
        spot.Config(
            ship_modules=SHIP,
            local_regions=zones,
            regions="cheapest",
            migrate="never",
            local_schedule=[{"step": 30}],
            local_alloc_delay=0.1,
        ),
    )
    job.result(timeout=180)
    assert [e["step"] for e in _kinds(job, "preempted")] == [30]
    assert [e["region"] for e in _kinds(job, "allocated")] == ["zone-a", "zone-a"]


def _ranked(prices: dict[str, float], work_s: float) -> Any:
    markets = {zone: (float("inf"), 60.0) for zone in prices}  # calm zones, a minute to start
    return rank_zones(prices, markets, work_s=work_s, save_s=5.0)


def test_a_move_is_made_only_when_the_saving_over_the_remaining_work_pays_for_it() -> None:
    """An hour of work left: moving from $1/h to $0.5/h saves ~$0.49 after the move's
    ~$0.01; with 30 s left the saving does not cover the new instance's start; no cheaper
    zone, or one cheaper by less than MIN_GAIN, is no move."""
    move = best_move(_ranked({"here": 1.0, "there": 0.5}, 3600), "here", 5.0)
    assert move is not None and move.there.zone == "there"
    assert move.saving == pytest.approx(3600 * 0.5 / 3600 - 60 * 0.5 / 3600 - 5 * 1.0 / 3600)
    assert move.cost == pytest.approx((5 * 1.0 + 60 * 0.5) / 3600)
    assert best_move(_ranked({"here": 1.0, "there": 0.5}, 30), "here", 5.0) is None
    assert best_move(_ranked({"here": 0.5, "there": 1.0}, 3600), "here", 5.0) is None
    slightly = 1.0 - MIN_GAIN / 2
    assert best_move(_ranked({"here": 1.0, "there": slightly}, 3600), "here", 5.0) is None
    assert best_move(_ranked({"there": 0.5}, 3600), "elsewhere", 5.0) is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"migrate": "best-price"}, "only one zone"),
        ({"migrate": "best-price", "regions": ["a", "a"]}, "names 'a' twice"),  # one zone, twice
        ({"migrate": "cheapest"}, "migrate"),
    ],
)
def test_bad_migrate_settings_are_refused_before_anything_runs(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(spot.ConfigError, match=words):
        spot.Config(**fields)


def test_the_dry_run_says_what_migrate_does() -> None:
    zones = {"a": {"price": 0.1}, "b": {"price": 0.2}}
    for migrate, words in (("best-price", "every 1 s to move a running job"), ("never", "zone it ran in")):
        plan = spot.train(
            jobfns.slow_steps,
            spot.Config(local_regions=zones, regions="cheapest", migrate=migrate, ship_modules=SHIP),
            dry_run=True,
        )
        assert words in plan["migrate"] and "migrate" in str(plan)
