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
empty folder, with a Python that has torch and not spotnb (`tests/vm_image.py`: SPOTNB_PYTHON
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
from spotnb.providers.gcp import GCPProvider
from spotnb.providers.local.metadata import MetadataEmulator
from tests.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.clouds_fixtures import CANARIES
from tests.gce_fake import FakeCompute, GceIdentity
from tests.vm_image import torch_only_python

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
    return torch_only_python(tmp_path_factory.mktemp("image") / "conda")


@pytest.fixture
def emulator() -> Any:
    em = MetadataEmulator()
    yield em
    em.close()


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
        provider="gcp",
        store=gs_store_url,
        region=REGION,
        instance_type="g2-standard-4",
        gcp_project=PROJECT,
        notice_poll="0.1s",
        heartbeat_timeout="60s",
    )
    started = time.monotonic()
    # driven from a thread of this process: a detached controller process could not reach the
    # fake Compute API (google-cloud-compute reads no endpoint override from the environment)
    job = spot.train(fit, cfg, detach=False)
    try:
        _wait(
            lambda: any(
                e["kind"] == "progress" and e["incarnation"] == 1 and e["step"] >= 10 for e in job.events
            ),
            90,
            "incarnation 1 to reach step 10",
        )
        inst1 = next(
            e["instance_id"] for e in job.events if e["kind"] == "allocated" and e["incarnation"] == 1
        )
        emulator.notify(inst1, time.time() + 30)  # GCE: instance/preempted turns TRUE
        result = job.result(timeout=150)
    except BaseException:
        for e in job.events:
            print({k: v for k, v in e.items() if k not in ("config", "rows", "traceback")})
        for log in tmp_path.glob("*.log"):
            print(log, log.read_text()[-3000:])
        print("compute requests:", [(r.method, r.path) for r in compute.adapter.requests][-30:])
        raise
    finally:
        job.stop(wait=True, timeout=30) if not job.done else None
        runner.close()
        button.close()
    print(f"job: {time.monotonic() - started:.1f} s")
    assert runner.errors == []
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
    assert [(b["cloud"], b["installed"]) for b in boots] == [("gcp", 1), ("gcp", 1)]  # each VM installed
    assert len(runner.scripts) == 2
    for log in (tmp_path / f"{name}.log" for name in runner.scripts):
        text = log.read_text()
        assert "spotnb code: " in text and "checked (sha256" in text  # the store's wheel, checked
        assert f"{image}, the image's torch" in text and "installing torch" not in text
    print("install seconds per VM:", [round(b["install_s"], 1) for b in boots])

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
    secrets = [v.encode() for v in CANARIES.values()] + identity.secrets()
    blobs: dict[str, bytes] = {}
    fs = gcsfs.GCSFileSystem(token="anon")
    bucket = gs_store_url.split("/")[2]
    for key in fs.find(bucket):
        blobs[f"gs://{key}"] = fs.cat_file(key)
    assert any(k.endswith("spec.json") for k in blobs) and any("MANIFEST" in k for k in blobs)
    for path in spotnb_home.rglob("*"):  # job DB, logs
        if path.is_file():
            blobs[str(path)] = path.read_bytes()
    for name, script in runner.scripts.items():  # what the VM was given
        blobs[f"startup-script:{name}"] = script.encode()
    for req in compute.adapter.requests:  # everything sent to the Compute API
        blobs[f"compute:{req.method} {req.url}"] = repr(req.body).encode()
    for path in tmp_path.glob("*.log"):  # what the VM printed
        blobs[str(path)] = path.read_bytes()
    blobs["events"] = repr(job.events).encode()
    assert len(blobs) > 10
    leaks = [name for name, data in blobs.items() if any(s in data for s in secrets)]
    assert leaks == []


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
