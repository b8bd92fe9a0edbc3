"""`Config.controller="cloud"`: the job's coordinator drives it, the notebook only follows.

The coordinator's real boot script (`controller_script`) runs on this machine as a VM would run
it: its own spotnb home (so the job key reaches it only through the script), this interpreter
as the image's Python (spotnb already there: nothing is pip-installed), the local market as the
cloud. The notebook side submits the job and starts no controller of its own; the script's
controller survives a preemption, ends the job with the right result and "powers off".
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import spotnb as spot
from spotnb import api, submit
from spotnb.control.jobdb import JobDB
from spotnb.control.supervise import ensure_controller
from spotnb.core.signing import load_key
from spotnb.errors import ConfigError
from spotnb.job import Job
from spotnb.providers.bootstrap import controller_script
from tests.support import jobfns

pytestmark = pytest.mark.jobs

ROOT = Path(__file__).resolve().parents[2]


def _submit(store_url: str, **fields) -> Job:
    config = spot.Config(
        controller="cloud",
        store=store_url,
        checkpoint="static:10",
        ship_modules=["tests.support.jobfns"],
        local_schedule=[{"step": 25, "phase": "step"}],
        **fields,
    )
    fn = functools.partial(jobfns.slow_steps, steps=40, step_time=0.01, hold_at=25)  # until the kill
    _, payload, files = api._prepare(fn, config)
    return submit.submit_job(payload, config, files, detach=True)


def test_the_coordinator_script_drives_the_job_to_its_end(
    store_url: str, tmp_path: Path, spotnb_home: Path
) -> None:
    job = _submit(store_url)
    assert JobDB().job(job.id)["controller"] == "cloud"
    key = load_key(job.id)
    assert key is not None
    script = tmp_path / "coordinator.sh"
    script.write_text(
        controller_script(
            job.id,
            store_url=job.store.url,
            job_key=key.hex(),
            cloud="local",
            instances=1,
            min_replicas=1,
            spotnb_version=spot.__version__,
        )
    )
    vm_home, log, off = tmp_path / "vm-home", tmp_path / "coordinator.log", tmp_path / "powered-off"
    env = {
        **os.environ,
        "SPOTNB_HOME": str(vm_home),  # the VM's own disk: nothing of the notebook's home
        "SPOTNB_PYTHON": sys.executable,
        "SPOTNB_LOG": str(log),
        "SPOTNB_POWEROFF_CMD": f"touch {off}",
        "PYTHONPATH": str(ROOT),
    }
    follower = Job(job.id, job.store, None, {})  # no job DB: it can only follow the store
    follower.follow()
    proc = subprocess.run(["bash", str(script)], env=env, timeout=300)
    assert proc.returncode == 0
    assert follower.result(timeout=60) == 40
    assert follower.breakdown().preemptions == 1  # the hosted controller relaunched it
    assert off.exists(), "the coordinator powers off once its controller ended the job"
    text = log.read_text()
    assert "pip install" not in text and key.hex() not in text
    key_file = vm_home / "keys" / f"{job.id}.key"
    assert key_file.read_text() == key.hex() and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    # nothing of the job was driven from the notebook's machine
    assert not (spotnb_home / "logs" / job.id / "controller.log").exists()


def test_a_local_job_with_a_cloud_controller_is_hosted_by_the_market(store_url: str) -> None:
    """Through the API: the local market hosts the controller (a process of its own session),
    a second `ensure_controller` finds it alive and does not double it."""
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=30, step_time=0.01),
        spot.Config(controller="cloud", store=store_url, ship_modules=["tests.support.jobfns"]),
    )
    assert job.result(timeout=120) == 30
    row = JobDB().job(job.id)
    assert row["controller"] == "cloud"
    assert ensure_controller(row) is False  # ended: nothing to host


def test_a_cloud_controller_needs_an_identity_on_a_cloud() -> None:
    with pytest.raises(ConfigError, match="controller_identity"):
        spot.Config(provider="aws", store="s3://bucket/spotnb", controller="cloud")
    with pytest.raises(ConfigError, match="controller"):
        spot.Config(controller="laptop")
    with pytest.raises(ConfigError, match="provider='any'"):
        spot.Config(
            provider="any",
            instance_type={"aws": "g5.xlarge"},
            regions=["aws/us-east-1a"],
            store="s3://bucket/spotnb",
            controller="cloud",
            controller_identity="x",
        )
    cfg = spot.Config(
        provider="aws", store="s3://bucket/spotnb", controller="cloud", controller_identity="spotnb-ctl"
    )
    assert cfg.controller_identity == "spotnb-ctl"
