"""Hostile runs of the job lifecycle (issue 14, part H1): paused controllers, leftover temp
files, ambiguous ids and who may read the files. Real processes and real signals on the
local spot market; every wait is on a condition with a generous deadline."""

from __future__ import annotations

import functools
import os
import signal
import stat
import time
from pathlib import Path

import pytest

import spotnb as spot
from spotnb.cli import main as cli
from spotnb.control.jobdb import JobDB
from spotnb.errors import SpotnbError
from spotnb.views.server.data import JobViews
from tests.support import jobfns
from tests.support.jobs import (
    Until,
    assert_matches_reference,
    mounted_tmpfs,
    running_job_in_store,
    wait_for,
    wait_progress,
)

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


# -- ids ------------------------------------------------------------------------------------
def test_an_ambiguous_prefix_is_an_error_listing_the_matches(capsys) -> None:
    db = JobDB()
    for job_id in ("20260101-aaa", "20260101-aab", "a_c", "xbc"):
        db.add_job(
            job_id, name=None, provider="local", region=None, instance_type="cpu", store="file:///nonexistent"
        )
    with pytest.raises(SpotnbError, match="ambiguous") as err:
        db.job("2026")
    assert "20260101-aaa" in str(err.value) and "20260101-aab" in str(err.value)
    assert db.job("20260101-aab")["id"] == "20260101-aab"  # a full id is never ambiguous
    assert db.job("x_c") is None and db.job("x%") is None  # no LIKE wildcards
    assert db.job("a_")["id"] == "a_c"
    # the CLI says so (exit 2, no traceback), and so does the REST API's data layer
    assert cli(["show", "2026"]) == 2
    assert "20260101-aaa" in capsys.readouterr().err
    with pytest.raises(SpotnbError, match="ambiguous"):
        JobViews(db).detail("2026")
    with pytest.raises(SpotnbError, match="ambiguous"):
        spot.attach("2026")


# -- owner-only files -------------------------------------------------------------------------
def test_home_store_and_db_are_owner_only(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "fresh" / "home"  # created by spotnb, not by the test
    monkeypatch.setenv("SPOTNB_HOME", str(home))
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=30, step_time=0.001),
        spot.Config(ship_modules=SHIP, checkpoint="static:10"),
    )
    assert job.result(timeout=120) == 30
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    seen = {"dirs": 0, "files": 0}
    for root, dirs, files in os.walk(home / "store"):
        for d in dirs:
            mode = stat.S_IMODE(os.stat(os.path.join(root, d)).st_mode)
            assert mode & 0o077 == 0, f"{os.path.join(root, d)} is {oct(mode)}"
            seen["dirs"] += 1
        for f in files:
            mode = stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode)
            assert mode & 0o077 == 0, f"{os.path.join(root, f)} is {oct(mode)}"
            seen["files"] += 1
    names = {f for _, _, files in os.walk(home / "store") for f in files}
    assert {"fn.pkl", "spec.json", "MANIFEST.json", "state.pt", "result.pkl"} <= names, names
    for f in home.iterdir():
        if f.name.startswith("jobs.db"):
            assert stat.S_IMODE(os.stat(f).st_mode) & 0o077 == 0, f


# -- leftover temp files ----------------------------------------------------------------------
def test_a_leftover_temp_file_does_not_wedge_the_job(monkeypatch) -> None:
    monkeypatch.setenv("SPOTNB_LEASE_TTL", "2")
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=300, step_time=0.02),
        spot.Config(ship_modules=SHIP, checkpoint="static:20"),
    )
    wait_progress(job, 20)
    db = JobDB()
    os.kill(db.lease(job.id)["pid"], signal.SIGKILL)
    # what an interrupted write of the controller's next segment leaves behind
    events = Path(job.store.job(job.id, "events"))
    old = events / "0000-ctl-00000.jsonl.tmp-0badf00d"
    old.write_bytes(b'{"t": 1, "kind": "sta')
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    fresh = events / "0001-ctl-00000.jsonl.tmp-0f00dbad"  # as a live writer's would be
    fresh.write_bytes(b"")
    wait_for(lambda: not db.controller_alive(job.id), 60, "the killed controller's lease never ran out")
    again = spot.attach(job.id)  # starts a new controller, which must not crash
    assert again.result(timeout=180) == 300
    assert not [e for e in again.events if e["kind"] == "error"]
    assert not old.exists(), "a stale temp file was left in the store"
    assert fresh.exists(), "a live writer's temp file was removed"


# -- split-brain controllers --------------------------------------------------------------------
def test_a_paused_controller_does_not_fail_the_job_its_successor_drives(reference, monkeypatch) -> None:
    """SIGSTOP the controller past its lease (a suspended laptop), let `jobs()` start a second
    one, SIGCONT the first: the job still ends bit-exact, and nothing the first one may still
    have said (an exit, an error, `failed`) reaches the job's history."""
    monkeypatch.setenv("SPOTNB_LEASE_TTL", "2")
    job = spot.train(
        functools.partial(jobfns.seeded_mlp, step_delay=0.1),
        spot.Config(checkpoint="static:20", ship_modules=SHIP),
    )
    wait_progress(job, 25)
    db = JobDB()
    first = db.lease(job.id)
    os.kill(first["pid"], signal.SIGSTOP)
    try:
        wait_for(lambda: not db.controller_alive(job.id), 60, "the paused controller's lease never ran out")
        spot.jobs()  # notices the stale lease and starts a second controller
        wait_for(
            lambda: (db.lease(job.id) or {}).get("owner") not in (None, first["owner"]),
            60,
            "no second controller took the job",
        )
        restarted = Until(lambda e: e["kind"] == "controller_restarted")
        job.add_sink(restarted)
        assert restarted.hit.wait(60), "the second controller never announced itself"
    finally:
        os.kill(first["pid"], signal.SIGCONT)
    # the first one wakes up while the second drives the job; it must notice and keep quiet
    assert_matches_reference(job, reference)
    kinds = [(e["kind"], e.get("status") or e.get("reason")) for e in job.events]
    assert ("status", "failed") not in kinds and ("exited", "crashed") not in kinds, kinds
    assert not [e for e in job.events if e["kind"] == "error"]
    # and a fresh reader of the log (a new kernel's attach) sees the same clean history
    again = spot.Job(job.id, job.store)
    again.follow()
    assert again.wait(60) and again.status == "succeeded"
    assert [e for e in again.events if e["kind"] == "status"][-1]["status"] == "succeeded"


# -- giving up clearly ------------------------------------------------------------------------------
def test_max_wait_gives_up_naming_the_wait_and_the_regions() -> None:
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=10, step_time=0.001),
        spot.Config(ship_modules=SHIP, local_capacity_failure=0.99, max_wait="3s", local_seed=1),
    )
    with pytest.raises(spot.JobStopped, match=r"max_wait=3s reached.*regions tried: local"):
        job.result(timeout=120)
    assert job.status == "stopped"
    assert not [e for e in job.events if e["kind"] == "allocated"]


def test_relaunches_without_net_progress_are_reported_then_stopped() -> None:
    kill_early = [{"step": 3, "phase": "step"}] * 8  # every instance dies before its first save
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=400, step_time=0.01),
        spot.Config(
            ship_modules=SHIP, checkpoint="static:100", local_schedule=kill_early, max_stalled_relaunches=4
        ),
    )
    with pytest.raises(spot.JobStopped, match=r"no net progress.*max_stalled_relaunches=4"):
        job.result(timeout=240)
    warnings = [e for e in job.events if e["kind"] == "warning" and "no net progress" in e["message"]]
    assert warnings and warnings[0]["stalled"] == 3
    assert len([e for e in job.events if e["kind"] == "allocated"]) == 4


# -- a vanished store ---------------------------------------------------------------------------
def test_a_job_whose_directory_vanished_is_lost_not_running(monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPOTNB_LEASE_TTL", "2")
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=2000, step_time=0.02),
        spot.Config(ship_modules=SHIP, checkpoint="static:20"),
    )
    wait_progress(job, 10)
    db = JobDB()
    agent = next(e for e in job.events if e["kind"] == "allocated")["info"]["pid"]
    killed = db.lease(job.id)["pid"]
    os.kill(killed, signal.SIGKILL)
    os.kill(agent, signal.SIGKILL)  # nothing writes to the store any more
    wait_for(lambda: not db.controller_alive(job.id), 60, "the killed controller's lease never ran out")
    import shutil

    shutil.rmtree(job.store.job(job.id))
    log = Path(os.environ["SPOTNB_HOME"]) / "logs" / job.id / "controller.log"
    size = log.stat().st_size
    rows = {r["id"]: r for r in spot.jobs()}
    assert rows[job.id]["status"] == "lost" and "no longer exists" in rows[job.id]["status_reason"]
    assert db.job(job.id)["status"] == "lost"  # remembered: the next call spawns nothing
    spot.jobs()
    assert db.lease(job.id)["pid"] == killed and log.stat().st_size == size, "a controller was spawned"
    again = spot.attach(job.id)
    assert again.status == "lost" and again.done
    with pytest.raises(spot.JobFailed, match="lost"):
        again.result(timeout=5)
    assert job.wait(60) and job.status == "lost"  # the original handle learns it too
    assert cli(["stop", job.id]) == 0
    assert "lost" in capsys.readouterr().out
    detail = JobViews(db).detail(job.id)
    assert detail["job"]["status"] == detail["status"] == "lost" and detail["status_reason"]


# -- a store full for a few seconds -------------------------------------------------------------
def test_a_store_full_for_a_few_seconds_does_not_end_the_job(monkeypatch) -> None:
    """The controller's event writes fail with ENOSPC for 3 s around a preemption (the store's
    disk full while the agent's checkpoint took the space): it keeps the events and retries."""
    import errno

    from spotnb.core.store import Store

    full_until = [0.0]
    real = Store.write_bytes

    def write_bytes(self, path: str, data: bytes) -> None:
        if "-ctl-" in path and time.time() < full_until[0]:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real(self, path, data)

    monkeypatch.setattr(Store, "write_bytes", write_bytes)
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=120, step_time=0.02),
        spot.Config(
            ship_modules=SHIP, checkpoint="static:20", local_schedule=[{"step": 40, "phase": "step"}]
        ),
        detach=False,
    )  # the controller runs in this process
    wait_progress(job, 35)
    full_until[0] = time.time() + 3.0  # the kill at step 40 lands in the window
    assert job.result(timeout=180) == 120
    assert job.breakdown().preemptions == 1
    kinds = [e["kind"] for e in job.events]
    assert "error" not in kinds and kinds.count("preempted") == 1


def test_spotnb_stop_ends_a_job_whose_controller_cannot_run(capsys, monkeypatch) -> None:
    """A job whose controller crashes at every start (here: a process that exits at once in
    its place, as a broken environment would; a bad spec no longer crashes it, it fails the
    job) still stops: `spotnb stop` records it and exits 0 with `stopped`."""
    import subprocess
    import sys

    import spotnb.control.supervise

    def crashing_controller(job_id: str, store_url: str) -> int:
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"]).pid

    monkeypatch.setattr(spotnb.control.supervise, "start_controller", crashing_controller)
    job_id = "job-no-controller"
    store, db, _ = running_job_in_store(job_id)
    store.write_bytes(store.job(job_id, "spec.json"), b"{}")
    assert cli(["stop", job_id, "--timeout", "5"]) == 0
    assert f"job {job_id}: stopped" in capsys.readouterr().out
    assert db.job(job_id)["status"] == "stopped"
    again = spot.Job(job_id, store)
    again.follow()
    assert again.wait(30) and again.status == "stopped"
    with pytest.raises(spot.JobStopped, match="no controller could run it"):
        again.result()


# -- a store that turned read-only ---------------------------------------------------------------
@pytest.fixture
def tmpfs(tmp_path: Path):
    """A real filesystem that can be remounted read-only."""
    with mounted_tmpfs(tmp_path / "mnt", "64m") as mnt:
        yield mnt


def test_a_store_that_turned_read_only_ends_the_job_saying_so(
    tmpfs: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    # the controller (its own process) rides out a refusing store for ~30 s before it gives
    # up; what is tested is what happens then, so the ride is shortened to ~3 s
    monkeypatch.setenv("SPOTNB_FLUSH_BACKOFF_SCALE", "0.1")

    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=100000, step_time=0.01),
        spot.Config(
            ship_modules=SHIP,
            store=(tmpfs / "store").as_uri(),
            checkpoint="static:50",
            heartbeat_timeout="3s",
        ),
    )
    wait_progress(job, 10)
    agent = next(e for e in job.events if e["kind"] == "allocated")["info"]["pid"]
    # the kernel refuses the remount while a file there is open for writing (mount exits 32,
    # busy): the job writes its events and checkpoints all the time, so on a busy machine the
    # first try can land mid-write. Ask again until the filesystem is read-only.
    tries: list[str] = []
    while len(tries) < 400:
        out = subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True, text=True)
        if out.returncode == 0:
            break
        tries.append(out.stderr.strip())
        time.sleep(0.05)  # the pause between tries of a refused remount, not a wait for an event
    else:
        raise AssertionError(f"the tmpfs never became read-only: {tries[-3:]}")
    db = JobDB()
    wait_for(
        lambda: db.job(job.id)["status"] == "lost", 240, "the job DB never said the store refuses writes"
    )
    reason = db.job(job.id)["status_reason"]
    assert "refuses writes" in reason and "writable" in reason  # what happened, what to do
    assert job.wait(60) and job.status == "lost"  # the notebook's handle ends
    with pytest.raises(spot.JobFailed, match="refuses writes"):
        job.result(timeout=5)
    wait_for(
        lambda: (
            not os.path.exists(f"/proc/{agent}")
            or Path(f"/proc/{agent}/stat").read_text().split(")")[-1].split()[0] == "Z"
        ),
        30,
        "the instance was left running on a store it cannot write",
    )
    log = Path(os.environ["SPOTNB_HOME"]) / "logs" / job.id / "controller.log"
    size = log.stat().st_size
    spot.jobs()  # no controller is started for it again
    assert not db.controller_alive(job.id) and log.stat().st_size == size
    assert cli(["show", job.id]) == 0 and "refuses writes" in capsys.readouterr().out
