"""A whole job on the Azure provider with no Azure account (#25 item 3).

What is real: the Azure provider and its azure-mgmt-compute / azure-mgmt-resource clients (every
Resource Manager call's URL, query and JSON body is the SDK's own serialisation, its pollers and
error mapping too), the controller, the real boot script (the cloud-init `write_files` entry of
the VM's `osProfile.customData` as the provider sent it), its `spotnb_azure_end` deallocating the
VM through Resource Manager with the managed identity's token from IMDS, `code_fetch` reading the
job's spotnb wheel from the store, pip installing it and its pinned dependencies from the package
index, the agent writing the az:// store through adlfs against Azurite, and spotnb's metadata
emulator answering the agent's Azure watcher in the Scheduled Events format (a `Preempt` event).

What is faked, and why: Resource Manager has no emulator, so `tests/arm_fake.FakeArm` answers it
below azure-core's pipeline (`tests/azure_transport.ArmTransport`: never a hand-written client
object, so a wrong keyword or field fails in the SDK), and answers what a VM reaches from inside
(IMDS's resource id, name and managed-identity token; the deallocate POST, which stops the VM's
processes as Azure's deallocation does). The boot script names IMDS and Resource Manager by their
fixed addresses (169.254.169.254, management.azure.com): the "hypervisor", `VMRunner`, rewrites
those two addresses to the fake's before it runs the script with bash in an empty folder, with a
Python that has torch and not spotnb (`tests/support/vm_image.py`: SPOTNB_PYTHON stands for the image's
Python); everything else in the script is as sent. A `shutdown` on the VM's PATH marks the VM
Stopped (still allocated and billed), so a script that powered off instead of deallocating fails
the test. The store's credential on the VMs is Azurite's connection string (adlfs and
`code_fetch` honour AZURE_STORAGE_CONNECTION_STRING, as the SDKs do): the wheel is read with a
SharedKey-signed GET, not with the managed identity's token (Azurite takes bearer tokens only
over HTTPS), so that IMDS token path of `code_fetch` is covered by tests/providers/test_shipping.py only.

Then every artefact is scanned for the canary credentials (the VM's token, Azurite's key, the
AWS canaries).
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.providers.azure.provider import AzureProvider
from spotnb.providers.local.metadata import MetadataEmulator
from tests.support.arm_fake import VM_TOKEN, FakeArm
from tests.support.azure_transport import SUBSCRIPTION
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.clouds_fixtures import AZURITE_KEY
from tests.support.fake_cloud import *  # noqa: F401,F403 - fixtures: image, emulator
from tests.support.fake_cloud import (
    assert_no_canary,
    assert_survived_like_cloud_images,
    fit,
    survive_a_preemption,
)

pytestmark = pytest.mark.jobs

LOCATION = "eastus"
ACCOUNT = "devstoreaccount1"  # Azurite's account
IDENTITY = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/spotnb-identity/providers/"
    "Microsoft.ManagedIdentity/userAssignedIdentities/spotnb-vm"
)
BOOT_PATH = "/opt/spotnb/bootstrap.sh"


def boot_script(vm: dict[str, Any]) -> str:
    """The script cloud-init writes and runs, from the VM's customData (base64 cloud-config)."""
    import yaml

    doc = yaml.safe_load(base64.b64decode(vm["properties"]["osProfile"]["customData"]))
    assert doc["runcmd"] == [["bash", BOOT_PATH]], doc["runcmd"]
    (entry,) = [f for f in doc["write_files"] if f["path"] == BOOT_PATH]
    return str(entry["content"])


class VMRunner:
    """The hypervisor: starts every VM Resource Manager created, once, as a local process running
    its boot script with bash from `image` (torch, no spotnb); a deallocation stops it."""

    def __init__(self, workdir: Path, arm: FakeArm, emulator: MetadataEmulator, image: Path) -> None:
        self.workdir, self.arm, self.emulator, self.image = workdir, arm, emulator, image
        self.procs: dict[str, subprocess.Popen] = {}
        self.scripts: dict[str, str] = {}
        self.deallocated: list[str] = []
        self.shut_down: list[str] = []
        self.errors: list[BaseException] = []
        arm.on_deallocate = self._deallocate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            for vm in self.arm.created():
                try:
                    self._boot(vm)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    self.errors.append(exc)
            for name in list(self.procs):
                marker = self.workdir / f"{name}.shutdown"
                if marker.exists() and name not in self.shut_down:  # the guest powered off
                    self.shut_down.append(name)
                    self.arm.set_power(name, "stopped")

    def _boot(self, vm: dict[str, Any]) -> None:
        name = vm["name"]
        script = self.scripts[name] = boot_script(vm)
        # the two fixed addresses a VM reaches from inside: this VM's IMDS and Resource Manager
        imds, arm_url = "http://169.254.169.254/metadata", "https://management.azure.com"
        assert imds in script and arm_url in script
        booted = script.replace(imds, f"{self.arm.url}/vm/{name}/metadata").replace(
            arm_url, f"{self.arm.url}/arm"
        )
        path = self.workdir / f"{name}.sh"
        path.write_text(booted)
        self.emulator.register(name)
        vm_dir = self.workdir / name  # the VM's disk: nothing of this checkout on it
        (vm_dir / "home").mkdir(parents=True)
        (vm_dir / "bin").mkdir()
        shutdown = vm_dir / "bin" / "shutdown"  # the guest powers off: Stopped, still allocated
        shutdown.write_text(f"#!/bin/sh\ntouch {self.workdir / f'{name}.shutdown'}\nkill -KILL 0\n")
        shutdown.chmod(0o755)
        drop = ("PYTHONPATH", "VIRTUAL_ENV", "SPOTNB_POWEROFF_CMD", "SPOTNB_IMDS_URL")
        env = {
            **{k: v for k, v in os.environ.items() if k not in drop},
            "PATH": f"{vm_dir / 'bin'}:{os.environ['PATH']}",
            "HOME": str(vm_dir / "home"),
            "SPOTNB_PYTHON": str(self.image),  # the image's Python (torch, no spotnb)
            "SPOTNB_LOG": str(self.workdir / f"{name}.log"),
            "SPOTNB_VENV": str(vm_dir / "venv"),
            "SPOTNB_WORKDIR": str(vm_dir / "work"),
            "SPOTNB_METADATA_URL": self.emulator.base_url(name),  # Scheduled Events
            "SPOTNB_IMDS_URL": f"{self.arm.url}/vm/{name}",  # code_fetch's IMDS
        }
        self.procs[name] = subprocess.Popen(["bash", str(path)], env=env, cwd=vm_dir, start_new_session=True)

    def _deallocate(self, name: str) -> None:
        """Azure deallocates the VM: its processes stop (once its curl has read the answer)."""
        self.deallocated.append(name)
        proc = self.procs.get(name)
        if proc is not None:
            threading.Timer(0.5, lambda: _kill_group(proc)).start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for proc in self.procs.values():
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()


def test_job_on_fake_azure_survives_preemption_and_leaks_no_credential(
    az_store_url: str,
    azure_env: str,
    emulator: MetadataEmulator,
    tmp_path: Path,
    spotnb_home: Path,
    image: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_SUBSCRIPTION_ID"):
        monkeypatch.delenv(key, raising=False)
    arm = FakeArm()
    clients = arm.clients()

    class Wired(AzureProvider):
        """The real provider, its clients on the fake Resource Manager, described every second."""

        describe_interval = 1.0

        def __init__(self, config: Any) -> None:
            super().__init__(config, **clients)

    monkeypatch.setattr("spotnb.api.get_provider_class", lambda name: Wired)
    runner = VMRunner(tmp_path, arm, emulator, image)

    cfg = spot.Config(
        provider="azure",
        store=az_store_url,
        region=LOCATION,
        instance_type="Standard_NC4as_T4_v3",
        azure_subscription_id=SUBSCRIPTION,
        azure_storage_account=ACCOUNT,
        azure_identity_id=IDENTITY,
        notice_poll="0.1s",
        heartbeat_timeout="60s",
        ship_modules=["tests.support.fake_cloud"],
    )
    started = time.monotonic()
    # driven from a thread of this process: a detached controller process would build its own
    # clients with DefaultAzureCredential against management.azure.com (the SDK reads no
    # endpoint override from the environment), not this in-process Resource Manager
    job = spot.train(fit, cfg, detach=False)
    try:  # Scheduled Events: a Preempt event
        result = survive_a_preemption(
            job,
            lambda vm: emulator.notify(vm, time.time() + 30),
            tmp_path,
            lambda: print("ARM:", arm.compute.log[-30:], dict(arm.vm_requests)),
        )
    finally:
        job.stop(wait=True, timeout=30) if not job.done else None
        runner.close()
        arm.close()
    print(f"job: {time.monotonic() - started:.1f} s")
    assert runner.errors == []
    logs = [tmp_path / f"{name}.log" for name in runner.scripts]
    assert_survived_like_cloud_images(job, result, "azure", logs, image)
    notice = next(e for e in job.events if e["kind"] == "notice")
    assert notice["incarnation"] == 1
    for log in logs:
        assert "Azure deallocates this VM" in log.read_text()  # spotnb_azure_end, through Resource Manager

    # -- Resource Manager saw what Azure would ---------------------------------------------------
    sent = clients["compute"].transport.requests + clients["resources"].transport.requests
    puts = [r for r in sent if r.method == "PUT" and "/virtualMachines/" in r.path]
    assert len(puts) == 2, [(r.method, r.path) for r in sent]
    for req in puts:
        props = req.body["properties"]
        assert props["priority"] == "Spot" and props["billingProfile"]["maxPrice"] == -1
        assert req.body["identity"]["userAssignedIdentities"] == {IDENTITY: {}}
        assert req.body["tags"]["spotnb-job"]
    vnets = [r for r in sent if r.method == "PUT" and "/virtualNetworks/" in r.path]
    assert len(vnets) == 1  # the network spotnb creates on first use, once
    group = f"/resourcegroups/spotnb-{LOCATION}"
    assert any(r.method == "PUT" and r.path.lower().endswith(group) for r in sent)
    # each VM deallocated itself through Resource Manager (never left Stopped), then was deleted
    assert sorted(runner.deallocated) == sorted(runner.scripts) and runner.shut_down == []
    assert arm.left() == {}, arm.left()  # no VM left running, Stopped or deallocated
    assert sum(n for k, n in arm.vm_requests.items() if k.endswith("/identity/oauth2/token")) >= 2

    # -- credentials: nothing spotnb wrote or sent holds a canary --------------------------------
    from azure.storage.blob import BlobServiceClient

    blobs: dict[str, bytes] = {}
    container = az_store_url.split("/")[2]
    client = BlobServiceClient.from_connection_string(azure_env).get_container_client(container)
    for item in client.list_blobs():
        blobs[f"az://{container}/{item.name}"] = client.download_blob(item.name).readall()
    for name, script in runner.scripts.items():  # what the VM was given
        blobs[f"customData:{name}"] = script.encode()
    for req in sent:  # everything sent to Resource Manager
        blobs[f"arm:{req.method} {req.url}"] = repr(req.body).encode()
    assert_no_canary(blobs, job, spotnb_home, tmp_path, [VM_TOKEN.encode(), AZURITE_KEY.encode()])


def test_code_fetch_reads_azurite_with_the_connection_strings_key(az_store_url: str, azure_env: str) -> None:
    """The VM's wheel fetch honours AZURE_STORAGE_CONNECTION_STRING (BlobEndpoint, AccountKey) as
    adlfs does: a SharedKey-signed GET that Azurite checks; a wrong key is refused."""
    from azure.storage.blob import BlobServiceClient

    from spotnb.providers import code_fetch

    container = az_store_url.split("/")[2]
    blob = "store/code/spotnb 0.1.whl"
    BlobServiceClient.from_connection_string(azure_env).get_container_client(container).upload_blob(
        blob, b"wheel bytes"
    )
    env = {"AZURE_STORAGE_CONNECTION_STRING": azure_env}
    source = f"az://{container}@{ACCOUNT}.blob.core.windows.net/{blob}"
    assert code_fetch.read(source, 100, env) == b"wheel bytes"
    url, headers = code_fetch.azure_request(container, blob, env)
    assert url.startswith(azure_env.split("BlobEndpoint=")[1].rstrip(";"))
    assert AZURITE_KEY not in repr(headers) and headers["Authorization"].startswith(f"SharedKey {ACCOUNT}:")
    other_key = base64.b64encode(b"x" * 64).decode()
    wrong = {"AZURE_STORAGE_CONNECTION_STRING": azure_env.replace(AZURITE_KEY, other_key)}
    with pytest.raises(OSError, match="403"):
        code_fetch.read(source, 100, wrong)
