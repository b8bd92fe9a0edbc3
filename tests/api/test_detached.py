"""Jobs outlive the notebook: SIGKILL the kernel or the controller mid-job (local market, with
preemptions) and the job still ends with the bit-exact result and a complete history."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import spotnb as spot
from spotnb.control.jobdb import JobDB
from tests.support import jobfns
from tests.support.jobs import assert_matches_reference, wait_progress

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]
CONFIG = dict(
    checkpoint="static:20",
    ship_modules=SHIP,
    local_upload_bps=8e6,
    local_schedule=[{"step": 50, "phase": "step"}, {"step": 130, "phase": "upload"}],
)


def _assert_same_as_reference(job: spot.Job, reference) -> None:
    assert_matches_reference(job, reference)
    # complete history: every incarnation that was allocated has ended, in order
    allocated = sorted(e["incarnation"] for e in job.events if e["kind"] == "allocated")
    ended = sorted(e["incarnation"] for e in job.events if e["kind"] in ("preempted", "exited"))
    assert allocated == ended == list(range(1, len(allocated) + 1))
    assert [e["kind"] for e in job.events].count("submitted") == 1


def test_job_survives_a_sigkilled_kernel(reference, spotnb_home) -> None:
    kernel = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import functools, threading, spotnb as spot; from tests.support import jobfns; "
            "job = spot.train(functools.partial(jobfns.seeded_mlp, step_delay=0.03), "
            f"spot.Config(**{CONFIG!r})); "
            "print(job.id, flush=True); threading.Event().wait()",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SPOTNB_HOME": str(spotnb_home)},
    )
    job_id = kernel.stdout.readline().strip()
    job = spot.attach(job_id)
    wait_progress(job, 70)
    kernel.send_signal(signal.SIGKILL)  # the "kernel" dies without any chance to clean up
    kernel.wait()
    _assert_same_as_reference(job, reference)
    assert job.breakdown().preemptions == 2


def test_a_sigkilled_controller_is_replaced(reference, monkeypatch) -> None:
    monkeypatch.setenv("SPOTNB_LEASE_TTL", "2")
    job = spot.train(
        __import__("functools").partial(jobfns.seeded_mlp, step_delay=0.03), spot.Config(**CONFIG)
    )
    wait_progress(job, 70)
    db = JobDB()
    lease = db.lease(job.id)
    assert lease is not None and lease["pid"] != os.getpid()
    os.kill(lease["pid"], signal.SIGKILL)
    deadline = time.time() + 60
    while db.controller_alive(job.id):  # the lease runs out: nobody drives the job now
        assert time.time() < deadline
        time.sleep(0.1)
    again = spot.attach(job.id)  # notices the stale lease and starts a new controller
    _assert_same_as_reference(again, reference)
    kinds = [e["kind"] for e in again.events]
    assert "controller_restarted" in kinds
    deadline = time.time() + 30  # the new controller lets go of the job once it is over
    while db.lease(job.id) is not None:
        assert time.time() < deadline, "the controller kept its lease after the job ended"
        time.sleep(0.1)


def test_two_controllers_never_drive_one_job(monkeypatch) -> None:
    from spotnb.control.supervise import start_controller

    job = spot.train(
        __import__("functools").partial(jobfns.slow_steps, steps=150, step_time=0.01),
        spot.Config(ship_modules=SHIP),
    )
    wait_progress(job, 10)
    owner = JobDB().lease(job.id)["owner"]
    start_controller(job.id, job.store.url)  # a second one gives up: the lease is held
    assert job.result(timeout=120) == 150
    assert len([e for e in job.events if e["kind"] == "allocated"]) == 1
    assert owner  # the first controller kept the job from start to end
