"""The local market's emulated zones (`Config.local_regions`, issue 10): each zone has its own
spot price (a constant or a schedule over the job's time) and its own preemptions, so where a
job runs, and where it goes after a preemption, can be tried on one machine with real
processes. The zone is the instance's region in the events and the ledger."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import spotnb as spot
from spotnb.errors import ConfigError
from tests.support import jobfns

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


def _allocated(job: spot.Job) -> list[dict[str, Any]]:
    return [e for e in job.events if e["kind"] == "allocated"]


def test_the_cheapest_zone_now_is_chosen_and_a_relaunch_goes_where_it_is_cheapest_then() -> None:
    """zone-a costs $0.10/h throughout; zone-b $0.30/h at first and $0.02/h from 0.5 s on.
    With regions="cheapest" the first instance starts in zone-a; the relaunch after the
    preemption at step 30 (seconds later: the instance had to start Python and torch first)
    goes to zone-b, and each instance is billed at its zone's price. The steps take well under
    a millisecond: the first instance holds at step 30 until the kill (`hold_at`)."""
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": [[0, 0.30], ["500ms", 0.02]]}}
    job = spot.train(
        functools.partial(jobfns.seeded_mlp, steps=60, width=32, hold_at=30),
        spot.Config(
            ship_modules=SHIP,
            local_regions=zones,
            regions="cheapest",
            local_schedule=[{"step": 30}],
            local_alloc_delay=0.1,
        ),
    )
    job.result(timeout=180)
    assert [e["step"] for e in job.events if e["kind"] == "preempted"] == [30]
    first, second = _allocated(job)
    assert (first["region"], first["spot_price"]) == ("zone-a", pytest.approx(0.10))
    assert (second["region"], second["spot_price"]) == ("zone-b", pytest.approx(0.02))
    spans = {inc.n: inc for inc in job.state.incs.values()}
    assert spans[1].region == "zone-a" and spans[2].region == "zone-b"
    b = job.breakdown()
    assert b.spot_price == pytest.approx(0.02)  # the latest instance's
    # billed per instance at its own price: more than all at $0.02, less than all at $0.10
    # (billed from the instance's allocation: the time asked before it is not charged, and on a
    # busy machine it is long enough to matter)
    run = {n: (inc.end or 0.0) - (inc.allocated or 0.0) for n, inc in spans.items()}
    assert b.spot_cost == pytest.approx((run[1] * 0.10 + run[2] * 0.02) / 3600, rel=0.05)


def test_a_zone_with_its_own_mttp_draws_its_own_preemptions() -> None:
    """A zone's mttp sets the preemption draw of the instances launched there (recorded in
    their info as `kill_at`); a zone without one falls back to local_mttp (here none)."""
    zones = {"calm": {"price": 0.05}, "stormy": {"price": 0.01, "mttp": "1h"}}
    for region, drawn in (("calm", False), ("stormy", True)):
        job = spot.train(
            functools.partial(jobfns.slow_steps, steps=3, step_time=0.0),
            spot.Config(ship_modules=SHIP, local_regions=zones, region=region, local_seed=7),
        )
        job.result(timeout=120)
        (allocated,) = _allocated(job)
        assert allocated["region"] == region
        assert (allocated["info"]["kill_at"] is not None) is drawn


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"local_regions": {"bad zone!": {"price": 0.1}}}, "letters, digits"),
        ({"local_regions": {"z": {"price": -1}}}, "from 0 to 1000"),
        ({"local_regions": {"z": {"price": [[0, 0.3], ["10s", 0.2], ["5s", 0.1]]}}}, "must increase"),
        ({"local_regions": {"z": {"price": [["10s", 0.2]]}}}, "at time 0"),
        ({"local_regions": {"z": {"price": 0.1, "cost": 1}}}, "price, mttp, billing and egress"),
        ({"local_regions": {"z": {"price": 0.1, "egress": -1}}}, "egress is $/GB"),
        ({"local_regions": {"z": {"mttp": "0s"}}}, "mttp must be positive"),
        ({"local_regions": {"z": {"price": 0.1}}, "region": "zone-x"}, "not zones of local_regions"),
        ({"local_regions": {"z": {"price": 0.1}}, "price_spot": 0.2}, "local_regions both"),
        ({"regions": ["local", "us-east-1"]}, "unless local_regions"),
        ({"local_regions": {f"z{i}": {} for i in range(17)}}, "up to 16"),
    ],
)
def test_bad_zones_are_refused_before_anything_launches(fields: dict[str, Any], words: str) -> None:
    with pytest.raises((ConfigError, ValueError)) as info:
        spot.train(jobfns.slow_steps, spot.Config(ship_modules=SHIP, **fields))
    assert words in str(info.value)
    assert "local_regions" in str(info.value) or "region" in str(info.value)


def test_the_timeline_names_the_zone_of_each_instance_once_the_job_moved() -> None:
    """The lanes of a job that ran in two zones say where each instance ran (the instance
    type, the same for all, is in the hover); a job in one zone keeps the type."""
    from spotnb.core.protocol import from_json
    from spotnb.core.state import JobState
    from spotnb.views.widget.figures import static_figures_from_state
    from spotnb.views.widget.synthetic import synthetic_events

    def lanes(state: JobState) -> list[str]:  # the names the timeline's lanes are ticked with
        return list(static_figures_from_state(state)["timeline"].layout.yaxis.ticktext)

    events = [e for batch in synthetic_events(steps=100, preempt_at=(50,)) for e in batch]
    assert all("g4dn" in lane for lane in lanes(JobState.from_events(events)))
    for e in events:
        if e["kind"] in ("allocated", "launched"):
            e["region"] = "zone-a" if e["incarnation"] == 1 else "zone-b"
    st = JobState.from_events([from_json(e) if isinstance(e, dict) else e for e in events])
    assert lanes(st) == ["#1 zone-a", "#2 zone-b"]


def test_the_configs_prices_price_the_local_market_and_its_dry_run() -> None:
    """Config.price_spot / price_on_demand were ignored by the local market: its prices (the
    widget's price lines, the placement) and the dry run showed the table's $0.158/$0.526 for
    g4dn.xlarge. Nothing is launched here."""
    from spotnb.providers.local.provider import LocalProvider

    config = spot.Config(price_spot=5.0, price_on_demand=9.0, ship_modules=SHIP)
    prices = LocalProvider(config).prices(config.instance_type_name())
    assert (prices["local"].spot, prices["local"].on_demand) == (5.0, 9.0), prices
    assert "Config.price_spot" in prices["local"].source
    text = spot.train(jobfns.slow_steps, config, dry_run=True).text()
    assert "$5.000/h spot, $9.000/h on demand (Config.price_spot, Config.price_on_demand)" in text, text
    assert "0.158" not in text and "0.526" not in text
    # one of them: the other is the table's, and said so
    half = spot.Config(price_on_demand=9.0, ship_modules=SHIP)
    local = LocalProvider(half).prices(half.instance_type_name())["local"]
    assert (local.spot, local.on_demand) == (pytest.approx(0.158, abs=0.05), 9.0)
    text = spot.train(jobfns.slow_steps, half, dry_run=True).text()
    assert "$9.000/h on demand (Config.price_on_demand)" in text and "built-in table" in text, text
    # a type the table does not know, priced by the Config alone
    own = spot.Config(instance_type="my-box", price_spot=0.5, price_on_demand=2.0, ship_modules=SHIP)
    assert LocalProvider(own).prices("my-box")["local"].spot == 0.5
    assert "$0.500/h spot, $2.000/h on demand" in spot.train(jobfns.slow_steps, own, dry_run=True).text()
    # emulated zones keep their own spot prices; the on-demand price is the Config's
    zoned = spot.Config(local_regions={"zone-a": {"price": 0.1}}, price_on_demand=9.0, ship_modules=SHIP)
    zone = LocalProvider(zoned).prices(zoned.instance_type_name())["zone-a"]
    assert (zone.spot, zone.on_demand) == (0.1, 9.0)
