"""The coordinator of a job on several instances on Azure (mixed into `AzureProvider`).

torchft's lighthouse must outlive every Spot VM, so it runs on a small regular-priority
(on-demand) VM, `Standard_B1ms` unless `Config.coordinator_instance_type` says otherwise. Per
job, created once and tagged with the job id (so `spotnb gc` and a later controller find them):

- an application security group `spotnb-job-<id>`: the job's members. Every Spot VM of the job
  (its inline NIC's IP configuration) and the coordinator's NIC are in it;
- a network security group `spotnb-job-<id>` on those NICs: TCP allowed from the group to the
  group, everything else inbound denied (the subnet's default rules let the whole virtual
  network in; the deny, at a lower priority number, overrides that for the job's VMs);
- a Standard public IP (closed to inbound traffic; the pip install needs a way out) and a NIC
  whose private IP is made static once Azure assigned it: a coordinator that died is replaced
  on the same NIC, so it answers at the address the replicas know.

The network resources are created with azure-mgmt-resource's generic `resources` operations
(PUT by resource id, `NETWORK_API_VERSION`), so the SDK dependencies stay azure-mgmt-compute and
azure-mgmt-resource. `close` and `spotnb gc` delete the VM, then the NIC, the IP and the groups.
The same operations create spotnb's own virtual network when `azure_subnet_id` is not given
(`ensure_subnet`) and let `spotnb gc` delete it (`gc_networks`). The coordinator carries
`azure_identity_id`: its idle guard deallocates the VM with it (a VM powered off from inside is
still billed on Azure); the lighthouse reads nothing with it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, ClassVar

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.compute import models as m

from spotnb.errors import ConfigError
from spotnb.market.prices import Price
from spotnb.providers.bootstrap import azure_cloud_config
from spotnb.providers.cleanup import JOB_TAG, MANAGED_TAG
from spotnb.providers.coordinator import (
    COORDINATOR_ROLE,
    MAX_COORDINATOR_LAUNCHES,
    ROLE_TAG,
    SETTLED_S,
    HostedController,
    KnownCoordinator,
    coordinator_boot_script,
    coordinator_price,
    coordinator_record,
    coordinator_type,
    failed_starts,
    host_on_coordinator,
)

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "AzureCoordinator",
    "DEFAULT_ADDRESS_SPACE",
    "DEFAULT_SUBNET",
    "default_network_ids",
    "default_network_body",
    "COORDINATOR_SIZE",
    "COORDINATOR_PRICES",
    "JobNetwork",
    "job_network_ids",
    "members_group_body",
    "job_nsg_body",
    "coordinator_ip_body",
    "coordinator_nic_body",
    "build_coordinator_vm",
    "coordinator_vm_name",
]

log = logging.getLogger("spotnb.providers.azure.provider")

NETWORK_API_VERSION = "2022-11-01"
ADMIN_USER = "spotnb"
#: The coordinator's size when Config.coordinator_instance_type is not set: 2 GiB like AWS's
#: t3.small and GCP's e2-small (the B1s's 1 GiB is tight for a pip install of torchft).
COORDINATOR_SIZE = "Standard_B1ms"
_PUBLIC_IP_PER_H = 0.005  # a Standard static public IPv4 address
#: On-demand Linux $/h (eastus, pay as you go) of small sizes, plus its public IP's $0.005/h,
#: for the ledger and the dry run when the built-in table (GPU sizes) has no row for them.
COORDINATOR_PRICES = {
    size: round(price + _PUBLIC_IP_PER_H, 4)
    for size, price in {
        "Standard_B1s": 0.0104,
        "Standard_B1ms": 0.0207,
        "Standard_B2s": 0.0416,
        "Standard_B2ms": 0.0832,
        "Standard_D2s_v5": 0.096,
        "Standard_D2as_v5": 0.086,
    }.items()
}
#: Errors that mean "not yet": the NIC still belongs to the VM that died (Azure keeps it for
#: that VM for a while after its deletion) or the size has no capacity; the next call retries.
_RETRY_CODES = frozenset(
    {
        "NicInUse",
        "NicReservedForAnotherVm",
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "Conflict",
    }
)
_GONE_STATES = (
    "PowerState/stopped",
    "PowerState/deallocated",
    "PowerState/deallocating",
    "PowerState/stopping",
)
_IN_USE = ("InUse", "CannotBeDeleted", "Conflict", "AnotherOperationInProgress")


#: The address space and the subnet of the virtual network spotnb creates on first use when
#: Config.azure_subnet_id is not set (Azure has no default network): its own network, so any
#: private range does; Azure's own portal default.
DEFAULT_ADDRESS_SPACE = "10.0.0.0/16"
DEFAULT_SUBNET = "10.0.0.0/20"
_DEFAULT_SUBNET_NAME = "spotnb"


def default_network_ids(subscription: str, resource_group: str, location: str) -> tuple[str, str]:
    """(virtual network id, subnet id) of the network spotnb creates in `location`."""
    vnet = (
        f"/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Network/"
        f"virtualNetworks/spotnb-{location}"
    )
    return vnet, f"{vnet}/subnets/{_DEFAULT_SUBNET_NAME}"


def default_network_body(location: str) -> dict[str, Any]:
    """The virtual network (with its one subnet) spotnb creates on first use, tagged as spotnb's
    so that `spotnb gc` may delete it, and only it."""
    return {
        "location": location,
        "tags": {MANAGED_TAG: "true"},
        "properties": {
            "addressSpace": {"addressPrefixes": [DEFAULT_ADDRESS_SPACE]},
            "subnets": [{"name": _DEFAULT_SUBNET_NAME, "properties": {"addressPrefix": DEFAULT_SUBNET}}],
        },
    }


def _job_slug(job_id: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", job_id.lower())


def _tags(job_id: str, role: str | None = None) -> dict[str, str]:
    tags = {JOB_TAG: job_id.lower(), MANAGED_TAG: "true"}
    if role:
        tags[ROLE_TAG] = role
    return tags


class JobNetwork(dict[str, str]):
    """The resource ids of one job's network: asg, nsg, ip, nic (a dict, shown in plans)."""


def job_network_ids(subscription: str, resource_group: str, job_id: str) -> JobNetwork:
    """Where the job's network resources live (fixed names, so any controller finds them)."""
    base = f"/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Network"
    name = f"spotnb-job-{_job_slug(job_id)}"[:80]
    return JobNetwork(
        asg=f"{base}/applicationSecurityGroups/{name}",
        nsg=f"{base}/networkSecurityGroups/{name}",
        ip=f"{base}/publicIPAddresses/{name}-coordinator",
        nic=f"{base}/networkInterfaces/{name}-coordinator",
    )


def members_group_body(job_id: str, location: str) -> dict[str, Any]:
    """The application security group: which NICs are the job's members."""
    return {"location": location, "tags": _tags(job_id), "properties": {}}


def job_nsg_body(job_id: str, location: str, asg_id: str) -> dict[str, Any]:
    """The network security group on every NIC of the job: all TCP from the job's members to
    its members (torchft's ports are not fixed: the lighthouse's, each Manager's gRPC, the
    checkpoint server a recovering peer reads, the gloo sockets), and nothing else in."""
    members = [{"id": asg_id}]
    return {
        "location": location,
        "tags": _tags(job_id),
        "properties": {
            "securityRules": [
                {
                    "name": "spotnb-job-members",
                    "properties": {
                        "description": "spotnb job members only (torchft quorum, peer state, gradients)",
                        "priority": 100,
                        "direction": "Inbound",
                        "access": "Allow",
                        "protocol": "Tcp",
                        "sourcePortRange": "*",
                        "destinationPortRange": "*",
                        "sourceApplicationSecurityGroups": members,
                        "destinationApplicationSecurityGroups": members,
                    },
                },
                {
                    "name": "spotnb-deny-others",
                    "properties": {
                        "description": "nothing else reaches the job's VMs (overrides AllowVnetInBound)",
                        "priority": 4000,
                        "direction": "Inbound",
                        "access": "Deny",
                        "protocol": "*",
                        "sourcePortRange": "*",
                        "destinationPortRange": "*",
                        "sourceAddressPrefix": "*",
                        "destinationApplicationSecurityGroups": members,
                    },
                },
            ]
        },
    }


def coordinator_ip_body(job_id: str, location: str) -> dict[str, Any]:
    """The coordinator's public IP: Standard (closed to inbound traffic by default), for its
    outbound pip install only."""
    return {
        "location": location,
        "tags": _tags(job_id, COORDINATOR_ROLE),
        "sku": {"name": "Standard", "tier": "Regional"},
        "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"},
    }


def coordinator_nic_body(
    job_id: str, location: str, subnet_id: str, net: JobNetwork, private_ip: str | None = None
) -> dict[str, Any]:
    """The coordinator's NIC. Created with a dynamic private IP, then sent again with the IP
    Azure assigned and `Static` (Azure's way to pin an address it chose): it never changes
    while the NIC exists, whichever VM uses it."""
    ip_config: dict[str, Any] = {
        "subnet": {"id": subnet_id},
        "primary": True,
        "privateIPAllocationMethod": "Static" if private_ip else "Dynamic",
        "applicationSecurityGroups": [{"id": net["asg"]}],
        "publicIPAddress": {"id": net["ip"]},
    }
    if private_ip:
        ip_config["privateIPAddress"] = private_ip
    return {
        "location": location,
        "tags": _tags(job_id, COORDINATOR_ROLE),
        "properties": {
            "ipConfigurations": [{"name": "primary", "properties": ip_config}],
            "networkSecurityGroup": {"id": net["nsg"]},
        },
    }


def coordinator_vm_name(job_id: str, suffix: str) -> str:
    """One name per coordinator VM (a replacement may start while the dead one is deleted)."""
    tail = f"-coord-{suffix}"
    return f"spotnb-{_job_slug(job_id)}"[: 64 - len(tail)] + tail


def build_coordinator_vm(
    job_id: str,
    *,
    location: str,
    size: str,
    image: m.ImageReference,
    nic_id: str,
    ssh_key: str,
    custom_data: str,
    name: str,
    identity: str | None = None,
) -> m.VirtualMachine:
    """The VirtualMachine sent to `begin_create_or_update` for the job's coordinator: regular
    priority (on demand: no eviction), on the job's NIC (detached, not deleted, with the VM),
    its OS disk deleted with it, and `identity`: azure_identity_id, which its idle guard
    deallocates the VM with (the lighthouse reads nothing of the job; a VM powered off from
    inside is still billed on Azure), or, when it hosts the job's controller,
    Config.controller_identity (launches the job's VMs and reads the store)."""
    vm = m.VirtualMachine(
        location=location,
        tags=_tags(job_id, COORDINATOR_ROLE),
        priority="Regular",
        hardware_profile=m.HardwareProfile(vm_size=size),
        storage_profile=m.StorageProfile(
            image_reference=image,
            os_disk=m.OSDisk(
                create_option="FromImage",
                delete_option="Delete",
                managed_disk=m.ManagedDiskParameters(storage_account_type="StandardSSD_LRS"),
            ),
        ),
        os_profile=m.OSProfile(
            computer_name=name,
            admin_username=ADMIN_USER,
            custom_data=custom_data,
            linux_configuration=m.LinuxConfiguration(
                disable_password_authentication=True,
                ssh=m.SshConfiguration(
                    public_keys=[
                        m.SshPublicKey(path=f"/home/{ADMIN_USER}/.ssh/authorized_keys", key_data=ssh_key)
                    ]
                ),
            ),
        ),
        network_profile=m.NetworkProfile(
            network_interfaces=[m.NetworkInterfaceReference(id=nic_id, primary=True, delete_option="Detach")]
        ),
    )
    if identity:
        vm.identity = m.VirtualMachineIdentity(
            type="UserAssigned", user_assigned_identities={identity: m.UserAssignedIdentitiesValue()}
        )
    return vm


def _code(exc: HttpResponseError) -> str:
    return str(getattr(exc.error, "code", None) or "")


class AzureCoordinator:
    """`Provider.coordinator` on Azure, and the cleanup of the job's network (a mixin of
    `AzureProvider`, which gives `config`, `compute`, `resources`, `subscription`, `ssh_key`,
    `_ensure_group`, `resource_group`, `coordinator_image` and `_terminated`)."""

    config: Config
    compute: Any
    resources: Any
    describe_interval: ClassVar[float]
    network_cleanup_timeout: ClassVar[float] = 300.0  # seconds `close` waits to delete the network
    _terminated: set[str]
    _hosted: dict[str, HostedController]

    if TYPE_CHECKING:  # what AzureProvider supplies; declared for mypy, never defined here

        def subscription(self) -> str: ...
        def ssh_key(self) -> str: ...
        def _ensure_group(self, location: str) -> str: ...
        def resource_group(self, location: str) -> str: ...
        def coordinator_image(self) -> m.ImageReference: ...

    # -- the subnet: configured, or spotnb's own network ------------------------------------
    def subnet_id(self, location: str) -> str:
        """Config.azure_subnet_id, else the subnet of spotnb's network in `location` (its id;
        `ensure_subnet` creates it)."""
        if self.config.azure_subnet_id:
            return str(self.config.azure_subnet_id)
        return default_network_ids(self.subscription(), self.resource_group(location), location)[1]

    def ensure_subnet(self, location: str) -> str:
        """The subnet the job's NICs use: Config.azure_subnet_id as it is, or spotnb's network
        in `location`, created on first use (found by id, created only if missing: a PUT of a
        virtual network replaces its subnets, so one that exists is never sent again)."""
        if self.config.azure_subnet_id:
            return str(self.config.azure_subnet_id)
        with self._subnet_lock:
            rg = self._ensure_group(location)
            vnet, subnet = default_network_ids(self.subscription(), rg, location)
            if location not in self._subnets_ready:
                if self._get(vnet) is None:
                    self._put(vnet, default_network_body(location))
                    log.info("created the virtual network %s (Config.azure_subnet_id not set)", vnet)
                elif self._get(subnet) is None:  # someone removed the subnet: put it back alone
                    self._put(subnet, {"properties": {"addressPrefix": DEFAULT_SUBNET}})
                self._subnets_ready.add(location)
            return subnet

    def gc_networks(self, timeout: float | None = None) -> list[str]:
        """`spotnb gc`: delete the virtual networks spotnb created (tagged spotnb-managed, named
        `spotnb-<location>`) once no VM uses them, after the deletions gc asked for finished;
        a user's network is never touched. Azure refuses a network still in use: it is kept,
        and a later gc tries again. Returns the ids deleted."""
        deadline = time.time() + (self.network_cleanup_timeout if timeout is None else timeout)
        for name, poller in list(self._deletions.items()):
            try:
                poller.result(timeout=max(0.0, deadline - time.time()))
            except (HttpResponseError, ResourceNotFoundError):
                pass
            self._deletions.pop(name, None)
        deleted: list[str] = []
        try:
            listed = list(
                self.resources.resources.list(filter=f"tagName eq '{MANAGED_TAG}' and tagValue eq 'true'")
            )
        except HttpResponseError as exc:  # no right to list the subscription: nothing to say
            log.warning("spotnb gc: could not list spotnb's virtual networks: %s", exc.message)
            return deleted
        for res in listed:
            rid = str(getattr(res, "id", "") or "")
            kind = str(getattr(res, "type", "") or "").lower()
            if kind != "microsoft.network/virtualnetworks" or not rid.rsplit("/", 1)[-1].startswith(
                "spotnb-"
            ):
                continue
            if (getattr(res, "tags", None) or {}).get(MANAGED_TAG) != "true":
                continue  # the list's filter is the server's: check again here
            try:
                self.resources.resources.begin_delete_by_id(rid, api_version=NETWORK_API_VERSION).result()
            except ResourceNotFoundError:
                pass
            except HttpResponseError as exc:
                log.info("kept the virtual network %s: %s", rid, exc.message)
                continue
            deleted.append(rid)
            self._subnets_ready.clear()
        return deleted

    def _init_coordinators(self) -> None:
        self._coordinators: dict[str, KnownCoordinator] = {}
        self._job_networks: set[tuple[str, str]] = set()  # (job id, location) set up or found
        self._reaped_jobs: set[tuple[str, str]] = set()  # (job id, location) of VMs gc ended
        self._deletions: dict[str, Any] = {}  # VM name → its delete poller
        self._coordinator_lock = threading.Lock()
        self._network_lock = threading.Lock()
        self._networks_ready: set[tuple[str, str]] = set()
        self._subnet_lock = threading.Lock()
        self._subnets_ready: set[str] = set()  # locations whose spotnb network exists

    # -- settings --------------------------------------------------------------------------
    def coordinator_size(self) -> str:
        return coordinator_type(self.config, COORDINATOR_SIZE)

    def coordinator_price(self) -> Price | None:
        return coordinator_price(self.config, "azure", self.coordinator_size(), COORDINATOR_PRICES)

    def coordinator_location(self) -> str:
        """The location of the job (`_validate` made sure there is one)."""
        regions = self.config.candidate_regions()
        first = next((r for r in regions if r), None) if isinstance(regions, list) else None
        location = first or self.config.region
        if not location:
            raise ConfigError("Config.region: give an Azure location such as 'eastus'")
        return str(location)

    def coordinator_custom_data(self, job_id: str, min_replicas: int | None = None) -> str:
        return azure_cloud_config(
            coordinator_boot_script(self.config, job_id, "azure", min_replicas, self._hosted.get(job_id))
        )

    def host_controller(self, job_id: str, store_url: str, job_key: str) -> None:
        """The job's coordinator, started (or found) with the controller on board and
        Config.controller_identity as its managed identity; then forgotten, so `close` leaves it."""
        host_on_coordinator(self, job_id, store_url, job_key)

    def _validate_one_location(self) -> None:
        """The job's VMs reach each other and their coordinator by private address, in one
        virtual network: one location."""
        regions = self.config.candidate_regions()
        if regions == "cheapest":
            raise ConfigError(
                "Config.regions: a job on several instances trains in one virtual network (its "
                "coordinator's): give one location, e.g. region='eastus', instead of 'cheapest'"
            )
        names = {r for r in regions if r}
        if len(names) > 1:
            raise ConfigError(
                f"Config.regions: {sorted(names)} are several Azure locations; the VMs of a job on "
                "several instances reach each other by private address in one virtual network "
                "(azure_subnet_id's, or spotnb's), so they must share its location"
            )

    def network_of(self, job_id: str, location: str) -> JobNetwork:
        return job_network_ids(self.subscription(), self.resource_group(location), job_id)

    # -- the job's network -----------------------------------------------------------------
    def _put(self, resource_id: str, body: dict[str, Any]) -> Any:
        from azure.mgmt.resource.resources.models import GenericResource

        # api_version is keyword-only from azure-mgmt-resource 26 on (a TypeError positionally)
        poller = self.resources.resources.begin_create_or_update_by_id(
            resource_id, GenericResource(body), api_version=NETWORK_API_VERSION
        )
        return poller.result()

    def _get(self, resource_id: str) -> Any | None:
        try:
            return self.resources.resources.get_by_id(resource_id, api_version=NETWORK_API_VERSION)
        except ResourceNotFoundError:
            return None

    def ensure_job_network(self, job_id: str, location: str) -> JobNetwork:
        """The job's member group and security group (found, or created once): every VM of the
        job carries them. Idempotent: PUT of the same body."""
        with self._network_lock:  # the slots launch in parallel: one sets up, the others wait
            if (job_id, location) in self._networks_ready:
                return self.network_of(job_id, location)
            self._ensure_group(location)
            net = self.network_of(job_id, location)
            self._job_networks.add((job_id, location))
            if self._get(net["nsg"]) is None:
                self._put(net["asg"], members_group_body(job_id, location))
                self._put(net["nsg"], job_nsg_body(job_id, location, net["asg"]))
            self._networks_ready.add((job_id, location))
            return net

    def _ensure_nic(self, job_id: str, location: str, net: JobNetwork) -> str:
        """The coordinator's NIC (found or created, its private IP pinned); returns that IP."""
        found = self._get(net["nic"])
        if found is not None:
            ip = _private_ip(found)
            if ip and _allocation(found) == "Static":
                return ip
        else:
            self._put(net["ip"], coordinator_ip_body(job_id, location))
            found = self._put(
                net["nic"], coordinator_nic_body(job_id, location, self.ensure_subnet(location), net)
            )
            ip = _private_ip(found)
        if not ip:
            raise RuntimeError(f"job {job_id}: Azure gave the coordinator's NIC no private IP")
        self._put(net["nic"], coordinator_nic_body(job_id, location, self.ensure_subnet(location), net, ip))
        log.info("job %s: coordinator address %s (%s)", job_id, ip, net["nic"])
        return ip

    # -- the coordinator -------------------------------------------------------------------
    def coordinator(self, job_id: str, min_replicas: int) -> str:
        """The job's coordinator: found by its tags, or started; one that died (deleted, or
        powered off: its idle guard, a failed install) is replaced on the same NIC, so the
        address (`http://<private IP>:<port>`) never changes. Between describes
        (`describe_interval`) the known address is returned."""
        with self._coordinator_lock:
            known = self._coordinators.get(job_id)
            if known is not None and time.time() - known.checked < self.describe_interval:
                return self._coordinator_address(known)
            return self._coordinator_address(self._refresh_coordinator(job_id, min_replicas))

    def _coordinator_address(self, known: KnownCoordinator) -> str:
        return f"http://{known.private_ip}:{self.config.coordinator_port}"

    def _refresh_coordinator(self, job_id: str, min_replicas: int) -> KnownCoordinator:
        known = self._coordinators.get(job_id)
        if known is None:
            location = self.coordinator_location()
            net = self.ensure_job_network(job_id, location)
            ip = self._ensure_nic(job_id, location, net)
            known = KnownCoordinator(job_id, location, ip, extra={"nic": net["nic"]})
            self._coordinators[job_id] = known
        rg = self.resource_group(known.region)
        live = []
        listed = self._coordinator_vms(job_id, rg)
        if (
            known.instance_id
            and known.instance_id not in {vm.name for vm in listed}
            and self._is_alive(rg, known.instance_id)
        ):  # started a moment ago: the list does not show it yet; never start a second one
            known.checked = time.time()
            return known
        for vm in listed:
            if self._is_alive(rg, vm.name):
                live.append(vm)
            elif vm.name not in self._terminated:  # powered off: a stopped VM still bills
                log.warning("job %s: coordinator %s is down; deleting it", job_id, vm.name)
                self._delete_vm(rg, vm.name)
        if live:
            vm = max(live, key=_created)
            if vm.name != known.instance_id:
                _adopt(known, vm)
            if time.time() - (known.started or 0.0) > SETTLED_S and self._is_alive(rg, vm.name, running=True):
                known.launches = 0  # it stayed up: only a run of failed starts ends the job
        else:
            self._launch_coordinator(known, rg, min_replicas)
        known.checked = time.time()
        return known

    def _coordinator_vms(self, job_id: str, rg: str) -> list[Any]:
        return [
            vm
            for vm in self.compute.virtual_machines.list(rg)
            if (vm.tags or {}).get(JOB_TAG) == job_id.lower()
            and (vm.tags or {}).get(ROLE_TAG) == COORDINATOR_ROLE
        ]

    def _is_alive(self, rg: str, name: str, running: bool = False) -> bool:
        """Creating, starting or running (or, with `running`, running only)."""
        if name in self._terminated:
            return False
        try:
            view = self.compute.virtual_machines.instance_view(rg, name)
        except ResourceNotFoundError:
            return False
        codes = [s.code for s in (view.statuses or []) if s.code]
        if any(c.startswith(("ProvisioningState/failed", "ProvisioningState/deleting")) for c in codes):
            return False
        if running:
            return "PowerState/running" in codes
        return not any(c in _GONE_STATES for c in codes)

    def _launch_coordinator(self, known: KnownCoordinator, rg: str, min_replicas: int) -> None:
        if known.launches >= MAX_COORDINATOR_LAUNCHES:
            raise failed_starts(
                known,
                "the Azure portal (its boot diagnostics)",
                "Check Config.azure_coordinator_image / coordinator_instance_type",
            )
        name = coordinator_vm_name(known.job_id, uuid.uuid4().hex[:8])  # never a name reused
        vm = build_coordinator_vm(
            known.job_id,
            location=known.region,
            size=self.coordinator_size(),
            image=self.coordinator_image(),
            nic_id=known.extra["nic"],
            ssh_key=self.ssh_key(),
            custom_data=self.coordinator_custom_data(known.job_id, min_replicas),
            name=name,
            identity=self._coordinator_identity(known.job_id),
        )
        try:
            self.compute.virtual_machines.begin_create_or_update(rg, name, vm)
        except HttpResponseError as exc:
            if _code(exc) not in _RETRY_CODES:
                raise
            log.warning(
                "job %s: the coordinator could not start yet (%s); trying again", known.job_id, _code(exc)
            )
            return
        known.launches += 1
        known.instance_id, known.instance_type, known.started = name, self.coordinator_size(), time.time()
        price = self.coordinator_price()
        log.info(
            "job %s: coordinator %s (%s, regular priority, %s) at %s",
            known.job_id,
            name,
            known.instance_type,
            f"${price.on_demand:.4f}/h" if price else "price unknown",
            self._coordinator_address(known),
        )

    def _coordinator_identity(self, job_id: str) -> str | None:
        """The coordinator's managed identity: Config.controller_identity when it hosts the
        job's controller, else azure_identity_id, which its idle guard deallocates it with (a
        powered-off Azure VM is still billed); the lighthouse itself reads nothing with it."""
        if job_id in self._hosted:
            return self.config.controller_identity
        return self.config.azure_identity_id or None

    def _coordinator_info(self, job_id: str) -> dict[str, Any]:
        return coordinator_record(self._coordinators.get(job_id), self.coordinator_price())

    def _delete_vm(self, rg: str, name: str) -> None:
        self._terminated.add(name)
        try:
            self._deletions[name] = self.compute.virtual_machines.begin_delete(rg, name)
        except ResourceNotFoundError:
            pass

    # -- the end ---------------------------------------------------------------------------
    def end_coordinator(self, job_id: str, location: str | None = None) -> list[str]:
        """Delete the job's coordinator VMs (found by their tags); returns their names."""
        location = location or self.coordinator_location()
        rg = self.resource_group(location)
        names = [vm.name for vm in self._coordinator_vms(job_id, rg)]
        for name in names:
            self._delete_vm(rg, name)
        if names:
            log.info("job %s: coordinator %s deleted", job_id, ", ".join(names))
        self._coordinators.pop(job_id, None)
        return names

    def remove_job_network(
        self, job_id: str, location: str | None = None, timeout: float | None = None
    ) -> bool:
        """Delete the job's NIC, public IP and security groups once the VMs using them are gone
        (Azure refuses while a NIC is attached or a group is in use); True when nothing of them
        remains. Gives up after `timeout` seconds; `spotnb gc` retries."""
        location = location or self.coordinator_location()
        net = self.network_of(job_id, location)
        deadline = time.time() + (self.network_cleanup_timeout if timeout is None else timeout)
        for name, poller in list(self._deletions.items()):  # the VMs that hold the NIC / groups
            try:
                poller.result(timeout=max(0.0, deadline - time.time()))
            except (HttpResponseError, ResourceNotFoundError):
                pass
            self._deletions.pop(name, None)
        done = True
        for key in ("nic", "ip", "nsg", "asg"):
            done = self._delete_when_free(net[key], deadline) and done
        self._job_networks.discard((job_id, location))
        self._networks_ready.discard((job_id, location))
        if not done:
            log.warning(
                "job %s: its network (NIC, IP, security groups) is still in use; spotnb gc removes it", job_id
            )
        return done

    def _delete_when_free(self, resource_id: str, deadline: float) -> bool:
        while True:
            try:
                self.resources.resources.begin_delete_by_id(
                    resource_id, api_version=NETWORK_API_VERSION
                ).result()
                return True
            except ResourceNotFoundError:
                return True
            except HttpResponseError as exc:
                if not any(word in _code(exc) for word in _IN_USE) or time.time() > deadline:
                    log.warning("could not delete %s: %s", resource_id, exc.message)
                    return False
            time.sleep(5.0)

    def close_coordinators(self) -> None:
        """End every coordinator this provider started or found and delete the network of
        those jobs and of the jobs gc reaped (an on-demand VM left running costs money)."""
        jobs = {(c.job_id, c.region) for c in self._coordinators.values()}
        jobs |= self._reaped_jobs | self._job_networks
        for job_id, location in sorted(jobs):
            try:
                self.end_coordinator(job_id, location)
                self.remove_job_network(job_id, location)
            except HttpResponseError as exc:
                log.warning(
                    "job %s: could not end its coordinator or network (%s); run spotnb gc", job_id, exc
                )
        self._reaped_jobs.clear()
        self._job_networks.clear()

    def plan_coordinator(self, job_id: str, location: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
        """Append the coordinator's requests to `requests`; return what the dry run says of it."""
        net = job_network_ids(
            self.config.azure_subscription_id or "<subscription>", self.resource_group(location), job_id
        )
        when = "once per job, if missing"
        name = coordinator_vm_name(job_id, "<n>")
        script = coordinator_boot_script(self.config, job_id, "azure", None, self._hosted.get(job_id))
        vm = build_coordinator_vm(
            job_id,
            location=location,
            size=self.coordinator_size(),
            image=self.coordinator_image(),
            nic_id=net["nic"],
            ssh_key="<throwaway ssh-ed25519 public key>",
            custom_data="<base64 cloud-config of the coordinator script>",
            name=name,
            identity=self._coordinator_identity(job_id),
        ).as_dict()
        subnet = self.subnet_id(location)
        put = "resources.resources.begin_create_or_update_by_id"
        requests.extend(
            [
                {
                    "api": put,
                    "when": when,
                    "args": {"resource_id": net["asg"]},
                    "body": members_group_body(job_id, location),
                },
                {
                    "api": put,
                    "when": when,
                    "args": {"resource_id": net["nsg"]},
                    "body": job_nsg_body(job_id, location, net["asg"]),
                },
                {
                    "api": put,
                    "when": when,
                    "args": {"resource_id": net["ip"]},
                    "body": coordinator_ip_body(job_id, location),
                },
                {
                    "api": put,
                    "when": when,
                    "args": {"resource_id": net["nic"]},
                    "body": coordinator_nic_body(job_id, location, subnet, net),
                },
                {
                    "api": put,
                    "when": "then the IP Azure assigned, made static",
                    "args": {"resource_id": net["nic"]},
                    "body": coordinator_nic_body(job_id, location, subnet, net, "<the assigned private IP>"),
                },
                {
                    "api": "compute.virtual_machines.begin_create_or_update",
                    "when": "the job's coordinator, regular priority; again only if it dies",
                    "args": {"resource_group_name": self.resource_group(location), "vm_name": name},
                    "body": vm,
                },
            ]
        )
        price = self.coordinator_price()
        return {
            "instance_type": self.coordinator_size(),
            "market": "on-demand",
            "price_on_demand": price.on_demand if price else None,
            "price_source": price.source if price else "unknown: set Config.coordinator_price",
            "address": f"http://<static private IP of its NIC>:{self.config.coordinator_port}",
            "ports": "all TCP between the VMs of application security group "
            f"{net['asg'].rsplit('/', 1)[-1]} only (network security group of the same name)",
            "ends": "deleted with the job, then its NIC, public IP and security groups are deleted",
            "bootstrap": script,
        }


def _private_ip(nic: Any) -> str | None:
    configs = (getattr(nic, "properties", None) or {}).get("ipConfigurations") or []
    return (configs[0].get("properties") or {}).get("privateIPAddress") if configs else None


def _allocation(nic: Any) -> str | None:
    configs = (getattr(nic, "properties", None) or {}).get("ipConfigurations") or []
    return (configs[0].get("properties") or {}).get("privateIPAllocationMethod") if configs else None


def _created(vm: Any) -> float:
    created = getattr(vm, "time_created", None)
    return created.timestamp() if created is not None else 0.0


def _adopt(known: KnownCoordinator, vm: Any) -> None:
    known.instance_id = str(vm.name)
    known.instance_type = str(
        getattr(getattr(vm, "hardware_profile", None), "vm_size", "") or known.instance_type
    )
    known.started = _created(vm) or time.time()
