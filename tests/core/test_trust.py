"""Trust in the store: who can write it can delete or corrupt work (detected) but runs no code.

Each test plays the attacker with real files in a real store while real agents run on the
local market: a pickle that would run a command replaces what spotnb is about to unpickle,
and the command must not run.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.core.store import Store
from spotnb.errors import SpotnbError
from tests.support import jobfns
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns", __name__]  # this module by value: its helpers run on the instance
FIXTURE = FIXTURES / "legacy-job"


class _Evil:
    """Unpickling this runs `touch <marker>` (what an attacker with write access would try)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def _evil(marker: Path) -> bytes:
    return pickle.dumps(_Evil(marker))


def _wait_for(job: spot.Job, predicate: Any, what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = next((e for e in job.events if predicate(e)), None)
        if found is not None:
            return found
        if job.done:
            break
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}; events: {[e['kind'] for e in job.events]}")


def gated(
    ctx: Any, gate: str, at: int, steps: int = 60, first_at: int | None = None, hold_at: int | None = None
) -> float:
    """Deterministic training that, in its first incarnation, waits at step `at` until the
    test has done its tampering (a hand-shake, not a timing guess); with `first_at`, also at
    that step until `gate + ".first"` exists (so that an earlier checkpoint commits first: on a
    busy box the writer may otherwise supersede every snapshot but the newest). `hold_at`: the
    first incarnation waits at that step until the market kills it: its steps take
    microseconds, and a kill scheduled a few steps after the gate could otherwise land only
    after the loop (`jobfns.hold_for_the_market`)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    ctx.track(model=model)
    for step in ctx.steps(steps):
        with torch.no_grad():
            model.weight.mul_(0.99).add_(0.01 * step)
        ctx.log(w=float(model.weight.sum()))
        for wait_at, path in ((first_at, gate + ".first"), (at, gate)):
            if ctx.incarnation == 1 and step == wait_at:
                deadline = time.monotonic() + 120
                while not os.path.exists(path) and time.monotonic() < deadline:
                    time.sleep(0.02)
        if ctx.incarnation == 1 and step == hold_at:
            jobfns.hold_for_the_market(ctx)
    return float(model.weight.sum())


def returns_a_lock(ctx: Any) -> Any:
    import threading

    for _ in ctx.steps(3):
        pass
    return threading.Lock()


def test_a_forged_result_is_refused_and_never_runs(tmp_path: Path, spotnb_home: Path) -> None:
    marker = tmp_path / "pwned-result"
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=5, step_time=0.0), spot.Config(ship_modules=SHIP)
    )
    assert job.wait(120) and job.status == "succeeded"
    path = job.store.job(job.id, "result.pkl")
    genuine = job.store.read_bytes(path)
    job.store.write_bytes(path, _evil(marker))
    with pytest.raises(SpotnbError, match="result.pkl is not loaded: .*not signed"):
        job.result()
    assert not marker.exists(), "a forged result.pkl ran a command on the notebook machine"
    job.store.write_bytes(path, genuine)
    assert job.result() == 5
    # the key stays on this machine, owner-only, and is nowhere in the store or the logs
    from spotnb.core.signing import key_path, load_key

    assert stat.S_IMODE(key_path(job.id).stat().st_mode) == 0o600
    assert stat.S_IMODE(key_path(job.id).parent.stat().st_mode) == 0o700
    key = load_key(job.id)
    assert key is not None
    for root in (Path(job.store.root), spotnb_home / "logs"):
        for f in root.rglob("*"):
            if f.is_file():
                data = f.read_bytes()
                assert key.hex().encode() not in data and key not in data, f


def test_a_forged_function_is_refused_at_relaunch(tmp_path: Path) -> None:
    marker, gate = tmp_path / "pwned-fn", tmp_path / "gate"
    fn = functools.partial(gated, gate=str(gate), at=5, steps=30, hold_at=8)
    job = spot.train(
        fn,
        spot.Config(ship_modules=SHIP, checkpoint="static:10", local_schedule=[{"step": 8, "phase": "step"}]),
    )
    _wait_for(job, lambda e: e["kind"] == "progress" and e["incarnation"] == 1, "incarnation 1 training")
    job.store.write_bytes(job.store.job(job.id, "fn.pkl"), _evil(marker))
    gate.touch()
    with pytest.raises(spot.JobFailed, match="refusing to load the function: .*not signed"):
        job.result(timeout=180)
    assert not marker.exists(), "a forged fn.pkl ran a command on the instance"
    assert [e["incarnation"] for e in job.events if e["kind"] == "error"] == [2]
    assert [e["step"] for e in job.events if e["kind"] == "preempted"] == [8]


def test_a_swapped_checkpoint_is_never_loaded_and_restore_falls_back(tmp_path: Path) -> None:
    marker, gate = tmp_path / "pwned-ckpt", tmp_path / "gate"
    fn = functools.partial(gated, gate=str(gate), at=35, steps=60, first_at=25, hold_at=38)
    job = spot.train(
        fn,
        spot.Config(
            ship_modules=SHIP, checkpoint="static:10", local_schedule=[{"step": 38, "phase": "step"}]
        ),
    )
    _wait_for(job, lambda e: e["kind"] == "checkpoint" and e["step"] <= 20, "a checkpoint before step 25")
    Path(str(gate) + ".first").touch()
    newest = _wait_for(
        job, lambda e: e["kind"] == "checkpoint" and e["step"] == 30, "the checkpoint at step 30"
    )
    # the attacker replaces the state and rewrites the manifest to match its size and hash
    folder = job.store.job(job.id, "ckpt", f"{newest['seq']:08d}")
    evil = _evil(marker)
    job.store.write_bytes(f"{folder}/state.pt", evil)
    manifest = json.loads(job.store.read_bytes(f"{folder}/MANIFEST.json"))
    import hashlib

    manifest["files"]["state.pt"] = {"size": len(evil), "sha256": hashlib.sha256(evil).hexdigest()}
    job.store.write_bytes(f"{folder}/MANIFEST.json", json.dumps(manifest).encode())
    gate.touch()
    result = job.result(timeout=180)
    assert not marker.exists(), "a swapped state.pt was unpickled on the instance"
    invalid = [e for e in job.events if e["kind"] == "checkpoint_invalid"]
    assert [e["seq"] for e in invalid] == [newest["seq"]]
    resumed = [e for e in job.events if e["kind"] == "resumed"]
    prior = [
        e["step"]
        for e in job.events
        if e["kind"] == "checkpoint" and e["incarnation"] == 1 and e["seq"] < newest["seq"]
    ]
    assert prior, "no checkpoint committed before the tampered one"
    assert [e["from_step"] for e in resumed] == [max(prior)]  # the one before, verified
    assert [e["step"] for e in job.events if e["kind"] == "preempted"] == [38]
    # the fallback is exact: every step logged twice logged the same value, and the result is
    # what the steps compute
    seen: dict[int, float] = {}
    for step, value in job.metrics["w"]:
        assert seen.setdefault(step, value) == value
    assert result == seen[59]


def test_a_return_value_that_cannot_be_pickled_fails_the_job_naming_its_type() -> None:
    job = spot.train(returns_a_lock, spot.Config(ship_modules=SHIP))
    with pytest.raises(spot.JobFailed, match=r"returned a _thread\.lock that cannot be pickled"):
        job.result(timeout=120)
    assert job.status == "failed"
    assert len([e for e in job.events if e["kind"] == "allocated"]) == 1


def test_a_job_of_the_previous_spotnb_is_read_without_unpickling_its_config(
    tmp_path: Path, store_url: str
) -> None:
    """The old layout (spec.json + config.pkl, made by the code before this change): the
    controller reads it as JSON, never unpickles config.pkl, and the instance refuses to run
    the unsigned job with a clear error."""
    from spotnb.api import run_controller
    from spotnb.control.jobdb import JobDB
    from spotnb.core.spec import load_spec

    store = Store(store_url)
    job_id = json.loads((FIXTURE / "spec.json").read_text())["job_id"]
    shutil.copytree(FIXTURE, Path(store.job(job_id)))
    marker = tmp_path / "pwned-config"
    Path(store.job(job_id, "config.pkl")).write_bytes(_evil(marker))
    spec = load_spec(store, job_id, None)
    assert spec.legacy and spec.runtime.policy == "static:10" and spec.runtime.save_every == 5
    config = spec.to_config()
    assert (
        config.name,
        config.checkpoint,
        config.save_every,
        config.keep_last,
        config.local_mttp,
        config.notice_poll,
        config.max_retries,
        config.ship_modules,
    ) == ("legacy-job", "static:10", 5, 3, 300.0, 2.0, 1, ["tests.core.jobfns"])
    JobDB().add_job(
        job_id, name="legacy-job", provider="local", region=None, instance_type="g4dn.xlarge", store=store.url
    )
    assert run_controller(job_id, store.url) == 0
    job = spot.attach(job_id, store=store.url)
    assert job.wait(60) and job.status == "failed"
    errors = [e["message"] for e in job.events if e["kind"] == "error"]
    assert errors and all("submitted by an older spotnb" in m for m in errors)
    assert not [e for e in job.events if e["kind"] == "allocating"]  # no instance for nothing
    assert not marker.exists(), "config.pkl was unpickled"


def test_a_forged_unsigned_spec_is_refused_for_a_job_with_a_key(store_url: str) -> None:
    """Downgrading a signed job to the old layout (to steer its settings) is caught."""
    from spotnb.core.signing import load_key
    from spotnb.core.spec import SpecError, load_spec

    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=3, step_time=0.0),
        spot.Config(ship_modules=SHIP, store=store_url),
    )
    assert job.wait(120)
    path = job.store.job(job.id, "spec.json")
    doc = json.loads(job.store.read_bytes(path))
    assert load_spec(job.store, job.id, load_key(job.id)).config["ship_modules"] == SHIP
    doc["config"]["requirements"] = ["evil-package"]
    job.store.write_bytes(path, json.dumps(doc).encode())
    with pytest.raises(SpecError, match="wrong signature"):
        load_spec(job.store, job.id, load_key(job.id))
    del doc["spec_version"], doc["signature"]
    job.store.write_bytes(path, json.dumps(doc).encode())
    with pytest.raises(SpecError, match="not signed, but this job has a key"):
        load_spec(job.store, job.id, load_key(job.id))


def test_the_boot_script_carries_the_key_only_when_launching() -> None:
    """A cloud VM gets the key in its boot script at launch; a dry run (no key yet) shows
    where it would go, and the script never echoes it into its log."""
    from spotnb.providers.base import LaunchSpec
    from spotnb.providers.bootstrap import KEY_PLACEHOLDER, bootstrap_script

    base = dict(
        job_id="j",
        incarnation=1,
        store_url="s3://b/p",
        instance_type="x",
        region=None,
        command=["python", "-m", "spotnb.runtime.agent"],
        spotnb_version="0.1.0",
    )
    key = "ab" * 32
    launched = bootstrap_script(LaunchSpec(job_key=key, **base), "aws")
    assert f"export SPOTNB_JOB_KEY={key}\n" in launched
    assert "set -x" not in launched and "$SPOTNB_JOB_KEY" not in launched
    assert key not in repr(LaunchSpec(job_key=key, **base))
    planned = bootstrap_script(LaunchSpec(**base), "aws")
    assert "SPOTNB_JOB_KEY='" + KEY_PLACEHOLDER + "'" in planned and key not in planned


def test_a_controller_ends_a_job_whose_spec_was_tampered_with(store_url: str) -> None:
    """No instance is launched for a spec that does not verify, and the job ends visibly (a
    controller that crashed instead would be restarted, and crash, at every `spotnb jobs`)."""
    from spotnb import api, submit

    config = spot.Config(ship_modules=SHIP, store=store_url)
    _, payload, files = api._prepare(jobfns.fails_at, config)
    job = submit.submit_job(payload, config, files, detach=True)  # submitted; no controller yet
    path = job.store.job(job.id, "spec.json")
    doc = json.loads(job.store.read_bytes(path))
    doc["config"]["requirements"] = ["evil-package"]
    job.store.write_bytes(path, json.dumps(doc).encode())
    assert api.run_controller(job.id, store_url) == 1
    job = spot.attach(job.id)
    assert job.wait(60) and job.status == "failed"
    with pytest.raises(spot.JobFailed, match="the job spec cannot be used: .*wrong signature"):
        job.result()
    assert not [e for e in job.events if e["kind"] == "allocating"]


def test_a_spec_of_an_unknown_version_is_refused_clearly(store_url: str) -> None:
    from spotnb.core.signing import new_key
    from spotnb.core.spec import JobSpec, SpecError, load_spec, write_spec

    store, key = Store(store_url), new_key()
    spec = JobSpec(job_id="j1", created=1.0, spotnb_version="9", cwd="/", config={}, spec_version=2)
    write_spec(store, spec, key)
    with pytest.raises(SpecError, match="spec_version 2 is not one this spotnb reads"):
        load_spec(store, "j1", key)
    with pytest.raises(SpecError, match="wrong signature"):
        load_spec(store, "j1", new_key())
