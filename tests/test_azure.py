"""Azure provider. The compute control plane cannot run here (no emulator exists), so it is the
one thing mocked: recording stand-ins for `ComputeManagementClient.virtual_machines` and
`ResourceManagementClient.resource_groups`. The VirtualMachine built for create, the
ResourceGroup created on first use, and the delete / simulate_eviction calls, are asserted field
by field against azure-mgmt-compute's and azure-mgmt-resource's own models and their REST
serialisation (`as_dict`), with no network. The Blob store itself runs against Azurite in
test_store_conformance.py."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.compute import models as m
from azure.mgmt.resource.resources.models import ResourceGroup

import spotnb as spot
from spotnb.errors import CapacityError, ConfigError
from spotnb.providers import get_provider_class
from spotnb.providers.azure import DEFAULT_IMAGE, AzureProvider, build_vm, throwaway_ssh_key, vm_name
from spotnb.providers.base import InstanceState, LaunchSpec
from spotnb.providers.cleanup import JOB_TAG, MANAGED_TAG

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
        command=[
            "python",
            "-m",
            "spotnb.runtime.agent",
            "--store",
            "az://spotnb/jobs",
            "--job",
            "20261121-000000-abc123",
            "--incarnation",
            "2",
        ],
        spotnb_version="0.1.0",
    )


class _Poller:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def done(self) -> bool:
        return True

    def result(self) -> None:
        if self.error:
            raise self.error


class FakeVirtualMachines:
    """Records calls; `view` is the instance view the next describe sees."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []
        self.fail_create: Exception | None = None
        self.view: Any = None

    def begin_create_or_update(self, rg: str, name: str, vm: m.VirtualMachine) -> _Poller:
        self.calls.append(("create", (rg, name, vm), {}))
        if self.fail_create:
            raise self.fail_create
        return _Poller()

    def instance_view(self, rg: str, name: str) -> Any:
        self.calls.append(("instance_view", (rg, name), {}))
        if self.view is None:
            raise ResourceNotFoundError("not found")
        return self.view

    def begin_delete(self, rg: str, name: str) -> _Poller:
        self.calls.append(("delete", (rg, name), {}))
        return _Poller()

    def simulate_eviction(self, rg: str, name: str) -> None:
        self.calls.append(("simulate_eviction", (rg, name), {}))

    def list(self, rg: str) -> list[Any]:
        return [
            SimpleNamespace(name="spotnb-x-1", location="eastus", tags={JOB_TAG: "x"}),
            SimpleNamespace(name="other", location="eastus", tags={}),
        ]

    def list_all(self) -> list[Any]:
        vm_id = (
            f"/subscriptions/{SUB}/resourceGroups/spotnb-westeurope/providers/"
            "Microsoft.Compute/virtualMachines/spotnb-y-2"
        )
        return [
            SimpleNamespace(name="spotnb-y-2", location="westeurope", tags={JOB_TAG: "y"}, id=vm_id),
            SimpleNamespace(name="other", location="eastus", tags={}, id="/x"),
        ]


class FakeResourceGroups:
    """Records `resource_groups.create_or_update(name, ResourceGroup)` calls into `log`, a list
    shared with the VMs' fake so the order of the two is visible."""

    def __init__(self, log: list) -> None:
        self.log = log

    def create_or_update(self, name: str, group: ResourceGroup) -> ResourceGroup:
        self.log.append(("create_group", (name, group), {}))
        return group


def _view(*codes: str) -> m.VirtualMachineInstanceView:
    return m.VirtualMachineInstanceView(statuses=[m.InstanceViewStatus(code=c) for c in codes])


@pytest.fixture
def fake() -> FakeVirtualMachines:
    return FakeVirtualMachines()


@pytest.fixture
def provider(fake: FakeVirtualMachines) -> AzureProvider:
    p = AzureProvider(_config(), compute=SimpleNamespace(virtual_machines=fake))
    p.validate()
    return p


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


def test_launch_describe_terminate_inject(provider: AzureProvider, fake: FakeVirtualMachines) -> None:
    inst = provider.launch(_spec())
    kind, (rg, name, vm), _ = fake.calls[0]
    assert (kind, rg, name) == ("create", RG, vm_name(_spec())) and inst.id == name
    script = base64.b64decode(vm.os_profile.custom_data).decode()
    assert "export AZURE_STORAGE_ACCOUNT_NAME=spotnbstore" in script
    fake.view = _view("ProvisioningState/creating")
    assert provider.describe(inst).state == InstanceState.PENDING
    fake.view = _view("ProvisioningState/succeeded", "PowerState/running")
    assert provider.describe(inst).state == InstanceState.RUNNING
    fake.view = _view("ProvisioningState/succeeded", "PowerState/stopped")
    assert provider.describe(inst).state == InstanceState.EXITED  # the guest powered off
    fake.view = _view("ProvisioningState/succeeded", "PowerState/deallocated")
    assert provider.describe(inst).state == InstanceState.PREEMPTED  # evicted (Deallocate)
    fake.view = None
    assert provider.describe(inst).state == InstanceState.PREEMPTED  # evicted (Delete)
    provider.inject(inst)
    assert fake.calls[-1] == ("simulate_eviction", (RG, name), {})
    provider.terminate(inst)
    assert fake.calls[-1] == ("delete", (RG, name), {})
    assert provider.describe(inst).state == InstanceState.TERMINATED


def test_capacity_errors_move_on(provider: AzureProvider, fake: FakeVirtualMachines) -> None:
    err = HttpResponseError(message="The requested size is not available in location 'eastus'")
    err.error = SimpleNamespace(code="SkuNotAvailable")
    fake.fail_create = err
    with pytest.raises(CapacityError, match="SkuNotAvailable in eastus"):
        provider.launch(_spec())
    other = HttpResponseError(message="bad request")
    other.error = SimpleNamespace(code="InvalidParameter")
    fake.fail_create = other
    with pytest.raises(HttpResponseError):
        provider.launch(_spec())


def test_close_deletes_what_it_launched(provider: AzureProvider, fake: FakeVirtualMachines) -> None:
    provider.launch(_spec())
    provider.close()
    assert fake.calls[-1][0] == "delete"


def test_validate() -> None:
    AzureProvider(_config(azure_subnet_id=None)).validate()  # spotnb's own network then
    with pytest.raises(ConfigError, match="azure_identity_id"):
        AzureProvider(_config(azure_identity_id=None)).validate()
    with pytest.raises(ConfigError, match="az://"):
        AzureProvider(_config(store="memory://x")).validate()
    with pytest.raises(ConfigError, match="azure_image"):
        AzureProvider(_config(azure_image="not-an-image")).validate()


def _default_group_provider(fake: FakeVirtualMachines) -> AzureProvider:
    p = AzureProvider(
        _config(azure_resource_group=None),
        compute=SimpleNamespace(virtual_machines=fake),
        resources=SimpleNamespace(resource_groups=FakeResourceGroups(fake.calls)),
    )
    p.validate()  # no azure_resource_group is fine
    return p


def test_default_resource_group_is_created_on_first_use(fake: FakeVirtualMachines) -> None:
    provider = _default_group_provider(fake)
    inst = provider.launch(_spec())
    (kind, (name, group), _), create = fake.calls[0], fake.calls[1]
    assert (kind, name) == ("create_group", "spotnb-eastus")  # before the VM
    assert isinstance(group, ResourceGroup)
    assert group.location == "eastus" and group.tags == {MANAGED_TAG: "true"}
    assert dict(group) == {"location": "eastus", "tags": {MANAGED_TAG: "true"}}  # the REST body
    assert create[0] == "create" and create[1][0] == "spotnb-eastus"
    assert inst.info["resource_group"] == "spotnb-eastus"
    # once per location: a second incarnation reuses it; another location gets its own
    provider.launch(_spec())
    provider.launch(_spec(region="westeurope"))
    groups = [c[1][0] for c in fake.calls if c[0] == "create_group"]
    assert groups == ["spotnb-eastus", "spotnb-westeurope"]
    # the VM is watched, evicted and deleted in the group it was created in
    provider.inject(inst)
    assert fake.calls[-1] == ("simulate_eviction", ("spotnb-eastus", inst.id), {})
    provider.terminate(inst)
    assert fake.calls[-1] == ("delete", ("spotnb-eastus", inst.id), {})
    # gc without a configured group looks through the subscription
    assert [(i.id, i.info["resource_group"], job) for i, job in provider.list_tagged()] == [
        ("spotnb-y-2", "spotnb-westeurope", "y")
    ]


def test_configured_resource_group_is_never_created(
    provider: AzureProvider, fake: FakeVirtualMachines
) -> None:
    provider.launch(_spec())
    assert [c[0] for c in fake.calls] == ["create"] and fake.calls[0][1][0] == RG


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


def test_list_tagged(provider: AzureProvider) -> None:
    assert [(i.id, job) for i, job in provider.list_tagged()] == [("spotnb-x-1", "x")]


def test_retail_prices_over_http_every_page_linux_meters_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """The public Retail Prices API, served over real HTTP from pages in its documented shape
    (tests/fixtures/azure_retail): both pages are read (NextPageLink), Windows and Low Priority
    meters are not Linux spot prices, and the result is cached on disk with its age."""
    import http.server
    import json
    import threading
    from pathlib import Path

    from spotnb.providers import azure

    pages = Path(__file__).parent / "fixtures" / "azure_retail"
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
