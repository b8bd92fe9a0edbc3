"""Zones ranked by the expected cost of the job's work, not by price (`spotnb.market.placement`,
issue 10), with a decaying penalty for a zone that just preempted or refused capacity."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import spotnb as spot
from spotnb.market.placement import NOMINAL_WORK, PENALTY_DECAY, penalty, rank_zones
from spotnb.policy.intervals import daly_interval, expected_total
from tests.support import jobfns

SHIP = ["tests.support.jobfns"]
HOUR = 3600.0


def test_a_cheap_zone_that_preempts_all_the_time_loses_to_a_calm_one() -> None:
    prices = {"cheap-stormy": 0.05, "calm": 0.08}
    markets = {"cheap-stormy": (120.0, 60.0), "calm": (6 * HOUR, 60.0)}
    ranked = rank_zones(prices, markets, work_s=10 * HOUR, save_s=20.0)
    assert [z.zone for z in ranked] == ["calm", "cheap-stormy"]
    stormy = ranked[1]
    # the terms are the checkpoint model's, not a made-up score
    tau = daly_interval(20.0, 120.0, 60.0)
    hours = (expected_total(10 * HOUR, tau, 20.0, 120.0, 60.0) + 60.0) / HOUR
    assert stormy.hours == pytest.approx(hours) and stormy.cost == pytest.approx(0.05 * hours)
    # with calm markets everywhere the price decides
    calm = {z: (6 * HOUR, 60.0) for z in prices}
    assert [z.zone for z in rank_zones(prices, calm)][0] == "cheap-stormy"


def test_a_zone_that_just_preempted_is_penalised_and_the_penalty_fades() -> None:
    prices = {"a": 0.10, "b": 0.10}
    markets = {z: (2 * HOUR, 30.0) for z in prices}
    assert [z.zone for z in rank_zones(prices, markets)] == ["a", "b"]  # a tie keeps the order
    now = 10_000.0
    ranked = rank_zones(prices, markets, trouble={"a": [now - 5]}, now=now)
    assert [z.zone for z in ranked] == ["b", "a"] and ranked[1].penalty == pytest.approx(2.0, abs=0.01)
    later = now + 10 * PENALTY_DECAY
    assert [z.zone for z in rank_zones(prices, markets, trouble={"a": [now]}, now=later)] == ["a", "b"]
    assert penalty([now, now], now) == pytest.approx(3.0)


def test_unknown_work_and_a_market_that_never_preempts() -> None:
    (z,) = rank_zones({"z": 0.2}, {"z": (float("inf"), 30.0)})
    assert z.hours == pytest.approx((NOMINAL_WORK + 30.0) / HOUR)


def test_the_relaunch_avoids_the_zone_that_just_preempted_it() -> None:
    """Two zones at the same price: the first instance runs in the first; after it is
    preempted the relaunch goes to the other (EAGER_NEXT_REGION), and the job finishes. Its
    steps take well under a millisecond: the first instance holds at step 20 until the kill
    (`hold_at`), or the market could see the job's end before its step 20."""
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": 0.10}}
    job = spot.train(
        functools.partial(jobfns.seeded_mlp, steps=40, width=32, hold_at=20),
        spot.Config(
            ship_modules=SHIP,
            local_regions=zones,
            regions="cheapest",
            local_schedule=[{"step": 20}],
            local_alloc_delay=0.1,
        ),
    )
    job.result(timeout=180)
    assert [e["step"] for e in job.events if e["kind"] == "preempted"] == [20]
    regions = [e["region"] for e in job.events if e["kind"] == "allocated"]
    assert regions == ["zone-a", "zone-b"]


def test_the_dry_run_shows_the_zones_ranked_with_their_terms(spotnb_home: Any) -> None:
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": 0.05, "mttp": "2m"}, "zone-c": {"price": 0.2}}
    plan = spot.train(jobfns.slow_steps, spot.Config(local_regions=zones, regions="cheapest"), dry_run=True)
    assert [z["zone"] for z in plan["placement"]] == ["zone-b", "zone-a", "zone-c"]
    text = str(plan)
    assert "zones by expected cost" in text and "MTTP 2 min" in text and "$0.050/h" in text
    assert "several regions" not in text  # zones are supported: not listed as missing


def test_a_region_s_market_counts_the_instances_of_its_zones(spotnb_home: Any) -> None:
    """AWS records zones (us-east-1b), GCP zones (us-central1-a), users name regions: the
    market of a region is measured over its zones, and only its zones."""
    from spotnb.control.jobdb import JobDB, in_region

    db = JobDB()
    db.add_job("j", name=None, provider="aws", region=None, instance_type="g4dn.xlarge", store="file:///s")
    for n, zone in enumerate(["us-east-1b", "us-east-1c", "us-east-10a", "eu-west-1a"], 1):
        db.record_incarnation(
            "j", n, provider="aws", instance_type="g4dn.xlarge", region=zone,
            requested=0.0, allocated=10.0, ready=20.0, ended=1000.0, end_reason="preempted",
        )  # fmt: skip
    stats = db.market("aws", "us-east-1", "g4dn.xlarge")
    assert stats.preemptions == 2 and stats.exposure == pytest.approx(2 * 990.0)
    assert db.market("aws", "us-east-1b", "g4dn.xlarge").preemptions == 1
    assert in_region("us-central1-a", "us-central1", "gcp") and not in_region(
        "us-central10", "us-central1", "gcp"
    )
    assert not in_region("east-2", "east", "local") and not in_region("ab", "a", "local")


def test_capacity_failures_are_folded_for_the_penalty_without_rescanning_the_events() -> None:
    """The controller ranks zones every second on the local market while a job may move; the
    capacity failures it penalises come folded by the job's state, not from a scan of every
    event (metrics included) at each look."""
    from spotnb.core.state import JobState

    def failed(region: str | None, t: float) -> dict[str, Any]:
        return {
            "kind": "alloc_failed",
            "t": t,
            "incarnation": 1,
            "region": region,
            "reason": "x",
            "retry_in": 0.0,
        }

    st = JobState.from_events([failed("zone-a", 100.0), failed(None, 101.0), failed("zone-a", 102.0)])
    assert list(st.alloc_failures) == [("zone-a", 100.0), ("zone-a", 102.0)]
    trouble: dict[str, list[float]] = {}
    for zone, t in st.alloc_failures:
        trouble.setdefault(zone, []).append(t)
    ranked = rank_zones(
        {"zone-a": 0.1, "zone-b": 0.1},
        {"zone-a": (3600.0, 60.0), "zone-b": (3600.0, 60.0)},
        trouble=trouble,
        now=110.0,
    )
    assert [z.zone for z in ranked] == ["zone-b", "zone-a"]
