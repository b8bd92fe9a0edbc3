"""A whole job on the GCP provider with no Google account (#25 item 3).

What is real: the GCP provider and its google-cloud-compute clients with their REST transport
(every Compute call's URL, query and JSON body is the SDK's own serialisation), the controller,
the real boot script (the instance's `startup-script` metadata item as the provider sent it),
`code_fetch` reading the job's spotnb wheel from the store, pip installing it and its pinned
dependencies from the package index, the agent writing the gs:// store through gcsfs against
the GCS emulator (`gcp-storage-emulator`), and spotnb's metadata emulator answering the agent's
GcpWatcher in GCE's `instance/preempted` format (long poll with etags).

What is faked, and why: Compute Engine's control plane (instances, zones, zone operations) has
no emulator and cannot run here, so `tests/gce_fake.FakeCompute` answers it below `requests`
(never a hand-written client object: a wrong field or keyword fails in the SDK). The VM's
identity is `tests/gce_fake.GceIdentity`: the GCE metadata server's service-account endpoints,
which google-auth on the VM reads for gcsfs's token; the notebook's own Application Default
Credentials are a service account key file whose token endpoint is the same stub. The "hypervisor" is
`VMRunner`: it boots each PROVISIONING instance by running its startup-script with bash in an
empty folder, with a Python that has torch and not spotnb (`tests/support/vm_image.py`: SPOTNB_PYTHON
stands for the Deep Learning VM's /opt/conda/bin/python); SPOTNB_POWEROFF_CMD marks the instance
TERMINATED in the fake (a guest shutdown), as `shutdown -h now` would.

Then every artefact is scanned for the canary credentials (the notebook's private key, its id
and access token, the VM's access token, and the AWS canaries).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.providers.gcp.provider import GCPProvider
from spotnb.providers.local.metadata import MetadataEmulator
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.fake_cloud import *  # noqa: F401,F403 - fixtures: image, emulator
from tests.support.fake_cloud import (
    assert_no_canary,
    assert_survived_like_cloud_images,
    fit,
    survive_a_preemption,
)
from tests.support.gce_fake import FakeCompute, GceIdentity

pytestmark = pytest.mark.jobs

PROJECT = "spotnb-e2e"
REGION = "us-central1"


class VMRunner:
    """The hypervisor: boots every PROVISIONING instance of `compute` once, as a local process
    running its `startup-script` with bash from `image` (torch, no spotnb)."""

    def __init__(
        self,
        workdir: Path,
        compute: FakeCompute,
        emulator: MetadataEmulator,
        identity: GceIdentity,
        image: Path,
        poweroff_url: str,
    ) -> None:
        self.workdir, self.compute, self.emulator = workdir, compute, emulator
        self.identity, self.image, self.poweroff_url = identity, image, poweroff_url
        self.procs: dict[str, subprocess.Popen] = {}
        self.scripts: dict[str, str] = {}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            for inst in self.compute.provisioning():
                try:
                    self._boot(inst)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    self.errors.append(exc)

    def _boot(self, inst: dict[str, Any]) -> None:
        name, zone = inst["name"], inst["zone"].rsplit("/", 1)[-1]
        items = {i["key"]: i.get("value", "") for i in inst["metadata"]["items"]}
        script = items["startup-script"]
        self.scripts[name] = script
        path = self.workdir / f"{name}.sh"
        path.write_text(script)
        self.emulator.register(name)
        poweroff = self.workdir / f"{name}-poweroff.sh"  # "the guest shuts down"
        poweroff.write_text(
            f'#!/bin/sh\nexec {sys.executable} -c "import urllib.request; urllib.request.urlopen('
            f"'{self.poweroff_url}/{zone}/{name}', data=b'').read()\"\n"
        )
        poweroff.chmod(0o755)
        vm = self.workdir / name  # the VM's disk: nothing of this checkout on it
        (vm / "home").mkdir(parents=True)
        drop = ("PYTHONPATH", "VIRTUAL_ENV", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG")
        env = {
            **{k: v for k, v in os.environ.items() if k not in drop},
            **self.identity.vm_env(),  # the VM's service account, from its metadata server
            "HOME": str(vm / "home"),
            "CLOUDSDK_CONFIG": str(vm / "home" / "gcloud"),
            "SPOTNB_PYTHON": str(self.image),  # the image's Python (torch, no spotnb)
            "SPOTNB_LOG": str(self.workdir / f"{name}.log"),
            "SPOTNB_POWEROFF_CMD": str(poweroff),
            "SPOTNB_VENV": str(vm / "venv"),
            "SPOTNB_WORKDIR": str(vm / "work"),
            "SPOTNB_METADATA_URL": self.emulator.base_url(name),
        }
        self.compute.boot(zone, name)
        self.procs[name] = subprocess.Popen(["bash", str(path)], env=env, cwd=vm, start_new_session=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class PowerButton:
    """A loopback endpoint the VMs' SPOTNB_POWEROFF_CMD calls: POST /<zone>/<name> powers the
    instance off in the fake (GCE keeps it, TERMINATED, until it is deleted)."""

    def __init__(self, compute: FakeCompute) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                _, zone, name = self.path.split("/", 2)
                compute.power_off(zone, name)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The notebook's ADC (an authorized_user file) and the VMs' metadata-server identity."""
    ident = GceIdentity(PROJECT)
    adc = tmp_path / "notebook-gcloud"
    adc.mkdir()
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(ident.key_file(adc)))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(adc))
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    try:  # gcsfs pickles the credentials it used to ~/.gcs_tokens: keep the test's out of $HOME
        import gcsfs.credentials

        monkeypatch.setattr(gcsfs.credentials, "tfile", str(tmp_path / "gcs_tokens"))
        monkeypatch.setattr(gcsfs.credentials.GoogleCredentials, "tokens", {})
    except ImportError:
        pass
    yield ident
    ident.close()


def test_job_on_fake_gce_survives_preemption_and_leaks_no_credential(
    gs_store_url: str,
    emulator: MetadataEmulator,
    identity: GceIdentity,
    tmp_path: Path,
    spotnb_home: Path,
    image: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    compute = FakeCompute(PROJECT, REGION)
    clients = compute.clients()

    class Wired(GCPProvider):
        """The real provider, its clients on the fake Compute API, described every second
        (a real project's API quota asks for 10 s; the fake has none)."""

        describe_interval = 1.0

        def __init__(self, config: Any) -> None:
            super().__init__(config, **clients)

    monkeypatch.setattr("spotnb.api.get_provider_class", lambda name: Wired)
    button = PowerButton(compute)
    runner = VMRunner(tmp_path, compute, emulator, identity, image, button.url)

    cfg = spot.Config(
        provider="gcp",
        store=gs_store_url,
        region=REGION,
        instance_type="g2-standard-4",
        gcp_project=PROJECT,
        notice_poll="0.1s",
        heartbeat_timeout="60s",
        ship_modules=["tests.support.fake_cloud"],
    )
    started = time.monotonic()
    # driven from a thread of this process: a detached controller process could not reach the
    # fake Compute API (google-cloud-compute reads no endpoint override from the environment)
    job = spot.train(fit, cfg, detach=False)
    try:  # GCE: instance/preempted turns TRUE
        result = survive_a_preemption(
            job,
            lambda vm: emulator.notify(vm, time.time() + 30),
            tmp_path,
            lambda: print("compute requests:", [(r.method, r.path) for r in compute.adapter.requests][-30:]),
        )
    finally:
        job.stop(wait=True, timeout=30) if not job.done else None
        runner.close()
        button.close()
    print(f"job: {time.monotonic() - started:.1f} s")
    assert runner.errors == []
    assert_survived_like_cloud_images(
        job, result, "gcp", [tmp_path / f"{n}.log" for n in runner.scripts], image
    )

    # -- the Compute API saw what GCE would: two Spot inserts, then both VMs deleted -------------
    sent = [(r.method, r.path.rsplit("/", 2)[-2:]) for r in compute.adapter.requests]
    inserts = [r for r in compute.adapter.requests if r.method == "POST" and r.path.endswith("/instances")]
    assert len(inserts) == 2, sent
    for req in inserts:
        assert req.body["scheduling"]["provisioningModel"] == "SPOT"
        assert req.body["scheduling"]["instanceTerminationAction"] == "DELETE"
        assert req.body["labels"]["spotnb-job"]
    assert compute.left() == [], compute.left()  # no instance left, not even a TERMINATED one
    assert sorted(compute.deleted) == sorted(runner.scripts)
    # the VMs wrote the store with their service account's token from the metadata server
    assert identity.requests["/computeMetadata/v1/instance/service-accounts/default/token"] >= 2

    # -- credentials: nothing spotnb wrote or sent holds a canary --------------------------------
    blobs: dict[str, bytes] = {}
    fs = gcsfs.GCSFileSystem(token="anon")
    bucket = gs_store_url.split("/")[2]
    for key in fs.find(bucket):
        blobs[f"gs://{key}"] = fs.cat_file(key)
    for name, script in runner.scripts.items():  # what the VM was given
        blobs[f"startup-script:{name}"] = script.encode()
    for req in compute.adapter.requests:  # everything sent to the Compute API
        blobs[f"compute:{req.method} {req.url}"] = repr(req.body).encode()
    assert_no_canary(blobs, job, spotnb_home, tmp_path, identity.secrets())


def test_the_default_instance_type_is_a_gce_machine_type_or_refused_before_any_insert() -> None:
    """A GCP job that names no instance_type must get a GCE machine type, or be refused by
    validate() naming instance_type, before anything is sent to Compute Engine."""
    from spotnb.errors import ConfigError

    compute = FakeCompute(PROJECT, REGION)
    cfg = spot.Config(provider="gcp", store="gs://bucket/store", region=REGION, gcp_project=PROJECT)
    try:
        GCPProvider(cfg, **compute.clients()).validate()
    except ConfigError as exc:
        assert "instance_type" in str(exc)
    else:
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", str(cfg.instance_type)), cfg.instance_type
    assert compute.adapter.requests == []
