"""Azure Spot VMs through azure-mgmt-compute (`pip install 'spotnb[azure]'`).

One VM per incarnation: `priority="Spot"`, the configured eviction policy and
`billing_profile.max_price` (−1: never evicted for price), the bootstrap as cloud-init
`custom_data`, a user-assigned managed identity for the store, and a NIC, Standard public IP
(secure by default: closed to inbound traffic, needed for outbound pip installs) and OS disk
created *inline* with `delete_option="Delete"`, so deleting the VM at the end of an incarnation
deletes its disk, NIC and IP too. Besides the compute SDK only azure-mgmt-resource is used (no
azure-mgmt-network): without `azure_resource_group`, the VMs go into a group spotnb creates on
first use, `spotnb-<location>` (one per location, tagged spotnb-managed, never deleted by spotnb:
it is empty between jobs and costs nothing), with `resource_groups.create_or_update`, which is
idempotent. A configured group is used as it is and never created. Azure has no default
network: without `azure_subnet_id`, the NICs use the subnet of a virtual network spotnb creates
in that group on first use, `spotnb-<location>` (tagged spotnb-managed, created only if missing:
a PUT of a network replaces its subnets), which `spotnb gc` deletes once no VM uses it.

A refused create is told apart (`_refusal`): the subscription's quota (QuotaError, final:
`quotas.azure_quota_error`), no capacity or throttling (HTTP 429, any 5xx: CapacityError, asked
again after a backoff), or anything else (Azure's error, as it is). Azure creates VMs
asynchronously: an operation that fails later (AllocationFailed) is read the same way by
`allocation_refusal`, so the controller backs off instead of creating and deleting in a loop.
A VM whose guest powers off is Stopped, still allocated and billed: the controller deletes every
VM it watches when it ends, and the boot scripts end their VM by deallocating it through
Resource Manager with its managed identity (`bootstrap.azure_end_vm`).

Credentials come from azure-identity's DefaultAzureCredential chain (env, CLI, managed
identity) and never enter a request body or the boot script. Fault injection:
`provider.inject(instance)` calls `simulate_eviction`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.compute import models as m

from spotnb.errors import CapacityError, ConfigError
from spotnb.market.prices import lookup_price
from spotnb.providers.azure.coordinator import (
    ADMIN_USER,
    NETWORK_API_VERSION,
    AzureCoordinator,
    JobNetwork,
    default_network_body,
    default_network_ids,
    job_network_ids,
)
from spotnb.providers.base import (
    Feature,
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    Price,
    Provider,
)
from spotnb.providers.bootstrap import azure_custom_data, require_remote_store
from spotnb.providers.cleanup import JOB_TAG, MANAGED_TAG, job_tags
from spotnb.providers.coordinator import ROLE_TAG, planned_hosting
from spotnb.providers.quotas import azure_quota_error

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "AzureProvider",
    "DEFAULT_IMAGE",
    "CAPACITY_CODES",
    "build_vm",
    "vm_name",
    "throwaway_ssh_key",
    "default_resource_group",
    "resource_group_model",
]

DEFAULT_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"  # Ubuntu HPC: NVIDIA drivers, CUDA
#: ARM codes of "no capacity here now": the controller backs off and moves on. A quota
#: (`quotas.AZURE_QUOTA_CODES`, `OperationNotAllowed` with a quota message) is told apart first and
#: is final; an `OperationNotAllowed` that is neither is Azure's answer as it is (a disabled
#: subscription, a policy), and throttling (HTTP 429) is retried after a backoff.
CAPACITY_CODES = frozenset(
    {
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "AllocationFailedSpotCapacity",
    }
)
#: the public Retail Prices API (no credentials); the environment may point elsewhere (tests
#: serve recorded responses, a proxy may mirror it)
_RETAIL_API = os.environ.get("SPOTNB_AZURE_RETAIL_API", "https://prices.azure.com/api/retail/prices")
#: seconds a location's fetched prices are reused (spotnb.market.price_cache)
RETAIL_TTL = 600.0


def vm_name(spec: LaunchSpec) -> str:
    """A VM (and Linux computer) name: ≤ 64 characters of letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]", "-", f"spotnb-{spec.job_id}-{spec.incarnation}".lower())[:64]


def default_resource_group(location: str) -> str:
    """The group spotnb creates on first use when `azure_resource_group` is not set."""
    return f"spotnb-{location}"


def resource_group_model(location: str) -> Any:
    """The exact ResourceGroup sent to `resource_groups.create_or_update`."""
    from azure.mgmt.resource.resources.models import ResourceGroup

    return ResourceGroup(location=location, tags={MANAGED_TAG: "true"})


def _group_of(resource_id: str) -> str | None:
    """The resource group in an ARM id (/subscriptions/…/resourceGroups/NAME/providers/…)."""
    parts = resource_id.split("/")
    lowered = [p.lower() for p in parts]
    return parts[lowered.index("resourcegroups") + 1] if "resourcegroups" in lowered else None


def throwaway_ssh_key() -> str:
    """An OpenSSH public key whose private half is discarded at once: Azure requires a key or
    a password for Linux VMs, and spotnb needs neither (nothing logs in)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def _image(ref: str) -> m.ImageReference:
    if ref.startswith("/"):
        return m.ImageReference(id=ref)
    parts = ref.split(":")
    if len(parts) != 4:
        raise ConfigError(
            f"Config.azure_image: {ref!r} is neither 'publisher:offer:sku:version' nor an image resource id"
        )
    publisher, offer, sku, version = parts
    return m.ImageReference(publisher=publisher, offer=offer, sku=sku, version=version)


def build_vm(
    spec: LaunchSpec,
    config: Config,
    location: str,
    ssh_key: str,
    job_network: JobNetwork | None = None,
    subnet_id: str | None = None,
) -> m.VirtualMachine:
    """The exact VirtualMachine model sent to `begin_create_or_update` for one incarnation, its
    NIC in `subnet_id` (default: Config.azure_subnet_id). With `job_network` (a job on several
    instances) its NIC joins the job's application security group and carries the job's network
    security group (TCP open between members only)."""
    name = vm_name(spec)
    nic = m.VirtualMachineNetworkInterfaceConfiguration(
        name=f"{name}-nic",
        primary=True,
        delete_option="Delete",
        ip_configurations=[
            m.VirtualMachineNetworkInterfaceIPConfiguration(
                name=f"{name}-ip",
                primary=True,
                subnet=m.SubResource(id=subnet_id or config.azure_subnet_id),
                public_ip_address_configuration=m.VirtualMachinePublicIPAddressConfiguration(
                    name=f"{name}-pip",
                    sku=m.PublicIPAddressSku(name="Standard", tier="Regional"),
                    delete_option="Delete",
                    public_ip_allocation_method="Static",
                ),
            )
        ],
    )
    if job_network is not None:
        nic.network_security_group = m.SubResource(id=job_network["nsg"])
        nic.ip_configurations[0].application_security_groups = [m.SubResource(id=job_network["asg"])]
    os_disk = m.OSDisk(
        create_option="FromImage",
        delete_option="Delete",
        managed_disk=m.ManagedDiskParameters(storage_account_type="StandardSSD_LRS"),
    )
    if config.azure_disk_gb:
        os_disk.disk_size_gb = config.azure_disk_gb
    vm = m.VirtualMachine(
        location=location,
        tags=job_tags(spec),
        priority="Spot",
        eviction_policy=config.azure_eviction_policy,
        billing_profile=m.BillingProfile(max_price=config.azure_max_price),
        hardware_profile=m.HardwareProfile(vm_size=spec.instance_type),
        storage_profile=m.StorageProfile(
            image_reference=_image(config.azure_image or DEFAULT_IMAGE), os_disk=os_disk
        ),
        os_profile=m.OSProfile(
            computer_name=name,
            admin_username=ADMIN_USER,
            custom_data=azure_custom_data(spec),
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
            network_api_version=NETWORK_API_VERSION, network_interface_configurations=[nic]
        ),
    )
    if config.azure_identity_id:
        vm.identity = m.VirtualMachineIdentity(
            type="UserAssigned",
            user_assigned_identities={config.azure_identity_id: m.UserAssignedIdentitiesValue()},
        )
    return vm


class AzureProvider(AzureCoordinator, Provider):
    """Azure Spot VMs; regions are Azure locations ("eastus", "westeurope"). A job on several
    instances also gets a coordinator (`spotnb.providers.azure.coordinator`)."""

    name = "azure"
    ships_code = True  # its VMs install the notebook's spotnb from the store
    unsupported: ClassVar[dict[Feature, str]] = {
        Feature.REBALANCE_HINT: "Azure Scheduled Events give no early rebalance recommendation",
    }

    credentials_hint: ClassVar[str] = (
        "Azure: `az login`, or $AZURE_CLIENT_ID, $AZURE_TENANT_ID and $AZURE_CLIENT_SECRET (a "
        "service principal), or a managed identity; and the subscription in "
        "$AZURE_SUBSCRIPTION_ID or azure_subscription_id"
    )

    @classmethod
    def has_credentials(cls) -> bool:
        """What DefaultAzureCredential would find, looked for without asking for a token (that
        is a network round trip per source): a service principal in the environment, a managed
        identity endpoint, or an `az login` token cache."""
        env = os.environ
        if (
            env.get("AZURE_CLIENT_ID")
            and env.get("AZURE_TENANT_ID")
            and any(
                env.get(k)
                for k in (
                    "AZURE_CLIENT_SECRET",
                    "AZURE_CLIENT_CERTIFICATE_PATH",
                    "AZURE_FEDERATED_TOKEN_FILE",
                )
            )
        ):
            return True
        if env.get("IDENTITY_ENDPOINT") or env.get("MSI_ENDPOINT"):
            return True
        home = env.get("AZURE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".azure")
        return any(
            os.path.isfile(os.path.join(home, name))
            for name in ("msal_token_cache.json", "msal_token_cache.bin")
        )

    def __init__(self, config: Config, compute: Any = None, resources: Any = None) -> None:
        """`compute` is a ComputeManagementClient and `resources` a ResourceManagementClient
        (each built from DefaultAzureCredential if None)."""
        super().__init__(config)
        self._compute = compute
        self._resources = resources
        self._groups_ready: set[str] = set()
        self._ssh_key: str | None = config.azure_ssh_public_key
        self._launched: dict[str, Instance] = {}
        self._terminated: set[str] = set()
        self._pollers: dict[str, Any] = {}
        self._refusals: dict[str, Exception] = {}  # VM name → why its creation failed later
        self._init_coordinators()

    # -- clients and settings --------------------------------------------------------------
    @property
    def compute(self) -> Any:
        if self._compute is None:
            from azure.identity import DefaultAzureCredential
            from azure.mgmt.compute import ComputeManagementClient

            self._compute = ComputeManagementClient(DefaultAzureCredential(), self.subscription())
        return self._compute

    @property
    def resources(self) -> Any:
        if self._resources is None:
            from azure.identity import DefaultAzureCredential
            from azure.mgmt.resource.resources import ResourceManagementClient

            self._resources = ResourceManagementClient(DefaultAzureCredential(), self.subscription())
        return self._resources

    def resource_group(self, location: str) -> str:
        """The configured group, or the one spotnb creates for this location."""
        return self.config.azure_resource_group or default_resource_group(location)

    def _ensure_group(self, location: str) -> str:
        """The group for `location`, created first if it is spotnb's default (once per provider)."""
        rg = self.resource_group(location)
        if not self.config.azure_resource_group and rg not in self._groups_ready:
            self.resources.resource_groups.create_or_update(rg, resource_group_model(location))
            self._groups_ready.add(rg)
        return rg

    def _group_of_instance(self, instance: Instance) -> str:
        return instance.info.get("resource_group") or self.resource_group(instance.region or "")

    def subscription(self) -> str:
        sub = self.config.azure_subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
        if not sub:
            raise ConfigError(
                "Config.azure_subscription_id: not set and $AZURE_SUBSCRIPTION_ID "
                "is empty; give the subscription to launch in"
            )
        return sub

    def storage_account(self) -> str | None:
        """azure_storage_account, $AZURE_STORAGE_ACCOUNT_NAME, or the account an
        `az://container@account.blob.core.windows.net/…` store names."""
        found = re.match(r"^[a-z]+://[^/@]+@([^./]+)\.", self.config.store_url())
        return (
            self.config.azure_storage_account
            or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
            or (found.group(1) if found else None)
        )

    def ssh_key(self) -> str:
        if self._ssh_key is None:
            self._ssh_key = throwaway_ssh_key()
        return self._ssh_key

    def coordinator_image(self) -> m.ImageReference:
        """The coordinator's image: azure_coordinator_image, else the instances' image."""
        return _image(self.config.azure_coordinator_image or self.config.azure_image or DEFAULT_IMAGE)

    def _vm_spec(self, spec: LaunchSpec) -> LaunchSpec:
        """The spec the VM gets: adlfs on the VM needs the account *name* (never a key)."""
        account = self.storage_account()
        if account and spec.store_url.startswith("az://"):
            return dataclasses.replace(spec, env={**spec.env, "AZURE_STORAGE_ACCOUNT_NAME": account})
        return spec

    def _location(self, spec: LaunchSpec) -> str:
        location = spec.region or self.config.region
        if not location:
            raise ConfigError("Config.region: give an Azure location such as 'eastus'")
        return location

    # -- validation and planning -----------------------------------------------------------
    def _validate(self) -> None:
        require_remote_store(self.config, self.name)
        cfg = self.config
        self.subscription()
        if not (cfg.region or (isinstance(cfg.regions, list) and cfg.regions) or cfg.regions == "cheapest"):
            raise ConfigError("Config.region: give an Azure location such as 'eastus' (or regions=[...])")
        store = cfg.store_url()
        if store.startswith("az://") and not self.storage_account():
            raise ConfigError(
                "Config.azure_storage_account: an az:// store needs the storage "
                "account name (or set $AZURE_STORAGE_ACCOUNT_NAME)"
            )
        if not cfg.azure_identity_id:
            raise ConfigError(
                "Config.azure_identity_id: give a user-assigned managed identity "
                "with 'Storage Blob Data Contributor' on the store, so the VM can "
                "reach it without a key"
            )
        if cfg.azure_image:
            _image(cfg.azure_image)
        if cfg.azure_coordinator_image:
            _image(cfg.azure_coordinator_image)
        if cfg.instances > 1:
            self._validate_one_location()

    def _plan_launch(self, spec: LaunchSpec) -> dict[str, Any]:
        spec = self._vm_spec(spec)
        location = self._location(spec) if (spec.region or self.config.region) else "<cheapest location>"
        elastic = self.config.instances > 1
        rg = self.resource_group(location if (spec.region or self.config.region) else "<location>")
        network = (
            job_network_ids(self.config.azure_subscription_id or "<subscription>", rg, spec.job_id)
            if elastic
            else None
        )
        vm = build_vm(
            spec,
            self.config,
            location,
            "<throwaway ssh-ed25519 public key>" if self._ssh_key is None else self._ssh_key,
            network,
            self._planned_subnet(location, rg),
        )
        body = vm.as_dict()
        body["properties"]["osProfile"]["customData"] = "<base64 of the cloud-config below>"
        name = vm_name(spec)
        cloud_config = base64.b64decode(azure_custom_data(spec)).decode()
        requests: list[dict[str, Any]] = []
        if not self.config.azure_resource_group:
            requests.append(
                {
                    "api": "resources.resource_groups.create_or_update",
                    "args": {"resource_group_name": rg},
                    "body": dict(resource_group_model(location)),
                    "note": "Config.azure_resource_group is not set: spotnb creates this group on "
                    "first use (idempotent; set azure_resource_group to use your own)",
                }
            )
        if not self.config.azure_subnet_id:
            vnet, subnet = default_network_ids(
                self.config.azure_subscription_id or "<subscription>", rg, location
            )
            requests.append(
                {
                    "api": "resources.resources.begin_create_or_update_by_id",
                    "when": "on first use, if missing (found by id: an existing one is never sent again)",
                    "args": {"resource_id": vnet},
                    "body": default_network_body(location),
                    "note": f"Config.azure_subnet_id is not set: spotnb creates this virtual network, "
                    f"tagged spotnb-managed, and the VMs' NICs use its subnet {subnet}; `spotnb gc` "
                    "deletes it once no VM uses it (set azure_subnet_id to use your own)",
                }
            )
        with planned_hosting(self, spec.job_id) as planned:
            coordinator = self.plan_coordinator(spec.job_id, location, requests) if planned else None
        requests.append(
            {
                "api": "compute.virtual_machines.begin_create_or_update",
                "args": {"resource_group_name": rg, "vm_name": name},
                "body": body,
            }
        )
        plan: dict[str, Any] = {
            "provider": "azure",
            "instances": self.config.instances,
            "location": location,
            "resource_group": rg,
            "subnet": self._planned_subnet(location, rg),
            "requests": requests,
            "cloud_config": cloud_config,
            "terminate": {
                "api": "compute.virtual_machines.begin_delete",
                "args": {"resource_group_name": rg, "vm_name": name},
                "note": "deletes the OS disk, NIC and public IP with it (delete_option)",
            },
            "fault_injection": {
                "api": "compute.virtual_machines.simulate_eviction",
                "args": {"resource_group_name": rg, "vm_name": name},
            },
        }
        if coordinator is not None:
            plan["coordinator"] = coordinator
        return plan

    def _planned_subnet(self, location: str, rg: str) -> str:
        """The subnet a dry run shows: the configured one, or spotnb's (placeholders offline)."""
        if self.config.azure_subnet_id:
            return str(self.config.azure_subnet_id)
        return default_network_ids(self.config.azure_subscription_id or "<subscription>", rg, location)[1]

    # -- backend hooks ---------------------------------------------------------------------
    def _launch(self, spec: LaunchSpec) -> Instance:
        spec = self._vm_spec(spec)
        location = self._location(spec)
        name = vm_name(spec)
        rg = self._ensure_group(location)
        subnet = self.ensure_subnet(location)
        network = self.ensure_job_network(spec.job_id, location) if self.config.instances > 1 else None
        vm = build_vm(spec, self.config, location, self.ssh_key(), network, subnet)
        try:
            poller = self.compute.virtual_machines.begin_create_or_update(rg, name, vm)
        except HttpResponseError as exc:
            raise self._refusal(exc, location) from None
        instance = Instance(
            id=name,
            provider="azure",
            region=location,
            instance_type=spec.instance_type,
            launched_at=time.time(),
            info={
                "resource_group": rg,
                "incarnation": spec.incarnation,
                **self._coordinator_info(spec.job_id),
            },
        )
        self._pollers[name] = poller
        self._launched[name] = instance
        return instance

    def _describe(self, instance: Instance) -> InstanceStatus:
        rg = self._group_of_instance(instance)
        poller = self._pollers.get(instance.id)
        if poller is not None and poller.done():
            try:
                poller.result()
            except HttpResponseError as exc:  # the allocation failed after the request
                code = _error_code(exc) or "failed"
                # what the controller does about it (`allocation_refusal`): a quota ends the
                # job, anything else (AllocationFailed: no capacity) is retried after a backoff
                self._refusals[instance.id] = self._refusal(exc, instance.region or "")
                return InstanceStatus(
                    InstanceState.TERMINATED, detail={"error": code, "message": exc.message}
                )
        try:
            view = self.compute.virtual_machines.instance_view(rg, instance.id)
        except ResourceNotFoundError:
            # gone: we deleted it, or the platform evicted it (eviction policy Delete)
            state = InstanceState.TERMINATED if instance.id in self._terminated else InstanceState.PREEMPTED
            return InstanceStatus(state, detail={"azure": "not found"})
        codes = [s.code for s in (view.statuses or []) if s.code]
        power = next((c.split("/", 1)[1] for c in codes if c.startswith("PowerState/")), None)
        failed = next((c for c in codes if c.startswith("ProvisioningState/failed")), None)
        detail = {"azure": codes}
        if failed:
            return InstanceStatus(InstanceState.TERMINATED, detail={**detail, "error": failed})
        if power == "running":
            return InstanceStatus(InstanceState.RUNNING, detail=detail)
        if power in (None, "starting"):
            return InstanceStatus(InstanceState.PENDING, detail=detail)
        if instance.id in self._terminated:
            return InstanceStatus(InstanceState.TERMINATED, detail=detail)
        if power in ("deallocated", "deallocating"):  # evicted with policy Deallocate
            return InstanceStatus(InstanceState.PREEMPTED, detail=detail)
        return InstanceStatus(InstanceState.EXITED, detail=detail)  # stopped: the guest shut down

    def _refusal(self, exc: HttpResponseError, location: str) -> Exception:
        """What a refused create means: a QuotaError (the subscription's quota: final), a
        CapacityError (no capacity now, or Azure throttling the API: retried after a backoff),
        or the error itself (anything else: the job fails with Azure's words)."""
        code = _error_code(exc)
        message = str(getattr(exc.error, "message", None) or exc.message or "")
        status = getattr(exc, "status_code", None)
        if status == 429 or code in ("TooManyRequests", "RetryableError"):
            return CapacityError(
                f"Azure throttled the request in {location} (HTTP {status}, {code or 'no code'}): "
                "too many API calls for the subscription, not a quota; asking again later"
            )
        quota = azure_quota_error(
            code, message, status=status, location=location, subscription=self.subscription()
        )
        if quota is not None and quota.limit is None:
            quota = azure_quota_error(
                code,
                message,
                status=status,
                location=location,
                subscription=self.subscription(),
                usage=self._spot_usage(location),
            )
        if quota is not None:
            return quota
        if code in CAPACITY_CODES:
            return CapacityError(f"{code} in {location}: {message}")
        if status is not None and status >= 500:  # ARM unavailable after azure-core's retries
            return CapacityError(
                f"Azure answered HTTP {status} ({code or 'no error code'}) in {location}: "
                f"{_first_line(message)}; asking again later"
            )
        return exc

    def _spot_usage(self, location: str) -> tuple[float, float] | None:
        """(in use, limit) of the location's spot vCPUs from the Usage API; None if unread."""
        try:
            for usage in self.compute.usage.list(location):
                if str(getattr(usage.name, "value", "")).lower() == "lowprioritycores":
                    return float(usage.current_value), float(usage.limit)
        except (HttpResponseError, AttributeError, TypeError, ValueError):
            pass
        return None

    def allocation_refusal(self, instance: Instance) -> Exception | None:
        """Why the VM's creation failed after Azure accepted it (an asynchronous
        AllocationFailed, a quota), once `describe` said TERMINATED; None if it did not fail."""
        return self._refusals.pop(instance.id, None)

    def _terminate(self, instance: Instance) -> None:
        """Delete the VM (its disk, NIC and IP go with it); the deletion finishes in Azure."""
        rg = self._group_of_instance(instance)
        if instance.info.get("job"):  # found by its tags (gc): `close` removes its job's network
            self._reaped_jobs.add((str(instance.info["job"]), instance.region or ""))
        self._delete_vm(rg, instance.id)

    def inject(self, instance: Instance) -> None:
        """Fault injection: Azure evicts the VM about 30 s after a Preempt scheduled event."""
        rg = self._group_of_instance(instance)
        self.compute.virtual_machines.simulate_eviction(rg, instance.id)

    def _prices(self, instance_type: str, regions: list[str] | None) -> dict[str, Price]:
        """Spot and on-demand $/h from the public Retail Prices API; the built-in table if it
        cannot be reached."""
        wanted = [
            r
            for r in (
                regions
                or ([self.config.region] if self.config.region else ["eastus", "westus2", "westeurope"])
            )
            if r
        ]
        table = lookup_price(instance_type, "azure")
        out: dict[str, Price] = {}
        for location in wanted:
            try:
                out[location] = _retail_price(instance_type, location)
            except (OSError, ValueError, KeyError):
                if table:
                    out[location] = Price(table.spot, table.on_demand, table.source)
        return out

    # -- cleanup ---------------------------------------------------------------------------
    def list_tagged(self) -> Iterator[tuple[Instance, str]]:
        """The configured group's tagged VMs, or (spotnb's groups being one per location) every
        tagged VM of the subscription."""
        configured = self.config.azure_resource_group
        vms = (
            self.compute.virtual_machines.list(configured)
            if configured
            else self.compute.virtual_machines.list_all()
        )
        for vm in vms:
            tags = vm.tags or {}
            if JOB_TAG in tags:
                rg = (
                    configured
                    or _group_of(getattr(vm, "id", None) or "")
                    or default_resource_group(vm.location)
                )
                yield (
                    Instance(
                        id=vm.name,
                        provider="azure",
                        region=vm.location,
                        instance_type="",
                        launched_at=0.0,
                        info={
                            "resource_group": rg,
                            "job": tags[JOB_TAG],
                            "role": tags.get(ROLE_TAG, "instance"),
                        },
                    ),
                    tags[JOB_TAG],
                )

    def close(self) -> None:
        """Safety net: delete every VM this provider launched and did not end, then the
        coordinators it started or found, and the network of those jobs and of the jobs gc
        reaped (an on-demand VM left running costs the user money)."""
        for instance in list(self._launched.values()):
            if instance.id not in self._terminated:
                try:
                    self._terminate(instance)
                except HttpResponseError:
                    pass
        self.close_coordinators()


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "no message"
    return line if len(line) <= 300 else line[:300] + "…"


def _error_code(exc: HttpResponseError) -> str:
    """The ARM error code of `exc` ("" when the body named none, or was no ARM error)."""
    return str(getattr(getattr(exc, "error", None), "code", None) or "")


def _retail_price(instance_type: str, location: str, timeout: float = 5.0) -> Price:
    """Spot and on-demand Linux $/h of `instance_type` in `location` from the Retail Prices
    API (its primary meters, every page), cached on disk for `RETAIL_TTL`; raises OSError /
    ValueError / KeyError when it cannot be read (the caller falls back to the table)."""
    from spotnb.market.price_cache import cached, describe_age

    def fetch() -> list[float]:
        query = (
            f"armRegionName eq '{location}' and armSkuName eq '{instance_type}' "
            "and priceType eq 'Consumption' and serviceName eq 'Virtual Machines'"
        )
        url: str | None = f"{_RETAIL_API}?$filter={urllib.parse.quote(query)}&meterRegion='primary'"
        items: list[dict[str, Any]] = []
        for _ in range(10):  # a handful of items per SKU and location; pages of 100
            if not url:
                break
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - public API
                page = json.load(resp)
            items += page["Items"]
            url = page.get("NextPageLink")
        linux = [
            i
            for i in items
            if "Windows" not in i.get("productName", "") and "Low Priority" not in i.get("skuName", "")
        ]
        spot = min(float(i["retailPrice"]) for i in linux if "Spot" in i["skuName"])
        on_demand = min(float(i["retailPrice"]) for i in linux if "Spot" not in i["skuName"])
        return [spot, on_demand]

    (spot, on_demand), age = cached(f"azure-retail-{instance_type}-{location}", RETAIL_TTL, fetch)
    return Price(spot, on_demand, f"Azure Retail Prices API ({describe_age(age)})")
