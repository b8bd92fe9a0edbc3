"""The checkpoint follows the job to another region (`Config.regional_stores`, issue 10), on
the local market's emulated zones: plain folders stand for the regions' buckets, the job runs
real processes that are really moved and killed, and the controller really copies."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.store import Store
from tests.core import jobfns
from tests.core.helpers import assert_matches_reference

SHIP = ["tests.core.jobfns"]
EGRESS = 0.02  # $/GB between zone-b and elsewhere


def _kinds(job: spot.Job, kind: str) -> list[dict[str, Any]]:
    return [e for e in job.events if e["kind"] == kind]


def _manifests(folder: str, job_id: str) -> dict[int, dict[str, Any]]:
    """Committed checkpoints of a store folder: seq -> manifest."""
    root = Path(folder) / "jobs" / job_id / "ckpt"
    out = {}
    for sub in sorted(root.glob("[0-9]*")):
        if (sub / "MANIFEST.json").exists():
            out[int(sub.name)] = json.loads((sub / "MANIFEST.json").read_text())
    return out


def _home(job: spot.Job) -> str:
    return Store(spot.Config().store_url()).root


def test_a_move_copies_the_checkpoint_to_the_new_regions_store_and_saves_there(reference, tmp_path) -> None:
    """zone-b becomes cheaper; it has its own store. The move copies the move's save into it
    (once: 7 saves are expected there, each would cross back), the new instance restores from
    the copy and its later saves land there; the job ends bit-exactly and the ledger counts
    the copy."""
    zone_b = str(tmp_path / "zone-b-bucket")
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": [[0, 0.30], ["1s", 0.02]], "egress": EGRESS}}
    job = spot.train(
        functools.partial(jobfns.seeded_mlp, step_delay=0.01, hold_at=60),
        spot.Config(
            ship_modules=SHIP,
            local_regions=zones,
            regions="cheapest",
            migrate="best-price",
            checkpoint="static:20",
            regional_stores={"zone-b": zone_b},
        ),
    )
    assert_matches_reference(job, reference)
    assert [e["region"] for e in _kinds(job, "allocated")] == ["zone-a", "zone-b"]
    placed = {e["incarnation"]: e for e in _kinds(job, "checkpoint_placed")}
    assert placed[1]["action"] == "fresh"
    copy = placed[2]
    assert copy["action"] == "copy" and copy["target"] == zone_b and copy["zone"] == "zone-b"
    (move_save,) = [e for e in _kinds(job, "checkpoint") if e["save_kind"] == "move"]
    assert copy["seq"] == move_save["seq"]
    # the cost rule, in the event's own numbers: copying pays the bytes once, reading across
    # pays them once plus every expected save written back
    gb = copy["nbytes"] / 1e9
    assert copy["copy_cost"] == pytest.approx(gb * EGRESS)
    assert copy["saves"] >= 6  # static:20 from step ~60 to 200
    assert copy["read_cost"] > copy["copy_cost"]
    # the new instance restored from the copy, and wrote every later save into zone-b's store
    (resumed,) = _kinds(job, "resumed")
    assert resumed["incarnation"] == 2 and resumed["from_step"] == move_save["step"]
    regional = _manifests(zone_b, job.id)
    later = sorted(e["seq"] for e in _kinds(job, "checkpoint") if e["incarnation"] == 2)
    assert len(later) >= 6
    # pruning counted checkpoints across both stores: the newest two are kept (in zone-b's)
    home = _manifests(_home(job), job.id)
    assert sorted(regional) == later[-2:] and not home
    assert all(m["incarnation"] == 2 for m in regional.values())
    # the transfer is a line of the bill
    b = job.breakdown()
    assert b.transfer_cost == pytest.approx(copy["cost"]) and b.transfer_cost > 0
    assert b.total_cost == pytest.approx(b.spot_cost + b.transfer_cost)
    assert "checkpoint transfer" in b.table()
