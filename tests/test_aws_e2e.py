"""A whole job on the AWS provider with no cloud account: moto_server plays EC2 and S3, and a
"VM runner" plays the instances by executing each instance's UserData (read back from moto)
with bash on this machine, as cloud-init would. So this runs the real bootstrap script, the
real agent against an s3:// store through s3fs, spotnb's metadata emulator in the IMDSv2
format for the preemption notice, and the real controller: launch → bootstrap → train →
notice → emergency checkpoint → pre-allocated replacement → restore → done.

Each "VM" starts as a cloud image does: in an empty folder, with a Python that has torch and not
spotnb (`tests/vm_image.py`: SPOTNB_PYTHON stands for the image's /opt/pytorch/bin/python). Its
boot script reads the job's spotnb wheel from the S3 store with the "VM's identity" (the moto
credentials), checks it, installs it and its pinned dependencies from the package index in a
fresh venv that sees the image's torch, and runs the agent from there. SPOTNB_POWEROFF_CMD
terminates the instance in moto instead of `shutdown -h now`. Then every artefact is scanned for
the canary credentials.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

import spotnb as spot
from spotnb.providers.cleanup import JOB_TAG
from spotnb.providers.local.metadata import MetadataEmulator
from tests.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.clouds_fixtures import CANARIES
from tests.vm_image import torch_only_python

ROOT = Path(__file__).resolve().parents[1]


class VMRunner:
    """Runs the UserData of every running spotnb instance in moto, once, as a local process
    booting from `image` (a Python with torch and without spotnb)."""

    def __init__(self, workdir: Path, emulator: MetadataEmulator, image: Path) -> None:
        self.workdir, self.emulator, self.image = workdir, emulator, image
        self.ec2 = boto3.client("ec2", region_name="us-east-1")
        self.procs: dict[str, subprocess.Popen] = {}
        self.scripts: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            resp = self.ec2.describe_instances(
                Filters=[
                    {"Name": "tag-key", "Values": [JOB_TAG]},
                    {"Name": "instance-state-name", "Values": ["running"]},
                ]
            )
            for res in resp["Reservations"]:
                for inst in res["Instances"]:
                    if inst["InstanceId"] not in self.procs:
                        self._boot(inst["InstanceId"])

    def _boot(self, instance_id: str) -> None:
        raw = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"][
            "Value"
        ]
        script = base64.b64decode(raw).decode()
        self.scripts[instance_id] = script
        path = self.workdir / f"{instance_id}.sh"
        path.write_text(script)
        self.emulator.register(instance_id)
        poweroff = self.workdir / f"{instance_id}-poweroff.sh"  # "the VM powers off"
        poweroff.write_text(
            f'#!/bin/sh\nexec {sys.executable} -c "import boto3; boto3.client('
            f"'ec2', region_name='us-east-1').terminate_instances("
            f"InstanceIds=['{instance_id}'])\"\n"
        )
        poweroff.chmod(0o755)
        vm = self.workdir / instance_id  # the VM's disk: nothing of this checkout on it
        vm.mkdir()
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
            "SPOTNB_PYTHON": str(self.image),  # the image's Python (torch, no spotnb)
            "SPOTNB_LOG": str(self.workdir / f"{instance_id}.log"),
            "SPOTNB_POWEROFF_CMD": str(poweroff),
            "SPOTNB_VENV": str(vm / "venv"),
            "SPOTNB_WORKDIR": str(vm / "work"),
            "SPOTNB_METADATA_URL": self.emulator.base_url(instance_id),
        }
        self.procs[instance_id] = subprocess.Popen(
            ["bash", str(path)], env=env, cwd=vm, start_new_session=True
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return torch_only_python(tmp_path_factory.mktemp("image") / "pytorch")


@pytest.fixture
def emulator() -> Any:
    em = MetadataEmulator()
    yield em
    em.close()


def test_job_on_moto_survives_preemption_and_leaks_no_credential(
    s3_store_url: str, emulator: MetadataEmulator, tmp_path: Path, spotnb_home: Path, image: Path
) -> None:
    ami = boto3.client("ec2", region_name="us-east-1").describe_images()["Images"][0]["ImageId"]
    runner = VMRunner(tmp_path, emulator, image)

    def fit(ctx: Any) -> dict[str, Any]:
        import time as _time

        import torch

        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ctx.track(model=model, optimizer=opt)
        for step in ctx.steps(30):
            loss = model(torch.ones(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ctx.log(loss=loss.item())
            if ctx.incarnation == 1 and step == 10:
                # hand-shake, not a timing guess: block until the notice has arrived
                t0 = _time.monotonic()
                while ctx.notice is None and _time.monotonic() - t0 < 60:
                    _time.sleep(0.02)
        return {"steps": ctx.step_index, "incarnation": ctx.incarnation}

    cfg = spot.Config(
        provider="aws",
        store=s3_store_url,
        regions=["us-east-1a"],
        aws_image_id=ami,
        notice_poll="0.1s",
        heartbeat_timeout="60s",
    )
    job = spot.train(fit, cfg)
    try:
        first = _wait(
            lambda: next(
                (
                    e
                    for e in job.events
                    if e["kind"] == "progress" and e["incarnation"] == 1 and e["step"] >= 10
                ),
                None,
            ),
            90,
            "incarnation 1 to reach step 10",
        )
        inst1 = next(
            e["instance_id"] for e in job.events if e["kind"] == "allocated" and e["incarnation"] == 1
        )
        assert first
        emulator.notify(inst1, time.time() + 120)  # the IMDSv2 instance-action notice
        result = job.result(timeout=150)
    except BaseException:
        for e in job.events:
            print({k: v for k, v in e.items() if k not in ("config", "rows", "traceback")})
        for log in tmp_path.glob("*.log"):
            print(log, log.read_text()[-3000:])
        raise
    finally:
        job.stop(wait=True, timeout=30) if not job.done else None
        runner.close()
    assert result == {"steps": 30, "incarnation": 2}
    kinds = [(e["incarnation"], e["kind"]) for e in job.events]
    for expected in [
        (1, "bootstrap"),
        (1, "ready"),
        (1, "notice"),
        (1, "evacuated"),
        (2, "allocated"),
        (2, "bootstrap"),
        (2, "resumed"),
        (2, "done"),
    ]:
        assert expected in kinds, expected
    resumed = next(e for e in job.events if e["kind"] == "resumed")
    assert resumed["from_step"] >= 11 and resumed["save_kind"] == "emergency"
    boots = [e for e in job.events if e["kind"] == "bootstrap" and e.get("phase") == "installed"]
    assert [(b["cloud"], b["installed"]) for b in boots] == [("aws", 1), ("aws", 1)]  # each VM installed
    for log in (tmp_path / f"{i}.log" for i in runner.scripts):
        text = log.read_text()
        assert "spotnb code: " in text and "checked (sha256" in text  # the store's wheel, checked
        assert f"{image}, the image's torch" in text and "installing torch" not in text
    print("install seconds per VM:", [round(b["install_s"], 1) for b in boots])
    # no VM left running
    ec2 = boto3.client("ec2", region_name="us-east-1")
    left = ec2.describe_instances(
        Filters=[
            {"Name": "tag:spotnb-job", "Values": [job.id]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    assert left["Reservations"] == []

    # -- credentials: nothing spotnb wrote or sent holds the canaries ------------------------
    secrets = [v.encode() for v in CANARIES.values()]
    blobs: dict[str, bytes] = {}
    s3 = boto3.client("s3", region_name="us-east-1")
    bucket = s3_store_url.split("/")[2]
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            blobs[f"s3://{bucket}/{obj['Key']}"] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    assert any(k.endswith("spec.json") for k in blobs) and any("MANIFEST" in k for k in blobs)
    for path in spotnb_home.rglob("*"):  # job DB, logs
        if path.is_file():
            blobs[str(path)] = path.read_bytes()
    for instance_id, script in runner.scripts.items():  # what the VM was given
        blobs[f"userdata:{instance_id}"] = script.encode()
    for path in tmp_path.glob("*.log"):  # what the VM printed
        blobs[str(path)] = path.read_bytes()
    blobs["events"] = repr(job.events).encode()
    assert len(blobs) > 10
    leaks = [name for name, data in blobs.items() if any(s in data for s in secrets)]
    assert leaks == []
