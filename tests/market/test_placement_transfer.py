"""Moving the checkpoint is part of a zone's expected cost (issue 10): the store stays where it
is, so a zone in another region or cloud pays egress for each restore and each save, and each
restore there takes longer (`spotnb.market.transfer`, `spotnb.market.placement.rank_zones`). And every job
with several candidate zones has its zones' prices followed (`prices` events at each
allocation), not only the jobs that may move."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import spotnb as spot
from spotnb.market.migration import best_move
from spotnb.market.placement import Transfer, rank_zones
from spotnb.market.transfer import BANDWIDTH, EGRESS, egress_per_gb, store_cloud, transfer_to
from tests.support import jobfns

HOUR = 3600.0
STORE = ("aws", "us-east-1")


def test_two_zones_at_the_same_price_the_one_beside_the_store_wins() -> None:
    prices = {"us-west-2a": 0.30, "us-east-1b": 0.30}  # the far one first: order is no help
    markets = {z: (6 * HOUR, 60.0) for z in prices}
    transfer = {
        "us-west-2a": transfer_to(STORE, ("aws", "us-west-2"), 5e9, True),
        "us-east-1b": transfer_to(STORE, ("aws", "us-east-1"), 5e9, True),
    }
    ranked = rank_zones(prices, markets, work_s=4 * HOUR, save_s=20.0, transfer=transfer)
    assert [z.zone for z in ranked] == ["us-east-1b", "us-west-2a"]
    near, far = ranked
    assert near.transfer_cost == 0.0 and near.restart == 60.0  # same region: free, no delay
    assert far.transfer.per_gb == EGRESS["aws"]["region"]
    assert far.restart == pytest.approx(60.0 + 5e9 / BANDWIDTH)  # the copy lengthens a restart
    assert far.transfer_cost == pytest.approx(5 * 0.02 * far.copies) and far.copies >= 1
    assert "across regions" in far.describe() and "per restore" in far.describe()
    # without the transfer the two would tie and the user's order (the far one) would win
    assert rank_zones(prices, markets)[0].zone == "us-west-2a"


def test_a_big_checkpoint_makes_a_cheaper_far_zone_lose() -> None:
    prices = {"gcp/us-central1-a": 0.20, "aws/us-east-1b": 0.30}
    markets = {z: (2 * HOUR, 120.0) for z in prices}

    def ranked(nbytes: float) -> list[str]:
        transfer = {
            "gcp/us-central1-a": transfer_to(STORE, ("gcp", "us-central1"), nbytes, True),
            "aws/us-east-1b": transfer_to(STORE, ("aws", "us-east-1"), nbytes, True),
        }
        out = rank_zones(prices, markets, work_s=4 * HOUR, save_s=30.0, transfer=transfer)
        return [z.zone for z in out]

    assert ranked(50e6)[0] == "gcp/us-central1-a"  # a small model: the cheaper cloud wins
    assert ranked(20e9)[0] == "aws/us-east-1b"  # 20 GB across clouds at each save and restore


def test_the_egress_table_and_the_store_s_cloud() -> None:
    assert store_cloud("s3://bucket/x") == "aws" and store_cloud("gs://b") == "gcp"
    assert store_cloud("az://c/p") == "azure" and store_cloud("file:///tmp/x") is None
    assert egress_per_gb(STORE, ("aws", "us-east-1")) == (0.0, "same region")
    assert egress_per_gb(STORE, ("gcp", "us-central1"))[0] == EGRESS["aws"]["internet"]
    assert (
        egress_per_gb(("aws", None), ("aws", "us-east-1"))[0] == EGRESS["aws"]["region"]
    )  # unknown: crossing
    assert egress_per_gb((None, None), (None, "zone-a")) == (0.0, "same place")  # the local market
    # restores leave the store's cloud, saves the zone's: each at its own cloud's rate
    t = transfer_to(STORE, ("gcp", "us-central1"), 1e9, False)
    assert (t.per_gb, t.per_gb_back) == (EGRESS["aws"]["internet"], EGRESS["gcp"]["internet"])


def test_a_move_pays_for_moving_the_checkpoint() -> None:
    """best-price: a zone a little cheaper in another region is not worth a 50 GB checkpoint's
    trip; with a small checkpoint the same move is made."""
    prices = {"us-east-1b": 0.30, "us-west-2a": 0.27}
    markets = {z: (float("inf"), 60.0) for z in prices}

    def move(nbytes: float) -> Any:
        transfer = {
            "us-east-1b": transfer_to(STORE, ("aws", "us-east-1"), nbytes, True),
            "us-west-2a": transfer_to(STORE, ("aws", "us-west-2"), nbytes, True),
        }
        ranked = rank_zones(prices, markets, work_s=10 * HOUR, save_s=10.0, transfer=transfer)
        return best_move(ranked, "us-east-1b", 10.0)

    small = move(10e6)
    assert small is not None and small.there.zone == "us-west-2a"
    assert move(50e9) is None  # $1 of egress for a $0.30 saving
    assert Transfer(1e9, 0.02, 20.0).gb == 1.0


def test_every_allocation_of_a_multi_zone_job_writes_the_zones_prices() -> None:
    """regions=[...] without migrate='best-price': the zones are tried in the user's order, and
    each allocation (the first and the relaunch after a preemption) writes a `prices` event,
    so the widget's price lines show for this job too."""
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": [[0, 0.30], ["1s", 0.02]]}}
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=30, step_time=0.01, hold_at=15),  # killed there
        spot.Config(
            ship_modules=["tests.support.jobfns"],
            local_regions=zones,
            regions=["zone-a", "zone-b"],
            local_schedule=[{"step": 15}],
            local_alloc_delay=0.1,
        ),
    )
    job.result(timeout=180)
    kinds = [e["kind"] for e in job.events]
    allocating = [i for i, k in enumerate(kinds) if k == "allocated"]
    said = [e for e in job.events if e["kind"] == "prices"]
    assert len(allocating) == 2 and len(said) >= 2
    assert all(set(e["zones"]) == {"zone-a", "zone-b"} for e in said)
    assert said[0]["zones"]["zone-a"] == 0.10
    # one before each allocation, the second after the first instance was preempted
    preempted = kinds.index("preempted")
    assert job.events[preempted]["step"] == 15
    assert any(job.events.index(e) > preempted for e in said)
    assert set(job.state.zone_prices) == {"zone-a", "zone-b"}


def test_the_checkpoint_size_is_the_largest_recent_one_or_an_estimate_before_the_first() -> None:
    """A checkpoint counts the bytes it wrote: one whose files an earlier one held says little,
    while a restore reads them all; before the first save an estimate stands in."""
    from types import SimpleNamespace

    from spotnb.market.transfer import NOMINAL_CHECKPOINT_BYTES, checkpoint_bytes

    assert checkpoint_bytes(SimpleNamespace(checkpoints=[])) == (NOMINAL_CHECKPOINT_BYTES, False)
    saves = [SimpleNamespace(nbytes=n) for n in (4e9, 1e6, 2e6)]
    assert checkpoint_bytes(SimpleNamespace(checkpoints=saves)) == (4e9, True)


def test_an_incremental_checkpoint_counts_what_it_references_too() -> None:
    """An incremental save writes only what changed, but moving to another region reads the
    frozen part it references as well."""
    from types import SimpleNamespace

    from spotnb.market.transfer import checkpoint_bytes

    saves = [SimpleNamespace(nbytes=n, referenced_bytes=4e9) for n in (1e6, 2e6)] * 6
    assert checkpoint_bytes(SimpleNamespace(checkpoints=saves)) == (4e9 + 2e6, True)
