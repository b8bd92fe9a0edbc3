"""A whole job on the AWS provider with no cloud account: moto_server plays EC2 and S3, and a
"VM runner" plays the instances by executing each instance's UserData (read back from moto)
with bash on this machine, as cloud-init would. So this runs the real bootstrap script, the
real agent against an s3:// store through s3fs, spotnb's metadata emulator in the IMDSv2
format for the preemption notice, and the real controller: launch → bootstrap → train →
notice → emergency checkpoint → pre-allocated replacement → restore → done.

Each "VM" starts as a cloud image does: in an empty folder, with a Python that has torch and not
spotnb (`tests/support/vm_image.py`: SPOTNB_PYTHON stands for the image's /opt/pytorch/bin/python). Its
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

import boto3
import pytest

import spotnb as spot
from spotnb.providers.cleanup import JOB_TAG
from spotnb.providers.local.metadata import MetadataEmulator
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.fake_cloud import *  # noqa: F401,F403 - fixtures: image, emulator
from tests.support.fake_cloud import (
    assert_no_canary,
    assert_survived_like_cloud_images,
    fit,
    survive_a_preemption,
)
from tests.support.paths import REPO

pytestmark = pytest.mark.jobs

ROOT = REPO


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


def test_job_on_moto_survives_preemption_and_leaks_no_credential(
    s3_store_url: str, emulator: MetadataEmulator, tmp_path: Path, spotnb_home: Path, image: Path
) -> None:
    ami = boto3.client("ec2", region_name="us-east-1").describe_images()["Images"][0]["ImageId"]
    runner = VMRunner(tmp_path, emulator, image)

    cfg = spot.Config(
        provider="aws",
        store=s3_store_url,
        regions=["us-east-1a"],
        aws_image_id=ami,
        notice_poll="0.1s",
        heartbeat_timeout="60s",
        ship_modules=["tests.support.fake_cloud"],
    )
    job = spot.train(fit, cfg)
    try:  # the IMDSv2 instance-action notice
        result = survive_a_preemption(job, lambda vm: emulator.notify(vm, time.time() + 120), tmp_path)
    finally:
        job.stop(wait=True, timeout=30) if not job.done else None
        runner.close()
    boot_logs = [tmp_path / f"{i}.log" for i in runner.scripts]
    assert_survived_like_cloud_images(job, result, "aws", boot_logs, image)
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
    blobs: dict[str, bytes] = {}
    s3 = boto3.client("s3", region_name="us-east-1")
    bucket = s3_store_url.split("/")[2]
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            blobs[f"s3://{bucket}/{obj['Key']}"] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    for instance_id, script in runner.scripts.items():  # what the VM was given
        blobs[f"userdata:{instance_id}"] = script.encode()
    assert_no_canary(blobs, job, spotnb_home, tmp_path)
