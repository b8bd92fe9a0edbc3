"""The coordinator of a job on several instances on Azure: what is Azure's own (what every cloud's
coordinator must do runs in tests/providers/test_coordinator_contract.py).

Azure Resource Manager has no emulator, so it is the one thing faked, and at the HTTP layer:
AzureProvider drives the REAL `azure.mgmt.compute.ComputeManagementClient` and
`azure.mgmt.resource.ResourceManagementClient` (the installed versions), whose pipeline
transport is `tests.support.azure_transport.ArmTransport`. The SDKs' own signatures (a keyword-only
`api_version` given positionally is a TypeError, as in production), request serialisation
(`?api-version=`, JSON bodies), error mapping and pollers all run; only ARM behind the wire is
answered in-process (`Arm` here): `ArmCompute` for the virtual machines (created, listed, their
instance views, deleted; a coordinator that powers off, a refused create, a list that lags) over
`GenericResources` for the network (NIC, public IP, security groups: resources by id, a dynamic
private IP assigned as Azure does).

What is asserted is what the SDKs sent (the VMs' and the network's JSON bodies and URLs), how
spotnb reacts to a coordinator that died, and what it deletes. The real fleet controller runs
against those in `test_a_coordinator_that_never_stays_up_fails_the_job_and_leaves_nothing`. No
packet crosses a network security group here, and no VM boots.
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError

import spotnb as spot
from spotnb.core.ledger import Span, compute_breakdown, coordinator_overheads
from spotnb.core.protocol import JobStatus, Progress
from spotnb.core.signing import KEY_ENV, new_key, save_key
from spotnb.errors import ConfigError
from spotnb.providers.azure import provider as azure_module
from spotnb.providers.azure.coordinator import (
    COORDINATOR_PRICES,
    NETWORK_API_VERSION,
    coordinator_nic_body,
    job_network_ids,
)
from spotnb.providers.azure.provider import AzureProvider
from spotnb.providers.base import LaunchSpec
from spotnb.providers.cleanup import JOB_TAG, gc
from spotnb.providers.coordinator import COORDINATOR_ROLE, MAX_COORDINATOR_LAUNCHES, ROLE_TAG
from tests.support.azure_transport import ArmCompute, ArmRequest, arm_error, compute_client, resource_client
from tests.support.clouds_fixtures import ship_fake

CANARIES = {
    "AZURE_CLIENT_SECRET": "spotnb-canary-azure-client-secret-4d3c",
    "AZURE_STORAGE_KEY": "spotnb-canary-azure-storage-key-8e7f",
    "GOOGLE_OAUTH_ACCESS_TOKEN": "spotnb-canary-gcp-token-1a2b",
    "AWS_SECRET_ACCESS_KEY": "spotnb-canary-aws-secret-5g6h",
}

SUB = "00000000-0000-0000-0000-000000000000"
RG = "spotnb-rg"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/v/subnets/s"
IDENTITY = (
    f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/x"
)
JOB = "20261125-000000-az0001"
NET = job_network_ids(SUB, RG, JOB)


def _config(**kw: Any) -> spot.Config:
    base = dict(
        provider="azure",
        store="az://spotnb/jobs",
        region="eastus",
        instance_type="Standard_NC4as_T4_v3",
        instances=3,
        min_instances=2,
        azure_subscription_id=SUB,
        azure_resource_group=RG,
        azure_subnet_id=SUBNET,
        azure_identity_id=IDENTITY,
        azure_storage_account="spotnbstore",
    )
    return spot.Config(**{**base, **kw})


def _spec(n: int = 1, job: str = JOB) -> LaunchSpec:
    return LaunchSpec(
        job_id=job,
        incarnation=n,
        store_url="az://spotnb/jobs",
        instance_type="Standard_NC4as_T4_v3",
        region="eastus",
        command=["python", "-m", "spotnb.runtime.agent", "--job", job, "--incarnation", str(n)],
        spotnb_version="0.1.0",
        slot=n - 1,
        job_key="00" * 32,
    )


class Arm:
    """Azure Resource Manager for the jobs here: `ArmCompute` (virtual machines) over its
    `GenericResources` (`res`: the network, by id), behind both real SDK clients, answered under
    one lock (the fleet controller's threads call at once). `sent`: every request either SDK
    serialised, in order; `created`: the JSON bodies of the VMs it accepted.

    - `coordinators_die`: a new coordinator VM's instance view says it powered off at once (its
      boot script failed);
    - `refuse_next`: error codes the next VM creates are refused with (an ARM error document);
    - `lagging_list`: `virtual_machines.list` answers no VM (Azure's list is eventually
      consistent)."""

    def __init__(self) -> None:
        self.compute = ArmCompute()
        self.res = self.compute.generic
        self.lock = threading.RLock()
        self.sent: list[ArmRequest] = []
        self.created: list[dict[str, Any]] = []
        self.coordinators_die = False
        self.refuse_next: list[str] = []
        self.lagging_list = False

    def __call__(self, request: ArmRequest) -> tuple[Any, ...]:
        with self.lock:
            self.sent.append(request)
            vm_put = request.method == "PUT" and _vm_name(request.path) is not None
            if vm_put and self.refuse_next:
                return 400, arm_error(self.refuse_next.pop(0))
            if self.lagging_list and request.method == "GET" and request.path.endswith("/virtualMachines"):
                return 200, {"value": []}
            answer = self.compute(request)
            if vm_put and answer[0] < 300:
                self.created.append(request.body)
                role = (request.body.get("tags") or {}).get(ROLE_TAG)
                if self.coordinators_die and role == COORDINATOR_ROLE:
                    self.compute.power[str(_vm_name(request.path))] = "stopped"
            return answer

    def clients(self) -> dict[str, Any]:
        """AzureProvider's `compute` and `resources`: the real clients, answered by this ARM."""
        return {"compute": compute_client(self, SUB), "resources": resource_client(self, SUB)}

    def calls(self) -> list[tuple[str, str]]:
        """("create" | "delete", VM name) of every VM PUT / DELETE the SDK sent, in order."""
        kinds = {"PUT": "create", "DELETE": "delete"}
        return [
            (kinds[r.method], str(_vm_name(r.path)))
            for r in self.sent
            if r.method in kinds and _vm_name(r.path) is not None
        ]

    def coordinators(self) -> list[dict[str, Any]]:
        """The coordinator VMs that exist, as ARM holds them."""
        with self.lock:
            vms = list(self.compute.vms.values())
        return [vm for vm in vms if (vm.get("tags") or {}).get(ROLE_TAG) == COORDINATOR_ROLE]


def _vm_name(path: str) -> str | None:
    """The VM a request's path names (not an action on it), or None."""
    if "/virtualMachines/" not in path:
        return None
    rest = path.split("/virtualMachines/")[1].split("/")
    return rest[0] if len(rest) == 1 else None


@pytest.fixture
def arm() -> Arm:
    return Arm()


def _provider(arm: Arm, **kw: Any) -> AzureProvider:
    p = AzureProvider(_config(**kw), **arm.clients())
    p.validate()
    p.describe_interval = 0.0  # describe at every call
    return p


def test_the_network_goes_through_the_real_resource_sdk_with_api_version_as_a_keyword(
    arm: Arm,
) -> None:
    """azure-mgmt-resource >= 26 makes `api_version` of `get_by_id`, `begin_create_or_update_by_id`
    and `begin_delete_by_id` keyword-only: given positionally it is a TypeError before any
    request. Through the real ResourceManagementClient (only Azure Resource Manager behind the
    transport is mocked) the job's network is looked up, created and deleted, each request
    naming the network API version in its URL."""
    res = arm.res
    p = _provider(arm)
    assert p.coordinator(JOB, 2) == "http://10.0.0.7:29510"
    p.close()
    sent = p.resources.transport.requests
    assert {r.method for r in sent} == {"GET", "PUT", "DELETE"}
    for r in sent:
        assert r.url.startswith(f"https://management.azure.com{r.path}?")
        assert f"api-version={NETWORK_API_VERSION}" in r.url and r.api_version == NETWORK_API_VERSION
        assert r.path in NET.values()
    nic_put = next(r for r in sent if r.method == "PUT" and r.path == NET["nic"])
    assert nic_put.body["location"] == "eastus" and nic_put.body["tags"][JOB_TAG] == JOB
    assert res.store == {}


def test_coordinator_is_regular_priority_on_a_static_address_in_the_job_groups(
    arm: Arm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The canary secrets of the environment and the job's HMAC key never reach the boot script."""
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    key = new_key()
    save_key(JOB, key)
    res = arm.res
    address = _provider(arm).coordinator(JOB, 2)
    assert address == "http://10.0.0.7:29510"
    (vm,) = arm.created  # the JSON body azure-mgmt-compute serialised
    body = vm["properties"]
    assert body["priority"] == "Regular"  # on demand: never evicted
    assert "evictionPolicy" not in body and "billingProfile" not in body
    assert body["hardwareProfile"]["vmSize"] == "Standard_B1ms"
    # azure_identity_id: its idle guard deallocates the VM with it (the lighthouse reads nothing)
    assert vm["identity"]["type"] == "UserAssigned"
    assert list(vm["identity"]["userAssignedIdentities"]) == [_config().azure_identity_id]
    assert vm["tags"] == {JOB_TAG: JOB, "spotnb-managed": "true", ROLE_TAG: COORDINATOR_ROLE}
    (nic,) = body["networkProfile"]["networkInterfaces"]
    assert nic["id"] == NET["nic"] and nic["properties"]["deleteOption"] == "Detach"
    script = base64.b64decode(body["osProfile"]["customData"]).decode()
    # the lighthouse module travels in the script (it has no identity to read the store with)
    assert '"$SPOTNB_LIGHTHOUSE" --min-replicas 2' in script and '--bind "[::]:29510"' in script
    assert "spotnb.runtime.group.lighthouse.py" in script and "<<'SPOTNB_MODULE'" in script
    assert not [name for name, value in CANARIES.items() if value in script]
    assert key.hex() not in script and KEY_ENV not in script
    # the NIC was created with a dynamic IP, then pinned to the IP Azure gave it
    nic_puts = [body for rid, body in res.puts if rid == NET["nic"]]
    assert [
        p["properties"]["ipConfigurations"][0]["properties"]["privateIPAllocationMethod"] for p in nic_puts
    ] == [
        "Dynamic",
        "Static",
    ]
    pinned = nic_puts[-1]["properties"]
    assert pinned["ipConfigurations"][0]["properties"]["privateIPAddress"] == "10.0.0.7"
    assert pinned["ipConfigurations"][0]["properties"]["applicationSecurityGroups"] == [{"id": NET["asg"]}]
    assert pinned["networkSecurityGroup"] == {"id": NET["nsg"]}
    assert set(res.store) == {NET["asg"], NET["nsg"], NET["ip"], NET["nic"]}
    assert all(res.store[k]["tags"][JOB_TAG] == JOB for k in res.store)


def test_security_group_opens_tcp_to_the_members_only(arm: Arm) -> None:
    res = arm.res
    p = _provider(arm)
    p.coordinator(JOB, 2)
    allow, deny = sorted(
        res.store[NET["nsg"]]["properties"]["securityRules"], key=lambda r: r["properties"]["priority"]
    )
    a, d = allow["properties"], deny["properties"]
    assert (a["access"], a["direction"], a["protocol"]) == ("Allow", "Inbound", "Tcp")
    assert (
        a["sourceApplicationSecurityGroups"]
        == a["destinationApplicationSecurityGroups"]
        == [{"id": NET["asg"]}]
    )
    assert "sourceAddressPrefix" not in a  # no address range: membership only
    # the subnet's default AllowVnetInBound (65000) would admit the whole network: denied first
    assert (d["access"], d["sourceAddressPrefix"], d["priority"]) == ("Deny", "*", 4000)
    assert d["destinationApplicationSecurityGroups"] == [{"id": NET["asg"]}]
    # the Spot VMs of the job join the member group and carry the same security group
    instance = p.launch(_spec())
    spot_vm = arm.created[-1]["properties"]
    assert spot_vm["priority"] == "Spot"
    nic = spot_vm["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert nic["networkSecurityGroup"] == {"id": NET["nsg"]}
    ip_config = nic["ipConfigurations"][0]["properties"]
    assert [g["id"] for g in ip_config["applicationSecurityGroups"]] == [NET["asg"]]
    # and record the coordinator they train with, for the cost ledger
    assert instance.info["coordinator"]["id"] == arm.coordinators()[0]["name"]
    assert instance.info["coordinator"]["price"] == pytest.approx(COORDINATOR_PRICES["Standard_B1ms"])


@pytest.mark.parametrize("death", ["deleted", "powered_off"])
def test_a_dead_coordinator_is_replaced_on_the_same_nic(arm: Arm, death: str) -> None:
    p = _provider(arm)
    address = p.coordinator(JOB, 2)
    (dead,) = arm.coordinators()
    if death == "deleted":
        arm.compute.vms.pop(dead["name"])
    else:  # its idle guard or a failed install powered it off: a stopped VM still bills
        arm.compute.power[dead["name"]] = "stopped"
    assert p.coordinator(JOB, 2) == address
    (replacement,) = arm.coordinators()
    assert replacement["name"] != dead["name"]
    assert replacement["properties"]["networkProfile"]["networkInterfaces"][0]["id"] == NET["nic"]
    assert (("delete", dead["name"]) in arm.calls()) == (death == "powered_off")


def test_a_nic_still_held_by_the_dead_vm_is_tried_again(arm: Arm) -> None:
    p = _provider(arm)
    address = p.coordinator(JOB, 2)
    arm.compute.vms.clear()
    arm.refuse_next = ["NicReservedForAnotherVm"]  # Azure keeps the NIC for the deleted VM a while
    assert p.coordinator(JOB, 2) == address and arm.coordinators() == []
    assert p.coordinator(JOB, 2) == address and len(arm.coordinators()) == 1


def test_close_deletes_the_coordinator_then_its_network(arm: Arm) -> None:
    res = arm.res
    p = _provider(arm)
    p.coordinator(JOB, 2)
    p.launch(_spec())
    (coordinator,) = arm.coordinators()
    p.close()
    assert arm.compute.vms == {} and ("delete", coordinator["name"]) in arm.calls()
    assert res.store == {}
    deleted = [rid for kind, rid in res.log if kind == "delete"]
    assert deleted == [NET["nic"], NET["ip"], NET["nsg"], NET["asg"]]  # the NIC before what it uses


def test_gc_reaps_the_coordinator_and_network_of_an_ended_job(
    arm: Arm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller died without `close`: `spotnb gc` deletes the coordinator and the network."""
    from spotnb.control.jobdb import JobDB

    res = arm.res
    db = JobDB()
    db.add_job(JOB, name=None, provider="azure", region="eastus", instance_type="x", store="az://spotnb/jobs")
    db.update_job(JOB, status="succeeded")
    _provider(arm).coordinator(JOB, 2)  # never closed
    (coordinator,) = arm.coordinators()

    class Wired(AzureProvider):
        def __init__(self, config: Any) -> None:
            super().__init__(config, **arm.clients())

    monkeypatch.setattr("spotnb.settings.registry.get_provider_class", lambda name: Wired)
    assert gc("azure", _config(instances=1, min_instances=1)) == [coordinator["name"]]
    assert arm.compute.vms == {} and res.store == {}


def _fit(ctx: Any) -> int:
    return 1


def test_a_coordinator_that_never_stays_up_fails_the_job_and_leaves_nothing(
    arm: Arm, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The real fleet controller and a file store (the boot check of a remote store is lifted:
    no VM reads it here): every coordinator powers off at once; the job fails with the reason,
    and its way out deletes the Spot VMs, the coordinator and the job's network."""
    res = arm.res
    arm.coordinators_die = True

    class Wired(AzureProvider):
        describe_interval = 0.0

        def __init__(self, config: Any) -> None:
            super().__init__(config, **arm.clients())

    monkeypatch.setattr("spotnb.api.get_provider_class", lambda name: Wired)
    monkeypatch.setattr(azure_module, "require_remote_store", lambda config, name: None)
    job = spot.train(_fit, _config(store=(tmp_path / "store").as_uri()), detach=False)
    assert job.wait(120), f"job still {job.status}"
    assert job.status == JobStatus.FAILED
    assert "did not stay up" in (job.state.error.message if job.state.error else "")
    job.driver._thread.join(timeout=120)
    assert not job.driver._thread.is_alive()
    assert len([c for c in arm.calls() if c[0] == "create" and "-coord-" in c[1]]) == MAX_COORDINATOR_LAUNCHES
    assert arm.compute.vms == {}  # Spot VMs and coordinators alike
    assert res.store == {}


def test_dry_run_lists_the_coordinator_and_its_price() -> None:
    plan = spot.train(_fit, _config(coordinator_instance_type="Standard_B2s"), dry_run=True)
    coordinator = plan["coordinator"]
    assert coordinator["market"] == "on-demand" and coordinator["instance_type"] == "Standard_B2s"
    assert coordinator["price_on_demand"] == pytest.approx(0.0416 + 0.005)  # the VM and its public IP
    vm_puts = [r for r in plan["requests"] if r["api"] == "compute.virtual_machines.begin_create_or_update"]
    assert [r["body"]["properties"]["priority"] for r in vm_puts] == ["Regular", "Spot"]
    spot_nic = vm_puts[1]["body"]["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]
    assert "/networkSecurityGroups/spotnb-job-" in spot_nic["properties"]["networkSecurityGroup"]["id"]
    text = str(plan)
    line = next(row for row in text.splitlines() if row.strip().startswith("coordinator"))
    assert "Standard_B2s" in line and "$0.0466/h on demand" in line and "not spot" in line
    assert "3 spot instances" in text


def test_ledger_bills_the_coordinator_on_its_own_line(arm: Arm) -> None:
    p = _provider(arm)
    p.coordinator(JOB, 2)
    instance = p.launch(_spec())
    started = instance.info["coordinator"]["started"]
    span = Span(
        1,
        started,
        started + 60,
        started + 120,
        started + 3660,
        False,
        Progress(step=100, compute_s=3540.0),
        0.16,
        0.53,
    )
    plain = compute_breakdown([span], started, started + 3660)
    billed = compute_breakdown(
        [span], started, started + 3660, overheads=coordinator_overheads([instance.info])
    )
    assert billed.coordinator_cost == pytest.approx(COORDINATOR_PRICES["Standard_B1ms"] * 3660 / 3600)
    assert billed.total_cost == pytest.approx(plain.spot_cost + billed.coordinator_cost)
    assert billed.spot_cost == plain.spot_cost and "coordinator $" in billed.table()


def test_a_list_that_lags_behind_never_starts_a_second_coordinator(
    arm: Arm,
) -> None:
    """Azure's list is eventually consistent: a VM created a moment ago may be missing from it.
    The provider asks the VM it started directly before starting another one on demand."""
    p = _provider(arm)
    p.coordinator(JOB, 2)
    arm.lagging_list = True
    asked = len(arm.sent)
    p.coordinator(JOB, 2)
    arm.lagging_list = False
    assert len(arm.coordinators()) == 1
    listed = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines"
    assert ("GET", listed) in [(r.method, r.path) for r in arm.sent[asked:]]  # answered without it


def test_a_coordinator_that_fails_half_way_leaves_no_network(arm: Arm) -> None:
    """The security groups were made, then the NIC was refused: `close` still deletes them."""
    res = arm.res
    res.refuse[NET["nic"]] = "AuthorizationFailed"
    p = _provider(arm)
    with pytest.raises(HttpResponseError, match="AuthorizationFailed"):
        p.coordinator(JOB, 2)
    assert NET["nsg"] in res.store
    p.close()
    assert res.store == {} and arm.compute.vms == {}


def test_a_nic_left_unpinned_by_a_dead_controller_is_pinned(arm: Arm) -> None:
    """A controller died between creating the NIC (dynamic IP) and pinning it: the next one
    pins the IP the NIC already has rather than making another NIC."""
    res = arm.res
    p = _provider(arm)
    net = p.ensure_job_network(JOB, "eastus")
    p._put(NET["nic"], coordinator_nic_body(JOB, "eastus", SUBNET, net))
    assert _provider(arm).coordinator(JOB, 2) == "http://10.0.0.7:29510"
    ip_config = res.store[NET["nic"]]["properties"]["ipConfigurations"][0]["properties"]
    assert ip_config["privateIPAllocationMethod"] == "Static" and ip_config["privateIPAddress"] == "10.0.0.7"


def test_the_old_aws_coordinator_names_still_work_with_a_warning() -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = spot.Config(
            provider="aws", aws_coordinator_port=30000, aws_coordinator_instance_type="t3.micro"
        )
    assert sorted(
        str(w.message).split(" is now ")[0] for w in caught if w.category is DeprecationWarning
    ) == [
        "Config.aws_coordinator_instance_type",
        "Config.aws_coordinator_port",
    ]
    assert (cfg.coordinator_port, cfg.coordinator_instance_type) == (30000, "t3.micro")
    with pytest.raises(ConfigError, match="give only coordinator_price"):
        spot.Config(aws_coordinator_price=0.1, coordinator_price=0.2)
    with pytest.raises(ConfigError, match="coordinator_port"):
        spot.Config(coordinator_port=True)
    with pytest.raises(ConfigError, match="coordinator_price"):
        spot.Config(coordinator_price=-1)


def test_a_spec_written_with_the_old_names_resumes_silently() -> None:
    """A job submitted before the rename (its spec dumps every field, old names included) is
    resumed with the new fields and no warning about names its user never wrote."""
    import warnings

    from spotnb.core.spec import JobSpec, config_json

    data = config_json(spot.Config(provider="aws", coordinator_port=30001, coordinator_price=0.03))
    old = {("aws_" + k if k.startswith("coordinator_") else k): v for k, v in data.items()}
    spec = JobSpec(job_id="j1", created=1.0, spotnb_version="0.1", cwd="/", config=old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = spec.to_config()
    assert (cfg.coordinator_port, cfg.coordinator_price) == (30001, 0.03)


def test_a_hosted_controller_runs_on_the_coordinator_with_its_identity(
    arm: Arm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Config.controller="cloud"`: the coordinator carries the controller (and the job key it
    verifies the spec with), runs as Config.controller_identity, never a credential; the
    notebook's `close` leaves it running, and asking again does not start a second one."""
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    identity = (
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/"
        "Microsoft.ManagedIdentity/userAssignedIdentities/ctl"
    )
    shipped = ship_fake(monkeypatch)  # the store is not reachable here
    p = _provider(arm, controller="cloud", controller_identity=identity)
    p.host_controller(JOB, "az://spotnb/jobs", "ab" * 32)
    p.close()
    (vm,) = arm.created  # the JSON body azure-mgmt-compute serialised
    assert list(vm["identity"]["userAssignedIdentities"]) == [identity]
    script = base64.b64decode(vm["properties"]["osProfile"]["customData"]).decode()
    assert f"spotnb.cli controller {JOB} --store az://spotnb/jobs" in script
    assert "spotnb.runtime.group.lighthouse --min-replicas 2" in script  # several instances: both
    assert "SPOTNB_WHEEL_EXTRAS='[azure,elastic]'" in script and "ab" * 32 in script
    assert shipped == [(JOB, bytes.fromhex("ab" * 32))]  # the job's wheel, verified with its key
    assert not [name for name, value in CANARIES.items() if value in script]
    assert not [c for c in arm.calls() if c[0] == "delete"]  # the job now depends on it
    again = _provider(arm, controller="cloud", controller_identity=identity)
    again.host_controller(JOB, "az://spotnb/jobs", "ab" * 32)
    assert len(arm.created) == 1
