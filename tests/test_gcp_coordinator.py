"""The coordinator of a job on several instances on GCP.

The Compute Engine control plane cannot run here (no emulator exists), so it is the one thing
mocked, as in tests/test_gcp.py: stateful stand-ins for `compute_v1.InstancesClient` (VMs that
exist, their status, deletions), `AddressesClient` (a reservation gets an internal IP, as GCE
assigns it) and `FirewallsClient`. What is asserted is what spotnb sends
(google-cloud-compute's own proto models), how it reacts to a coordinator that died, and what it
deletes. The real fleet controller runs against those stand-ins in
`test_a_coordinator_that_never_stays_up_fails_the_job_and_leaves_nothing`. No packet crosses a
firewall rule here, and no VM boots.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

import spotnb as spot
from spotnb.errors import ConfigError
from spotnb.ledger import Span, compute_breakdown, coordinator_overheads
from spotnb.protocol import JobStatus, Progress
from spotnb.providers import gcp as gcp_module
from spotnb.providers.base import Feature, LaunchSpec
from spotnb.providers.cleanup import JOB_TAG, gc
from spotnb.providers.coordinator import COORDINATOR_ROLE, MAX_COORDINATOR_LAUNCHES, ROLE_TAG
from spotnb.providers.gcp import GCPProvider
from spotnb.providers.gcp_coordinator import (
    COORDINATOR_PRICES,
    address_name,
    firewall_names,
    job_network_tag,
)
from spotnb.signing import KEY_ENV, new_key, save_key
from tests.clouds_fixtures import ship_fake

CANARIES = {
    "AZURE_CLIENT_SECRET": "spotnb-canary-azure-client-secret-4d3c",
    "AZURE_STORAGE_KEY": "spotnb-canary-azure-storage-key-8e7f",
    "GOOGLE_OAUTH_ACCESS_TOKEN": "spotnb-canary-gcp-token-1a2b",
    "AWS_SECRET_ACCESS_KEY": "spotnb-canary-aws-secret-5g6h",
}

PROJECT = "spotnb-test"
ZONE = "us-central1-a"
JOB = "20261125-000000-gc0001"
IP = "10.128.0.42"


def _config(**kw: Any) -> spot.Config:
    base = dict(
        provider="gcp",
        store="gs://spotnb/jobs",
        region=ZONE,
        instance_type="g2-standard-4",
        instances=3,
        min_instances=2,
        gcp_project=PROJECT,
    )
    return spot.Config(**{**base, **kw})


def _spec(n: int = 1) -> LaunchSpec:
    return LaunchSpec(
        job_id=JOB,
        incarnation=n,
        store_url="gs://spotnb/jobs",
        instance_type="g2-standard-4",
        region=ZONE,
        command=["python", "-m", "spotnb.runtime.agent", "--job", JOB, "--incarnation", str(n)],
        spotnb_version="0.1.0",
        slot=n - 1,
        job_key="00" * 32,
    )


class _Op:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def result(self, timeout: float | None = None) -> None:
        if self.error:
            raise self.error


class FakeInstances:
    """VMs by name. `coordinators_die`: a new coordinator is TERMINATED at once (its boot
    script powered it off); `refuse`: errors the next inserts fail with."""

    def __init__(self) -> None:
        self.vms: dict[str, compute_v1.Instance] = {}
        self.zones: dict[str, str] = {}
        self.inserted: list[compute_v1.Instance] = []
        self.calls: list[tuple[str, str]] = []
        self.coordinators_die = False
        self.refuse: list[Exception] = []

    def insert(self, request: compute_v1.InsertInstanceRequest) -> _Op:
        vm = compute_v1.Instance(request.instance_resource)
        self.calls.append(("insert", vm.name))
        if self.refuse:
            return _Op(self.refuse.pop(0))
        self.inserted.append(vm)
        dies = self.coordinators_die and dict(vm.labels).get(ROLE_TAG) == COORDINATOR_ROLE
        vm.status = "TERMINATED" if dies else "RUNNING"
        vm.creation_timestamp = datetime.now(timezone.utc).isoformat()
        self.vms[vm.name], self.zones[vm.name] = vm, request.zone
        return _Op()

    def get(self, project: str, zone: str, instance: str) -> compute_v1.Instance:
        if instance not in self.vms:
            raise gexc.NotFound("gone")
        return self.vms[instance]

    def delete(self, request: compute_v1.DeleteInstanceRequest) -> _Op:
        self.calls.append(("delete", request.instance))
        if self.vms.pop(request.instance, None) is None:
            raise gexc.NotFound("gone")
        return _Op()

    def list(self, request: compute_v1.ListInstancesRequest) -> list[compute_v1.Instance]:
        assert "labels." in request.filter
        return [vm for name, vm in self.vms.items() if self.zones[name] == request.zone]

    def aggregated_list(self, request: Any) -> list[tuple[str, Any]]:
        return [(f"zones/{ZONE}", SimpleNamespace(instances=list(self.vms.values())))]

    def coordinators(self) -> list[compute_v1.Instance]:
        return [vm for vm in self.vms.values() if dict(vm.labels).get(ROLE_TAG) == COORDINATOR_ROLE]


class FakeAddresses:
    def __init__(self) -> None:
        self.store: dict[str, compute_v1.Address] = {}
        self.inserted: list[compute_v1.Address] = []

    def insert(self, project: str, region: str, address_resource: compute_v1.Address) -> _Op:
        assert region == "us-central1"
        self.inserted.append(address_resource)
        self.store[address_resource.name] = compute_v1.Address(
            address_resource, address=IP, status="RESERVED"
        )
        return _Op()

    def get(self, project: str, region: str, address: str) -> compute_v1.Address:
        if address not in self.store:
            raise gexc.NotFound("no address")
        return self.store[address]

    def delete(self, project: str, region: str, address: str) -> _Op:
        if self.store.pop(address, None) is None:
            raise gexc.NotFound("no address")
        return _Op()


class FakeFirewalls:
    def __init__(self) -> None:
        self.store: dict[str, compute_v1.Firewall] = {}

    def insert(self, project: str, firewall_resource: compute_v1.Firewall) -> _Op:
        self.store[firewall_resource.name] = firewall_resource
        return _Op()

    def get(self, project: str, firewall: str) -> compute_v1.Firewall:
        if firewall not in self.store:
            raise gexc.NotFound("no rule")
        return self.store[firewall]

    def delete(self, project: str, firewall: str) -> _Op:
        if self.store.pop(firewall, None) is None:
            raise gexc.NotFound("no rule")
        return _Op()


Fakes = tuple[FakeInstances, FakeAddresses, FakeFirewalls]


@pytest.fixture
def fakes() -> Fakes:
    return FakeInstances(), FakeAddresses(), FakeFirewalls()


def _provider(fakes: Fakes, **kw: Any) -> GCPProvider:
    instances, addresses, firewalls = fakes
    p = GCPProvider(_config(**kw), instances=instances, addresses=addresses, firewalls=firewalls)
    p.validate()
    p.describe_interval = 0.0  # describe at every call
    return p


def test_gcp_supports_several_instances(fakes: Fakes) -> None:
    assert _provider(fakes).supports(Feature.ELASTIC)


def test_coordinator_is_standard_on_the_reserved_address_with_the_job_tag(
    fakes: Fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canary secrets of the environment and the job's HMAC key never reach the boot script."""
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    key = new_key()
    save_key(JOB, key)
    instances, addresses, _ = fakes
    assert _provider(fakes).coordinator(JOB, 2) == f"http://{IP}:29510"
    (address,) = addresses.inserted
    assert (address.name, address.address_type, address.purpose) == (
        address_name(JOB),
        "INTERNAL",
        "GCE_ENDPOINT",
    )
    assert address.labels[JOB_TAG] == JOB and address.labels[ROLE_TAG] == COORDINATOR_ROLE
    (vm,) = instances.inserted
    assert vm.scheduling.provisioning_model == "STANDARD"  # on demand: never preempted
    assert vm.scheduling.automatic_restart and vm.scheduling.on_host_maintenance == "MIGRATE"
    assert vm.machine_type == f"zones/{ZONE}/machineTypes/e2-small"
    assert vm.network_interfaces[0].network_i_p == IP
    assert list(vm.tags.items) == [job_network_tag(JOB)]
    assert dict(vm.labels) == {JOB_TAG: JOB, "spotnb-managed": "true", ROLE_TAG: COORDINATOR_ROLE}
    assert not vm.service_accounts  # it reads nothing of the job
    (script,) = [i.value for i in vm.metadata.items if i.key == "startup-script"]
    # the lighthouse module travels in the script (it has no identity to read the store with)
    assert '"$SPOTNB_LIGHTHOUSE" --min-replicas 2' in script and '--bind "[::]:29510"' in script
    assert "spotnb.runtime.lighthouse.py" in script and "<<'SPOTNB_MODULE'" in script
    assert not [name for name, value in CANARIES.items() if value in script]
    assert key.hex() not in script and KEY_ENV not in script


def test_firewall_opens_tcp_to_the_members_only(fakes: Fakes) -> None:
    instances, _, firewalls = fakes
    p = _provider(fakes)
    p.coordinator(JOB, 2)
    allow_name, deny_name = firewall_names(JOB)
    allow, deny = firewalls.store[allow_name], firewalls.store[deny_name]
    tag = job_network_tag(JOB)
    assert (allow.direction, allow.priority) == ("INGRESS", 1000)
    assert list(allow.source_tags) == list(allow.target_tags) == [tag]
    assert not allow.source_ranges  # membership only, no address range
    assert [(a.I_p_protocol, list(a.ports)) for a in allow.allowed] == [("tcp", ["0-65535"])]
    # default-allow-internal (65534) would admit the whole network: denied right after
    assert (deny.priority, list(deny.source_ranges), list(deny.target_tags)) == (1001, ["0.0.0.0/0"], [tag])
    assert [d.I_p_protocol for d in deny.denied] == ["tcp"]
    # the Spot VMs of the job carry the tag, and record the coordinator they train with
    instance = p.launch(_spec())
    spot_vm = instances.inserted[-1]
    assert spot_vm.scheduling.provisioning_model == "SPOT" and list(spot_vm.tags.items) == [tag]
    assert instance.info["coordinator"]["id"] == instances.coordinators()[0].name


def test_a_second_controller_finds_the_same_coordinator(fakes: Fakes) -> None:
    instances, addresses, _ = fakes
    first = _provider(fakes).coordinator(JOB, 2)
    assert _provider(fakes).coordinator(JOB, 2) == first
    assert len(instances.coordinators()) == 1 and len(addresses.inserted) == 1


@pytest.mark.parametrize("death", ["deleted", "powered_off"])
def test_a_dead_coordinator_is_replaced_at_the_same_address(fakes: Fakes, death: str) -> None:
    instances, _, _ = fakes
    p = _provider(fakes)
    address = p.coordinator(JOB, 2)
    (dead,) = instances.coordinators()
    if death == "deleted":
        instances.vms.pop(dead.name)
    else:  # its idle guard or a failed install powered it off: it still holds the address
        dead.status = "TERMINATED"
    assert p.coordinator(JOB, 2) == address
    (replacement,) = instances.coordinators()
    assert replacement.name != dead.name and replacement.network_interfaces[0].network_i_p == IP
    deleted_first = ("delete", dead.name) in instances.calls
    assert deleted_first == (death == "powered_off")
    if deleted_first:  # freed before the replacement asked for the address
        assert instances.calls.index(("delete", dead.name)) < instances.calls.index(
            ("insert", replacement.name)
        )


def test_an_address_still_in_use_is_tried_again(fakes: Fakes) -> None:
    instances, _, _ = fakes
    p = _provider(fakes)
    address = p.coordinator(JOB, 2)
    instances.vms.clear()
    instances.refuse = [gexc.BadRequest("IP_IN_USE_BY_ANOTHER_RESOURCE: already being used")]
    assert p.coordinator(JOB, 2) == address and instances.coordinators() == []
    assert p.coordinator(JOB, 2) == address and len(instances.coordinators()) == 1


def test_close_deletes_the_coordinator_the_address_and_the_rules(fakes: Fakes) -> None:
    instances, addresses, firewalls = fakes
    p = _provider(fakes)
    p.coordinator(JOB, 2)
    p.launch(_spec())
    p.close()
    assert instances.vms == {} and addresses.store == {} and firewalls.store == {}


def test_gc_reaps_a_powered_off_coordinator_and_its_network(
    fakes: Fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller died without `close`, and the coordinator's idle guard powered it off
    (TERMINATED still holds its disk and the address): `spotnb gc` deletes it all."""
    from spotnb.jobdb import JobDB

    instances, addresses, firewalls = fakes
    db = JobDB()
    db.add_job(JOB, name=None, provider="gcp", region=ZONE, instance_type="x", store="gs://spotnb/jobs")
    db.update_job(JOB, status="succeeded")
    _provider(fakes).coordinator(JOB, 2)  # never closed
    (coordinator,) = instances.coordinators()
    coordinator.status = "TERMINATED"

    class Wired(GCPProvider):
        def __init__(self, config: Any) -> None:
            super().__init__(config, instances=instances, addresses=addresses, firewalls=firewalls)

    monkeypatch.setattr("spotnb.providers.get_provider_class", lambda name: Wired)
    assert gc("gcp", _config(instances=1, min_instances=1)) == [coordinator.name]
    assert instances.vms == {} and addresses.store == {} and firewalls.store == {}


def test_a_coordinator_that_never_stays_up_ends_the_job(fakes: Fakes) -> None:
    instances, _, _ = fakes
    instances.coordinators_die = True
    p = _provider(fakes)
    for _ in range(MAX_COORDINATOR_LAUNCHES):
        p.coordinator(JOB, 2)
    with pytest.raises(RuntimeError, match=f"started {MAX_COORDINATOR_LAUNCHES} times and did not stay up"):
        p.coordinator(JOB, 2)
    assert instances.coordinators() == []


def _fit(ctx: Any) -> int:
    return 1


def test_a_coordinator_that_never_stays_up_fails_the_job_and_leaves_nothing(
    fakes: Fakes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The real fleet controller and a file store (the boot check of a remote store is lifted:
    no VM reads it here): every coordinator powers off at once; the job fails with the reason,
    and its way out deletes the Spot VMs, the coordinator, the address and the rules."""
    instances, addresses, firewalls = fakes
    instances.coordinators_die = True

    class Wired(GCPProvider):
        describe_interval = 0.0

        def __init__(self, config: Any) -> None:
            super().__init__(config, instances=instances, addresses=addresses, firewalls=firewalls)

    monkeypatch.setattr("spotnb.api.get_provider_class", lambda name: Wired)
    monkeypatch.setattr(gcp_module, "require_remote_store", lambda config, name: None)
    job = spot.train(_fit, _config(store=(tmp_path / "store").as_uri()), detach=False)
    assert job.wait(120), f"job still {job.status}"
    assert job.status == JobStatus.FAILED
    assert "did not stay up" in (job.state.error.message if job.state.error else "")
    job.driver._thread.join(timeout=120)
    assert not job.driver._thread.is_alive()
    assert (
        len([c for c in instances.calls if c[0] == "insert" and "-coord-" in c[1]])
        == MAX_COORDINATOR_LAUNCHES
    )
    assert instances.vms == {} and addresses.store == {} and firewalls.store == {}


def test_several_instances_need_one_region() -> None:
    with pytest.raises(ConfigError, match="share one region"):
        GCPProvider(_config(region=None, regions=["us-central1-a", "europe-west4-b"])).validate()
    with pytest.raises(ConfigError, match="instead of 'cheapest'"):
        GCPProvider(_config(region=None, regions="cheapest")).validate()
    GCPProvider(_config(region=None, regions=["us-central1-a", "us-central1-b"])).validate()


def test_dry_run_lists_the_coordinator_and_its_price() -> None:
    plan = spot.train(_fit, _config(), dry_run=True)
    coordinator = plan["coordinator"]
    assert coordinator["market"] == "on-demand" and coordinator["instance_type"] == "e2-small"
    assert coordinator["price_on_demand"] == pytest.approx(COORDINATOR_PRICES["e2-small"])
    inserts = [r["body"] for r in plan["requests"] if r["api"] == "compute_v1.InstancesClient.insert"]
    assert [b["scheduling"]["provisioning_model"] for b in inserts] == ["STANDARD", "SPOT"]
    assert inserts[1]["tags"]["items"] == inserts[0]["tags"]["items"]  # one network tag
    rules = [r["body"] for r in plan["requests"] if r["api"] == "compute_v1.FirewallsClient.insert"]
    assert [(bool(r["allowed"]), bool(r["denied"])) for r in rules] == [(True, False), (False, True)]
    text = str(plan)
    line = next(row for row in text.splitlines() if row.strip().startswith("coordinator"))
    assert "e2-small" in line and f"${COORDINATOR_PRICES['e2-small']:.4f}/h on demand" in line
    assert "3 spot instances" in text


def test_ledger_bills_the_coordinator_on_its_own_line(fakes: Fakes) -> None:
    p = _provider(fakes, coordinator_price=0.02)
    p.coordinator(JOB, 2)
    instance = p.launch(_spec())
    started = instance.info["coordinator"]["started"]
    trained = Progress(step=100, compute_s=3540.0)
    span = Span(1, started, started + 60, started + 120, started + 3660, False, trained, 0.2, 0.7)
    plain = compute_breakdown([span], started, started + 3660)
    overheads = coordinator_overheads([instance.info])
    billed = compute_breakdown([span], started, started + 3660, overheads=overheads)
    assert billed.coordinator_cost == pytest.approx(0.02 * 3660 / 3600)
    assert billed.total_cost == pytest.approx(plain.spot_cost + billed.coordinator_cost)
    assert billed.spot_cost == plain.spot_cost and "coordinator $" in billed.table()


def test_a_list_that_lags_behind_never_starts_a_second_coordinator(fakes: Fakes) -> None:
    instances, _, _ = fakes
    p = _provider(fakes)
    p.coordinator(JOB, 2)
    real_list = instances.list
    instances.list = lambda request: []  # type: ignore[method-assign]
    p.coordinator(JOB, 2)
    instances.list = real_list  # type: ignore[method-assign]
    assert len(instances.coordinators()) == 1


def test_a_coordinator_that_fails_half_way_leaves_no_network(fakes: Fakes) -> None:
    """The firewall rules were made, then the address was refused: `close` still deletes them."""
    instances, addresses, firewalls = fakes

    def refuse(project: str, region: str, address_resource: compute_v1.Address) -> _Op:
        raise gexc.Forbidden("compute.addresses.create denied")

    addresses.insert = refuse  # type: ignore[method-assign]
    p = _provider(fakes)
    with pytest.raises(gexc.Forbidden):
        p.coordinator(JOB, 2)
    assert len(firewalls.store) == 2
    p.close()
    assert firewalls.store == {} and instances.vms == {}


def test_another_jobs_coordinator_is_left_alone(fakes: Fakes) -> None:
    """Killing one job's coordinator neither counts nor replaces the other job's."""
    instances, _, _ = fakes
    p = _provider(fakes)
    p.coordinator(JOB, 2)
    p.coordinator("20261125-000000-other1", 2)
    mine = next(vm for vm in instances.coordinators() if dict(vm.labels)[JOB_TAG] == JOB)
    mine.status = "TERMINATED"
    p.coordinator("20261125-000000-other1", 2)
    assert mine.name in instances.vms  # only its own controller call replaces it
    p.coordinator(JOB, 2)
    assert len(instances.coordinators()) == 2 and mine.name not in instances.vms


def test_a_custom_network_needs_its_subnetwork() -> None:
    with pytest.raises(ConfigError, match="gcp_subnetwork"):
        GCPProvider(_config(gcp_network="projects/p/global/networks/train")).validate()


def test_a_hosted_controller_runs_on_the_coordinator_with_its_service_account(
    fakes: Fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Config.controller="cloud"`: the coordinator carries the controller (and the job key it
    verifies the spec with), runs as Config.controller_identity, never a credential; the
    notebook's `close` leaves it running, and asking again does not start a second one."""
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    instances, _, _ = fakes
    account = f"spotnb-ctl@{PROJECT}.iam.gserviceaccount.com"
    shipped = ship_fake(monkeypatch)  # the store is not reachable here
    p = _provider(fakes, controller="cloud", controller_identity=account)
    p.host_controller(JOB, "gs://spotnb/jobs", "cd" * 32)
    p.close()
    (vm,) = instances.inserted
    assert [a.email for a in vm.service_accounts] == [account]
    (script,) = [i.value for i in vm.metadata.items if i.key == "startup-script"]
    assert f"spotnb.cli controller {JOB} --store gs://spotnb/jobs" in script
    assert "SPOTNB_WHEEL_EXTRAS='[gcp,elastic]'" in script and "cd" * 32 in script
    assert shipped == [(JOB, bytes.fromhex("cd" * 32))]  # the job's wheel, verified with its key
    assert not [name for name, value in CANARIES.items() if value in script]
    assert not [c for c in instances.calls if c[0] == "delete"]  # the job now depends on it
    again = _provider(fakes, controller="cloud", controller_identity=account)
    again.host_controller(JOB, "gs://spotnb/jobs", "cd" * 32)
    assert len(instances.inserted) == 1


def test_a_missing_coordinator_image_names_its_field(fakes: Fakes) -> None:
    """The coordinator's insert answered GCE's 404 for its image (the real exception class with
    GCE's message shape; the compute client is the stand-in above): the field that names the
    image is the one to fix, not a retry."""
    instances, _, _ = fakes
    image = "projects/my-images/global/images/family/gone"
    instances.refuse = [gexc.NotFound(f"The resource '{image}' was not found")]
    p = _provider(fakes, gcp_coordinator_image=image)
    with pytest.raises(ConfigError, match=r"^Config\.gcp_coordinator_image: the image .*family/gone"):
        p.coordinator(JOB, 2)
    assert instances.coordinators() == []
