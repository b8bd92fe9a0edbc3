"""Fixtures that start the cloud emulators on 127.0.0.1 free ports, once per test session.

- `moto_server` (pip `moto[server]`): EC2, IAM and S3 over real HTTP; boto3 and s3fs reach it
  through `AWS_ENDPOINT_URL`.
- Azurite (npm `azurite`): Blob storage; adlfs reaches it through the development connection
  string in `AZURE_STORAGE_CONNECTION_STRING`.
- `gcp-storage-emulator` (pip): GCS; gcsfs reaches it through `STORAGE_EMULATOR_HOST`.

Every credential set here is a recognisable canary (`CANARIES`) so a test can scan whatever
spotnb wrote for it. A missing emulator skips its tests with the install command.
Test files use `pytest_plugins = ["tests.support.clouds_fixtures"]`-free direct imports:
`from tests.support.clouds_fixtures import *`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# gcsfs reads this at import time: without it, it asks each bucket's type over gRPC/TLS,
# which the emulator cannot answer, and waits a minute per bucket (docs/dev/notices.md, "Cloud notices").
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

__all__ = [
    "moto_endpoint",
    "aws_env",
    "azurite_endpoint",
    "azure_env",
    "gcs_endpoint",
    "gcs_env",
    "CANARIES",
    "AZURITE_KEY",
    "free_port",
    "s3_store_url",
    "az_store_url",
    "gs_store_url",
    "ship_fake",
]

CANARIES = {
    "AWS_ACCESS_KEY_ID": "AKIASPOTNBCANARY7Q2X",
    "AWS_SECRET_ACCESS_KEY": "spotnb-canary-aws-secret-9f8e7d6c5b4a",
    "AWS_SESSION_TOKEN": "spotnb-canary-aws-session-token-0a1b2c",
}
# Azurite's published development key (not a secret, but it must not leak into artefacts either).
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen, what: str) -> None:
    """Poll until the server answers any HTTP status (bounded; not a sleep hiding a race)."""
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")
        try:
            urllib.request.urlopen(url, timeout=1.0).close()
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer on {url} within {_START_TIMEOUT:.0f} s")


def _start(cmd: list[str], url: str, what: str, log: Path) -> subprocess.Popen:
    out = open(log, "wb")  # noqa: SIM115 - the server process writes it until the fixture ends
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        _wait_http(url, proc, what)
    except Exception:
        _stop(proc)
        raise
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- AWS ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = shutil.which("moto_server")
    if exe is None:
        pytest.skip("moto_server not installed: pip install 'moto[server]>=5.1'")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        f"{url}/moto-api/",
        "moto_server",
        tmp_path_factory.mktemp("moto") / "moto.log",
    )
    yield url
    _stop(proc)


def _forget_s3fs() -> None:
    """fsspec caches filesystem instances by their arguments, not by the environment they read
    their endpoint from: forget them whenever AWS_ENDPOINT_URL changes."""
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def aws_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """boto3/s3fs pointed at moto with canary credentials; returns the endpoint."""
    _forget_s3fs()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for key, value in CANARIES.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    yield moto_endpoint
    _forget_s3fs()


@pytest.fixture
def s3_store_url(aws_env: str) -> str:
    import boto3

    bucket = f"spotnb-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/store"


# -- Azure -------------------------------------------------------------------------------------
def _azurite_exe() -> str | None:
    found = shutil.which("azurite-blob")
    if found:
        return found
    for prefix in (os.environ.get("SPOTNB_NPM_PREFIX"), str(Path.home() / ".cache/spotnb/azurite")):
        if prefix:
            exe = Path(prefix) / "node_modules" / ".bin" / "azurite-blob"
            if exe.exists():
                return str(exe)
    return None


@pytest.fixture(scope="session")
def azurite_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = _azurite_exe()
    if exe is None:
        pytest.skip("azurite not installed: run scripts/setup.d/30-clouds.sh (npm install azurite)")
    port = free_port()
    data = tmp_path_factory.mktemp("azurite")
    url = f"http://127.0.0.1:{port}/devstoreaccount1"
    proc = _start(
        [
            exe,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(data),
            "--skipApiVersionCheck",
            "--loose",
        ],
        f"http://127.0.0.1:{port}/",
        "azurite",
        data / "azurite.log",
    )
    yield url
    _stop(proc)


@pytest.fixture
def azure_env(azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    conn = (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={azurite_endpoint};"
    )
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    return conn


@pytest.fixture
def az_store_url(azure_env: str) -> str:
    from azure.storage.blob import BlobServiceClient

    container = f"spotnb-{uuid.uuid4().hex[:10]}"
    BlobServiceClient.from_connection_string(azure_env).create_container(container)
    return f"az://{container}/store"


# -- GCP ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = shutil.which("gcp-storage-emulator")
    if exe is None:
        pytest.skip("gcp-storage-emulator not installed: pip install gcp-storage-emulator")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(
        [exe, "start", "--host=127.0.0.1", f"--port={port}", "--in-memory"],
        f"{url}/storage/v1/b",
        "gcp-storage-emulator",
        tmp_path_factory.mktemp("gcs") / "gcs.log",
    )
    yield url
    _stop(proc)


@pytest.fixture
def gcs_env(gcs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    return gcs_endpoint


@pytest.fixture
def gs_store_url(gcs_env: str) -> str:
    import gcsfs

    bucket = f"spotnb-{uuid.uuid4().hex[:10]}"
    gcsfs.GCSFileSystem(endpoint_url=gcs_env, token="anon").mkdir(bucket)
    return f"gs://{bucket}/store"


# -- a shipped spotnb where no store is reachable ------------------------------------------------
def ship_fake(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bytes | None]]:
    """Stand in for the job's shipped spotnb (`spotnb.providers.shipping.code_for_launch`) where the store
    is not reachable (the fake SDK transports): a fixed wheel reference with the extras asked
    for. Returns the (job, key) of every call."""
    from spotnb.providers import shipping

    calls: list[tuple[str, bytes | None]] = []

    def fake(config: Any, job_id: str, extras: Any = (), key: bytes | None = None) -> Any:
        calls.append((job_id, key))
        ref = shipping.CodeRef(f"{config.store_url()}/code/spotnb-0.1.0-{'a' * 64}.whl", "a" * 64, 1, "0.1.0")
        return ref.with_extras(extras)

    monkeypatch.setattr(shipping, "code_for_launch", fake)
    return calls


# -- fault injection in front of moto ------------------------------------------------------------
class FaultProxy:
    """A loopback HTTP proxy in front of moto_server that answers chosen EC2 actions in chosen
    regions with an EC2 error document (moto cannot simulate a capacity shortage). Everything
    else is forwarded unchanged. The region is read from the SigV4 credential scope."""

    def __init__(self, upstream: str) -> None:
        import http.client
        import re
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import parse_qs, urlsplit

        self.upstream = urlsplit(upstream)
        self.rules: dict[tuple[str, str], tuple[int, str, str | None]] = {}
        self.messages: dict[tuple[str, str], str] = {}  # (action, region) → its error's message
        self.raw: dict[tuple[str, str], tuple[int, bytes]] = {}  # (action, region) → a raw answer
        # (X-Amz-Target, region) → (status, JSON document): JSON-protocol services (Service Quotas)
        self.json_answers: dict[tuple[str, str], tuple[int, Any]] = {}
        self.hits: list[tuple[str, str]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                scope = re.search(r"Credential=[^/]+/\d+/([^/]+)/", self.headers.get("Authorization", ""))
                region = scope.group(1) if scope else ""
                action = parse_qs(body.decode(errors="replace")).get("Action", [""])[0]
                target = self.headers.get("X-Amz-Target", "")
                if target and (target, region) in proxy.json_answers:
                    proxy.hits.append((target, region))
                    status, document = proxy.json_answers[(target, region)]
                    data = json.dumps(document).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/x-amz-json-1.1")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if (action, region) in proxy.raw:
                    proxy.hits.append((action, region))
                    status, data = proxy.raw[(action, region)]
                    self.send_response(status)
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                rule = proxy.rules.get((action, region))
                if rule is not None and (rule[2] is None or rule[2] in body.decode(errors="replace")):
                    proxy.hits.append((action, region))
                    status, code, _ = rule
                    message = proxy.messages.get(
                        (action, region), f"injected by the test: no capacity for this request in {region}"
                    )
                    doc = (
                        f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error>'
                        f"<Code>{code}</Code><Message>{message}</Message></Error></Errors>"
                        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
                    ).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    self.wfile.write(doc)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fail(
        self,
        action: str,
        region: str,
        code: str = "InsufficientInstanceCapacity",
        status: int = 500,
        when: str | None = None,
        message: str | None = None,
    ) -> None:
        """Answer `action` in `region` with `code` (and `message`, EC2's words); with `when`, only
        requests whose body holds that text (e.g. "InstanceMarketOptions": the spot launches,
        not an on-demand one)."""
        self.rules[(action, region)] = (status, code, when)
        if message is not None:
            self.messages[(action, region)] = message

    def answer_raw(self, action: str, region: str, status: int, body: bytes) -> None:
        """Answer `action` in `region` with `body` as it is (a body that is no EC2 document)."""
        self.raw[(action, region)] = (status, body)

    def answer_json(self, target: str, region: str, status: int, document: Any) -> None:
        """Answer the JSON-protocol call `target` (its X-Amz-Target, e.g.
        "ServiceQuotasV20190624.GetServiceQuota") in `region` with `document` (moto's Service
        Quotas knows no EC2 quota)."""
        self.json_answers[(target, region)] = (status, document)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ec2_faults(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """boto3 pointed at a FaultProxy in front of moto; `ec2_faults.fail(action, region)`."""
    proxy = FaultProxy(aws_env)
    _forget_s3fs()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    yield proxy
    _forget_s3fs()
    proxy.close()


__all__ += ["FaultProxy", "ec2_faults"]
