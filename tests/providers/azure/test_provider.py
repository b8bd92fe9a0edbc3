"""Azure provider. Azure Resource Manager has no emulator, so it is the one thing faked, and at
the HTTP layer: AzureProvider drives the REAL `azure.mgmt.compute.ComputeManagementClient` and
`azure.mgmt.resource.ResourceManagementClient` (the installed versions: their signatures,
request serialisation, pollers and error mapping all run), whose pipeline transport is
`tests.support.azure_transport.ArmTransport`, answered in-process by `ArmCompute` (VMs, instance views,
list / list_all, simulate_eviction, delete) over `GenericResources` (the resource group). What is
asserted is what the SDK sent: each request's method, URL and JSON body (`priority: Spot`,
`evictionPolicy`, `billingProfile.maxPrice`, tags, identity, image, `osProfile.customData`, the
ResourceGroup created on first use), so a wrong keyword or field fails here as in production.
`build_vm`'s model is also checked field by field. No request leaves the process. The Blob
store itself runs against Azurite in test_store_conformance.py."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from azure.mgmt.compute import models as m

import spotnb as spot
from spotnb.errors import CapacityError, ConfigError
from spotnb.providers.azure.provider import DEFAULT_IMAGE, AzureProvider, build_vm, throwaway_ssh_key, vm_name
from spotnb.providers.base import InstanceState, LaunchSpec
from spotnb.providers.cleanup import JOB_TAG, MANAGED_TAG
from spotnb.settings.registry import get_provider_class
from tests.support.azure_transport import ArmCompute, ArmRequest, compute_client, resource_client
from tests.support.jobs import agent_command
from tests.support.paths import FIXTURES

SUB = "00000000-0000-0000-0000-000000000000"
RG = "spotnb-rg"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/v/subnets/s"
IDENTITY = (
    f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ManagedIdentity/"
    "userAssignedIdentities/spotnb"
)


def _config(**kw: Any) -> spot.Config:
    base = dict(
        provider="azure",
        store="az://spotnb/jobs",
        region="eastus",
        instance_type="Standard_NC4as_T4_v3",
        azure_subscription_id=SUB,
        azure_resource_group=RG,
        azure_subnet_id=SUBNET,
        azure_identity_id=IDENTITY,
        azure_storage_account="spotnbstore",
        azure_max_price=0.9,
    )
    return spot.Config(**{**base, **kw})


def _spec(region: str = "eastus") -> LaunchSpec:
    return LaunchSpec(
        job_id="20261121-000000-abc123",
        incarnation=2,
        store_url="az://spotnb/jobs",
        instance_type="Standard_NC4as_T4_v3",
        region=region,
        command=agent_command("az://spotnb/jobs", "20261121-000000-abc123", 2),
        spotnb_version="0.1.0",
    )


VMS = "/providers/Microsoft.Compute/virtualMachines"


def _vm_path(rg: str, name: str, action: str = "") -> str:
    return f"/subscriptions/{SUB}/resourceGroups/{rg}{VMS}/{name}" + (f"/{action}" if action else "")


def _seed_vm(arm: ArmCompute, rg: str, name: str, location: str, tags: dict[str, str]) -> None:
    """A VM that exists in the subscription (what list / list_all answer)."""
    arm.vms[name] = {
        "id": _vm_path(rg, name),
        "name": name,
        "type": "Microsoft.Compute/virtualMachines",
        "location": location,
        "tags": tags,
        "properties": {"provisioningState": "Succeeded"},
    }


class Arm:
    """Azure Resource Manager (`ArmCompute`, over its `GenericResources`) behind both real
    clients; `sent` is every request either client's SDK serialised, in order."""

    def __init__(self) -> None:
        self.compute = ArmCompute()
        self.sent: list[ArmRequest] = []

    def __call__(self, request: ArmRequest) -> tuple[Any, ...]:
        self.sent.append(request)
        return self.compute(request)

    def provider(self, **kw: Any) -> AzureProvider:
        p = AzureProvider(
            _config(**kw), compute=compute_client(self, SUB), resources=resource_client(self, SUB)
        )
        p.validate()
        return p

    def calls(self) -> list[tuple[str, str]]:
        """(method, path) of every request, api-version checked on each."""
        assert all(r.api_version for r in self.sent)
        return [(r.method, r.path) for r in self.sent]


@pytest.fixture
def arm() -> Arm:
    return Arm()


@pytest.fixture
def provider(arm: Arm) -> AzureProvider:
    return arm.provider()


def test_registry() -> None:
    assert get_provider_class("azure") is AzureProvider


def test_vm_model_field_by_field() -> None:
    key = throwaway_ssh_key()
    assert key.startswith("ssh-ed25519 ")
    vm = build_vm(_spec(), _config(), "eastus", key)
    assert isinstance(vm, m.VirtualMachine)
    assert vm.location == "eastus"
    assert vm.priority == m.VirtualMachinePriorityTypes.SPOT
    assert vm.eviction_policy == "Delete"
    assert vm.billing_profile.max_price == 0.9
    assert vm.hardware_profile.vm_size == "Standard_NC4as_T4_v3"
    assert vm.tags == {JOB_TAG: "20261121-000000-abc123", "spotnb-incarnation": "2", "spotnb-managed": "true"}
    img = vm.storage_profile.image_reference
    assert (img.publisher, img.offer, img.sku, img.version) == tuple(DEFAULT_IMAGE.split(":"))
    assert vm.storage_profile.os_disk.delete_option == "Delete"
    nic = vm.network_profile.network_interface_configurations[0]
    assert nic.delete_option == "Delete" and nic.primary
    ip = nic.ip_configurations[0]
    assert ip.subnet.id == SUBNET
    assert ip.public_ip_address_configuration.delete_option == "Delete"
    assert ip.public_ip_address_configuration.sku.name == "Standard"  # closed to inbound by default
    assert vm.network_profile.network_api_version
    assert vm.os_profile.linux_configuration.disable_password_authentication is True
    assert vm.os_profile.linux_configuration.ssh.public_keys[0].key_data == key
    assert list(vm.identity.user_assigned_identities) == [IDENTITY]
    cloud_config = base64.b64decode(vm.os_profile.custom_data).decode()
    assert cloud_config.startswith("#cloud-config\n")
    assert "python -m spotnb.runtime.agent" not in cloud_config  # "$PY" -m ...
    assert '"$PY" -m spotnb.runtime.agent --store az://spotnb/jobs' in cloud_config
    assert "export AZURE_STORAGE_ACCOUNT_NAME=spotnbstore" not in cloud_config  # added by provider
    # the REST body azure-mgmt-compute sends
    body = vm.as_dict()
    props = body["properties"]
    assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
    assert props["billingProfile"] == {"maxPrice": 0.9}
    assert props["osProfile"]["customData"] == vm.os_profile.custom_data
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"


def test_launch_describe_terminate_inject(provider: AzureProvider, arm: Arm) -> None:
    inst = provider.launch(_spec())
    name = vm_name(_spec())
    assert inst.id == name
    (put,) = arm.sent  # the VM, and nothing else (group and subnet are configured)
    assert (put.method, put.path) == ("PUT", _vm_path(RG, name)) and put.api_version
    # the body azure-mgmt-compute serialised
    assert put.body["location"] == "eastus"
    assert put.body["tags"] == {
        JOB_TAG: "20261121-000000-abc123",
        "spotnb-incarnation": "2",
        "spotnb-managed": "true",
    }
    assert put.body["identity"]["type"] == "UserAssigned"
    assert list(put.body["identity"]["userAssignedIdentities"]) == [IDENTITY]
    props = put.body["properties"]
    assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
    assert props["billingProfile"] == {"maxPrice": 0.9}
    assert props["hardwareProfile"] == {"vmSize": "Standard_NC4as_T4_v3"}
    img = props["storageProfile"]["imageReference"]
    assert (img["publisher"], img["offer"], img["sku"], img["version"]) == tuple(DEFAULT_IMAGE.split(":"))
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    nic = props["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert nic["ipConfigurations"][0]["properties"]["subnet"] == {"id": SUBNET}
    linux = props["osProfile"]["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True
    assert linux["ssh"]["publicKeys"][0]["keyData"].startswith("ssh-ed25519 ")
    script = base64.b64decode(props["osProfile"]["customData"]).decode()
    assert script.startswith("#cloud-config\n")
    assert "export AZURE_STORAGE_ACCOUNT_NAME=spotnbstore" in script
    assert '"$PY" -m spotnb.runtime.agent --store az://spotnb/jobs' in script
    arm.compute.views[name] = ["ProvisioningState/creating"]
    assert provider.describe(inst).state == InstanceState.PENDING
    arm.compute.views[name] = ["ProvisioningState/succeeded", "PowerState/running"]
    assert provider.describe(inst).state == InstanceState.RUNNING
    arm.compute.views[name] = ["ProvisioningState/succeeded", "PowerState/stopped"]
    assert provider.describe(inst).state == InstanceState.EXITED  # the guest powered off
    arm.compute.views[name] = ["ProvisioningState/succeeded", "PowerState/deallocated"]
    assert provider.describe(inst).state == InstanceState.PREEMPTED  # evicted (Deallocate)
    assert arm.calls()[-1] == ("GET", _vm_path(RG, name, "instanceView"))
    del arm.compute.vms[name]
    assert provider.describe(inst).state == InstanceState.PREEMPTED  # evicted (Delete): 404
    provider.inject(inst)
    assert arm.calls()[-1] == ("POST", _vm_path(RG, name, "simulateEviction"))
    provider.terminate(inst)
    assert arm.calls()[-1] == ("DELETE", _vm_path(RG, name))
    assert provider.describe(inst).state == InstanceState.TERMINATED


def test_capacity_errors_move_on(provider: AzureProvider, arm: Arm) -> None:
    arm.compute.refuse_all = (
        409,
        "SkuNotAvailable",
        "The requested size is not available in location 'eastus'",
    )
    with pytest.raises(CapacityError, match="SkuNotAvailable in eastus"):
        provider.launch(_spec())
    arm.compute.refuse_all = (400, "InvalidParameter", "bad request")
    with pytest.raises(HttpResponseError, match="InvalidParameter") as raised:
        provider.launch(_spec())
    assert raised.value.error.code == "InvalidParameter"
    assert arm.compute.vms == {}


def test_close_deletes_what_it_launched(provider: AzureProvider, arm: Arm) -> None:
    inst = provider.launch(_spec())
    provider.close()
    assert arm.calls()[-1] == ("DELETE", _vm_path(RG, inst.id))
    assert arm.compute.vms == {}


def test_validate() -> None:
    AzureProvider(_config(azure_subnet_id=None)).validate()  # spotnb's own network then
    with pytest.raises(ConfigError, match="azure_identity_id"):
        AzureProvider(_config(azure_identity_id=None)).validate()
    with pytest.raises(ConfigError, match="az://"):
        AzureProvider(_config(store="memory://x")).validate()
    with pytest.raises(ConfigError, match="azure_image"):
        AzureProvider(_config(azure_image="not-an-image")).validate()


def test_default_resource_group_is_created_on_first_use(arm: Arm) -> None:
    provider = arm.provider(azure_resource_group=None)  # no azure_resource_group is fine
    inst = provider.launch(_spec())
    (group, create) = arm.sent
    # the group first, as azure-mgmt-resource serialised `create_or_update`, then the VM in it
    assert (group.method, group.path) == ("PUT", f"/subscriptions/{SUB}/resourcegroups/spotnb-eastus")
    assert group.body == {"location": "eastus", "tags": {MANAGED_TAG: "true"}}
    assert (create.method, create.path) == ("PUT", _vm_path("spotnb-eastus", inst.id))
    assert inst.info["resource_group"] == "spotnb-eastus"
    # once per location: a second incarnation reuses it; another location gets its own
    provider.launch(_spec())
    provider.launch(_spec(region="westeurope"))
    groups = [r.path.rsplit("/", 1)[-1] for r in arm.sent if "/resourcegroups/" in r.path]
    assert groups == ["spotnb-eastus", "spotnb-westeurope"]
    assert arm.sent[-1].path == _vm_path("spotnb-westeurope", inst.id)
    # the VM is watched, evicted and deleted in the group it was created in
    provider.inject(inst)
    assert arm.calls()[-1] == ("POST", _vm_path("spotnb-eastus", inst.id, "simulateEviction"))
    provider.terminate(inst)
    assert arm.calls()[-1] == ("DELETE", _vm_path("spotnb-eastus", inst.id))
    # gc without a configured group looks through the subscription
    arm.compute.vms.clear()
    _seed_vm(arm.compute, "spotnb-westeurope", "spotnb-y-2", "westeurope", {JOB_TAG: "y"})
    _seed_vm(arm.compute, "elsewhere", "other", "eastus", {})
    assert [(i.id, i.info["resource_group"], job) for i, job in provider.list_tagged()] == [
        ("spotnb-y-2", "spotnb-westeurope", "y")
    ]
    assert arm.calls()[-1] == ("GET", f"/subscriptions/{SUB}{VMS}")  # list_all


def test_configured_resource_group_is_never_created(provider: AzureProvider, arm: Arm) -> None:
    inst = provider.launch(_spec())
    assert arm.calls() == [("PUT", _vm_path(RG, inst.id))]


def test_dry_run_names_the_default_resource_group() -> None:
    def fit(ctx):
        return 1

    plan = spot.train(fit, _config(azure_resource_group=None), dry_run=True)
    assert plan["resource_group"] == "spotnb-eastus"
    group, vm = plan["requests"]
    assert group["api"] == "resources.resource_groups.create_or_update"
    assert group["args"] == {"resource_group_name": "spotnb-eastus"}
    assert group["body"] == {"location": "eastus", "tags": {MANAGED_TAG: "true"}}
    assert "first use" in group["note"]
    assert vm["api"] == "compute.virtual_machines.begin_create_or_update"
    assert vm["args"]["resource_group_name"] == "spotnb-eastus"
    assert plan["terminate"]["args"]["resource_group_name"] == "spotnb-eastus"
    assert "spotnb-eastus" in str(plan)


def test_dry_run() -> None:
    def fit(ctx):
        return 1

    plan = spot.train(fit, _config(), dry_run=True)
    req = plan["requests"][0]
    assert req["api"] == "compute.virtual_machines.begin_create_or_update"
    assert req["body"]["properties"]["priority"] == "Spot"
    assert plan["cloud_config"].startswith("#cloud-config")
    assert plan["fault_injection"]["api"].endswith("simulate_eviction")
    assert "begin_create_or_update" in str(plan)


def test_list_tagged(provider: AzureProvider, arm: Arm) -> None:
    _seed_vm(arm.compute, RG, "spotnb-x-1", "eastus", {JOB_TAG: "x"})
    _seed_vm(arm.compute, RG, "other", "eastus", {})
    _seed_vm(arm.compute, "another-group", "spotnb-z-3", "eastus", {JOB_TAG: "z"})
    assert [(i.id, job) for i, job in provider.list_tagged()] == [("spotnb-x-1", "x")]
    assert arm.calls() == [("GET", f"/subscriptions/{SUB}/resourceGroups/{RG}{VMS}")]  # list(RG)


def test_retail_prices_over_http_every_page_linux_meters_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """The public Retail Prices API, served over real HTTP from pages in its documented shape
    (tests/support/fixtures/azure_retail): both pages are read (NextPageLink), Windows and Low Priority
    meters are not Linux spot prices, and the result is cached on disk with its age."""
    import http.server
    import json
    import threading

    from spotnb.providers.azure import provider as azure

    pages = FIXTURES / "azure_retail"
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked.append(self.path)
            page = json.loads((pages / ("page2.json" if "page=2" in self.path else "page1.json")).read_text())
            if page.get("NextPageLink"):
                page["NextPageLink"] = f"http://127.0.0.1:{server.server_port}/prices?page=2"
            body = json.dumps(page).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(azure, "_RETAIL_API", f"http://127.0.0.1:{server.server_port}/prices")
        price = azure._retail_price("Standard_NC4as_T4_v3", "eastus")
        assert (price.spot, price.on_demand) == (0.1578, 0.526)
        assert price.source == "Azure Retail Prices API (fetched just now)"
        assert len(asked) == 2 and "armSkuName" in asked[0] and "meterRegion" in asked[0]
        again = azure._retail_price("Standard_NC4as_T4_v3", "eastus")
        assert again == price and len(asked) == 2  # from the cache
    finally:
        server.shutdown()
