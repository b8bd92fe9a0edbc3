"""Credentials stay in each SDK's own chain: they never reach a request body, a boot script, a
dry-run plan or the job's config event. (The full-job scan of store files, job DB, user data,
VM logs and events runs in test_aws_e2e.py against moto.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

import spotnb as spot
from spotnb.providers.base import LaunchSpec
from spotnb.providers.bootstrap import SecretInBootstrap, bootstrap_script
from spotnb.submit import public_config as _public_config

CANARY = {
    "AWS_ACCESS_KEY_ID": "AKIASPOTNBCANARY7Q2X",
    "AWS_SECRET_ACCESS_KEY": "spotnb-canary-aws-secret-9f8e7d6c5b4a",
    "AZURE_CLIENT_ID": "11111111-2222-3333-4444-canarycanary",
    "AZURE_CLIENT_SECRET": "spotnb-canary-azure-secret-5e4d3c",
    "AZURE_TENANT_ID": "99999999-8888-7777-6666-canarytenant",
    "AZURE_STORAGE_KEY": "spotnb-canary-storage-key-a1b2c3",
    "GOOGLE_OAUTH_ACCESS_TOKEN": "spotnb-canary-gcp-token-ya29",
}


@pytest.fixture(autouse=True)
def canaries(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in CANARY.items():
        monkeypatch.setenv(k, v)


def _clean(text: str) -> None:
    leaked = [k for k, v in CANARY.items() if v in text]
    assert leaked == [], f"credential values leaked: {leaked}"


def _configs() -> list[spot.Config]:
    return [
        spot.Config(provider="aws", store="s3://bucket/spotnb", region="us-east-1", requirements=["einops"]),
        spot.Config(
            provider="azure",
            store="az://c/spotnb",
            region="eastus",
            azure_subscription_id="sub",
            azure_resource_group="rg",
            azure_subnet_id="/subnet",
            azure_identity_id="/identity",
            azure_storage_account="acct",
        ),
        spot.Config(provider="gcp", store="gs://bucket/spotnb", region="us-central1-a", gcp_project="proj"),
    ]


@pytest.mark.parametrize("config", _configs(), ids=["aws", "azure", "gcp"])
def test_dry_run_plan_and_config_event_hold_no_credential(
    config: spot.Config, capsys: pytest.CaptureFixture
) -> None:
    def fit(ctx):
        return 1

    plan = spot.train(fit, config, dry_run=True)
    _clean(json.dumps(plan, default=str))
    _clean(capsys.readouterr().out)
    _clean(json.dumps(_public_config(config), default=str))


def test_launch_requests_hold_no_credential() -> None:
    """Each launch goes through its cloud's real SDK (Azure's ComputeManagementClient over
    `ArmTransport`, google-cloud-compute's REST InstancesClient over `GceAdapter`); what the
    SDK serialised onto the wire is scanned: the request bodies and the boot scripts in them."""
    import base64

    from spotnb.providers.azure.provider import AzureProvider
    from spotnb.providers.gcp.provider import GCPProvider
    from tests.support.azure_transport import ArmCompute, ArmRequest, compute_client, resource_client
    from tests.support.gce_fake import FakeCompute

    azure_cfg, gcp_cfg = _configs()[1], _configs()[2]
    spec = dict(
        job_id="j",
        incarnation=1,
        instance_type="x",
        command=["python", "-m", "spotnb.runtime.agent"],
        spotnb_version="0.1.0",
    )
    arm, arm_sent = ArmCompute(), []

    def answer(request: ArmRequest) -> Any:
        arm_sent.append(request)
        return arm(request)

    AzureProvider(
        azure_cfg, compute=compute_client(answer, "sub"), resources=resource_client(answer, "sub")
    ).launch(LaunchSpec(store_url="az://c/spotnb", region="eastus", **spec))
    gce = FakeCompute("proj", "us-central1", machine_types=("x",))
    GCPProvider(gcp_cfg, **gce.clients()).launch(
        LaunchSpec(store_url="gs://bucket/spotnb", region="us-central1-a", **spec)
    )

    sent: list[str] = []
    (vm_put,) = [r for r in arm_sent if r.method == "PUT" and "/virtualMachines/" in r.path]
    sent.append(json.dumps(vm_put.body))
    sent.append(base64.b64decode(vm_put.body["properties"]["osProfile"]["customData"]).decode())
    (insert,) = [r for r in gce.adapter.requests if r.method == "POST"]
    assert insert.path == "/compute/v1/projects/proj/zones/us-central1-a/instances"
    sent.append(json.dumps(insert.body))
    (script,) = [i["value"] for i in insert.body["metadata"]["items"] if i["key"] == "startup-script"]
    assert script.startswith("#!/bin/bash")
    sent.append(script)
    for request in [*arm_sent, *gce.adapter.requests]:  # nor in any URL or query of either
        sent.append(request.url)
    assert len(sent) >= 4
    for text in sent:
        _clean(text)


def test_bootstrap_refuses_credential_like_env() -> None:
    spec = LaunchSpec(
        job_id="j",
        incarnation=1,
        store_url="s3://b/p",
        instance_type="x",
        region=None,
        command=["python", "-m", "spotnb.runtime.agent"],
        env={"AWS_SECRET_ACCESS_KEY": "x"},
    )
    with pytest.raises(SecretInBootstrap, match="credential"):
        bootstrap_script(spec, "aws")
