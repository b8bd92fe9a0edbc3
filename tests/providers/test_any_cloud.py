"""provider="any": one job's zones ranked across the clouds the user has credentials for.

AWS runs against moto_server over real HTTP (prices from `describe_spot_price_history`, the
store's bucket region from `GetBucketLocation`); Azure's prices come from recorded Retail
Prices pages served over HTTP (tests/support/fixtures/azure_retail); GCP's from the dated table. The
Azure and GCP compute control planes have no emulator, so they are answered in-process behind
the REAL SDK clients: Azure's ComputeManagementClient over `tests/azure_transport.ArmTransport`
(`ArmCompute`), google-cloud-compute's REST clients over `tests/gce_fake.FakeCompute`; what is
asserted is the request each SDK serialised.
Credentials are looked for for real (`has_credentials`), in an environment each test sets."""

from __future__ import annotations

import http.server
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.control.jobdb import JobDB
from spotnb.errors import ConfigError
from spotnb.market.prices import Price
from spotnb.providers import multi
from spotnb.providers.aws.provider import AWSProvider
from spotnb.providers.azure import provider as azure
from spotnb.providers.azure.provider import AzureProvider
from spotnb.providers.base import InstanceState, LaunchSpec
from spotnb.providers.gcp.provider import GCPProvider
from tests.providers.azure.test_provider import IDENTITY, RG, SUB, SUBNET
from tests.providers.gcp.test_provider import PROJECT
from tests.support import jobfns
from tests.support.azure_transport import ArmCompute, compute_client, resource_client
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.gce_fake import FakeCompute
from tests.support.paths import FIXTURES

TYPES = {"aws": "g5.xlarge", "azure": "Standard_NC4as_T4_v3", "gcp": "g2-standard-4"}
PAGES = FIXTURES / "azure_retail"


def _config(store: str = "s3://spotnb-nowhere/jobs", **kw: Any) -> spot.Config:
    base: dict[str, Any] = dict(
        provider="any",
        instance_type=TYPES,
        regions=["aws/us-west-2a", "aws/us-east-1a", "azure/eastus", "gcp/us-central1-a"],
        store=store,
        aws_image_id="ami-12345678",
        azure_subscription_id=SUB,
        azure_resource_group=RG,
        azure_subnet_id=SUBNET,
        azure_identity_id=IDENTITY,
        gcp_project=PROJECT,
        gcp_service_account="spotnb@spotnb-test.iam.gserviceaccount.com",
    )
    return spot.Config(**{**base, **kw})


def _spec(region: str) -> LaunchSpec:
    return LaunchSpec(
        job_id="20261125-000000-any001",
        incarnation=1,
        store_url="s3://spotnb-nowhere/jobs",
        instance_type="aws:g5.xlarge, azure:Standard_NC4as_T4_v3, gcp:g2-standard-4",
        region=region,
        command=["python", "-m", "spotnb.runtime.agent"],
        job_key="00" * 32,
    )


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An environment where no cloud's credentials can be found."""
    for key in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AZURE_CLIENT_ID",
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_SECRET",
        "IDENTITY_ENDPOINT",
        "MSI_ENDPOINT",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # not an EC2 machine: no IMDS wait
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "azure"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))


class _Retail:
    """The Retail Prices API, served from the recorded pages; `mode` "garbage" answers HTML."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.asked = 0
        retail = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                retail.asked += 1
                if retail.mode == "garbage":
                    body = b"<html>502 Bad Gateway</html>"
                else:
                    page = json.loads(
                        (PAGES / ("page2.json" if "page=2" in self.path else "page1.json")).read_text()
                    )
                    if page.get("NextPageLink"):
                        page["NextPageLink"] = f"http://127.0.0.1:{retail.port}/prices?page=2"
                    body = json.dumps(page).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def retail(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Retail]:
    served = _Retail()
    monkeypatch.setattr(azure, "_RETAIL_API", f"http://127.0.0.1:{served.port}/prices")
    yield served
    served.server.shutdown()


class MockedAzure(AzureProvider):
    """The Azure provider on the real Azure SDK clients, Resource Manager answered in-process
    (`ArmCompute` behind `ArmTransport`: the control plane has no emulator)."""

    def __init__(self, config: Any) -> None:
        self.arm = ArmCompute()  # `log`: (method, VM name) of every VM request the SDK sent
        super().__init__(
            config, compute=compute_client(self.arm, SUB), resources=resource_client(self.arm, SUB)
        )


class MockedGCP(GCPProvider):
    """The GCP provider on the real google-cloud-compute REST clients, Compute Engine answered
    in-process (`FakeCompute` below `requests`: the control plane has no emulator); a new VM is
    RUNNING at once."""

    def __init__(self, config: Any) -> None:
        self.gce = FakeCompute(PROJECT, "us-central1")
        self.gce.status_on_insert = lambda body: "RUNNING"
        super().__init__(config, **self.gce.clients())


@pytest.fixture
def clouds(aws_env: str, retail: _Retail, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> _Retail:
    """Credentials for the three clouds (AWS: moto's canaries; Azure: a service principal in
    the environment; GCP: an ADC file), and the mocked control planes."""
    monkeypatch.setenv("AZURE_CLIENT_ID", "spotnb-canary-client")
    monkeypatch.setenv("AZURE_TENANT_ID", "spotnb-canary-tenant")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "spotnb-canary-secret")
    adc = tmp_path / "adc.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "x", "client_secret": "y"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    classes = {"aws": AWSProvider, "azure": MockedAzure, "gcp": MockedGCP}
    monkeypatch.setattr(multi, "get_provider_class", lambda name: classes[name])
    return retail


def test_no_credentials_for_any_cloud_is_a_config_error_before_anything_is_launched(
    no_credentials: None,
) -> None:
    config = _config()
    for dry_run in (True, False):
        with pytest.raises(ConfigError) as err:
            spot.train(jobfns.slow_steps, config, dry_run=dry_run)
        text = str(err.value)
        assert "Config.provider" in text and "provider='any'" in text
        assert "aws configure" in text and "az login" in text and "gcloud auth" in text
    assert JobDB().jobs() == []  # nothing was submitted


def test_bad_mappings_are_clear_errors_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="instance_type: provider='any' needs one type per cloud"):
        _config(instance_type="g5.xlarge")
    with pytest.raises(ConfigError, match=r"'gcp/us-central1-a' is on gcp, which has no instance type"):
        _config(instance_type={"aws": "g5.xlarge", "azure": "Standard_NC4as_T4_v3"})
    with pytest.raises(ConfigError, match=r"instance_type: \['oracle'\] are not clouds"):
        _config(instance_type={**TYPES, "oracle": "VM.GPU"})
    with pytest.raises(ConfigError, match="does not name its cloud"):
        _config(regions=["us-east-1a", "gcp/us-central1-a"])
    with pytest.raises(ConfigError, match="any_clouds: 'gcp' has no instance type"):
        _config(instance_type={"aws": "g5.xlarge"}, regions="cheapest", any_clouds=["aws", "gcp"])
    with pytest.raises(ConfigError, match="regions: provider='any' picks among zones"):
        _config(regions=None)
    with pytest.raises(ConfigError, match="a mapping per cloud applies to provider='any'"):
        spot.Config(provider="aws", instance_type={"aws": "g5.xlarge"})


def test_the_dry_run_ranks_the_zones_of_every_cloud_with_the_cloud_column(
    clouds: _Retail, s3_store_url: str
) -> None:
    """Live prices of each cloud in one table: moto's zones (its spot price is a token
    $0.00001), Azure's recorded Retail Prices ($0.1578) and GCP's dated table. The store is an
    S3 bucket in us-east-1: the AWS zone beside it ranks before the one in us-west-2 at the same
    price (the checkpoint's copies cost egress there), and the other clouds' rows carry the
    egress across clouds."""
    plan = spot.train(jobfns.slow_steps, _config(store=s3_store_url), dry_run=True)
    rows = {r["zone"]: r for r in plan["placement"]}
    order = [r["zone"] for r in plan["placement"]]
    assert set(rows) == {"aws/us-west-2a", "aws/us-east-1a", "azure/eastus", "gcp/us-central1-a"}
    assert {r["cloud"] for r in plan["placement"]} == {"aws", "azure", "gcp"}
    assert order[:2] == ["aws/us-east-1a", "aws/us-west-2a"]
    assert rows["aws/us-east-1a"]["transfer"] == 0.0 < rows["aws/us-west-2a"]["transfer"]
    assert "across regions" in rows["aws/us-west-2a"]["text"]
    assert (
        "$0.158/h" in rows["azure/eastus"]["text"]
        and "across clouds (aws → azure)" in rows["azure/eastus"]["text"]
    )
    assert "$0.224/h" in rows["gcp/us-central1-a"]["text"]
    text = str(plan)
    assert "1. aws   aws/us-east-1a" in text and "azure aws" not in text  # the cloud column
    apis = [r["api"] for r in plan["requests"]]
    assert any(a.startswith("aws: ") for a in apis) and any(a.startswith("gcp: ") for a in apis)
    assert "spotnb-canary" not in json.dumps(plan, default=str)  # no credential in the plan


def test_a_launch_goes_to_the_zone_s_cloud_and_is_watched_and_ended_there(clouds: _Retail) -> None:
    p = multi.AnyCloudProvider(_config())
    p.validate()
    assert p.clouds() == ["aws", "azure", "gcp"]
    vm = p.launch(_spec("azure/eastus"))
    assert vm.region == "azure/eastus" and vm.instance_type == "Standard_NC4as_T4_v3"
    arm = p.sub("azure").arm
    sent = [method for method, _ in arm.log]
    assert sent[0] == "PUT" and "DELETE" not in sent  # created through the real SDK
    assert p.notice_settings("azure/eastus")["format"] == "azure"
    assert p.notice_settings("gcp/us-central1-a")["format"] == "gcp"
    assert p.market_key("gcp/us-central1-a") == ("gcp", "us-central1-a", "g2-standard-4", {})
    gce = p.launch(_spec("gcp/us-central1-a"))
    assert gce.region == "gcp/us-central1-a" and gce.info["cloud"] == "gcp"
    assert p.describe(gce).state == InstanceState.RUNNING
    fake = p.sub("gcp").gce
    (insert,) = fake.inserts()
    assert insert.path == f"/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances"
    assert insert.body["scheduling"]["provisioningModel"] == "SPOT"
    assert insert.body["machineType"] == "zones/us-central1-a/machineTypes/g2-standard-4"
    p.terminate(gce)
    sent = fake.adapter.requests[-1]
    assert (sent.method, sent.path) == (
        "DELETE",
        f"/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances/{gce.id}",
    )
    assert fake.instances == {}
    # a successor controller knows the instance only from its event: still reached on its cloud
    again = multi.AnyCloudProvider(_config())
    again._given = {"azure": p.sub("azure")}
    again.terminate(
        spot.providers.base.Instance(  # type: ignore[attr-defined]
            id=vm.id, provider="any", region=vm.region, instance_type="", launched_at=0.0, info=vm.info
        )
    )
    assert [method for method, _ in arm.log][-1] == "DELETE"


class _Flaky(MockedGCP):
    """GCP whose price answer is down, slow, or garbage (`how`)."""

    how = "down"
    release = threading.Event()

    def _prices(self, instance_type: str, regions: list[str] | None) -> dict[str, Price]:
        if self.how == "down":
            raise OSError("cloudbilling.googleapis.com: connection refused")
        if self.how == "slow":
            self.release.wait(60)
        if self.how == "garbage":
            return {"us-central1-a": Price(math.nan, 1.0, "?"), "us-central1-b": Price(-1.0, 1.0, "?")}
        return super()._prices(instance_type, regions)


@pytest.mark.parametrize("how", ["down", "slow", "garbage"])
def test_one_cloud_s_prices_down_slow_or_garbage_leave_out_that_cloud_only(
    clouds: _Retail, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setattr(_Flaky, "how", how)
    monkeypatch.setattr(_Flaky, "release", threading.Event())
    classes = {"aws": AWSProvider, "azure": MockedAzure, "gcp": _Flaky}
    monkeypatch.setattr(multi, "get_provider_class", lambda name: classes[name])
    p = multi.AnyCloudProvider(_config(regions=["aws/us-east-1a", "azure/eastus", "gcp/us-central1-b"]))
    # the healthy clouds' answers are in the on-disk cache (read in milliseconds), so the
    # wait below bounds the slow cloud only, which never answers until released
    p.sub("aws").prices("g5.xlarge", ["us-east-1a"])
    p.sub("azure").prices("Standard_NC4as_T4_v3", ["eastus"])
    p.price_wait = 2.0 if how == "slow" else 120.0
    try:
        prices = p.prices("ignored")
    finally:
        _Flaky.release.set()
    assert set(prices) == {"aws/us-east-1a", "azure/eastus"}


def test_azure_retail_api_answering_garbage_or_aws_down_falls_back_to_the_dated_table(
    clouds: _Retail, monkeypatch: pytest.MonkeyPatch
) -> None:
    clouds.mode = "garbage"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: refused
    p = multi.AnyCloudProvider(_config(regions=["aws/us-east-1a", "azure/eastus"]))
    prices = p.prices("ignored")
    assert set(prices) == {"aws/us-east-1a", "azure/eastus"}
    assert "built-in table" in prices["azure/eastus"].source and clouds.asked >= 1
    assert "built-in table" in prices["aws/us-east-1a"].source
    assert prices["aws/us-east-1a"].spot == 0.302  # the table's g5.xlarge


def test_the_controller_launches_on_the_zone_s_cloud_with_its_notices_and_records_its_market(
    clouds: _Retail, s3_store_url: str
) -> None:
    """The real controller's allocation on provider="any" (GCP's control plane mocked): the
    incarnation document the agent reads names the zone's cloud's notice format (not the
    first cloud's), the job DB records the incarnation under that cloud and type (its market's
    history), and the zones' prices are written at the allocation."""
    from spotnb.control.controller import Controller
    from spotnb.core.store import Store
    from spotnb.job import Job

    cfg = _config(store=s3_store_url, regions=["gcp/us-central1-a", "aws/us-east-1a", "azure/eastus"])
    store, db = Store(s3_store_url), JobDB()
    job = Job("20261125-000002-any002", store, db, {})
    p = multi.AnyCloudProvider(cfg)
    ctl = Controller(job, cfg, p, store, db)
    assert ctl._take_lease() is not None
    inst = ctl.planner.allocate(1)
    ctl.writer.flush()
    events = ctl.pump()
    assert inst is not None and inst.region == "gcp/us-central1-a"
    doc = json.loads(store.read_bytes(store.job(job.id, "incarnations", "0001.json")))
    assert doc["notice"]["format"] == "gcp" and doc["market"]["grace"] == 30.0
    (allocated,) = [e for e in events if e["kind"] == "allocated"]
    assert allocated["region"] == "gcp/us-central1-a" and allocated["spot_price"] == 0.224
    (prices,) = [e for e in events if e["kind"] == "prices"]
    assert set(prices["zones"]) == {"gcp/us-central1-a", "aws/us-east-1a", "azure/eastus"}
    row = db._exec("SELECT provider, region, instance_type FROM incarnations WHERE job_id=?", (job.id,))
    assert [tuple(r) for r in row] == [("gcp", "us-central1-a", "g2-standard-4")]
    p.close()


def test_a_cloud_without_credentials_is_left_out_and_said_and_a_cloud_s_own_checks_still_apply(
    aws_env: str, s3_store_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only AWS credentials here: Azure and GCP are left out (the dry run says why and how to
    set theirs) and AWS's zones are ranked; a cloud with credentials whose own settings are
    incomplete is refused before launch with its provider's message, naming the cloud."""
    for key in ("AZURE_CLIENT_ID", "IDENTITY_ENDPOINT", "MSI_ENDPOINT", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "azure"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    plan = spot.train(jobfns.slow_steps, _config(store=s3_store_url), dry_run=True)
    assert {r["cloud"] for r in plan["placement"]} == {"aws"}
    assert set(plan["clouds_left_out"]) == {"azure", "gcp"}
    text = str(plan)
    assert "cloud left out" in text and "az login" in text and "gcloud auth" in text
    monkeypatch.setenv("AZURE_CLIENT_ID", "c")
    monkeypatch.setenv("AZURE_TENANT_ID", "t")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "s")
    with pytest.raises(ConfigError, match="provider='any', on azure: Config.azure_identity_id: give"):
        spot.train(jobfns.slow_steps, _config(store=s3_store_url, azure_identity_id=None), dry_run=True)
