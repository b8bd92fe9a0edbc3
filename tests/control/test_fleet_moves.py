"""Moving the replicas of a job on several instances to a cheaper zone (`Config.migrate=
"best-price"`, issue 10), on the local market's emulated zones: real agent processes training
together through a real torchft lighthouse, a real new instance joining from a peer, a real
old one leaving the quorum. Nothing is mocked.

`movefns.paced_dp` is `jobfns.exact_dp` (every gradient a multiple of 1/8: the final weights say to the
bit whether each step's global batch was applied exactly once) whose first replicas train
slowly: the group trains at the pace of its slowest member, so the job cannot end before the
moves are made however slow this machine is, and ends soon after them.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.market.migration import MIN_GAIN, MoveGate, best_move, best_replica_move
from spotnb.market.placement import rank_zones
from spotnb.views.widget.figures import timeline_traces
from spotnb.views.widget.text import event_line
from tests.support import jobfns
from tests.support.movefns import paced_dp

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

SHIP = ["tests.support.jobfns", "tests.support.movefns"]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")


def _by(job: spot.Job, kind: str, n: int | None = None) -> list[Any]:
    return [e for e in job.events if e["kind"] == kind and (n is None or e["incarnation"] == n)]


def test_replicas_move_one_at_a_time_without_a_pause_and_the_job_pays_less() -> None:
    """zone-a costs $0.10/h; zone-b $0.30/h at first and $0.005/h from 4 s on (the market's
    time starts at its first launch). Both replicas start in zone-a; each is moved to zone-b in
    turn: its new instance joins the group (3 replicas), then the old one leaves (2 again).
    The weights are the calm run's to the bit, no step is redone, nobody restores from the
    store, and the job costs less than staying."""
    steps = 800  # at most 48 s at the slow pace; ends within seconds of the last move
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": [[0, 0.30], ["4s", 0.005]]}}
    job = spot.train(
        functools.partial(paced_dp, steps=steps, first=2, slow=0.06),
        spot.Config(
            ship_modules=SHIP,
            instances=2,
            local_regions=zones,
            regions="cheapest",
            migrate="best-price",
            local_alloc_delay=0.1,
        ),
    )
    result = job.result(timeout=120)
    assert result["weights"] == jobfns.exact_dp_expected(steps)  # exactly once, as a calm run
    slot = {e["incarnation"]: e["slot"] for e in _by(job, "allocating")}
    region = {e["incarnation"]: e["region"] for e in _by(job, "allocated")}
    assert region == {1: "zone-a", 2: "zone-a", 3: "zone-b", 4: "zone-b"}
    assert sorted(slot.values()) == [0, 0, 1, 1]
    # one slot at a time: the second move is decided after the first one's old replica left
    first, second = _by(job, "moving")
    assert {first["incarnation"], second["incarnation"]} == {1, 2}
    assert (first["from_region"], first["to_region"]) == ("zone-a", "zone-b")
    assert first["slot"] == slot[first["incarnation"]] and first["to_incarnation"] == 3
    assert slot[3] == slot[first["incarnation"]] and slot[4] == slot[second["incarnation"]]
    assert first["saving"] > 0 and first["move_cost"] > 0
    (first_end,) = _by(job, "exited", first["incarnation"])
    assert first_end["reason"] == "moved" and first_end["t"] <= second["t"]
    (second_end,) = _by(job, "exited", second["incarnation"])
    assert second_end["reason"] == "moved"
    # the old replicas left like after a notice: no save, no preemption; the new ones healed
    # from a peer (no store restore); the survivor of the first move was never restarted
    assert not _by(job, "preempted") and not _by(job, "checkpoint_failed")
    assert not [c for c in _by(job, "checkpoint") if c["save_kind"] in ("move", "emergency")]
    assert not _by(job, "resumed")
    for n in (3, 4):
        quorums = _by(job, "quorum", n)
        assert quorums and quorums[0]["healed"], f"incarnation {n} did not heal from a peer"
    assert second["incarnation"] not in {e["incarnation"] for e in _by(job, "started") if e["t"] > first["t"]}
    # the quorum never shrank below two during the moves (two → three → two, twice)
    sizes = [q["replicas"] for q in _by(job, "quorum") if q["t"] >= first["t"]]
    assert min(sizes) >= 2 and max(sizes) == 3
    # no failed step anywhere: no replica logged the same step twice
    rows: dict[int, list[dict]] = defaultdict(list)
    for e in _by(job, "metrics"):
        rows[e["incarnation"]].extend(e["rows"])
    for n, logged in rows.items():
        counts = Counter(r["step"] for r in logged if "loss" in r)
        assert max(counts.values()) == 1, f"incarnation {n} redid a step: {counts.most_common(2)}"
    finals = {n: r["final"] for n, logged in rows.items() for r in logged if "final" in r}
    assert set(finals) == {3, 4} and len(set(finals.values())) == 1  # identical weights
    # money: both instances of a slot are billed while they overlap; still less than staying
    incs = job.state.incs
    assert incs[3].allocated < incs[first["incarnation"]].end
    b = job.breakdown()
    billed = sum((inc.end - inc.allocated) * inc.spot_price / 3600 for inc in incs.values())
    assert b.spot_cost == pytest.approx(billed, rel=1e-6)
    end = max(inc.end for inc in incs.values())
    staying = sum((end - incs[n].allocated) * 0.10 / 3600 for n in (1, 2))
    assert b.spot_cost < staying
    assert b.preemptions == 0
    # and the instance-seconds count both of a slot's instances while they overlap: every
    # instance's life (asked → end) is in the breakdown's total, side by side
    assert b.total >= sum(inc.end - inc.asked for inc in incs.values()) - 1e-6
    # shown: each move in the feed (which slot, the saving) and on its lane of the timeline
    line = event_line(first)
    assert line is not None and "zone-a to zone-b" in line and f"slot {first['slot']}" in line
    traces = dict(timeline_traces(job.state))
    marks = [text for text in traces["tl:move"]["text"] if "moves to zone-b" in text]
    assert len(marks) == 2


def test_a_move_without_capacity_in_the_new_zone_is_abandoned_and_the_replica_stays(
    tmp_path: Path,
) -> None:
    """The market has room for exactly the job's two instances (a node-count trace that never
    changes), so a move's extra instance is refused: the move is abandoned with a warning,
    both replicas train on in zone-a untouched, and the job ends exact."""
    trace = tmp_path / "full.csv"
    trace.write_text("0,2\n600000,2\n")  # Parcae's format: (time_ms, available nodes)
    steps = 150
    zones = {"zone-a": {"price": 0.10}, "zone-b": {"price": [[0, 0.30], ["4s", 0.02]]}}
    job = spot.train(
        functools.partial(paced_dp, steps=steps, first=2, slow=0.06),
        spot.Config(
            ship_modules=SHIP,
            instances=2,
            local_regions=zones,
            regions="cheapest",
            migrate="best-price",
            local_alloc_delay=0.1,
            local_trace=str(trace),
        ),
    )
    result = job.result(timeout=120)
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    moving = _by(job, "moving")
    assert moving and all(m["incarnation"] in (1, 2) for m in moving)
    refused = [e for e in _by(job, "alloc_failed") if e["region"] == "zone-b"]
    assert len(refused) == len(moving)  # each move's instance asked once, in zone-b only
    warnings = [w["message"] for w in _by(job, "warning") if "abandoned" in w.get("message", "")]
    assert len(warnings) == len(moving) and "it stays in zone-a" in warnings[0]
    assert [e["region"] for e in _by(job, "allocated")] == ["zone-a", "zone-a"]
    for n in (1, 2):
        (exited,) = _by(job, "exited", n)
        assert exited["reason"] == "done"
    assert not _by(job, "evacuated") and not _by(job, "preempted")


def _ranked(prices: dict[str, float], work_s: float) -> Any:
    markets = {zone: (float("inf"), 60.0) for zone in prices}  # calm zones, a minute to start
    return rank_zones(prices, markets, work_s=work_s, save_s=5.0)


def test_a_replica_moves_when_its_saving_pays_for_the_overlap_and_nothing_is_saved() -> None:
    """An hour of the group's work left, $1/h here and $0.5/h there, a minute to start, 2 s
    to leave: moving bills the old instance here for the start and the leave, and the new one
    there for the hour; the move's own cost is the new instance idle while it starts plus the
    leave (no save, unlike a single instance's move). 30 s left: the overlap costs more than
    it saves; a zone cheaper by less than MIN_GAIN: no move."""
    move = best_replica_move(_ranked({"here": 1.0, "there": 0.5}, 3600), "here", 2.0)
    assert move is not None and move.there.zone == "there" and move.replica
    assert move.saving == pytest.approx((3600 * 1.0 - 3600 * 0.5 - (60 + 2) * 1.0) / 3600)
    assert move.cost == pytest.approx((60 * 0.5 + 2 * 1.0) / 3600)
    assert "nothing is saved" in move.reason() and "slot" not in move.reason()
    single = best_move(_ranked({"here": 1.0, "there": 0.5}, 3600), "here", 5.0)
    assert single is not None and move.saving != single.saving
    # the state crossing from the peer's zone is part of the move
    priced = best_replica_move(_ranked({"here": 1.0, "there": 0.5}, 3600), "here", 2.0, 0.01, 30.0)
    assert priced is not None and priced.saving == pytest.approx(move.saving - 0.01 - 30 * 1.0 / 3600)
    assert best_replica_move(_ranked({"here": 1.0, "there": 0.5}, 30), "here", 2.0) is None
    slightly = 1.0 - MIN_GAIN / 2
    assert best_replica_move(_ranked({"here": 1.0, "there": slightly}, 3600), "here", 2.0) is None
    assert best_replica_move(_ranked({"here": 0.5, "there": 1.0}, 3600), "here", 2.0) is None


def test_the_gate_admits_the_next_replica_without_a_new_wait_while_the_gap_holds() -> None:
    """The replicas move one at a time between the same zones: once the gap has held for the
    payback, the next replica's move is admitted at the next look that still finds it; a look
    that finds no move starts the wait over, as for one instance."""
    move = best_replica_move(_ranked({"here": 1.0, "there": 0.5}, 3600), "here", 2.0)
    assert move is not None and move.payback_s > 0
    gate = MoveGate()
    assert gate.admit(move, 0.0, keep=True) is None  # the wait starts
    assert gate.admit(move, move.payback_s, keep=True) is move  # the first replica
    assert gate.admit(move, move.payback_s + 1, keep=True) is move  # the next, no new wait
    assert gate.admit(None, move.payback_s + 2, keep=True) is None  # the gap closed
    assert gate.admit(move, move.payback_s + 3, keep=True) is None  # a whole payback again
    single = MoveGate()  # one instance: every move waits its payback
    assert single.admit(move, 0.0) is None and single.admit(move, move.payback_s) is move
    assert single.admit(move, move.payback_s + 1) is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"instances": 2, "migrate": "best-price"}, "only one zone"),
        ({"instances": 2, "migrate": "best-price", "regions": ["a", "a"]}, "names 'a' twice"),
        ({"instances": 2, "migrate": "best-price", "regions": "cheapest"}, "local market has only one"),
    ],
)
def test_moves_of_several_instances_are_refused_where_they_cannot_work(
    fields: dict[str, Any], words: str
) -> None:
    with pytest.raises(spot.ConfigError, match=words):
        spot.Config(**fields)
