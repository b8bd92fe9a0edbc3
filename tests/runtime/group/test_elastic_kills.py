"""Attacks on a job of several instances: the coordinator killed, a replica frozen. Real
processes (agents, the lighthouse), real signals."""

from __future__ import annotations

import functools
import os
import signal

import psutil
import pytest

import spotnb as spot
from spotnb.runtime.group.elastic import COLLECTIVE_TIMEOUT
from tests.support import jobfns
from tests.support.jobs import wait_for, wait_progress

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")

SHIP = ["tests.support.jobfns"]


def _lighthouses(job_id: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "spotnb.runtime.group.lighthouse" in cmd and job_id in cmd:
            out.append(p)
    return out


def test_a_killed_coordinator_is_restarted_and_the_replicas_carry_on() -> None:
    """The lighthouse is SIGKILLed mid-run: the market starts it again at the same address and
    the replicas' quorum requests reach it; nothing is lost or applied twice. The new lighthouse
    numbers quorums from 1 again; the replicas must not take a repeated number for their old
    process group (issue 9: a pause of one collective timeout or more per collision;
    `test_lighthouse_restart` makes the collision happen every time)."""
    steps = 150
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.05),
        spot.Config(instances=3, ship_modules=SHIP, local_alloc_delay=0.1),
    )
    wait_progress(job, 30)
    (first,) = _lighthouses(job.id)
    first.kill()
    wait_for(lambda: [p for p in _lighthouses(job.id) if p.pid != first.pid], 60, "no new lighthouse")
    result = job.result(timeout=120)  # ~25 s without the stall: do not spend 4 min on it
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    assert not [e for e in job.events if e["kind"] == "preempted"]  # no replica was lost to it
    times = sorted(
        r["t"] for e in job.events if e["kind"] == "metrics" for r in e["rows"] if r.get("replica") == 0
    )
    pause = max(b - a for a, b in zip(times, times[1:], strict=False))
    print(f"longest pause between two steps of replica 0: {pause:.2f} s")
    # torchft retries a refused quorum request after quorum_timeout / (retries + 1), ~6 s
    assert pause < COLLECTIVE_TIMEOUT.total_seconds(), f"the replicas stalled {pause:.1f} s"


def test_a_frozen_replica_drops_out_and_rejoins() -> None:
    """SIGSTOP one replica for longer than the lighthouse's heartbeat timeout: the others go
    on without it; after SIGCONT it catches up from a peer. The result is exact."""
    steps = 200
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.05),
        spot.Config(instances=3, ship_modules=SHIP, local_alloc_delay=0.1, heartbeat_timeout=60),
    )
    wait_progress(job, 30)
    launched = [e for e in job.events if e["kind"] == "launched"]
    victim = int(launched[-1]["info"]["pid"])
    os.kill(victim, signal.SIGSTOP)
    try:
        # the others train on: a quorum of two forms while it is frozen (an event, not a clock)
        wait_for(
            lambda: any(e["kind"] == "quorum" and e["replicas"] == 2 for e in job.events),
            60,
            "no quorum of 2",
        )
    finally:
        os.kill(victim, signal.SIGCONT)
    result = job.result(timeout=240)
    assert result["weights"] == jobfns.exact_dp_expected(steps)


def test_a_sigkilled_controller_is_replaced_and_the_fleet_starts_again(monkeypatch) -> None:
    """The detached controller (and with it the local market's lighthouse) is SIGKILLed: a new
    controller ends the orphaned replicas, starts a new coordinator and the slots restore
    from the store. Nothing is applied twice."""
    import time

    from spotnb.control.jobdb import JobDB

    monkeypatch.setenv("SPOTNB_LEASE_TTL", "2")
    steps = 120
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.05),
        spot.Config(instances=2, ship_modules=SHIP, local_alloc_delay=0.1, checkpoint="static:10"),
    )
    wait_progress(job, 40)
    db = JobDB()
    lease = db.lease(job.id)
    assert lease is not None and lease["pid"] != os.getpid()
    os.kill(lease["pid"], signal.SIGKILL)
    deadline = time.time() + 60
    while db.controller_alive(job.id):
        assert time.time() < deadline
        time.sleep(0.1)
    again = spot.attach(job.id)
    result = again.result(timeout=240)
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    kinds = [e["kind"] for e in again.events]
    assert "controller_restarted" in kinds and "resumed" in kinds
    wait_for(lambda: not _lighthouses(job.id), 30, "a lighthouse outlived its job")


def _kill_a_replica(job: spot.Job, at_step: int) -> int:
    """SIGKILL the newest replica's agent at `at_step`, as the kernel's OOM killer would: no
    notice, no Python exception. Its incarnation."""
    wait_progress(job, at_step)
    launched = [e for e in job.events if e["kind"] == "launched"][-1]
    os.kill(int(launched["info"]["pid"]), signal.SIGKILL)
    return launched["incarnation"]


def test_a_replica_killed_without_notice_is_replaced_and_the_job_ends_exact() -> None:
    """One of three replicas dies (-9) mid-run: a lost replica, not a failed job. The two
    others train on, a replacement heals from a peer, and every step is applied exactly once;
    a warning says which incarnation died, how, and where its log is."""
    steps = 120
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.05),
        spot.Config(instances=3, ship_modules=SHIP, local_alloc_delay=0.1),
    )
    victim = _kill_a_replica(job, 30)
    result = job.result(timeout=240)
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    (crashed,) = [e for e in job.events if e["kind"] == "exited" and e["reason"] == "crashed"]
    assert crashed["incarnation"] == victim
    (warned,) = [e for e in job.events if e["kind"] == "warning" and "died without an error" in e["message"]]
    assert f"incarnation {victim}" in warned["message"] and "exit code -9" in warned["message"]
    assert ".log" in warned["message"]
    healed = [e for e in job.events if e["kind"] == "quorum" and e["incarnation"] > victim and e["healed"]]
    assert healed, "the replacement joined from a peer"


def test_when_crashes_exceed_the_budget_the_survivors_checkpoint_and_the_job_says_why() -> None:
    """max_crashes=0: the first replica that dies ends the job. Before the survivors are ended
    they checkpoint the step they reached (nothing they computed is lost to a resume); the job
    fails as "crashed" with an error that names the incarnation, its exit code and its log."""
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=100_000, step_delay=0.05),
        spot.Config(instances=3, ship_modules=SHIP, local_alloc_delay=0.1, save_every=100_000, max_crashes=0),
    )
    victim = _kill_a_replica(job, 30)
    with pytest.raises(spot.JobFailed, match=rf"incarnation {victim} died without reporting an error"):
        job.result(timeout=240)
    assert job.status == "failed" and job.state.status_reason == "crashed"
    (error,) = [e for e in job.events if e["kind"] == "error"]
    assert error["exc_type"] == "InstanceCrashed" and "exit code -9" in error["message"]
    saves = [e for e in job.events if e["kind"] == "checkpoint" and e["incarnation"] != victim]
    assert saves and saves[-1]["step"] >= 30, "the survivors checkpointed before they were ended"
