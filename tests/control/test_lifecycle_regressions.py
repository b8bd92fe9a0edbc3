"""Findings of the adversarial run against the merged issue-14 fixes. Each test fails on the
code it was written against; a fix makes it pass. Real processes where a job is involved."""

from __future__ import annotations

import pytest

import spotnb as spot
from spotnb.errors import ConfigError

pytestmark = pytest.mark.jobs


@pytest.mark.parametrize(
    "name",
    ["a\x85b", "job\x9b2J", "a\u2028b", "a\u202eb"],
    ids=["C1-NEL", "C1-CSI", "line-separator", "bidi-override"],
)
def test_a_name_with_non_ascii_control_or_format_characters_is_refused(name: str) -> None:
    """Config._name refuses only C0 controls and DEL: C1 controls (U+0080-U+009F, e.g. the 8-bit
    CSI U+009B a terminal treats as an escape), line separators and bidi overrides reach
    `spotnb jobs`, logs and cloud tags unchanged."""
    with pytest.raises(ConfigError, match="name"):
        spot.Config(name=name)


def test_a_schedule_step_of_true_is_refused() -> None:
    """`{'step': True}` passes the "non-negative int" check (bool is an int) while 3.0 and '3'
    are refused; a bool is a typo, not step 1."""
    with pytest.raises(ConfigError, match="local_schedule"):
        spot.Config(local_schedule=[{"step": True}])


def test_max_stalled_relaunches_of_true_is_refused() -> None:
    """`max_stalled_relaunches=True` is silently taken as 1 (stop after the first stalled
    instance) where every other wrong type is refused."""
    with pytest.raises(ConfigError, match="max_stalled_relaunches"):
        spot.Config(max_stalled_relaunches=True)


def test_a_job_directory_deleted_under_a_live_job_is_not_a_success_nobody_can_attach_to(monkeypatch) -> None:
    """rmtree of the job directory while the controller and agent run: their writes recreate
    the directory (events/, ckpt/, result.pkl) without spec.json, the job ends `succeeded` in
    the job DB, and then `spot.attach(id)` raises "has no spec". Either the job is `lost`
    (issue 14: a vanished job directory is terminal `lost`) or it can still be attached."""
    import functools
    import shutil
    import time

    from tests.support import jobfns

    monkeypatch.setenv("SPOTNB_LEASE_TTL", "3")
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=1500, step_time=0.02),
        spot.Config(ship_modules=["tests.support.jobfns"], checkpoint="static:20"),
    )
    try:
        deadline = time.time() + 120
        while not any(e["kind"] == "progress" and e["step"] >= 30 for e in job.events):
            assert time.time() < deadline, "job never reached step 30"
            time.sleep(0.1)
        shutil.rmtree(job.store.job(job.id))
        assert job.wait(240), "job never ended after its directory was deleted"
        row = next(r for r in spot.jobs() if r["id"] == job.id)
        if row["status"] != "lost":  # another notebook attaches (a fresh process, no cache)
            import subprocess
            import sys

            code = f"import spotnb as spot; print(spot.attach({job.id!r}).result(timeout=30))"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            assert out.returncode == 0 and out.stdout.strip() == "1500", (row["status"], out.stderr[-600:])
    finally:
        if not job.done:
            job.stop()


def test_no_alarm_about_vanished_checkpoints_when_none_was_ever_committed() -> None:
    """Seen under load (8 jobs, local_mttp=6s): an instance killed before its first checkpoint
    makes the next one warn "every checkpoint is missing or failed verification, so training
    restarts from step 0" although no checkpoint ever existed: the warning is meant for lost
    checkpoints (issue 14), and a false one teaches users to ignore it."""
    import functools

    from tests.support import jobfns

    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=40, step_time=0.05, hold_at=30),  # until the kill
        spot.Config(
            ship_modules=["tests.support.jobfns"],
            checkpoint="periodic:1000",
            local_schedule=[{"step": 30, "phase": "step", "notice": False}],
        ),
    )
    try:
        assert job.result(timeout=240) == 40
        assert any(e["kind"] == "allocated" and e["incarnation"] == 2 for e in job.events)
        assert [e["step"] for e in job.events if e["kind"] == "preempted"] == [30]
        assert not any(e["kind"] == "checkpoint" and e.get("incarnation") == 1 for e in job.events)
        alarms = [e["message"] for e in job.events if e.get("restart_from_zero")]
        assert not alarms, alarms
    finally:
        if not job.done:
            job.stop()
