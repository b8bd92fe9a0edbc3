"""Hostile runs of several processes per instance (`Config.procs_per_instance`): real agents
on the local market, real child ranks over gloo, nothing mocked. The job key never reaches a
rank's environment or command line, and a stopped job leaves no process of its groups.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import psutil
import pytest

import spotnb as spot
from spotnb.core.signing import load_key
from tests.support import procfns
from tests.support.jobs import wait_for, wait_progress

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")

SHIP = ["tests.support.procfns"]


def _ranks(job_id: str) -> list[psutil.Process]:
    """The ranks other than 0 of the job's instances (rank 0 is the agent)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "spotnb.runtime.group.local_rank" in cmd and job_id in cmd:
            found.append(p)
    return found


# the test's spotnb home and the market's beacon files (the market removes them when it closes)
# the job's own files, kept by design: its home, the beacon, the instance log under $SPOTNB_HOME/logs
_THEIRS = ("SPOTNB_HOME", "SPOTNB_BEACON", "SPOTNB_INSTANCE_LOG")


def _read(pid: int, what: str) -> bytes:
    with open(f"/proc/{pid}/{what}", "rb") as f:
        return f.read()


def test_a_stopped_job_leaves_no_rank_and_no_rank_holds_the_key(tmp_path: Path) -> None:
    """instances=2 × procs=2, stopped mid-run (`Job.stop`): while they run, no rank's
    environment or command line holds the job key (rank 0 hands it over a pipe); once the
    job is stopped, no rank nor agent of it runs on, and nothing of the groups is left in
    the temporary folder (the market SIGKILLs an instance's process group: no cleanup runs)."""
    job = spot.train(
        functools.partial(procfns.group_dp, steps=10_000, out=str(tmp_path), step_delay=0.05),
        spot.Config(ship_modules=SHIP, local_alloc_delay=0.1, procs_per_instance=2, instances=2),
    )
    wait_progress(job, 5)
    wait_for(lambda: len(_ranks(job.id)) == 2, 30, "two ranks 1")
    ranks = _ranks(job.id)
    agents = [r.parent() for r in ranks]
    key = load_key(job.id)
    assert key is not None
    named: set[str] = set()  # what the job's processes' variables name in the temporary folder
    for p in [*ranks, *agents]:
        assert p is not None
        env, cmd = _read(p.pid, "environ"), _read(p.pid, "cmdline")
        assert key.hex().encode() not in env + cmd and key not in env + cmd
        for var in env.decode(errors="replace").split("\0"):
            name, _, value = var.partition("=")
            if (
                name.startswith("SPOTNB_")
                and name not in _THEIRS
                and value.startswith(tempfile.gettempdir() + os.sep)
            ):
                named.add(value)
    job.stop(timeout=30)
    assert job.status == "stopped"
    everyone: list[Any] = [*ranks, *agents]
    wait_for(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in everyone), 20, "left"
    )
    assert not [p for p in named if os.path.exists(p)]


def test_a_rank_that_dies_every_incarnation_ends_the_job_rather_than_looping(tmp_path: Path) -> None:
    """Rank 1 dies at step 3 every time, silently (as a crashing extension would): each death
    reads as a lost instance, not a user error, so the job is relaunched; the relaunches make
    no net progress, and the job ends at `max_stalled_relaunches`, saying so, instead of
    relaunching for ever."""
    job = spot.train(
        functools.partial(procfns.crash_rank1, at=3),
        spot.Config(ship_modules=SHIP, local_alloc_delay=0.1, procs_per_instance=2, max_stalled_relaunches=2),
    )
    with pytest.raises(spot.JobStopped, match=r"no net progress"):
        job.result(timeout=40)
    warnings = [e for e in job.events if e["kind"] == "warning" and "local rank 1" in e["message"]]
    assert warnings and "exited with code 139" in warnings[0]["message"]
