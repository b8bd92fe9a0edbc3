"""GCP provider. The Compute Engine control plane cannot run here (no emulator exists), so it is
the one thing mocked: recording stand-ins for `compute_v1.InstancesClient` and
`compute_v1.ZonesClient`. The requests built for insert, delete, simulate_maintenance_event and
the zone listing are asserted field by field against
google-cloud-compute's own proto models, with no network. The GCS store itself runs against
gcp-storage-emulator in test_store_conformance.py."""

from __future__ import annotations

import dataclasses
import re
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
from spotnb.providers.gcp import (
    DEFAULT_IMAGE,
    FALLBACK_ZONE_SUFFIXES,
    GCPProvider,
    delete_request,
    insert_request,
    instance_name,
    simulate_request,
)

PROJECT = "spotnb-test"


def _config(**kw: Any) -> spot.Config:
    base = dict(
        provider="gcp",
        store="gs://spotnb/jobs",
        region="us-central1-a",
        instance_type="g2-standard-4",
        gcp_project=PROJECT,
        gcp_service_account="spotnb@spotnb-test.iam.gserviceaccount.com",
    )
    return spot.Config(**{**base, **kw})


def _spec(zone: str = "us-central1-a") -> LaunchSpec:
    return LaunchSpec(
        job_id="20261121-000000-ABC123",
        incarnation=3,
        store_url="gs://spotnb/jobs",
        instance_type="g2-standard-4",
        region=zone,
        command=[
            "python",
            "-m",
            "spotnb.runtime.agent",
            "--store",
            "gs://spotnb/jobs",
            "--job",
            "20261121-000000-ABC123",
            "--incarnation",
            "3",
        ],
        spotnb_version="0.1.0",
    )


class _Op:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def result(self, timeout: float | None = None) -> None:
        if self.error:
            raise self.error


class FakeInstances:
    """`insert_error` fails every insert; `zone_errors` fails the inserts into given zones."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.insert_error: Exception | None = None
        self.zone_errors: dict[str, Exception] = {}
        self.status: str | None = "RUNNING"

    def insert(self, request: compute_v1.InsertInstanceRequest) -> _Op:
        self.calls.append(("insert", request))
        return _Op(self.zone_errors.get(request.zone, self.insert_error))

    def inserted_zones(self) -> list[str]:
        return [req.zone for kind, req in self.calls if kind == "insert"]

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


def _zone(name: str, region: str, status: str = "UP") -> compute_v1.Zone:
    return compute_v1.Zone(
        name=name,
        status=status,
        region=f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/regions/{region}",
    )


class FakeZones:
    """ZonesClient.list: returns `zones` (as the API would, in no particular order), or raises
    `error` (e.g. Forbidden when the credentials may not list zones)."""

    def __init__(self, zones: list[compute_v1.Zone] | None = None, error: Exception | None = None) -> None:
        self.zones = (
            zones
            if zones is not None
            else [
                _zone("us-central1-f", "us-central1"),
                _zone("us-central1-b", "us-central1"),
                _zone("us-central1-a", "us-central1"),
                _zone("us-central1-c", "us-central1"),
                _zone("us-central1-d", "us-central1", status="DOWN"),
            ]
        )
        self.error = error
        self.requests: list[compute_v1.ListZonesRequest] = []

    def list(self, request: compute_v1.ListZonesRequest) -> list[compute_v1.Zone]:
        self.requests.append(request)
        if self.error:
            raise self.error
        return list(self.zones)


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
    assert dict(inst.labels) == {
        JOB_TAG: "20261121-000000-abc123",
        "spotnb-incarnation": "3",
        "spotnb-managed": "true",
    }
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
    assert provider.describe(inst).state == InstanceState.PREEMPTED  # deleted by the platform
    provider.inject(inst)
    kind, req = fake.calls[-1]
    assert kind == "simulate" and req.instance == inst.id
    provider.terminate(inst)
    kind, req = fake.calls[-1]
    assert kind == "delete" and req.instance == inst.id and req.zone == "us-central1-a"
    assert provider.describe(inst).state == InstanceState.TERMINATED


def test_capacity_errors_move_on(provider: GCPProvider, fake: FakeInstances) -> None:
    fake.insert_error = gexc.ServiceUnavailable(
        "ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'us-central1-a' does not have enough resources"
    )
    with pytest.raises(CapacityError, match="us-central1-a"):
        provider.launch(_spec())
    fake.insert_error = gexc.Forbidden("QUOTA_EXCEEDED: Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded")
    with pytest.raises(CapacityError):
        provider.launch(_spec())
    fake.insert_error = gexc.BadRequest("Invalid value for field 'resource.machineType'")
    with pytest.raises(gexc.BadRequest):
        provider.launch(_spec())


def test_validate() -> None:
    GCPProvider(_config(region="us-central1")).validate()  # a region is fine
    GCPProvider(_config(region=None, regions=["us-central1", "europe-west4-b"])).validate()
    with pytest.raises(ConfigError, match="Config.regions: 'eastus' is neither a GCP region nor a zone"):
        GCPProvider(_config(region=None, regions=["us-central1", "eastus"])).validate()
    with pytest.raises(ConfigError, match="Config.region: 'us-central1-' is neither"):
        GCPProvider(_config(region="us-central1-")).validate()
    with pytest.raises(ConfigError, match="gs://"):
        GCPProvider(_config(store="memory://x")).validate()


_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_GCE_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


@pytest.mark.parametrize(
    "job_id",
    ["<job-id>", "20261121-000000-ABC123", "Job_ID with spaces!", "x" * 100, "-" * 5, "a" * 54 + "-" * 10],
)
def test_instance_name_is_a_valid_gce_name(job_id: str) -> None:
    names = {instance_name(dataclasses.replace(_spec(), job_id=job_id, incarnation=n)) for n in (1, 12, 123)}
    assert len(names) == 3  # one name per incarnation, even for cut ids
    for name in names:
        assert _GCE_NAME.match(name) and len(name) <= 63, name
        assert name.startswith("spotnb-")
    assert instance_name(dataclasses.replace(_spec(), job_id="<job-id>", incarnation=1)) == "spotnb-job-id-1"


def test_dry_run() -> None:
    def fit(ctx):
        return 1

    plan = spot.train(fit, _config(), dry_run=True)
    body = plan["requests"][0]["body"]
    assert body["scheduling"]["provisioning_model"] == "SPOT"
    assert plan["bootstrap"].startswith("#!/bin/bash")
    name = plan["fault_injection"]["args"]["instance"]
    assert name == body["name"] == plan["terminate"]["args"]["instance"] == "spotnb-job-id-1"
    assert _GCE_NAME.match(name)
    for labels in (body["labels"], body["disks"][0]["initialize_params"]["labels"]):
        assert all(_GCE_LABEL_VALUE.match(v) for v in labels.values()), labels
    assert plan["zones"] == ["us-central1-a"]
    assert "InstancesClient.insert" in str(plan)


# -- a region: its zones in turn -------------------------------------------------------------
# (the compute control plane is mocked: FakeZones answers ZonesClient.list, FakeInstances insert)


def _region_provider(fake: FakeInstances, zones: FakeZones, **kw: Any) -> GCPProvider:
    p = GCPProvider(_config(region="us-central1", **kw), instances=fake, zones=zones)
    p.validate()
    return p


def test_region_lists_its_zones_and_tries_them_in_turn(fake: FakeInstances) -> None:
    zones = FakeZones()
    provider = _region_provider(fake, zones)
    fake.zone_errors = {
        "us-central1-a": gexc.ServiceUnavailable(
            "ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'projects/p/zones/us-central1-a' does not have "
            "enough resources available to fulfill the request."
        ),
        "us-central1-b": gexc.BadRequest(
            "Invalid value for field 'resource.machineType': 'zones/us-central1-b/machineTypes/"
            "g2-standard-4'. Machine type with name 'g2-standard-4' does not exist in zone "
            "'us-central1-b'."
        ),
    }
    inst = provider.launch(_spec(zone="us-central1"))
    # UP zones of the region, sorted; the DOWN one is never tried
    assert fake.inserted_zones() == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert inst.region == inst.info["zone"] == "us-central1-c"
    req = [r for k, r in fake.calls if k == "insert"][-1]
    assert req.instance_resource.machine_type == "zones/us-central1-c/machineTypes/g2-standard-4"
    disk = req.instance_resource.disks[0]
    assert disk.initialize_params.disk_type.startswith("zones/us-central1-c/")
    (listing,) = zones.requests
    assert isinstance(listing, compute_v1.ListZonesRequest)
    assert listing.project == PROJECT and listing.filter == "region eq .*/regions/us-central1"
    # the VM is then watched, deleted and injected in the zone it landed in
    provider.terminate(inst)
    kind, req = fake.calls[-1]
    assert kind == "delete" and req.zone == "us-central1-c"
    # the zone list is read once per provider
    fake.zone_errors = {}
    provider.launch(dataclasses.replace(_spec(zone="us-central1"), incarnation=4))
    assert len(zones.requests) == 1


def test_region_with_every_zone_exhausted_is_a_capacity_error(fake: FakeInstances) -> None:
    provider = _region_provider(fake, FakeZones())
    fake.insert_error = gexc.ServiceUnavailable("ZONE_RESOURCE_POOL_EXHAUSTED")
    with pytest.raises(CapacityError) as err:
        provider.launch(_spec(zone="us-central1"))
    assert fake.inserted_zones() == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    for zone in fake.inserted_zones():
        assert zone in str(err.value)


def test_region_where_no_zone_offers_the_machine_type_is_a_config_error(fake: FakeInstances) -> None:
    provider = _region_provider(fake, FakeZones())
    fake.insert_error = gexc.BadRequest("Machine type with name 'g2-standard-4' does not exist in zone")
    with pytest.raises(ConfigError, match="Config.instance_type: no zone of us-central1 can run"):
        provider.launch(_spec(zone="us-central1"))
    fake.calls.clear()
    fake.insert_error = gexc.Forbidden("Required 'compute.instances.create' permission")
    with pytest.raises(gexc.Forbidden):  # not a zone problem: raised at once
        provider.launch(_spec(zone="us-central1"))
    assert fake.inserted_zones() == ["us-central1-a"]


def test_zones_fall_back_when_listing_is_not_allowed(fake: FakeInstances) -> None:
    zones = FakeZones(error=gexc.Forbidden("Required 'compute.zones.list' permission"))
    provider = _region_provider(fake, zones)
    # us-east1 style: this region has no zone -a
    fake.zone_errors = {
        "us-central1-a": gexc.NotFound(
            "The resource 'projects/spotnb-test/zones/us-central1-a' was not found"
        )
    }
    inst = provider.launch(_spec(zone="us-central1"))
    assert fake.inserted_zones() == ["us-central1-a", "us-central1-b"]
    assert inst.info["zone"] == "us-central1-b"
    assert provider.zones("us-central1")[0] == [f"us-central1-{s}" for s in FALLBACK_ZONE_SUFFIXES]


def test_region_dry_run_names_the_zone_order(fake: FakeInstances) -> None:
    provider = _region_provider(fake, FakeZones())
    plan = provider.plan_launch(_spec(zone="us-central1"))
    assert plan["zones"] == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    assert plan["zone"] == "us-central1-a"
    assert plan["requests"][0]["args"]["zone"] == "us-central1-a"
    assert "ZonesClient.list" in plan["zone_order"]
    assert [k for k, _ in fake.calls] == []  # a dry run creates nothing
    denied = _region_provider(FakeInstances(), FakeZones(error=gexc.Forbidden("denied")))
    plan = denied.plan_launch(_spec(zone="us-central1"))
    assert plan["zones"][:3] == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert "fallback" in plan["zone_order"] and "Forbidden" in plan["zone_order"]


def test_list_tagged(provider: GCPProvider) -> None:
    assert [(i.id, job) for i, job in provider.list_tagged()] == [("spotnb-x-1", "x")]


def test_region_without_zones_is_a_config_error(fake: FakeInstances) -> None:
    provider = _region_provider(fake, FakeZones(zones=[_zone("europe-west4-a", "europe-west4")]))
    with pytest.raises(ConfigError, match="'us-central1' has no zone that is UP"):
        provider.launch(_spec(zone="us-central1"))
    assert fake.inserted_zones() == []
