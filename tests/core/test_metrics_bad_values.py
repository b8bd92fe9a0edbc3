"""What the hostile run found in metrics and the ledger (issue 14, items 3 and 6), on the real
local market: values JSON cannot carry, reserved names, corrupt logs, rows lost at a kill
right after a commit, and a compute/recompute split that must be exact.

Each test failed on the code before its fix."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.core.ledger import CATEGORIES
from tests.support import jobfns

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns", __name__]


def odd_values(ctx: Any, steps: int = 30) -> int:
    """Logs every kind of value a training loop produces, the awkward ones included."""
    import torch

    for step in ctx.steps(steps):
        ctx.log(
            loss=1.0 / (step + 1),
            huge=10**400,
            nan=float("nan"),
            inf=float("-inf"),
            vec=torch.ones(3),
            scalar=torch.tensor(2.5),
            big_int=2**60,
            label="warmup",
        )
    return ctx.step_index


def logs_a_reserved_name(ctx: Any) -> None:
    for step in ctx.steps(10):
        ctx.log(step=step * 100)  # would silently replace the row's step


def strict_json(line: str) -> Any:
    """Parse as JavaScript's JSON.parse would: NaN and Infinity are not JSON."""

    def reject(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=reject)


def _event_lines(job: spot.Job) -> list[str]:
    folder = Path(job.store.job(job.id, "events"))
    return [
        line for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines() if line.strip()
    ]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spotnb.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_values_json_cannot_carry_reach_no_reader_as_an_error() -> None:
    job = spot.train(odd_values, spot.Config(ship_modules=SHIP))
    assert job.result(timeout=120) == 30  # the follower did not die: result() returned
    for line in _event_lines(job):  # every line is JSON a browser can parse
        strict_json(line)
    m = job.metrics
    assert [s for s, _ in m["loss"]] == list(range(30))
    assert m["scalar"][0] == (0, 2.5) and m["big_int"][0] == (0, float(2**60))
    assert "huge" not in m and "nan" not in m and "inf" not in m and "vec" not in m
    warned = {e.get("metric"): e for e in job.events if e["kind"] == "warning" and e.get("metric")}
    assert set(warned) == {"huge", "nan", "inf", "vec"}  # one warning per metric ...
    assert all(e["step"] == 0 for e in warned.values())  # ... naming where it started
    assert "nan" in warned["nan"]["message"] and "step 0" in warned["nan"]["message"]
    # every reader: CLI show and logs from a fresh process, the REST API's view
    for args in (("show", job.id), ("logs", job.id)):
        out = _cli(*args)
        assert out.returncode == 0, out.stderr
    from spotnb.views.server.data import JobViews

    detail = JobViews().detail(job.id)
    assert detail is not None and detail["status"] == "succeeded"
    json.dumps(detail, allow_nan=False)


def test_a_metric_named_like_a_row_key_is_refused_with_the_fix() -> None:
    job = spot.train(logs_a_reserved_name, spot.Config(ship_modules=SHIP))
    with pytest.raises(spot.JobFailed) as info:
        job.result(timeout=120)
    message = str(info.value)
    assert "'step'" in message and "my_step" in message


def test_readers_survive_a_corrupt_or_foreign_event_log() -> None:
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=20, step_time=0.0), spot.Config(ship_modules=SHIP)
    )
    assert job.result(timeout=120) == 20
    garbage = [
        "{not json",
        "[1, 2, 3]",
        '"a string"',
        '{"t": 1}',
        '{"kind": "metrics", "t": "yesterday", "incarnation": "one", "rows": "oops"}',
        '{"kind": "metrics", "t": 1e400, "incarnation": 1, "rows": [{"step": "abc", "x": 1}, 7]}',
        '{"kind": "status", "t": 2, "incarnation": 0, "status": 5}',
        '{"kind": "progress", "t": 3, "incarnation": 1, "step": "far", "compute_s": "lots"}',
        '{"kind": "allocated", "t": 4, "incarnation": 1, "spot_price": "cheap"}',
        '{"kind": "from_a_newer_spotnb", "t": 5, "incarnation": 0, "payload": {"a": [1]}}',
    ]
    bad = Path(job.store.job(job.id, "events", "0000-zzz-00000.jsonl"))
    bad.write_text("\n".join(garbage) + "\n")
    again = spot.attach(job.id)
    assert again.wait(60) and again.status == "succeeded" and again.result() == 20
    b = again.breakdown()
    assert sum(getattr(b, c) for c in CATEGORIES) == pytest.approx(b.total, rel=1e-6)
    assert [s for s, _ in again.metrics["step_value"]] == list(range(20))
    from spotnb.views.server.data import JobViews

    assert JobViews().detail(job.id)["status"] == "succeeded"
    from spotnb.core.state import JobState

    state = JobState()
    state.feed_events(again.events)
    assert state.status == "succeeded"
    assert _cli("show", job.id).returncode == 0


def test_rows_of_committed_steps_survive_kills_right_after_commits() -> None:
    """Kill between each commit and the news of it, three times: every step's row exists."""
    schedule = [
        {"step": 15, "phase": "commit"},
        {"step": 45, "phase": "commit"},
        {"step": 75, "phase": "commit"},
    ]
    fn = functools.partial(jobfns.slow_steps, steps=100, step_time=0.005)
    job = spot.train(
        fn,
        spot.Config(
            ship_modules=SHIP, checkpoint="static:10", local_schedule=schedule, local_alloc_delay=0.05
        ),
    )
    assert job.result(timeout=240) == 100
    kills = [e for e in job.events if e["kind"] == "preempted"]
    assert len(kills) == 3 and {e["phase"] for e in kills} == {"commit"}
    logged = {s for s, _ in job.metrics["step_value"]}
    assert logged == set(range(100)), f"holes at {sorted(set(range(100)) - logged)}"
    for e in job.events:  # the resume points are committed checkpoints
        if e["kind"] == "resumed":
            assert set(range(e["from_step"])) <= logged


def test_compute_and_recompute_are_exact_across_kills() -> None:
    """Steps that sleep a known time: compute covers each step once, recompute each redo."""
    step_time = 0.01
    schedule = [
        {"step": 35, "phase": "commit"},
        {"step": 58, "phase": "step"},
        {"step": 90, "phase": "upload"},
    ]
    fn = functools.partial(jobfns.slow_steps, steps=120, step_time=step_time)
    job = spot.train(
        fn,
        spot.Config(
            ship_modules=SHIP,
            checkpoint="static:10",
            local_schedule=schedule,
            local_upload_bps=2e5,
            local_alloc_delay=0.05,
        ),
    )
    assert job.result(timeout=240) == 120
    b = job.breakdown()
    assert sum(getattr(b, c) for c in CATEGORIES) == pytest.approx(b.total, rel=1e-6)
    assert b.compute >= 120 * step_time
    redone = len(job.metrics["step_value"]) - 120
    assert redone > 0 and b.recompute >= redone * step_time


def deletes_its_checkpoints(ctx: Any, store_root: str) -> int:
    """Incarnation 1 deletes every checkpoint at step 35 (a bucket lifecycle rule, a user's
    cleanup), then is killed at step 38, where it holds until the kill (its steps are too short
    for the market to be sure to see step 38 on a loaded machine): its successor has nothing
    to restore."""
    import torch

    ctx.track(model=torch.nn.Linear(2, 2))
    for step in ctx.steps(60):
        if ctx.incarnation == 1 and step == 35:
            shutil.rmtree(os.path.join(store_root, "jobs", ctx.job_id, "ckpt"))
        time.sleep(0.002)
        if ctx.incarnation == 1 and step == 38:
            jobfns.hold_for_the_market(ctx)
    return ctx.step_index


def test_a_restart_from_zero_after_every_checkpoint_vanished_is_said(tmp_path: Path) -> None:
    store = tmp_path / "store"
    fn = functools.partial(deletes_its_checkpoints, store_root=str(store))
    job = spot.train(
        fn,
        spot.Config(
            ship_modules=SHIP,
            store=store.as_uri(),
            checkpoint="static:10",
            local_schedule=[{"step": 38, "phase": "step"}],
        ),
    )
    assert job.result(timeout=120) == 60
    assert [e["step"] for e in job.events if e["kind"] == "preempted"] == [38]
    warnings = [e for e in job.events if e["kind"] == "warning" and e.get("restart_from_zero")]
    assert len(warnings) == 1 and warnings[0]["incarnation"] == 2
    assert warnings[0]["high_water"] >= 30 and "step 0" in warnings[0]["message"]
    from spotnb.views.widget.text import event_line

    assert "step 0" in (event_line(warnings[0]) or "")  # the feed shows it


def killed_in_its_first_restore(ctx: Any, armed: str, store_root: str) -> int:
    """Incarnation 1 waits at step 24 for its checkpoint of step 20, then holds at step 25 for
    the market's kill; incarnation 2 arms the tracked gate before its restore, which then holds
    in the restore phase until the second kill; incarnation 3 disarms it."""
    import torch

    if ctx.incarnation == 2:
        Path(armed).touch()
    else:
        Path(armed).unlink(missing_ok=True)
    ctx.track(model=torch.nn.Linear(8, 8), gate=jobfns.HoldInRestore(armed))
    for step in ctx.steps(40):
        if step == 24 and ctx.incarnation == 1:
            jobfns.wait_for_checkpoint(ctx, store_root, 20)
        if step == 25 and ctx.incarnation == 1:
            jobfns.hold_for_the_market(ctx)
    return ctx.step_index


def test_a_kill_can_land_during_a_restore(tmp_path: Path) -> None:
    schedule = [{"step": 25, "phase": "step"}, {"step": 0, "phase": "restore"}]
    store = tmp_path / "store"
    fn = functools.partial(killed_in_its_first_restore, armed=str(tmp_path / "armed"), store_root=str(store))
    config = spot.Config(
        ship_modules=SHIP, store=store.as_uri(), checkpoint="static:10", local_schedule=schedule
    )
    job = spot.train(fn, config)
    assert job.result(timeout=120) == 40
    kills = [(e["step"], e["phase"]) for e in job.events if e["kind"] == "preempted"]
    assert kills[0][0] == 25 and [k[1] for k in kills] == ["idle", "restore"]
    # the third incarnation restores what the killed restore was loading
    assert [e["from_step"] for e in job.events if e["kind"] == "resumed"] == [20]


def test_a_failing_pre_commit_flush_aborts_the_commit(tmp_path: Path) -> None:
    """The checkpoint worker makes the logged rows durable before it writes the manifest;
    when that fails, the checkpoint is not committed (and the previous one stays)."""
    import torch

    from spotnb.core.store import Store
    from spotnb.runtime.checkpoint.checkpointer import Checkpointer

    store = Store(tmp_path.as_uri())
    events: list[tuple[str, dict]] = []
    seen: list[tuple[int, bool]] = []
    fail = {"now": False}

    def before_commit(step: int) -> None:
        manifests = list(tmp_path.glob("jobs/j/ckpt/*/MANIFEST.json"))
        seen.append((step, len(manifests)))
        if fail["now"]:
            raise OSError("store full")

    ck = Checkpointer(
        store, "j", 1, lambda e: events.append((e.kind, e.to_json())), before_commit=before_commit
    )
    state = {"w": torch.ones(4)}
    ck.save_now(ck.snapshot(state, 10, "periodic"))
    fail["now"] = True
    ck.submit(ck.snapshot(state, 20, "periodic"))
    assert ck.wait(30)
    ck.close()
    assert seen == [(10, 0), (20, 1)]  # called before each manifest existed
    assert [k for k, _ in events] == ["checkpoint", "checkpoint_failed"]
    assert [m.step for m in ck.list_manifests()] == [10]
