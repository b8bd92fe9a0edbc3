"""GCP provider. The Compute Engine control plane cannot run here (no emulator exists), so it is
the one thing faked, and below `requests`: every test that calls the API drives REAL
google-cloud-compute clients (`InstancesClient`, `ZonesClient`, REST transport) whose requests
the stateful `tests/gce_fake.FakeCompute` answers in-process. What is asserted is what those
clients serialised onto the wire (path, method, query, JSON body) and how spotnb reacts to GCE's
own error documents and operations, so a wrong keyword or field fails here. The request
builders are also checked field by field against google-cloud-compute's proto models. The GCS
store itself runs against gcp-storage-emulator in test_store_conformance.py."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

import spotnb as spot
from spotnb.errors import CapacityError, ConfigError, QuotaError
from spotnb.providers.base import InstanceState, LaunchSpec
from spotnb.providers.cleanup import JOB_TAG
from spotnb.providers.gcp.provider import (
    DEFAULT_IMAGE,
    FALLBACK_ZONE_SUFFIXES,
    GCPProvider,
    delete_request,
    insert_request,
    instance_name,
    simulate_request,
)
from spotnb.providers.gcp.zones import REGION_ZONES
from spotnb.settings.registry import get_provider_class
from tests.support.gce_fake import FakeCompute
from tests.support.gcp_transport import compute_clients, done_operation, gce_error
from tests.support.jobs import agent_command

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
        command=agent_command("gs://spotnb/jobs", "20261121-000000-ABC123", 3),
        spotnb_version="0.1.0",
    )


_ZONES_OF_US_CENTRAL1 = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]


@pytest.fixture
def gce() -> FakeCompute:
    """us-central1 as ZonesClient.list answers it (in no particular order): a, b, c and f UP,
    d DOWN."""
    compute = FakeCompute(PROJECT, "us-central1", zones=("f", "b", "a", "c", "d"))
    compute.zone_status["us-central1-d"] = "DOWN"
    return compute


@pytest.fixture
def provider(gce: FakeCompute) -> GCPProvider:
    p = GCPProvider(_config(), **gce.clients())
    p.validate()
    return p


def _exhausted(zone: str) -> tuple[int, Any]:
    """GCE's asynchronous ZONE_RESOURCE_POOL_EXHAUSTED: the insert's operation fails."""
    message = (
        f"The zone 'projects/{PROJECT}/zones/{zone}' does not have enough resources available "
        "to fulfill the request.  Try a different zone, or try again later."
    )
    return 200, done_operation(zone, error=(503, "ZONE_RESOURCE_POOL_EXHAUSTED", message))


def _refused(status: int, message: str, reason: str) -> tuple[int, Any]:
    """A synchronous error document answering the insert."""
    return status, gce_error(status, message, reason)


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


def test_launch_describe_terminate_inject(provider: GCPProvider, gce: FakeCompute) -> None:
    inst = provider.launch(_spec())
    (insert,) = gce.inserts()
    assert insert.path == f"/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances"
    assert insert.body["name"] == inst.id and insert.body["scheduling"]["provisioningModel"] == "SPOT"
    assert inst.region == "us-central1-a"
    for status, state in (
        ("STAGING", InstanceState.PENDING),
        ("RUNNING", InstanceState.RUNNING),
        ("TERMINATED", InstanceState.EXITED),
    ):
        gce.set_status("us-central1-a", inst.id, status)
        assert provider.describe(inst).state == state
    got = gce.adapter.requests[-1]
    assert (got.method, got.path) == (
        "GET",
        f"/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances/{inst.id}",
    )
    gce.vanish("us-central1-a", inst.id)
    assert provider.describe(inst).state == InstanceState.PREEMPTED  # deleted by the platform
    gce.instances[("us-central1-a", inst.id)] = {"name": inst.id, "status": "RUNNING"}
    provider.inject(inst)
    sent = gce.adapter.requests[-1]
    assert (sent.method, sent.path) == (
        "POST",
        f"/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances/{inst.id}/simulateMaintenanceEvent",
    )
    assert gce.maintenance == [inst.id]
    provider.terminate(inst)
    sent = gce.adapter.requests[-1]
    assert (sent.method, sent.path) == (
        "DELETE",
        f"/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances/{inst.id}",
    )
    assert gce.deleted == [inst.id]
    assert provider.describe(inst).state == InstanceState.TERMINATED


def test_capacity_errors_move_on(provider: GCPProvider, gce: FakeCompute) -> None:
    gce.refuse_all = _exhausted("us-central1-a")
    with pytest.raises(CapacityError, match="us-central1-a"):
        provider.launch(_spec())
    gce.refuse_all = (
        200,
        done_operation(
            "us-central1-a",
            error=(
                403,
                "QUOTA_EXCEEDED",
                "Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
            ),
        ),
    )
    with pytest.raises(QuotaError, match="PREEMPTIBLE_NVIDIA_L4_GPUS"):  # a quota is no shortage
        provider.launch(_spec())
    gce.refuse_all = _refused(400, "Invalid value for field 'resource.machineType'", "invalid")
    with pytest.raises(gexc.BadRequest):
        provider.launch(_spec())
    assert gce.instances == {}


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
# (real ZonesClient.list and InstancesClient.insert, answered by FakeCompute)

_LISTING = f"/compute/v1/projects/{PROJECT}/zones"


def _region_provider(gce: FakeCompute, **kw: Any) -> GCPProvider:
    p = GCPProvider(_config(region="us-central1", **kw), **gce.clients())
    p.validate()
    return p


def _listings(gce: FakeCompute) -> list[Any]:
    return [r for r in gce.adapter.requests if r.method == "GET" and r.path == _LISTING]


def test_region_lists_its_zones_and_tries_them_in_turn(gce: FakeCompute) -> None:
    provider = _region_provider(gce)
    gce.refuse = {
        "us-central1-a": _exhausted("us-central1-a"),
        "us-central1-b": _refused(
            400,
            "Invalid value for field 'resource.machineType': 'zones/us-central1-b/machineTypes/"
            "g2-standard-4'. Machine type with name 'g2-standard-4' does not exist in zone "
            "'us-central1-b'.",
            "invalid",
        ),
    }
    inst = provider.launch(_spec(zone="us-central1"))
    # UP zones of the region, sorted; the DOWN one is never tried
    assert gce.inserted_zones() == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert inst.region == inst.info["zone"] == "us-central1-c"
    body = gce.inserts()[-1].body
    assert body["machineType"] == "zones/us-central1-c/machineTypes/g2-standard-4"
    assert body["disks"][0]["initializeParams"]["diskType"].startswith("zones/us-central1-c/")
    (listing,) = _listings(gce)
    assert listing.query["filter"] == ["region eq .*/regions/us-central1"]
    assert listing.timeout is not None  # an offline listing must not hang: bounded
    bound = listing.timeout if isinstance(listing.timeout, (int, float)) else max(listing.timeout)
    assert bound <= 30
    # the VM is then watched, deleted and injected in the zone it landed in
    provider.terminate(inst)
    sent = gce.adapter.requests[-1]
    assert (sent.method, sent.path) == (
        "DELETE",
        f"/compute/v1/projects/{PROJECT}/zones/us-central1-c/instances/{inst.id}",
    )
    # the zone list is read once per provider
    gce.refuse = {}
    provider.launch(dataclasses.replace(_spec(zone="us-central1"), incarnation=4))
    assert len(_listings(gce)) == 1


def test_region_with_every_zone_exhausted_is_a_capacity_error(gce: FakeCompute) -> None:
    provider = _region_provider(gce)
    gce.refuse = {
        z: _exhausted(z) for z in ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")
    }
    with pytest.raises(CapacityError) as err:
        provider.launch(_spec(zone="us-central1"))
    assert gce.inserted_zones() == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    for zone in gce.inserted_zones():
        assert zone in str(err.value)


def test_region_where_no_zone_offers_the_machine_type_is_a_config_error(gce: FakeCompute) -> None:
    provider = _region_provider(gce)
    gce.refuse_all = _refused(
        400, "Machine type with name 'g2-standard-4' does not exist in zone 'us-central1-a'.", "invalid"
    )
    with pytest.raises(ConfigError, match="Config.instance_type: no zone of us-central1 can run"):
        provider.launch(_spec(zone="us-central1"))
    gce.adapter.requests.clear()
    gce.refuse_all = _refused(
        403, f"Required 'compute.instances.create' permission for 'projects/{PROJECT}'", "forbidden"
    )
    with pytest.raises(gexc.Forbidden):  # not a zone problem: raised at once
        provider.launch(_spec(zone="us-central1"))
    assert gce.inserted_zones() == ["us-central1-a"]


def test_zones_fall_back_when_listing_is_not_allowed(gce: FakeCompute) -> None:
    gce.zones_refused = _refused(
        403, f"Required 'compute.zones.list' permission for 'projects/{PROJECT}'", "forbidden"
    )
    provider = _region_provider(gce)
    # the table's zones of us-central1 (a, b, c, f); one retired since answers "not found"
    gce.refuse = {
        "us-central1-a": _refused(
            404, f"The resource 'projects/{PROJECT}/zones/us-central1-a' was not found", "notFound"
        )
    }
    inst = provider.launch(_spec(zone="us-central1"))
    assert gce.inserted_zones() == ["us-central1-a", "us-central1-b"]
    assert inst.info["zone"] == "us-central1-b"
    assert provider.zones("us-central1")[0] == list(REGION_ZONES["us-central1"])
    assert "built-in zone table" in provider.zones("us-central1")[1]
    # a region the table does not know: GCE's zone suffixes in turn
    assert provider.zones("mars-north1") == (
        [f"mars-north1-{s}" for s in FALLBACK_ZONE_SUFFIXES],
        "fallback (zones could not be listed: Forbidden)",
    )


def test_region_dry_run_names_the_zone_order(gce: FakeCompute) -> None:
    provider = _region_provider(gce)
    plan = provider.plan_launch(_spec(zone="us-central1"))
    assert plan["zones"] == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    assert plan["zone"] == "us-central1-a"
    assert plan["requests"][0]["args"]["zone"] == "us-central1-a"
    assert "ZonesClient.list" in plan["zone_order"]
    assert [(r.method, r.path) for r in gce.adapter.requests] == [("GET", _LISTING)]  # creates nothing
    denied = FakeCompute(PROJECT, "us-central1")
    denied.zones_refused = _refused(403, "denied", "forbidden")
    plan = _region_provider(denied).plan_launch(_spec(zone="us-central1"))
    assert plan["zones"][:3] == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert "built-in zone table" in plan["zone_order"] and "Forbidden" in plan["zone_order"]


def test_list_tagged(provider: GCPProvider, gce: FakeCompute) -> None:
    gce.instances[("us-central1-a", "spotnb-x-1")] = {
        "name": "spotnb-x-1",
        "status": "RUNNING",
        "labels": {JOB_TAG: "x"},
    }
    gce.instances[("us-central1-b", "someone-else")] = {"name": "someone-else", "status": "RUNNING"}
    assert [(i.id, job) for i, job in provider.list_tagged()] == [("spotnb-x-1", "x")]
    (sent,) = gce.adapter.requests
    assert sent.path == f"/compute/v1/projects/{PROJECT}/aggregated/instances"
    assert sent.query["filter"] == [f"labels.{JOB_TAG}:*"]


def test_region_without_zones_is_a_config_error(gce: FakeCompute) -> None:
    gce.zone_items = [
        {
            "name": "europe-west4-a",
            "status": "UP",
            "region": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/regions/europe-west4",
        }
    ]
    provider = _region_provider(gce)
    with pytest.raises(ConfigError, match="'us-central1' has no zone that is UP"):
        provider.launch(_spec(zone="us-central1"))
    assert gce.inserted_zones() == []


# -- a "not found": the zone's, or the user's ------------------------------------------------
# These go through google-cloud-compute's REAL REST transport (InstancesClient and ZonesClient,
# transport="rest"); only Compute Engine behind `requests` is faked (tests/support/gcp_transport.py),
# answering with GCE's JSON error documents, so the exceptions are the ones google-api-core
# builds from them (404 → NotFound, its message and `errors` items). The messages are GCE's
# shapes as reported by users: "The resource '<path>' was not found" (synchronous 404 of
# instances.insert), "... of type 'serviceAccount' was not found", and an operation's error.


def _gce(answers: dict[str, tuple[int, Any]]) -> tuple[Any, Any, Any]:
    """Real REST clients; an insert into a zone in `answers` gets that answer, any other
    succeeds; the region's zones are listed as GCE lists them."""

    def handler(request: Any) -> tuple[int, Any]:
        if request.method == "GET" and request.path == f"/compute/v1/projects/{PROJECT}/zones":
            region = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/regions/us-central1"
            return 200, {
                "items": [{"name": z, "status": "UP", "region": region} for z in _ZONES_OF_US_CENTRAL1]
            }
        zone = request.path.split("/zones/")[1].split("/")[0]
        if request.method == "POST" and request.path.endswith("/instances"):
            return answers.get(zone, (200, done_operation(zone)))
        return 404, gce_error(404, f"The resource '{request.path}' was not found")

    return compute_clients(handler)


def _inserted(adapter: Any) -> list[str]:
    return [r.path.split("/zones/")[1].split("/")[0] for r in adapter.requests if r.method == "POST"]


def _not_found(path: str) -> tuple[int, Any]:
    """instances.insert's synchronous 404 for a resource the request names."""
    return 404, gce_error(404, f"The resource '{path}' was not found")


_IMAGE = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
_P = f"projects/{PROJECT}"
_SA = "spotnb@spotnb-test.iam.gserviceaccount.com"


@pytest.mark.parametrize(
    ("answer", "field", "named"),
    [
        pytest.param(_not_found(_IMAGE), "gcp_image", _IMAGE, id="image"),
        pytest.param(
            _not_found("projects/ubuntu-os-cloud/zones/us-central1-a/imageFamilyViews/x"),
            "gcp_image",
            "imageFamilyViews/x",
            id="image-family-view",  # under zones/, yet the image's: missing in every zone
        ),
        pytest.param(
            _not_found(f"{_P}/global/networks/default"),
            "gcp_network",
            "global/networks/default",
            id="network",
        ),
        pytest.param(
            _not_found(f"{_P}/regions/us-central1/subnetworks/s"),
            "gcp_subnetwork",
            "subnetworks/s",
            id="subnetwork",
        ),
        pytest.param(
            (404, gce_error(404, f"The resource 'One of [{_SA}]' of type 'serviceAccount' was not found")),
            "gcp_service_account",
            _SA,
            id="service-account",
        ),
        pytest.param(
            (400, gce_error(400, f'Service account "{_SA}" does not exist.', "badRequest")),
            "gcp_service_account",
            _SA,
            id="service-account-400",
        ),
        pytest.param(
            (
                200,
                done_operation(
                    "us-central1-a",
                    error=(404, "RESOURCE_NOT_FOUND", f"The resource '{_IMAGE}' was not found"),
                ),
            ),
            "gcp_image",
            _IMAGE,
            id="image-in-the-operation",
        ),
        pytest.param(_not_found(_P), "gcp_project", _P, id="project"),
    ],
)
def test_a_missing_resource_names_its_config_field_not_the_instance_type(
    answer: tuple[int, Any], field: str, named: str
) -> None:
    """Missing in one zone is missing in all: the launch ends at the first zone with the field
    to fix, and never says the instance type is the problem."""
    instances, zones, adapter = _gce({"us-central1-a": answer})
    provider = GCPProvider(_config(region="us-central1"), instances=instances, zones=zones)
    provider.validate()
    with pytest.raises(ConfigError) as err:
        provider.launch(_spec(zone="us-central1"))
    message = str(err.value)
    assert message.startswith(f"Config.{field}: ") and named in message, message
    assert "instance_type" not in message and "g2-standard-4" not in message
    assert _inserted(adapter) == ["us-central1-a"]  # no other zone was tried


def test_a_missing_image_in_an_explicit_zone_names_gcp_image() -> None:
    instances, zones, adapter = _gce({"us-central1-a": _not_found(_IMAGE)})
    provider = GCPProvider(_config(region="us-central1-a"), instances=instances, zones=zones)
    with pytest.raises(
        ConfigError, match=r"^Config\.gcp_image: the image .*pytorch-latest-gpu.* was not found"
    ):
        provider.launch(_spec())
    assert _inserted(adapter) == ["us-central1-a"]


def test_a_zone_without_the_machine_or_accelerator_type_moves_on() -> None:
    """What one zone lacks another may offer: the zone itself (a fallback suffix the region
    lacks), its machine type or accelerator type: the next zone is tried."""
    instances, zones, adapter = _gce(
        {
            "us-central1-a": _not_found(f"{_P}/zones/us-central1-a/machineTypes/g2-standard-4"),
            "us-central1-b": _not_found(f"{_P}/zones/us-central1-b/acceleratorTypes/nvidia-l4"),
            "us-central1-c": _not_found(f"{_P}/zones/us-central1-c"),
        }
    )
    provider = GCPProvider(
        _config(region="us-central1", gcp_accelerator_type="nvidia-l4"), instances=instances, zones=zones
    )
    instance = provider.launch(_spec(zone="us-central1"))
    assert _inserted(adapter) == _ZONES_OF_US_CENTRAL1 and instance.info["zone"] == "us-central1-f"
    # the request GCE got: the real body of the REST transport, in the zone that took it
    body = [r for r in adapter.requests if r.method == "POST"][-1].body
    assert body["machineType"] == "zones/us-central1-f/machineTypes/g2-standard-4"
    assert body["guestAccelerators"][0]["acceleratorType"] == "zones/us-central1-f/acceleratorTypes/nvidia-l4"


def test_no_zone_offering_the_machine_type_still_blames_the_instance_type() -> None:
    missing = {z: _not_found(f"{_P}/zones/{z}/machineTypes/g2-standard-4") for z in _ZONES_OF_US_CENTRAL1}
    instances, zones, adapter = _gce(missing)
    provider = GCPProvider(_config(region="us-central1"), instances=instances, zones=zones)
    with pytest.raises(
        ConfigError, match="Config.instance_type: no zone of us-central1 can run 'g2-standard-4'"
    ):
        provider.launch(_spec(zone="us-central1"))
    assert _inserted(adapter) == _ZONES_OF_US_CENTRAL1


def test_a_not_found_naming_nothing_is_not_blamed_on_the_zone(gce: FakeCompute) -> None:
    """A NotFound whose message names no resource is raised as GCE said it, not read as 'not
    in this zone' (a message GCE would not send, through google-api-core's own mapping)."""
    provider = _region_provider(gce)
    gce.refuse_all = _refused(404, "gone", "notFound")
    with pytest.raises(gexc.NotFound):
        provider.launch(_spec(zone="us-central1"))
    assert gce.inserted_zones() == ["us-central1-a"]


# -- a dry run offline ------------------------------------------------------------------------
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> list[str]:
    """This process cannot reach Google: every name lookup or connection to anything but
    loopback fails at once (and is recorded), as on a laptop offline, so no test can hang on
    the network or reach Google. No Google credentials on disk, and not a GCE machine (the
    residency check reads files: patched, so a test run on a GCE VM behaves the same)."""
    import socket

    from google.auth.compute_engine import _metadata

    attempts: list[str] = []
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if str(host) not in _LOOPBACK:
            attempts.append(f"resolve {host}")
            raise socket.gaierror(socket.EAI_NONAME, "offline (the test's network guard)")
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(self: socket.socket, address: Any) -> Any:
        if isinstance(address, tuple) and str(address[0]) not in _LOOPBACK:
            attempts.append(f"connect {address[0]}:{address[1]}")
            raise OSError(101, "Network is unreachable (the test's network guard)")
        return real_connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no ADC file in it
    monkeypatch.setattr(_metadata, "detect_gce_residency_linux", lambda: False)
    return attempts


def _fit(ctx: Any) -> int:
    return 1


_OFFLINE_CONFIG = dict(provider="gcp", region="us-central1", gcp_project=PROJECT, store="gs://spotnb/jobs")


@pytest.mark.timeout(60)
def test_an_offline_dry_run_expands_a_region_from_the_zone_table_without_probing(offline: list[str]) -> None:
    """No credentials: the API is not asked and google-auth never probes the metadata server
    (offline, each probe waits out its timeouts: 21-25 s were measured). The time it took is
    printed, not asserted (timing goals live in benchmarks/)."""
    import time

    start = time.perf_counter()
    plan = spot.train(_fit, spot.Config(**_OFFLINE_CONFIG, instance_type="g2-standard-4"), dry_run=True)
    elapsed = time.perf_counter() - start
    print(f"offline GCP dry run: {elapsed:.2f} s")
    assert plan["zones"] == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    assert "built-in zone table" in plan["zone_order"] and "no Google credentials" in plan["zone_order"]
    assert "us-central1-a" in str(plan)
    assert offline == []  # nothing was looked up or dialled: no metadata probe, no API call


@pytest.mark.timeout(60)
def test_a_dry_run_with_credentials_but_no_network_falls_back_to_the_zone_table(
    offline: list[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials on disk (gcloud's ADC file) but no network: the zone listing fails (the
    token refresh cannot reach Google) and the table answers; nothing hangs."""
    import json

    adc = tmp_path / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir(parents=True, exist_ok=True)
    adc.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "spotnb-test.apps.googleusercontent.com",
                "client_secret": "spotnb-canary-gcp-client-secret",
                "refresh_token": "spotnb-canary-gcp-refresh-token",
            }
        )
    )
    plan = spot.train(_fit, spot.Config(**_OFFLINE_CONFIG, instance_type="g2-standard-4"), dry_run=True)
    assert plan["zones"] == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    assert "built-in zone table" in plan["zone_order"]
    assert offline and all("googleapis.com" in a for a in offline), offline  # tried Google only
