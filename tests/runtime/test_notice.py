"""Preemption notices in each cloud's format, served by the local market's metadata emulator
and read by the agent's real watchers (no part of spotnb is mocked)."""

from __future__ import annotations

import functools

import pytest

import spotnb as spot
from tests.support import jobfns

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


def _by(job: spot.Job, kind: str, incarnation: int | None = None) -> list[dict]:
    return [
        e
        for e in job.events
        if e["kind"] == kind and (incarnation is None or e["incarnation"] == incarnation)
    ]


@pytest.mark.parametrize("fmt", ["aws", "azure", "gcp"])
def test_emergency_save_commits_before_the_kill(fmt: str) -> None:
    fn = functools.partial(jobfns.slow_steps, steps=150, step_time=0.02)
    config = spot.Config(
        local_notice_format=fmt,
        local_grace=3.0,
        notice_poll=0.1,
        local_schedule=[{"step": 40, "notice": True}],
        save_every=1000,
        ship_modules=SHIP,
    )
    job = spot.train(fn, config)
    assert job.result(timeout=120) == 150
    notice = _by(job, "notice", 1)
    assert notice and notice[0]["source"] == fmt
    saves = _by(job, "checkpoint", 1)
    assert [e["save_kind"] for e in saves] == ["emergency"]
    assert saves[0]["t"] < notice[0]["deadline"]  # committed before the announced kill
    (preempted,) = _by(job, "preempted", 1)
    assert preempted["how"] == "evacuated"
    (resumed,) = _by(job, "resumed", 2)
    assert resumed["save_kind"] == "emergency" and resumed["from_step"] == saves[0]["step"] > 0
    assert job.breakdown().recompute < 0.5  # nothing was lost but the unreported tail


def test_no_emergency_save_when_the_grace_is_too_short() -> None:
    """The decision not to attempt a save that cannot finish does not depend on the cloud's
    notice format (each format's watcher is covered by test_emergency_save_commits_before_the_kill
    and tests/runtime/test_notice_protocols.py), so one format runs here: GCP's, whose real grace
    (30 s) is the shortest."""
    fmt = "gcp"
    fn = functools.partial(jobfns.seeded_mlp, steps=160, step_delay=0.05)
    # a ~3.4 MB state uploaded at 2 MB/s cannot fit in a 1 s notice; the notice comes after
    # the first periodic save has measured that (before it, the agent can only estimate)
    config = spot.Config(
        local_notice_format=fmt,
        local_grace=1.0,
        notice_poll=0.1,
        local_schedule=[{"step": 100, "notice": True}],
        checkpoint="static:30",
        local_upload_bps=2e6,
        ship_modules=SHIP,
    )
    job = spot.train(fn, config)
    job.result(timeout=180)
    assert not [e for e in _by(job, "checkpoint", 1) if e["save_kind"] == "emergency"]
    assert _by(job, "checkpoint", 1)[0]["t"] < _by(job, "notice", 1)[0]["t"]
    (skipped,) = _by(job, "emergency_skipped", 1)
    assert skipped["needed"] > skipped["time_left"]
    (preempted,) = _by(job, "preempted", 1)
    assert preempted["how"] == "preempted"
    resumed = _by(job, "resumed", 2)
    reported = max(e["step"] for e in _by(job, "progress", 1))
    if resumed:
        assert resumed[0]["save_kind"] == "periodic"
        assert resumed[0]["from_step"] < reported
    assert job.breakdown().recompute > 0  # the lost steps were redone and counted


def test_sigterm_counts_as_a_notice_and_the_job_evacuates() -> None:
    """A soft shutdown (GCP's ACPI soft-off; `kill -TERM` of the agent) is a notice: the agent
    writes a `notice` event with source "sigterm" and evacuates with an emergency save."""
    import os
    import signal

    from tests.support.jobs import wait_progress

    fn = functools.partial(jobfns.slow_steps, steps=400, step_time=0.02)
    config = spot.Config(local_grace=20.0, save_every=10_000, ship_modules=SHIP)
    job = spot.train(fn, config)
    wait_progress(job, 20)
    (launched,) = _by(job, "launched", 1)
    os.kill(int(launched["info"]["pid"]), signal.SIGTERM)
    assert job.result(timeout=120) == 400
    (notice,) = _by(job, "notice", 1)
    assert notice["source"] == "sigterm"
    assert [e["save_kind"] for e in _by(job, "checkpoint", 1)] == ["emergency"]
    (preempted,) = _by(job, "preempted", 1)
    assert preempted["how"] == "evacuated"
