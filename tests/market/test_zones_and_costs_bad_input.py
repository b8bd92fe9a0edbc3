"""Hostile input for emulated zones (local_regions), placement by expected cost, the job DB's
per-region market and the coordinator's line in the ledger (issues 9 and 10).

The tests above "guards" each began as a failing test for a defect an attack found; the ones
under "guards" held from the start and keep important behaviour."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

import spotnb as spot
from spotnb.core.ledger import compute_breakdown, coordinator_overheads
from spotnb.core.state import JobState
from spotnb.market.placement import rank_zones
from tests.providers.aws.test_coordinator import coordinator_job_events
from tests.support import jobfns


# -- defects -------------------------------------------------------------------------------------
def test_a_zone_s_market_does_not_count_another_zone_whose_name_extends_it(spotnb_home: Any) -> None:
    """Emulated zones are free names: local_regions={'east': ..., 'east-2': ...} (or 'a' and
    'ab'). The job DB's market of zone 'east' now counts "the zones of a region" by name
    prefix (`in_region`), so every preemption in 'east-2' is charged to 'east': regions=
    'cheapest' then ranks the calm zone 'east' as if it preempted as often as 'east-2' and
    the user pays for the stormy zone (or never gets the cheap calm one)."""
    from spotnb.control.jobdb import JobDB

    db = JobDB()
    db.add_job("j", name=None, provider="local", region=None, instance_type="g4dn.xlarge", store="file:///s")
    for n in range(1, 6):  # five preemptions, all in the stormy zone 'east-2'
        db.record_incarnation(
            "j", n, provider="local", instance_type="g4dn.xlarge", region="east-2",
            requested=0.0, allocated=10.0, ready=20.0, ended=100.0, end_reason="preempted",
        )  # fmt: skip
    db.record_incarnation(
        "j", 6, provider="local", instance_type="g4dn.xlarge", region="east",
        requested=0.0, allocated=10.0, ready=20.0, ended=5000.0, end_reason="finished",
    )  # fmt: skip
    assert db.market("local", "east-2", "g4dn.xlarge").preemptions == 5
    calm = db.market("local", "east", "g4dn.xlarge")
    assert calm.preemptions == 0, f"zone 'east' charged with {calm.preemptions} preemptions of 'east-2'"


def test_zone_a_is_not_charged_with_zone_ab(spotnb_home: Any) -> None:
    """Same defect with the shortest names: 'ab' counts as a zone of 'a' (one lower-case letter
    after the name is read as an AWS zone suffix), so local_regions={'a':..., 'ab':...}
    charges every preemption of 'ab' to 'a'."""
    from spotnb.control.jobdb import JobDB

    short = JobDB()
    short.add_job(
        "k", name=None, provider="local", region=None, instance_type="g4dn.xlarge", store="file:///s"
    )
    short.record_incarnation(
        "k", 1, provider="local", instance_type="g4dn.xlarge", region="ab",
        requested=0.0, allocated=10.0, ready=20.0, ended=100.0, end_reason="preempted",
    )  # fmt: skip
    assert short.market("local", "ab", "g4dn.xlarge").preemptions == 1
    assert short.market("local", "a", "g4dn.xlarge").preemptions == 0, "zone 'a' charged with 'ab'"


def test_a_coordinator_with_a_text_start_does_not_break_every_view() -> None:
    """An instance's info is read from the store (a corrupt, foreign or older writer's event):
    a coordinator whose `started` is text ("2026-11-25T08:00Z") makes `coordinator_overheads`
    call float() on it, and the ValueError escapes JobState.breakdown(): job.cost(),
    job.breakdown(), the widget's cost line and the lab panel's row all raise, for a job whose
    own spot instances are perfectly readable. The bad coordinator should be skipped (or
    counted as unreadable), like a bad row of metrics."""
    state = JobState.from_events(
        coordinator_job_events({"id": "i-coord", "started": "2026-11-25T08:00Z", "price": 0.0208})
    )
    b = state.breakdown()  # raised ValueError before the fix
    assert b.spot_cost > 0
    state.cost(b)


def test_a_coordinator_with_a_text_price_does_not_break_every_view() -> None:
    """Same with `price: "0.0208/h"` (or any text): ValueError from float() in
    coordinator_overheads, so job.cost() and the widget raise."""
    state = JobState.from_events(
        coordinator_job_events({"id": "i-coord", "started": 10.0, "price": "0.0208/h"})
    )
    state.cost(state.breakdown())


def test_a_negative_or_infinite_coordinator_price_is_not_billed_as_such() -> None:
    """A coordinator price of -5 $/h is billed as -$0.14 an hour: the job's total cost drops
    below what its spot instances cost and the savings shown exceed 100 % of the truth;
    inf makes the total cost inf. Prices out of [0, inf) should be refused like the zones'
    prices (local_settings refuses anything outside [0, 1000))."""
    for price in (-5.0, math.inf, math.nan):
        over = coordinator_overheads([{"coordinator": {"id": "c", "started": 0.0, "price": price}}])
        b = compute_breakdown([], 0.0, 3600.0, overheads=over)
        assert math.isfinite(b.coordinator_cost) and b.coordinator_cost >= 0, (price, b.coordinator_cost)


# -- guards (held from the start) --------------------------------------------------------------------
def test_zones_survive_the_spec_s_json_round_trip() -> None:
    """The controller rebuilds the Config from the spec's JSON: schedules become lists of
    lists, durations numbers; validating them again must give the same zones."""
    from spotnb.core.spec import config_json
    from spotnb.settings.config import provider_prefixes

    cfg = spot.Config(
        local_regions={"a": {"price": [[0, 0.1], ["1h", 0.2]], "mttp": "10m"}, "b": {"price": 0.05}},
        regions="cheapest",
    )
    data = json.loads(json.dumps(config_json(cfg)))
    fields = {
        k: v
        for k, v in data.items()
        if not (k.startswith(provider_prefixes()) and not k.startswith("local_"))
        and not (k == "checkpoint" and v is None)
    }
    again = spot.Config(**fields)
    assert again.local_regions == cfg.local_regions
    assert again.local_zone_price("a", 3599) == 0.1 and again.local_zone_price("a", 3600) == 0.2
    assert spot.Config(local_regions=cfg.local_regions).local_regions == cfg.local_regions


@pytest.mark.parametrize(
    "zones",
    [
        {"a": {"price": [[0, math.nan]]}},
        {"a": {"price": [[0, math.inf]]}},
        {"a": {"price": [[0, -0.1]]}},
        {"a": {"price": [[0, "0.1"]]}},
        {"a": {"price": [[0, 0.1], ["0s", 0.2]]}},
        {"a": {"price": [[5, 0.1]]}},
        {"a": {"price": [[0, 0.1], [math.nan, 0.2]]}},
        {"a": {"mttp": 0}},
        {"a": {"mttp": "-1m"}},
        {"a b": {"price": 0.1}},
        {"a": {"price": 0.1, "capacity": 3}},
    ],
)
def test_bad_zones_are_refused(zones: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        spot.Config(local_regions=zones)


def test_zone_price_at_odd_times_stays_a_price() -> None:
    cfg = spot.Config(local_regions={"a": {"price": [[0, 0.1], [60, 0.3]]}})
    assert cfg.local_zone_price("a", -10.0) == 0.1
    assert cfg.local_zone_price("a", math.inf) == 0.3
    assert cfg.local_zone_price("nowhere", 0.0) is None


def test_ranking_with_nan_free_markets_is_total_and_stable() -> None:
    """A zone that never preempts at price 0 ranks first; ties keep the user's order."""
    ranked = rank_zones(
        {"b": 0.2, "a": 0.2, "free": 0.0},
        {"b": (3600.0, 10.0), "a": (3600.0, 10.0), "free": (math.inf, 10.0)},
    )
    assert [z.zone for z in ranked] == ["free", "b", "a"]


def test_a_dry_run_with_cheapest_and_no_zones_does_not_fail(spotnb_home: Any) -> None:
    plan = spot.train(jobfns.slow_steps, spot.Config(regions="cheapest"), dry_run=True)
    str(plan)
