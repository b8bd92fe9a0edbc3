"""`spotnb doctor --provider azure` through the real Azure SDKs' request serialisation.

Azure's control plane has no emulator: it is answered in-process at the HTTP layer
(`tests/support/azure_transport.py`'s `ArmTransport`, the azure-core transport of every client the doctor
makes, the credential's included: azure-identity and msal run their own code, the token request
is answered here). The store is Azurite over real HTTP (adlfs, as a job writes it); the Retail
Prices API is a loopback server with its documented pages (tests/support/fixtures/azure_retail).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotnb.doctor.report import FAIL, OK, SKIP, UNKNOWN, Report, doctor
from tests.support.azure_transport import SUBSCRIPTION, ArmRequest, ArmTransport, arm_error
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.clouds_fixtures import free_port
from tests.support.doctor_proxy import RuleProxy
from tests.support.paths import FIXTURES

RG = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/spotnb"
IDENTITY = f"{RG}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/spotnb-vm"
ACCOUNT = f"{RG}/providers/Microsoft.Storage/storageAccounts/devstoreaccount1"
SUBNET = f"{RG}/providers/Microsoft.Network/virtualNetworks/spotnb-vnet/subnets/vms"
CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
_RETAIL = FIXTURES / "azure_retail"
#: the Retail Prices API's two documented pages as one (spot meters on the first, on demand on the second)
PAGE = {
    "Items": [i for n in (1, 2) for i in json.loads((_RETAIL / f"page{n}.json").read_text())["Items"]],
    "NextPageLink": None,
}


class FakeArm:
    """Azure Resource Manager and the token endpoint, as knobs."""

    def __init__(self) -> None:
        self.secret_ok = True
        self.spot_limit = 10
        self.roles = [CONTRIBUTOR]
        self.images = True
        self.locations = ["eastus", "westeurope", "westus2"]
        self.sizes = {"Standard_NC4as_T4_v3": 4, "Standard_NC8as_T4_v3": 8}

    def __call__(self, r: ArmRequest) -> tuple[int, Any]:
        path = r.path
        if "openid-configuration" in path:
            base = r.url.split("/v2.0/")[0]
            return 200, {
                "token_endpoint": f"{base}/oauth2/v2.0/token",
                "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                "issuer": f"{base}/v2.0",
            }
        if path == "/common/discovery/instance":  # msal asks it after a refused token
            host = "login.microsoftonline.com"
            return 200, {
                "tenant_discovery_endpoint": f"https://{host}/tenant/v2.0/.well-known/openid-configuration",
                "api-version": "1.1",
                "metadata": [{"preferred_network": host, "preferred_cache": host, "aliases": [host]}],
            }
        if path.endswith("/oauth2/v2.0/token"):
            if not self.secret_ok:
                return 401, {
                    "error": "invalid_client",
                    "error_description": "AADSTS7000215: Invalid client secret provided.",
                }
            return 200, {"access_token": "doctor-test-token", "expires_in": 3600, "token_type": "Bearer"}
        if path == f"/subscriptions/{SUBSCRIPTION}":
            return 200, {"subscriptionId": SUBSCRIPTION, "displayName": "spotnb test", "state": "Enabled"}
        if path == f"/subscriptions/{SUBSCRIPTION}/locations":
            return 200, {"value": [{"name": n, "displayName": n} for n in self.locations]}
        compute = f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/eastus"
        if path == f"{compute}/vmSizes":
            return 200, {"value": [{"name": n, "numberOfCores": c} for n, c in self.sizes.items()]}
        if path == f"{compute}/usages":
            usage = {
                "name": {"value": "lowPriorityCores", "localizedValue": "Total Regional Low-priority vCPUs"},
                "currentValue": 0,
                "limit": self.spot_limit,
                "unit": "Count",
            }
            return 200, {"value": [usage]}
        if path.startswith(f"{compute}/publishers/") and path.endswith("/versions"):
            return 200, (
                [{"name": "22.04.2025100101", "location": "eastus", "id": path + "/x"}] if self.images else []
            )
        if path == IDENTITY:
            return 200, {
                "id": IDENTITY,
                "name": "spotnb-vm",
                "properties": {"principalId": "pid-1", "clientId": "c"},
            }
        if path == f"/subscriptions/{SUBSCRIPTION}/resources":
            return 200, {
                "value": [
                    {"id": ACCOUNT, "name": "devstoreaccount1", "type": "Microsoft.Storage/storageAccounts"}
                ]
            }
        if path == f"{ACCOUNT}/providers/Microsoft.Authorization/roleAssignments":
            assert r.query["$filter"] == ["assignedTo('pid-1')"]
            rows = [
                {
                    "properties": {
                        "roleDefinitionId": f"/subscriptions/{SUBSCRIPTION}/providers/"
                        f"Microsoft.Authorization/roleDefinitions/{role}",
                        "scope": ACCOUNT,
                        "principalId": "pid-1",
                    }
                }
                for role in self.roles
            ]
            return 200, {"value": rows}
        return 404, arm_error("ResourceNotFound", f"the test's ARM has no {path}")


@pytest.fixture
def arm(az_store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeArm]:
    from spotnb.providers.azure import provider as azure

    for key, value in {
        "AZURE_CLIENT_ID": "client",
        "AZURE_TENANT_ID": "tenant",
        "AZURE_CLIENT_SECRET": "s3cr3t",
    }.items():
        monkeypatch.setenv(key, value)
    prices = RuleProxy("http://127.0.0.1:1", lambda r: (200, "application/json", json.dumps(PAGE).encode()))
    monkeypatch.setattr(azure, "_RETAIL_API", f"{prices.url}/prices")
    yield FakeArm()
    prices.close()


def _run(store: str, arm: FakeArm | None, **kw: Any) -> Report:
    hooks = kw.pop("hooks", {})
    fields: dict[str, Any] = {
        "store": store,
        "region": "eastus",
        "instance_type": "Standard_NC4as_T4_v3",
        "azure_subscription_id": SUBSCRIPTION,
        "azure_subnet_id": SUBNET,
        "azure_identity_id": IDENTITY,
        "azure_storage_account": "devstoreaccount1",
        **kw,
    }
    if arm is not None:
        hooks["transport"] = ArmTransport(arm)
    report = doctor(provider="azure", timeout=fields.pop("timeout", 8), hooks=hooks, **fields)
    print(report.text())
    return report


def test_every_check_passes(arm: FakeArm, az_store_url: str) -> None:
    report = _run(az_store_url, arm)
    lines = dict(report.results)
    assert all(r.status == OK for r in lines.values()), report.text()
    assert report.exit_code == 0
    assert "a service principal in the environment" in lines["credentials"].detail
    assert "'spotnb test'" in lines["credentials"].detail
    assert "Standard_NC4as_T4_v3: 4 vCPUs" in lines["instance type"].detail
    assert "0 of 10 in use" in lines["spot quota"].detail
    assert (
        "Storage Blob Data Contributor" in lines["identity"].detail
        and "not checked: groups" in lines["identity"].detail
    )
    assert "microsoft-dsvm:ubuntu-hpc:2204" in lines["image"].detail
    assert "$0.1578/h" in lines["prices"].detail and "Retail Prices API" in lines["prices"].detail
    assert "s3cr3t" not in report.to_json()


def test_each_azure_check_fails_with_its_fix(arm: FakeArm, az_store_url: str) -> None:
    arm.spot_limit = 0
    arm.roles = ["acdd72a7-3385-48ef-bd42-f606fba81ae7"]  # Reader: no blob data
    arm.images = False
    typo = az_store_url.replace("az://spotnb-", "az://spotnb-x")
    report = _run(typo, arm)
    lines = dict(report.results)
    assert report.exit_code == 1
    assert lines["spot quota"].status == FAIL and "0 of 0 in use" in lines["spot quota"].detail
    assert "lowPriorityCores" in lines["spot quota"].fix and "value=4" in lines["spot quota"].fix
    assert lines["identity"].status == FAIL and "no Storage Blob Data Contributor" in lines["identity"].detail
    assert "az role assignment create" in lines["identity"].fix and "pid-1" in lines["identity"].fix
    assert lines["image"].status == FAIL and "spotnb's default" in lines["image"].detail
    assert lines["store"].status == FAIL and "does not exist" in lines["store"].detail


def test_wrong_location_and_size(arm: FakeArm, az_store_url: str) -> None:
    lines = dict(_run(az_store_url, arm, region="eastus9").results)
    assert lines["region"].status == FAIL and "did you mean eastus" in lines["region"].fix
    assert lines["instance type"].detail == "skipped: needs region"
    lines = dict(_run(az_store_url, arm, instance_type="Standard_NC4as_T4").results)
    assert lines["instance type"].status == FAIL and "Standard_NC4as_T4_v3" in lines["instance type"].fix
    assert lines["spot quota"].status == SKIP


def test_refused_and_missing_credentials(
    arm: FakeArm, az_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    arm.secret_ok = False
    report = _run(az_store_url, arm)
    lines = dict(report.results)
    assert lines["credentials"].status == FAIL and "AADSTS7000215" in lines["credentials"].detail
    assert lines["region"].detail == "skipped: needs credentials"
    assert lines["store"].status == OK  # Azurite's key: the store does not need the ARM token
    for key in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(Path(az_store_url).parent))  # no az login cache there
    lines = dict(_run(az_store_url, arm).results)
    assert (
        lines["credentials"].detail == "no Azure credentials found" and "az login" in lines["credentials"].fix
    )


def test_an_arm_answering_500_or_garbage(arm: FakeArm, az_store_url: str) -> None:
    def broken(r: ArmRequest) -> tuple[int, Any]:
        if "/vmSizes" in r.path:
            return 500, arm_error("InternalServerError", "the test's ARM broke")
        if "/usages" in r.path or "/versions" in r.path:
            return 200, ["not", {"the": "shape"}]
        return arm(r)

    report = _run(az_store_url, broken)  # type: ignore[arg-type]
    lines = dict(report.results)
    assert lines["instance type"].status == UNKNOWN and "InternalServerError" in lines["instance type"].detail
    assert lines["image"].status == UNKNOWN and "Azure answered" in lines["image"].detail
    assert lines["credentials"].status == OK and report.exit_code == 2
    assert "Traceback" not in report.text()


def test_retail_prices_answering_garbage(
    arm: FakeArm, az_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """{"Items": null} is JSON the provider's price fetch does not expect: the line says '?',
    the run goes on."""
    from spotnb.providers.azure import provider as azure

    garbage = RuleProxy("http://127.0.0.1:1", lambda r: (200, "application/json", b'{"Items": null}'))
    monkeypatch.setattr(azure, "_RETAIL_API", f"{garbage.url}/prices")
    try:
        lines = dict(_run(az_store_url, arm).results)
    finally:
        garbage.close()
    assert lines["prices"].status == UNKNOWN
    assert lines["credentials"].status == OK


def test_offline_every_check_says_it_could_not_reach_azure(
    arm: FakeArm, az_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service principal in the environment, every endpoint (the authority, ARM, the Retail
    Prices API, the blob endpoint) a closed port, the SDKs' own transports: '?' everywhere."""
    from spotnb.providers.azure import provider as azure

    closed = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("AZURE_AUTHORITY_HOST", f"https://{closed}")
    monkeypatch.setattr(azure, "_RETAIL_API", f"http://{closed}/prices")
    conn = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        f"BlobEndpoint=http://{closed}/devstoreaccount1;"
    )
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    t0 = time.monotonic()
    report = _run(az_store_url, None, hooks={"arm_endpoint": f"https://{closed}"}, timeout=6)
    print(f"offline doctor took {time.monotonic() - t0:.2f} s")
    for name, r in report.results[1:]:
        assert r.status == UNKNOWN and "could not reach" in r.detail, (name, r.detail)
    assert report.exit_code == 2
