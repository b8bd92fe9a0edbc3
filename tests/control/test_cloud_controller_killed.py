"""`Config.controller="cloud"` under attack: the coordinator's real boot script run on this
machine as a VM would run it (its own spotnb home, this interpreter as the image's Python, the
local market as the cloud), with its controller killed mid-job; and the notebook side's record
of where a job's controller runs, which decides whether this machine may ever drive it."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb import api, submit
from spotnb.control import supervise
from spotnb.control.jobdb import JobDB
from spotnb.core.signing import load_key
from spotnb.job import Job
from spotnb.providers.bootstrap import controller_script
from tests.support import jobfns

pytestmark = pytest.mark.jobs

ROOT = Path(__file__).resolve().parents[2]


def _submit(store_url: str, steps: int, step_time: float, **fields: Any) -> Job:
    config = spot.Config(
        controller="cloud",
        store=store_url,
        checkpoint="static:10",
        ship_modules=["tests.support.jobfns"],
        **fields,
    )
    fn = functools.partial(jobfns.slow_steps, steps=steps, step_time=step_time)
    _, payload, files = api._prepare(fn, config)
    return submit.submit_job(payload, config, files, detach=True)


def _wait(what: str, cond: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _run_coordinator(job: Job, tmp_path: Path, **env_extra: str) -> tuple[subprocess.Popen, Path, Path, Path]:
    """The coordinator's boot script, started as a VM would run it: (process, its spotnb
    home, its log, the file its power-off makes)."""
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
        "SPOTNB_HOME": str(vm_home),
        "SPOTNB_PYTHON": sys.executable,
        "SPOTNB_LOG": str(log),
        "SPOTNB_POWEROFF_CMD": f"touch {off}",
        "PYTHONPATH": str(ROOT),
        **env_extra,
    }
    proc = subprocess.Popen(["bash", str(script)], env=env, start_new_session=True)
    return proc, vm_home, log, off


@pytest.mark.parametrize("attack", ["kill", "stop"])
def test_a_killed_or_frozen_hosted_controller_is_replaced_and_ends_the_job_before_power_off(
    store_url: str, tmp_path: Path, attack: str
) -> None:
    """SIGKILL (an OOM kill) of the controller the coordinator runs: the script starts it
    again, and the new one takes the job over once the dead one's lease runs out. The
    coordinator must not read the restarted controller's "a live controller holds the job"
    as the job's end and power off, leaving its instance unmanaged and the job unfinished.
    SIGSTOP (a controller frozen whole, its lease no longer renewed): nothing else on the
    machine would ever drive the job again, so the script ends the frozen one and starts
    another."""
    job = _submit(store_url, steps=80, step_time=0.05)
    follower = Job(job.id, job.store, None, {})
    follower.follow()
    # the frozen controller's lease runs out in 3 s; the script looks every 2 s
    proc, vm_home, log, off = _run_coordinator(job, tmp_path, SPOTNB_LEASE_TTL="3", SPOTNB_WATCHDOG_S="2")
    try:
        vm_db = JobDB(vm_home / "jobs.db")
        lease = _wait("the hosted controller's lease", lambda: vm_db.path.exists() and vm_db.lease(job.id))
        _wait("the job's first steps", lambda: follower.metrics.get("step_value"))
        os.kill(int(lease["pid"]), signal.SIGKILL if attack == "kill" else signal.SIGSTOP)
        assert follower.result(timeout=40) == 80
        assert proc.wait(timeout=30) == 0
        assert off.exists()
        text = log.read_text()
        assert "starting it again" in text
        if attack == "stop":
            assert "stopped renewing its lease" in text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if attack == "stop":
            try:
                os.kill(int(lease["pid"]), signal.SIGKILL)
            except (ProcessLookupError, UnboundLocalError):
                pass


def test_resume_records_where_the_job_s_controller_now_runs(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job DB's `controller` column is what keeps this machine from driving a job whose
    controller runs on its coordinator (two controllers on two machines share no lease).
    A resume that moves the controller to the cloud must record it, or the next `spot.jobs()`
    / `attach` here starts a second controller beside the coordinator's; one that brings it
    back to the notebook must record that too, or the notebook asks the cloud for a hosted
    controller (a coordinator VM) while its own drives the job."""
    monkeypatch.setenv("SPOTNB_LEASE_TTL", "3")  # the controllers it starts: a quick handover
    fn = functools.partial(jobfns.fails_at, step_fail=1)
    config = spot.Config(store=store_url, ship_modules=["tests.support.jobfns"])
    job = spot.train(fn, config)
    with pytest.raises(spot.JobFailed):
        job.result(timeout=60)
    assert JobDB().job(job.id)["controller"] is None
    again = spot.resume(job.id, controller="cloud")  # the local market hosts it
    assert JobDB().job(job.id)["controller"] == "cloud"
    with pytest.raises(spot.JobFailed):
        again.result(timeout=60)
    hosted: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(supervise, "ensure_hosted_controller", lambda row: hosted.append(row["id"]) or False)
        supervise.ensure_controller({**JobDB().job(job.id), "status": "running"})
    assert hosted == [job.id]  # followed through its host, never started here
    back = spot.resume(job.id, controller="notebook")
    assert JobDB().job(job.id)["controller"] is None
    with pytest.raises(spot.JobFailed):
        back.result(timeout=60)


@pytest.mark.parametrize(
    "provider, identity, words",
    [
        ("aws", "arn:aws:iam::123456789012:instance-profile/spotnb-ctl", "name 'spotnb-ctl'"),
        ("aws", "spotnb ctl", "instance profile name"),
        ("aws", "spotnb-ctl\nrm -rf /", "instance profile name"),
        ("aws", "x" * 129, "instance profile name"),
        ("azure", "spotnb-ctl", "resource id"),
        (
            "azure",
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/v",
            "resource id",
        ),
        ("gcp", "spotnb-ctl", "service account email"),
        ("gcp", "someone@gmail.com", "service account email"),
        ("gcp", " ctl@p.iam.gserviceaccount.com", "service account email"),
    ],
)
def test_a_controller_identity_of_the_wrong_shape_is_refused_before_anything_is_written(
    provider: str, identity: str, words: str
) -> None:
    """Caught at the Config, not after the job was submitted and its coordinator asked for
    (an ARN where AWS wants a name fails there with an opaque ValidationError)."""
    stores = {"aws": "s3://bucket/spotnb", "azure": "az://container/spotnb", "gcp": "gs://bucket/spotnb"}
    with pytest.raises(spot.ConfigError, match=f"controller_identity.*{words}"):
        spot.Config(
            provider=provider, store=stores[provider], controller="cloud", controller_identity=identity
        )


@pytest.mark.parametrize(
    "provider, identity",
    [
        ("aws", "spotnb-controller"),
        ("aws", "team+spotnb=ctl,1.2@x"),
        (
            "azure",
            "/subscriptions/0000/resourcegroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/ctl",
        ),
        ("gcp", "spotnb-ctl@my-project.iam.gserviceaccount.com"),
        ("gcp", "123456789-compute@developer.gserviceaccount.com"),
    ],
)
def test_controller_identities_of_the_right_shape_are_taken(provider: str, identity: str) -> None:
    stores = {"aws": "s3://bucket/spotnb", "azure": "az://container/spotnb", "gcp": "gs://bucket/spotnb"}
    cfg = spot.Config(
        provider=provider, store=stores[provider], controller="cloud", controller_identity=identity
    )
    assert cfg.controller_identity == identity


def test_a_hosting_error_that_echoes_the_boot_script_does_not_leak_the_job_key(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cloud API error may quote the request it refused (the coordinator's user data, which
    carries the job key). The job is refused with the error's text, in the store's event log
    and in what the notebook shows: the key must appear in neither. (The cloud's refusal is
    stood in for: the local market's host raises it.)"""
    from spotnb.providers.local.provider import LocalProvider

    def refuse(self: Any, job_id: str, store_url: str, job_key: str) -> None:
        raise RuntimeError(f"InvalidParameterValue: UserData 'export SPOTNB_JOB_KEY={job_key}' is too long")

    monkeypatch.setattr(LocalProvider, "host_controller", refuse)
    fn = functools.partial(jobfns.slow_steps, steps=3)
    with pytest.raises(Exception) as err:
        spot.train(
            fn, spot.Config(controller="cloud", store=store_url, ship_modules=["tests.support.jobfns"])
        )
    (row,) = JobDB().jobs()
    key = load_key(row["id"])
    assert key is not None
    assert "UserData" in str(err.value) and key.hex() not in str(err.value)
    assert err.value.__cause__ is None or key.hex() not in str(err.value.__cause__)
    assert key.hex() not in caplog.text
    events = Path(store_url.removeprefix("file://")) / "jobs" / row["id"] / "events"
    text = "".join(p.read_text() for p in events.iterdir())
    assert "UserData" in text and key.hex() not in text


def test_a_hosted_job_that_ended_while_no_notebook_watched_is_not_hosted_again(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common case of a job that outlives the notebook: it ended on its coordinator (which
    powered off) while no notebook followed, so this machine's job DB still says running. The
    next `spot.jobs()` must read the end from the store, not ask the cloud for the job's
    coordinator again (on a cloud: a new on-demand VM that boots, installs spotnb, finds the
    job ended and powers off, at every listing). (The cloud's host is stood in for.)"""
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=5, step_time=0.01),
        spot.Config(controller="cloud", store=store_url, ship_modules=["tests.support.jobfns"]),
    )
    assert job.result(timeout=60) == 5
    JobDB().update_job(job.id, status="running")  # what a notebook that was closed knew
    from spotnb.providers.local.provider import LocalProvider

    asked: list[str] = []
    monkeypatch.setattr(LocalProvider, "host_controller", lambda self, job_id, *a: asked.append(job_id))
    rows = spot.jobs()
    assert asked == []
    assert [r["status"] for r in rows if r["id"] == job.id] == ["succeeded"]
    assert JobDB().job(job.id)["status"] == "succeeded"


def test_one_hosted_job_with_a_spec_that_cannot_be_read_does_not_break_the_listing(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`spot.jobs()` asks after every unfinished job's controller; a hosted job whose spec
    was tampered with (or whose store refuses this machine right now) must not make the
    listing of every job raise. It is said in the log, and the other jobs are listed."""
    bad = _submit(store_url, steps=5, step_time=0.01)
    good = _submit(store_url, steps=5, step_time=0.01)
    spec = Path(store_url.removeprefix("file://")) / "jobs" / bad.id / "spec.json"
    spec.write_text(spec.read_text().replace('"steps"', '"stepz"').replace("}", ' , "x": 1}', 1))
    caplog.set_level(logging.WARNING, logger="spotnb")
    rows = spot.jobs()
    assert {r["id"] for r in rows} >= {bad.id, good.id}
    assert bad.id in caplog.text


def test_the_dry_run_says_where_a_cloud_controller_runs_on_the_local_market(store_url: str) -> None:
    """On a cloud the plan shows the coordinator that hosts it; on the local market there is
    no coordinator to show, and the plan said nothing of where the job would be driven from."""
    plan = spot.train(jobfns.slow_steps, spot.Config(controller="cloud", store=store_url), dry_run=True)
    assert "hosted by the local market" in str(plan)
    assert JobDB().jobs() == []
    plain = spot.train(jobfns.slow_steps, spot.Config(store=store_url), dry_run=True)
    assert "controller" not in plain


def test_a_second_machine_s_controller_does_not_drive_a_hosted_job(store_url: str, tmp_path: Path) -> None:
    job = _submit(store_url, steps=60, step_time=0.05)
    follower = Job(job.id, job.store, None, {})
    follower.follow()
    proc, vm_home, _, _ = _run_coordinator(job, tmp_path)
    other = None
    try:
        vm_db = JobDB(vm_home / "jobs.db")
        _wait("the hosted controller's lease", lambda: vm_db.path.exists() and vm_db.lease(job.id))
        _wait("the job's first steps", lambda: follower.metrics.get("step_value"))
        # another machine: its own spotnb home, holding the job's key
        home = tmp_path / "other-home"
        (home / "keys").mkdir(parents=True)
        key = load_key(job.id)
        assert key is not None
        (home / "keys" / f"{job.id}.key").write_text(key.hex())
        env = {**os.environ, "SPOTNB_HOME": str(home), "PYTHONPATH": str(ROOT)}
        other = subprocess.Popen(
            [sys.executable, "-m", "spotnb.cli", "controller", job.id, "--store", job.store.url], env=env
        )
        assert other.wait(timeout=30) == api.EXIT_LEASE_HELD  # it found the job driven
    finally:
        for p in (proc, other):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL) if p is proc else p.kill()
