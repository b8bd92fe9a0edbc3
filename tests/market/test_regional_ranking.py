"""The zone ranking knows the regional stores (`Config.regional_stores`, issue 10): a zone
with its own store pays the checkpoint's crossing once, at its first start (the copy), and
nothing for its later starts and saves; a zone without one reads from and writes back to where
the checkpoint is. Before, every zone was priced as reading from and writing to the home
store, so a job whose checkpoint had followed it into a zone's store saw each of its saves
there as crossing, and a zone a hair cheaper elsewhere as the better place: a move back, paid
with a copy and every later save across."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import spotnb as spot
from spotnb.core import protocol as ev
from spotnb.core.state import JobState
from spotnb.core.store import Store
from spotnb.market.migration import best_move
from spotnb.market.placement import Transfer, rank_zones
from spotnb.market.regional import Regional
from spotnb.settings.registry import get_provider_class

GB = 1e9
BIG = 50 * GB  # a checkpoint whose crossings dwarf a 1 % price gap


def _regional(tmp_path: Path) -> tuple[Regional, str]:
    zones = {
        "zone-a": {"price": 0.099, "egress": 0.1},
        "zone-b": {"price": 0.100, "egress": 0.1},
    }
    b_store = str(tmp_path / "zone-b-store")
    config = spot.Config(local_regions=zones, regions="cheapest", regional_stores={"zone-b": b_store})
    home = Store((tmp_path / "home").as_uri())
    return Regional(config, get_provider_class("local")(config), home, "j1"), b_store


def _rank(regional: Regional, source: str | None, saved: bool = True) -> list:
    zones = ("zone-a", "zone-b")
    transfer = {z: regional.transfer(z, source, BIG, saved) for z in zones}
    markets = {z: (3600.0, 60.0) for z in zones}
    return rank_zones({"zone-a": 0.099, "zone-b": 0.100}, markets, save_s=10.0, transfer=transfer)


def test_a_job_whose_checkpoint_followed_it_into_a_zone_s_store_does_not_move_back_for_a_lower_price(
    tmp_path: Path,
) -> None:
    regional, b_store = _regional(tmp_path)
    ranked = _rank(regional, b_store)
    by_zone = {z.zone: z for z in ranked}
    assert ranked[0].zone == "zone-b"
    # staying pays no crossing at all: its restores read the zone's store, its saves stay there
    assert by_zone["zone-b"].transfer_cost == 0.0
    # going back to zone-a pays the copy home and every later save written back across
    assert by_zone["zone-a"].restore_cost == pytest.approx(BIG / GB * 0.2)  # b → home → a
    assert by_zone["zone-a"].transfer_cost > by_zone["zone-a"].restore_cost
    assert best_move(ranked, "zone-b", 10.0) is None


def test_a_zone_with_a_store_pays_its_copy_once_and_a_zone_without_one_pays_every_crossing(
    tmp_path: Path,
) -> None:
    """From the home store: zone-b's first start copies into its store (once, however often it
    would be preempted after); zone-a reads the home store at every start and writes every save
    back. The ranking's dollars are those counts times the zone's link price."""
    regional, _ = _regional(tmp_path)
    by_zone = {z.zone: z for z in _rank(regional, None)}
    b, a = by_zone["zone-b"], by_zone["zone-a"]
    assert b.transfer_cost == pytest.approx(BIG / GB * 0.1)  # home → zone-b's store, once
    assert b.restore_cost == b.transfer_cost
    assert a.copies > 2  # the first restore, the saves and the relaunches' restores
    assert a.transfer_cost == pytest.approx(a.copies * BIG / GB * 0.1)
    # before the first save there is nothing to copy: zone-b costs nothing, zone-a its saves
    fresh = {z.zone: z for z in _rank(regional, None, saved=False)}
    assert fresh["zone-b"].transfer_cost == 0.0 and fresh["zone-a"].transfer_cost > 0.0


def test_later_starts_read_the_copy_the_first_one_made() -> None:
    """`Transfer.per_gb_later`: however many relaunches a preempting zone expects, only the
    first start pays the crossing; without it every start does."""
    copied = Transfer(BIG, 0.02, 1000.0, True, "copied", 0.0, per_gb_later=0.0, seconds_later=0.0)
    across = Transfer(BIG, 0.02, 1000.0, True, "across regions", 0.0)
    markets = {"z": (600.0, 60.0)}  # preempted every 10 minutes: many relaunches
    (once,) = rank_zones({"z": 1.0}, markets, work_s=36000.0, save_s=10.0, transfer={"z": copied})
    (every,) = rank_zones({"z": 1.0}, markets, work_s=36000.0, save_s=10.0, transfer={"z": across})
    assert once.transfer_cost == pytest.approx(BIG / GB * 0.02)
    assert every.transfer_cost > 10 * once.transfer_cost
    # and the later starts do not wait for the crossing either: less wall time
    assert once.hours < every.hours and once.restart == every.restart == 1060.0


@pytest.mark.parametrize(
    ("action", "where"), [("copy", "target"), ("read_across", "source"), ("in_place", "source")]
)
def test_the_state_knows_which_store_the_saves_go_to(action: str, where: str) -> None:
    placed = ev.CheckpointPlaced(
        zone="zone-b", action=action, source="file:///home", target="file:///b", incarnation=1
    )
    state = JobState()
    assert state.checkpoint_store is None
    state.feed_events([placed])
    assert state.checkpoint_store == {"source": "file:///home", "target": "file:///b"}[where]


def test_a_corrupt_checkpoint_size_is_no_size_and_ranks_without_nan(tmp_path: Path) -> None:
    """A corrupt save record (`nbytes` inf, NaN or negative) must not become the checkpoint's
    size: inf bytes × a free 0 $/GB link is NaN, which compares false, so the sort would put
    that zone anywhere. The size is the good records', and the ranking holds no NaN."""
    from types import SimpleNamespace

    from spotnb.market.transfer import checkpoint_bytes

    good = SimpleNamespace(nbytes=BIG, referenced_bytes=0)
    for bad in (float("inf"), float("nan"), -5.0):
        state = SimpleNamespace(checkpoints=[good, SimpleNamespace(nbytes=bad, referenced_bytes=0)])
        assert checkpoint_bytes(state) == (BIG, True)
    regional, _ = _regional(tmp_path)
    nbytes, saved = checkpoint_bytes(
        SimpleNamespace(checkpoints=[SimpleNamespace(nbytes=float("inf"), referenced_bytes=0)])
    )
    zones = ("zone-a", "zone-b")
    transfer = {z: regional.transfer(z, regional.urls["zone-b"], nbytes, saved) for z in zones}
    markets = {z: (3600.0, 60.0) for z in zones}
    ranked = rank_zones({"zone-a": 0.099, "zone-b": 0.100}, markets, save_s=10.0, transfer=transfer)
    assert not any(math.isnan(z.cost) or math.isnan(z.transfer_cost) for z in ranked)
    assert [z.zone for z in ranked] == ["zone-b", "zone-a"]


def test_the_dry_run_line_of_a_copied_checkpoint_does_not_multiply_every_copy_by_the_copy_price(
    tmp_path: Path,
) -> None:
    """The line said "at $0.100/GB × 8.0 copies = $0.0000" for a zone with its own store before
    the first save (and $0.1 × 8 copies = $5 for a 50 GB one that pays the copy once): its
    arithmetic must be the one the cost was computed with."""
    regional, _ = _regional(tmp_path)
    for saved in (False, True):
        b = {z.zone: z for z in _rank(regional, None, saved=saved)}["zone-b"]
        line = b.describe()
        assert "× " + f"{b.copies:.1f} copies" not in line
        assert f"${b.transfer_cost:.4f}" in line and "once" in line
