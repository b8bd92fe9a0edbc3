"""GCP provider. The Compute Engine control plane cannot run here (no emulator exists), so it is
the one thing mocked: a recording stand-in for `compute_v1.InstancesClient`. The requests built
for insert, delete and simulate_maintenance_event are asserted field by field against
google-cloud-compute's own proto models, with no network. The GCS store itself runs against
gcp-storage-emulator in test_store_conformance.py."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

import spotnb as spot
from spotnb.errors import CapacityError, ConfigError
from spotnb.providers import get_provider_class
from spotnb.providers.base import InstanceState, LaunchSpec
from spotnb.providers.cleanup import JOB_TAG
from spotnb.providers.gcp import (DEFAULT_IMAGE, GCPProvider, delete_request, insert_request,
                                  instance_name, simulate_request)

PROJECT = "spotnb-test"


def _config(**kw: Any) -> spot.Config:
    base = dict(provider="gcp", store="gs://spotnb/jobs", region="us-central1-a",
                instance_type="g2-standard-4", gcp_project=PROJECT,
                gcp_service_account="spotnb@spotnb-test.iam.gserviceaccount.com")
    return spot.Config(**{**base, **kw})


def _spec(zone: str = "us-central1-a") -> LaunchSpec:
    return LaunchSpec(job_id="20261121-000000-ABC123", incarnation=3, store_url="gs://spotnb/jobs",
                      instance_type="g2-standard-4", region=zone,
                      command=["python", "-m", "spotnb.runtime.agent", "--store", "gs://spotnb/jobs",
                               "--job", "20261121-000000-ABC123", "--incarnation", "3"],
                      spotnb_version="0.1.0")


class _Op:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def result(self, timeout: float | None = None) -> None:
        if self.error:
            raise self.error


class FakeInstances:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.insert_error: Exception | None = None
        self.status: str | None = "RUNNING"

    def insert(self, request: compute_v1.InsertInstanceRequest) -> _Op:
        self.calls.append(("insert", request))
        return _Op(self.insert_error)

    def get(self, project: str, zone: str, instance: str) -> Any:
        self.calls.append(("get", (project, zone, instance)))
        if self.status is None:
            raise gexc.NotFound("gone")
        return compute_v1.Instance(name=instance, status=self.status)

    def delete(self, request: compute_v1.DeleteInstanceRequest) -> _Op:
        self.calls.append(("delete", request))
        return _Op()

    def simulate_maintenance_event(self, request: Any) -> _Op:
        self.calls.append(("simulate", request))
        return _Op()

    def aggregated_list(self, request: Any) -> list[tuple[str, Any]]:
        labelled = compute_v1.Instance(name="spotnb-x-1", status="RUNNING", labels={JOB_TAG: "x"})
        return [("zones/us-central1-a", SimpleNamespace(instances=[labelled]))]


@pytest.fixture
def fake() -> FakeInstances:
    return FakeInstances()


@pytest.fixture
def provider(fake: FakeInstances) -> GCPProvider:
    p = GCPProvider(_config(), instances=fake)
    p.validate()
    return p


def test_registry() -> None:
    assert get_provider_class("gcp") is GCPProvider


def test_insert_request_field_by_field() -> None:
    req = insert_request(_spec(), _config(gcp_accelerator_type="nvidia-l4"), PROJECT, "us-central1-a")
    assert isinstance(req, compute_v1.InsertInstanceRequest)
    assert (req.project, req.zone) == (PROJECT, "us-central1-a")
    inst = req.instance_resource
    assert inst.name == instance_name(_spec()) == "spotnb-20261121-000000-abc123-3"
    assert inst.machine_type == "zones/us-central1-a/machineTypes/g2-standard-4"
    s = inst.scheduling
    assert s.provisioning_model == "SPOT"
    assert s.instance_termination_action == "DELETE"
    assert s.on_host_maintenance == "TERMINATE"
    assert s.automatic_restart is False
    assert dict(inst.labels) == {JOB_TAG: "20261121-000000-abc123", "spotnb-incarnation": "3",
                                 "spotnb-managed": "true"}
    disk = inst.disks[0]
    assert disk.boot and disk.auto_delete
    assert disk.initialize_params.source_image == DEFAULT_IMAGE
    items = {i.key: i.value for i in inst.metadata.items}
    assert items["startup-script"].startswith("#!/bin/bash")
    assert "'spotnb[gcp]==0.1.0'" in items["startup-script"]
    assert inst.service_accounts[0].email == "spotnb@spotnb-test.iam.gserviceaccount.com"
    acc = inst.guest_accelerators[0]
    assert acc.accelerator_type.endswith("/acceleratorTypes/nvidia-l4") and acc.accelerator_count == 1
    assert inst.network_interfaces[0].network == "global/networks/default"
    # the JSON the REST transport sends
    body = compute_v1.Instance.to_dict(inst)
    assert body["scheduling"]["provisioning_model"] == "SPOT"


def test_delete_and_simulate_requests() -> None:
    d = delete_request(PROJECT, "us-central1-a", "vm")
    assert isinstance(d, compute_v1.DeleteInstanceRequest)
    assert (d.project, d.zone, d.instance) == (PROJECT, "us-central1-a", "vm")
    s = simulate_request(PROJECT, "us-central1-a", "vm")
    assert isinstance(s, compute_v1.SimulateMaintenanceEventInstanceRequest)
    assert (s.project, s.zone, s.instance) == (PROJECT, "us-central1-a", "vm")


def test_launch_describe_terminate_inject(provider: GCPProvider, fake: FakeInstances) -> None:
    inst = provider.launch(_spec())
    kind, req = fake.calls[0]
    assert kind == "insert" and req.instance_resource.name == inst.id
    assert inst.region == "us-central1-a"
    fake.status = "STAGING"
    assert provider.describe(inst).state == InstanceState.PENDING
    fake.status = "RUNNING"
    assert provider.describe(inst).state == InstanceState.RUNNING
    fake.status = "TERMINATED"
    assert provider.describe(inst).state == InstanceState.EXITED
    fake.status = None
    assert provider.describe(inst).state == InstanceState.PREEMPTED   # deleted by the platform
    provider.inject(inst)
    kind, req = fake.calls[-1]
    assert kind == "simulate" and req.instance == inst.id
    provider.terminate(inst)
    kind, req = fake.calls[-1]
    assert kind == "delete" and req.instance == inst.id and req.zone == "us-central1-a"
    assert provider.describe(inst).state == InstanceState.TERMINATED


def test_capacity_errors_move_on(provider: GCPProvider, fake: FakeInstances) -> None:
    fake.insert_error = gexc.ServiceUnavailable(
        "ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'us-central1-a' does not have enough resources")
    with pytest.raises(CapacityError, match="us-central1-a"):
        provider.launch(_spec())
    fake.insert_error = gexc.Forbidden("QUOTA_EXCEEDED: Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded")
    with pytest.raises(CapacityError):
        provider.launch(_spec())
    fake.insert_error = gexc.BadRequest("Invalid value for field 'resource.machineType'")
    with pytest.raises(gexc.BadRequest):
        provider.launch(_spec())


def test_validate() -> None:
    with pytest.raises(ConfigError, match="not a GCP zone"):
        GCPProvider(_config(region=None, regions=["us-central1"])).validate()
    with pytest.raises(ConfigError, match="gs://"):
        GCPProvider(_config(store="memory://x")).validate()


def test_dry_run(capsys: pytest.CaptureFixture) -> None:
    def fit(ctx):
        return 1

    plan = spot.train(fit, _config(), dry_run=True)
    body = plan["requests"][0]["body"]
    assert body["scheduling"]["provisioning_model"] == "SPOT"
    assert plan["bootstrap"].startswith("#!/bin/bash")
    assert plan["fault_injection"]["args"]["instance"] == "spotnb--job-id--1"  # dry-run job id
    assert "InstancesClient.insert" in capsys.readouterr().out


def test_list_tagged(provider: GCPProvider) -> None:
    assert [(i.id, job) for i, job in provider.list_tagged()] == [("spotnb-x-1", "x")]
