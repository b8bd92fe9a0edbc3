"""`spotnb doctor --provider gcp` through google-cloud-compute's REST transport, google-auth and
gcsfs.

Compute Engine, IAM, the bucket's and the project's IAM policies and the Cloud Billing catalog
have no emulator: a `requests` transport adapter answers them in their REST shapes
(`GoogleApis`, after `tests/support/gcp_transport.py`), mounted on the sessions of the doctor's real
clients (its `http_adapter` hook). The credentials are a real service-account key file (a fresh
RSA key) whose token endpoint is a loopback server, so google-auth signs and exchanges a JWT as
it does against Google. The store is the GCS emulator over real HTTP (gcsfs, as a job writes it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from requests.adapters import BaseAdapter

from spotnb.doctor.report import FAIL, OK, SKIP, UNKNOWN, Report, doctor
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.clouds_fixtures import free_port
from tests.support.doctor_proxy import RuleProxy
from tests.support.gcp_transport import gce_error
from tests.support.paths import FIXTURES

PROJECT = "spotnb-test"
SA = f"123-compute@{PROJECT}.iam.gserviceaccount.com"
CATALOG = json.loads((FIXTURES / "gcp_catalog" / "skus.json").read_text())["pages"]
COMPUTE = f"/compute/v1/projects/{PROJECT}"


class GoogleApis(BaseAdapter):
    """Compute Engine, IAM, Cloud Storage's IAM, Resource Manager and the billing catalog, as
    knobs; anything else is answered 501 (never forwarded)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpus_all_regions = 1.0
        self.sa_exists = True
        self.bucket_roles = ["roles/storage.objectAdmin"]
        self.broken: tuple[int, Any] | None = None  # every Compute Engine answer
        self.api_disabled = False
        self.requests: list[str] = []

    def answer(self, method: str, host: str, path: str) -> tuple[int, Any]:
        if host == "compute.googleapis.com":
            if self.broken is not None:
                return self.broken
            if self.api_disabled:
                message = (
                    f"Compute Engine API has not been used in project {PROJECT} before or it is disabled."
                )
                return 403, gce_error(403, message, "accessNotConfigured")
            return self.compute(path)
        if host == "iam.googleapis.com":
            if self.sa_exists and path.endswith(f"/serviceAccounts/{SA}"):
                return 200, {"email": SA, "disabled": False}
            return 404, gce_error(404, "Unknown service account")
        if host == "storage.googleapis.com" and path.endswith("/iam"):
            return 200, {
                "bindings": [{"role": r, "members": [f"serviceAccount:{SA}"]} for r in self.bucket_roles]
            }
        if host == "cloudresourcemanager.googleapis.com":
            return 200, {"bindings": [{"role": "roles/viewer", "members": [f"serviceAccount:{SA}"]}]}
        if host == "cloudbilling.googleapis.com":
            return 200, CATALOG[0]  # one page: its nextPageToken asks the second
        return 501, gce_error(501, f"the test does not serve {host}", "x")

    def compute(self, path: str) -> tuple[int, Any]:
        if path == f"{COMPUTE}/regions/us-central1":
            quotas = [
                {"metric": "CPUS", "limit": 24, "usage": 0},
                {"metric": "G2_CPUS", "limit": 8, "usage": 0},
                {"metric": "NVIDIA_L4_GPUS", "limit": 1, "usage": 0},
                {"metric": "PREEMPTIBLE_NVIDIA_L4_GPUS", "limit": 0, "usage": 0},
            ]
            zones = [f"https://www.googleapis.com{COMPUTE}/zones/us-central1-{z}" for z in "abc"]
            return 200, {"name": "us-central1", "status": "UP", "zones": zones, "quotas": quotas}
        if path.startswith(f"{COMPUTE}/zones/us-central1-") and path.endswith("/machineTypes/g2-standard-4"):
            accel = [{"guestAcceleratorType": "nvidia-l4", "guestAcceleratorCount": 1}]
            return 200, {"name": "g2-standard-4", "guestCpus": 4, "memoryMb": 16384, "accelerators": accel}
        if path == COMPUTE:
            quotas = [{"metric": "GPUS_ALL_REGIONS", "limit": self.gpus_all_regions, "usage": 0}]
            return 200, {"name": PROJECT, "defaultServiceAccount": SA, "quotas": quotas}
        if (
            path
            == "/compute/v1/projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
        ):
            return 200, {"name": "pytorch-2-13-cu128-v20261101", "family": "pytorch-latest-gpu"}
        if path == f"{COMPUTE}/zones":
            region = f"https://www.googleapis.com{COMPUTE}/regions/us-central1"
            return 200, {
                "items": [{"name": f"us-central1-{z}", "status": "UP", "region": region} for z in "abc"]
            }
        return 404, gce_error(404, f"The resource 'projects/{PROJECT}/{path}' was not found")

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        split = urlsplit(request.url or "")
        self.requests.append(f"{request.method} {split.hostname}{split.path}")
        status, payload = self.answer(request.method or "", split.hostname or "", split.path)
        if split.hostname == "cloudbilling.googleapis.com" and "pageToken=page-2" in (split.query or ""):
            payload = CATALOG[1]
        response = requests.Response()
        response.status_code = status
        response.url = request.url or ""
        response.request = request
        response.headers["Content-Type"] = "application/json; charset=UTF-8"
        response._content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        response.encoding = "utf-8"
        return response

    def close(self) -> None:
        pass


def _key_file(path: Path, token_uri: str) -> Path:
    """A service-account key file as IAM issues one, with a fresh RSA key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    info = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "doctor-test",
        "private_key": pem,
        "client_email": f"notebook@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
    path.write_text(json.dumps(info))
    return path


_KEY: list[str] = []  # one RSA key per session (generating one takes a while on a busy machine)


class TokenServer:
    """OAuth 2.0's token endpoint: it grants every JWT, or refuses them all."""

    def __init__(self) -> None:
        self.refuse = False
        self.proxy = RuleProxy("http://127.0.0.1:1", self)

    def __call__(self, r: Any) -> Any:
        if self.refuse:
            body = {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
            return 400, "application/json", json.dumps(body).encode()
        body = {"access_token": "doctor-test-token", "expires_in": 3600, "token_type": "Bearer"}
        return 200, "application/json", json.dumps(body).encode()


@pytest.fixture
def google(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[GoogleApis, TokenServer]]:
    tokens = TokenServer()
    key = tmp_path / "key.json"
    if _KEY:
        info = json.loads(_KEY[0])
        info["token_uri"] = f"{tokens.proxy.url}/token"
        key.write_text(json.dumps(info))
    else:
        _KEY.append(_key_file(key, f"{tokens.proxy.url}/token").read_text())
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    yield GoogleApis(), tokens
    tokens.proxy.close()


def _run(store: str, apis: GoogleApis | None, **kw: Any) -> Report:
    fields = {
        "store": store,
        "region": "us-central1",
        "instance_type": "g2-standard-4",
        "gcp_project": PROJECT,
        **kw,
    }
    hooks = {"http_adapter": apis} if apis is not None else {}
    report = doctor(provider="gcp", timeout=fields.pop("timeout", 8), hooks=hooks, **fields)
    print(report.text())
    return report


def test_every_check_passes(google: Any, gs_store_url: str) -> None:
    apis, _ = google
    report = _run(gs_store_url, apis)
    lines = dict(report.results)
    assert all(r.status == OK for r in lines.values()), report.text()
    assert report.exit_code == 0
    assert (
        "$GOOGLE_APPLICATION_CREDENTIALS" in lines["credentials"].detail
        and PROJECT in lines["credentials"].detail
    )
    assert "1 × nvidia-l4" in lines["instance type"].detail
    quota = lines["spot quota"].detail
    assert "G2_CPUS" in quota and "NVIDIA_L4_GPUS" in quota and "GPUS_ALL_REGIONS" in quota
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS" not in quota  # its limit is 0: spot VMs use the regular one
    assert (
        "roles/storage.objectAdmin" in lines["identity"].detail
        and "not checked: groups" in lines["identity"].detail
    )
    assert "pytorch-2-13" in lines["image"].detail
    assert "Cloud Billing catalog" in lines["prices"].detail


def test_each_gcp_check_fails_with_its_fix(google: Any, gs_store_url: str) -> None:
    apis, _ = google
    apis.gpus_all_regions = 0
    apis.bucket_roles = ["roles/storage.objectViewer"]
    bucket = gs_store_url.split("/")[2]
    report = _run(
        f"gs://{bucket}x/store",
        apis,
        gcp_image="projects/deeplearning-platform-release/global/images/family/nope",
    )
    lines = dict(report.results)
    assert report.exit_code == 1
    assert (
        lines["spot quota"].status == FAIL
        and "GPUS_ALL_REGIONS 0/0 in use, needs 1" in lines["spot quota"].detail
    )
    assert "console.cloud.google.com/iam-admin/quotas" in lines["spot quota"].fix
    assert lines["identity"].status == FAIL and "no role that writes" in lines["identity"].detail
    assert "add-iam-policy-binding" in lines["identity"].fix
    assert lines["image"].status == FAIL and "family/nope" in lines["image"].detail
    assert lines["store"].status == FAIL and "does not exist" in lines["store"].detail
    apis.sa_exists = False
    lines = dict(
        _run(gs_store_url, apis, gcp_service_account=f"nobody@{PROJECT}.iam.gserviceaccount.com").results
    )
    assert lines["identity"].status == FAIL and "no service account" in lines["identity"].detail


def test_wrong_names_and_a_disabled_api(google: Any, gs_store_url: str) -> None:
    apis, _ = google
    lines = dict(_run(gs_store_url, apis, region="us-central9").results)
    assert lines["region"].status == FAIL and "did you mean us-central1" in lines["region"].fix
    assert lines["instance type"].detail == "skipped: needs region"
    lines = dict(_run(gs_store_url, apis, instance_type="g2-standard-5").results)
    assert lines["instance type"].status == FAIL and "us-central1-a" in lines["instance type"].detail
    assert lines["spot quota"].status == SKIP
    apis.api_disabled = True
    lines = dict(_run(gs_store_url, apis).results)
    assert (
        lines["region"].status == FAIL
        and "gcloud services enable compute.googleapis.com" in lines["region"].fix
    )


def test_refused_and_missing_credentials(
    google: Any, gs_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    apis, tokens = google
    tokens.refuse = True
    lines = dict(_run(gs_store_url, apis).results)
    assert lines["credentials"].status == FAIL and "invalid_grant" in lines["credentials"].detail
    assert lines["store"].detail == "skipped: needs credentials"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
    lines = dict(_run(gs_store_url, apis).results)
    assert lines["credentials"].status == FAIL and "not a file" in lines["credentials"].detail


@pytest.mark.parametrize(
    "fault",
    [(500, gce_error(500, "backend error", "backendError")), (200, b"<html>not json")],
    ids=["500", "garbage"],
)
def test_compute_answering_errors_or_garbage(google: Any, gs_store_url: str, fault: Any) -> None:
    apis, _ = google
    apis.broken = fault
    report = _run(gs_store_url, apis)
    lines = dict(report.results)
    assert lines["credentials"].status == OK and lines["store"].status == OK
    assert lines["region"].status == UNKNOWN and "Google Cloud answered" in lines["region"].detail
    assert lines["image"].status == UNKNOWN
    assert report.exit_code == 2 and "Traceback" not in report.text()


def test_offline_every_check_says_it_could_not_reach_google(
    google: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key file whose token endpoint is a closed port, the storage emulator's too, no adapter
    (the SDKs' own transports): every line '?', at once."""
    closed = f"http://127.0.0.1:{free_port()}"
    info = json.loads(_KEY[0])
    info["token_uri"] = f"{closed}/token"
    key = tmp_path / "offline-key.json"
    key.write_text(json.dumps(info))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", closed)
    t0 = time.monotonic()
    report = _run("gs://some-bucket/jobs", None)
    print(f"offline doctor took {time.monotonic() - t0:.2f} s")
    for name, r in report.results[1:]:
        assert r.status == UNKNOWN and "could not reach" in r.detail, (name, r.detail)
    assert report.exit_code == 2
