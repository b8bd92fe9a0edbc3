"""The local market forks its instances from a zygote that imported torch once
(`spotnb/runtime/zygote.py`): a forked instance is what a cold one is (its own session, the
controller sees its exit, preemptions and resumes as before), and a zygote that is gone means
cold starts, never a lost job. Nothing is mocked: real processes, really killed."""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from pathlib import Path

import spotnb as spot
from tests.core import jobfns

SHIP = ["tests.core.jobfns"]


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


def test_the_zygote_can_be_turned_off(tmp_path: Path, monkeypatch) -> None:
    """SPOTNB_LOCAL_ZYGOTE=0 (the controller inherits it): every instance starts cold."""
    monkeypatch.setenv("SPOTNB_LOCAL_ZYGOTE", "0")
    fn = functools.partial(jobfns.who_started_me, steps=5, out=str(tmp_path))
    job = spot.train(fn, spot.Config(ship_modules=SHIP))
    assert job.result(timeout=180) == 5
    first = json.loads((tmp_path / "1.json").read_text())
    assert "spotnb.runtime.zygote" not in first["parent"], first["parent"]
