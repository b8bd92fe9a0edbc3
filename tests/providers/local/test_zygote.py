"""The local market forks its instances from a zygote that imported torch once
(`spotnb/runtime/zygote.py`): a forked instance is what a cold one is (its own session, the
controller sees its exit, preemptions and resumes as before), and a zygote that is gone or
stopped means cold starts, never a lost job, preemption or process. Nothing is mocked: real
processes, really killed. The job function's steps take microseconds, less than the market's
look at the beacon: the first instance holds at the scheduled step (`hold_at`) until killed."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
from pathlib import Path

import pytest

import spotnb as spot
from tests.support import jobfns

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


def _wait_for(path: Path, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)  # polling a file the instance writes, not waiting out a race
    return json.loads(path.read_text())


def _kills(job: spot.Job) -> list[int]:
    """The steps at which the market's kills landed, in the job's own record."""
    return [e["step"] for e in job.events if e["kind"] == "preempted"]


def test_a_replacement_is_forked_from_the_market_s_zygote(tmp_path: Path) -> None:
    """Killed at step 20, the job resumes on a second instance forked by the same zygote as the
    first; each instance leads its own session (the market kills the group) and draws from
    numpy's global generator as a fresh process does, not as a copy of its sibling."""
    fn = functools.partial(jobfns.who_started_me, steps=40, out=str(tmp_path), hold_at=20)
    job = spot.train(fn, spot.Config(local_schedule=[{"step": 20}], ship_modules=SHIP))
    assert job.result(timeout=180) == 40
    assert job.breakdown().preemptions == 1
    assert _kills(job) == [20]
    first, second = (json.loads((tmp_path / f"{n}.json").read_text()) for n in (1, 2))
    assert "spotnb.runtime.zygote" in first["parent"], first["parent"]
    assert first["ppid"] == second["ppid"]
    assert first["sid"] == first["pid"] and second["sid"] == second["pid"]
    assert first["draw"] != second["draw"]


def test_a_dead_zygote_means_a_cold_start_and_the_job_goes_on(tmp_path: Path) -> None:
    """The zygote is SIGKILLed while its instance trains: that instance is still preempted on
    schedule and seen to end, and its replacement starts as a process of its own."""
    go = tmp_path / "go"
    fn = functools.partial(jobfns.who_started_me, steps=40, out=str(tmp_path), wait_for=str(go), hold_at=20)
    job = spot.train(fn, spot.Config(local_schedule=[{"step": 20}], ship_modules=SHIP))
    first = _wait_for(tmp_path / "1.json")
    assert "spotnb.runtime.zygote" in first["parent"], first["parent"]
    os.kill(first["ppid"], signal.SIGKILL)
    go.touch()
    assert job.result(timeout=180) == 40
    assert job.breakdown().preemptions == 1
    assert _kills(job) == [20]
    second = json.loads((tmp_path / "2.json").read_text())
    assert "spotnb.runtime.zygote" not in second["parent"], second["parent"]
    assert second["ppid"] != first["ppid"]
    _assert_none_left(job.id)


def test_the_zygote_can_be_turned_off(tmp_path: Path, monkeypatch) -> None:
    """SPOTNB_LOCAL_ZYGOTE=0 (the controller inherits it): every instance starts cold."""
    monkeypatch.setenv("SPOTNB_LOCAL_ZYGOTE", "0")
    fn = functools.partial(jobfns.who_started_me, steps=5, out=str(tmp_path))
    job = spot.train(fn, spot.Config(ship_modules=SHIP))
    assert job.result(timeout=180) == 5
    first = json.loads((tmp_path / "1.json").read_text())
    assert "spotnb.runtime.zygote" not in first["parent"], first["parent"]


def _job_processes(job_id: str) -> list[str]:
    """Live processes whose command line names the job (its controller, zygote, instances):
    once the job has ended and its controller exited, none."""
    found = []
    for name in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if name.isdigit() and job_id.encode() in cmd and state not in (b"Z", b"X"):
            found.append(name + ": " + cmd.replace(b"\0", b" ").decode(errors="replace"))
    return found


def _assert_none_left(job_id: str) -> None:
    deadline = time.monotonic() + 60
    while (left := _job_processes(job_id)) and time.monotonic() < deadline:
        time.sleep(0.05)  # the controller closes its market after the job's end
    assert not left, left


def test_a_stopped_zygote_costs_no_preemption_and_no_process(tmp_path: Path) -> None:
    """The zygote is SIGSTOPped while its instance trains: that instance's kill at step 20 is
    seen at once (its end read from /proc, its stopped parent cannot report it), its replacement
    starts cold instead of waiting on the zygote forever, and when the job ends no process of
    it is left (the stopped zygote was ended)."""
    go = tmp_path / "go"
    fn = functools.partial(jobfns.who_started_me, steps=40, out=str(tmp_path), wait_for=str(go), hold_at=20)
    job = spot.train(fn, spot.Config(local_schedule=[{"step": 20}], ship_modules=SHIP))
    first = _wait_for(tmp_path / "1.json")
    os.kill(first["ppid"], signal.SIGSTOP)
    go.touch()
    try:
        assert job.result(timeout=120) == 40
    finally:
        with contextlib.suppress(ProcessLookupError):  # a failed run must not leave it stopped
            os.kill(first["ppid"], signal.SIGCONT)
    assert job.breakdown().preemptions == 1
    assert _kills(job) == [20]
    second = json.loads((tmp_path / "2.json").read_text())
    assert "spotnb.runtime.zygote" not in second["parent"], second["parent"]
    _assert_none_left(job.id)
