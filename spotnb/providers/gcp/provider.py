"""GCP Spot VMs through google-cloud-compute (`pip install 'spotnb[gcp]'`).

One instance per incarnation with `Scheduling(provisioning_model="SPOT",
instance_termination_action="DELETE", on_host_maintenance="TERMINATE")`: a preempted VM is
deleted with its boot disk (`auto_delete`), so nothing is left billing; GPU VMs cannot
live-migrate, hence TERMINATE on host maintenance (the agent's GcpWatcher treats
TERMINATE_ON_HOST_MAINTENANCE as a preemption). The bootstrap is the `startup-script`
metadata item.

Where: `region` / `regions` take zones ("us-central1-a") or regions ("us-central1"). A region is
tried zone by zone, in the order `ZonesClient.list` gives for it (zones that are UP, sorted by
name); a capacity error (ZONE_RESOURCE_POOL_EXHAUSTED, stockout) or a zone that does not
offer the machine type moves on to the next zone, and only when every zone refused does the
launch raise CapacityError (the controller then backs off and tries again). A quota
(QUOTA_EXCEEDED: the region's GPUs or CPUs, the project's GPUS_ALL_REGIONS) is no shortage:
the launch raises QuotaError at once, naming the quota and how to raise it (`quotas`). When the credentials
may not list zones (compute.zones.list denied, offline), or there are no Google credentials at
all (then the API is not asked: a dry run offline takes no metadata-server probe), the zones
come from the built-in table (`gcp_zones.REGION_ZONES`); for a region it lacks, the fallback is
the zone suffixes GCE uses, `<region>-a, -b, -c, -d, -f` (`FALLBACK_ZONE_SUFFIXES`): those a
region lacks are skipped like a zone without the machine type. A "not found" that is
not about the zone (the image, network, subnetwork, service account or project) ends the launch
at once with a ConfigError naming the Config field to fix (`spotnb.providers.gcp.errors`).

Credentials come from google-auth's Application Default Credentials; the VM uses its service
account. Fault injection: `provider.inject(instance)` calls `simulate_maintenance_event`.
Spot prices: GCP publishes them only through the Cloud Billing Catalog API, which needs an API
key; spotnb uses its built-in table (the same price in every zone).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from google.api_core import exceptions as gexc
from google.auth.exceptions import GoogleAuthError
from google.cloud import compute_v1
from requests.exceptions import RequestException

from spotnb.errors import CapacityError, ConfigError
from spotnb.market.prices import lookup_price
from spotnb.providers.base import (
    Feature,
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    Price,
    Provider,
)
from spotnb.providers.bootstrap import gcp_startup_script, require_remote_store
from spotnb.providers.cleanup import JOB_TAG, job_tags
from spotnb.providers.coordinator import COORDINATOR_ROLE, ROLE_TAG, planned_hosting
from spotnb.providers.gcp.coordinator import GCPCoordinator, job_network_tag
from spotnb.providers.gcp.errors import error_texts, missing_resource, missing_resource_error, zone_lacks
from spotnb.providers.gcp.zones import ZONES_AS_OF, table_zones
from spotnb.providers.quotas import gcp_quota_error

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "GCPProvider",
    "DEFAULT_IMAGE",
    "CAPACITY_MARKERS",
    "FALLBACK_ZONE_SUFFIXES",
    "build_instance",
    "instance_name",
    "insert_request",
    "delete_request",
    "simulate_request",
    "zones_request",
    "is_zone",
    "is_region",
]

log = logging.getLogger("spotnb.providers.gcp.provider")

DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
# Error reasons that mean "not in this zone now": the controller tries the next candidate.
CAPACITY_MARKERS = (
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_EXHAUSTED",
    "UNSUPPORTED_OPERATION",
    "does not have enough resources available",
    "stockout",
)
# Errors that mean "this zone cannot serve this request at all" (no such zone, machine type or
# GPU there): inside a region, the next zone is tried; for an explicit zone they are raised.
# (A NotFound counts only when the resource it names is zonal: `gcp_errors.zone_lacks`.)
NOT_IN_ZONE_MARKERS = ("does not exist in zone", "Unknown zone", "Invalid value for field 'zone'")
#: Zone suffixes tried, in this order, when zones cannot be listed (GCE names zones a–f; most
#: regions have three of them, and a suffix a region lacks is skipped).
FALLBACK_ZONE_SUFFIXES = ("a", "b", "c", "d", "f")
_ZONE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
_REGION = re.compile(r"^[a-z]+-[a-z]+\d+$")
_NAME_MAX = 63
_INSERT_TIMEOUT = 180.0
#: seconds `ZonesClient.list` may take before the zone table answers instead (offline, a
#: network that drops packets)
_LIST_TIMEOUT = 10.0


def is_zone(name: str | None) -> bool:
    return bool(name and _ZONE.match(name))


def is_region(name: str | None) -> bool:
    return bool(name and _REGION.match(name))


def instance_name(spec: LaunchSpec) -> str:
    """A valid GCE name, `[a-z]([-a-z0-9]*[a-z0-9])?` of at most 63 characters, for any job id
    (a real one or the dry run's "<job-id>"): runs of other characters become one dash, and a
    long id is cut so the incarnation number stays at the end (names must differ per
    incarnation)."""
    suffix = f"-{spec.incarnation}"
    job = re.sub(r"[^a-z0-9]+", "-", spec.job_id.lower()).strip("-") or "job"
    job = job[: _NAME_MAX - len("spotnb-") - len(suffix)].rstrip("-")
    return f"spotnb-{job}{suffix}"


def _labels(spec: LaunchSpec) -> dict[str, str]:
    """job_tags as valid GCE label values (lowercase letters, digits, `_` and `-`, ≤ 63)."""
    return {
        k: re.sub(r"[^a-z0-9_-]+", "-", v.lower()).strip("-")[:_NAME_MAX] for k, v in job_tags(spec).items()
    }


def build_instance(spec: LaunchSpec, config: Config, zone: str) -> compute_v1.Instance:
    """The exact Instance resource sent to `InstancesClient.insert` for one incarnation. A job
    on several instances tags it with the job's network tag (its firewall rules open TCP
    between the job's VMs only)."""
    name = instance_name(spec)
    disk = compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,
        type_="PERSISTENT",
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=config.gcp_image or DEFAULT_IMAGE,
            disk_size_gb=config.gcp_disk_gb,
            disk_type=f"zones/{zone}/diskTypes/pd-balanced",
            labels=_labels(spec),
        ),
    )
    nic = compute_v1.NetworkInterface(
        network=config.gcp_network or "global/networks/default",
        # an ephemeral external IP for outbound pip installs; the default firewall admits no
        # inbound traffic to this VM beyond what the project's own rules allow
        access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")],
    )
    if config.gcp_subnetwork:
        nic.subnetwork = config.gcp_subnetwork
    instance = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{spec.instance_type}",
        labels=_labels(spec),
        disks=[disk],
        network_interfaces=[nic],
        scheduling=compute_v1.Scheduling(
            provisioning_model="SPOT",
            instance_termination_action="DELETE",
            on_host_maintenance="TERMINATE",
            automatic_restart=False,
        ),
        metadata=compute_v1.Metadata(
            items=[
                compute_v1.Items(key="startup-script", value=gcp_startup_script(spec)),
                compute_v1.Items(key="install-nvidia-driver", value="True"),
            ]
        ),
        service_accounts=[
            compute_v1.ServiceAccount(
                email=config.gcp_service_account or "default",
                scopes=["https://www.googleapis.com/auth/cloud-platform"],
            )
        ],
    )
    if config.instances > 1:
        instance.tags = compute_v1.Tags(items=[job_network_tag(spec.job_id)])
    if config.gcp_accelerator_type:
        instance.guest_accelerators = [
            compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{config.gcp_accelerator_type}",
                accelerator_count=config.gcp_accelerator_count,
            )
        ]
    return instance


def insert_request(
    spec: LaunchSpec, config: Config, project: str, zone: str
) -> compute_v1.InsertInstanceRequest:
    return compute_v1.InsertInstanceRequest(
        project=project, zone=zone, instance_resource=build_instance(spec, config, zone)
    )


def delete_request(project: str, zone: str, name: str) -> compute_v1.DeleteInstanceRequest:
    return compute_v1.DeleteInstanceRequest(project=project, zone=zone, instance=name)


def simulate_request(
    project: str, zone: str, name: str
) -> compute_v1.SimulateMaintenanceEventInstanceRequest:
    return compute_v1.SimulateMaintenanceEventInstanceRequest(project=project, zone=zone, instance=name)


def zones_request(project: str, region: str) -> compute_v1.ListZonesRequest:
    """Zones of one region: `Zone.region` is the region's URL, matched by a regular expression
    (the `eq` form of the list filter must match the whole field)."""
    return compute_v1.ListZonesRequest(project=project, filter=f"region eq .*/regions/{region}")


def _region_of(zone: str) -> str:
    """The region of a zone ("us-central1-a" → "us-central1"); a region stays itself."""
    return zone.rsplit("-", 1)[0] if _ZONE.match(zone) else zone


def _codes(exc: Exception) -> tuple[str, ...]:
    """The codes and reasons of a GCE error's items (an operation's `code`, a REST `reason`)."""
    out: list[str] = []
    for item in getattr(exc, "errors", None) or []:
        for key in ("code", "reason"):
            value = getattr(item, key, None) or (item.get(key) if isinstance(item, dict) else None)
            if isinstance(value, str) and value:
                out.append(value)
    return tuple(out)


def _is_capacity(exc: Exception) -> bool:
    """No capacity now, or the API throttled or unavailable (any 5xx): worth asking again."""
    return any(marker in str(exc) for marker in CAPACITY_MARKERS) or isinstance(
        exc, (gexc.ResourceExhausted, gexc.TooManyRequests, gexc.ServerError)
    )


def _not_in_zone(exc: Exception) -> bool:
    return zone_lacks(exc) or any(m in str(exc) for m in NOT_IN_ZONE_MARKERS)


class GCPProvider(GCPCoordinator, Provider):
    """GCE Spot VMs; a region is tried zone by zone. A job on several instances also gets a
    coordinator (`spotnb.providers.gcp.coordinator`)."""

    name = "gcp"
    ships_code = True  # its VMs install the notebook's spotnb from the store
    unsupported: ClassVar[dict[Feature, str]] = {
        Feature.NOTICE_ACK: "GCE has no way to acknowledge a preemption notice",
        Feature.REBALANCE_HINT: "GCE gives no early rebalance recommendation",
    }

    credentials_hint: ClassVar[str] = (
        "GCP: `gcloud auth application-default login`, or $GOOGLE_APPLICATION_CREDENTIALS "
        "naming a service account key file; and the project in gcp_project or "
        "$GOOGLE_CLOUD_PROJECT"
    )

    @classmethod
    def has_credentials(cls) -> bool:
        """What Application Default Credentials would find, without its metadata-server probe
        (seconds of timeouts off GCE): a key file, gcloud's ADC file, or a GCE machine."""
        named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if named:
            return os.path.isfile(named)
        config_dir = os.environ.get("CLOUDSDK_CONFIG") or os.path.join(
            os.path.expanduser("~"), ".config", "gcloud"
        )
        if os.path.isfile(os.path.join(config_dir, "application_default_credentials.json")):
            return True
        try:
            from google.auth.compute_engine import _metadata

            return bool(_metadata.detect_gce_residency_linux())
        except Exception:  # noqa: BLE001 - a private helper of google-auth: absent means no
            return False

    def __init__(
        self,
        config: Config,
        instances: Any = None,
        zones: Any = None,
        addresses: Any = None,
        firewalls: Any = None,
        machine_types: Any = None,
        catalog: Any = None,
    ) -> None:
        """`instances` is an InstancesClient, `zones` a ZonesClient, `addresses` an
        AddressesClient, `firewalls` a FirewallsClient, `machine_types` a MachineTypesClient
        and `catalog` an authorized session for the Cloud Billing catalog (each built from
        Application Default Credentials if None)."""
        super().__init__(config)
        self._client = instances
        self._zones_client = zones
        self._machine_types = machine_types
        self._catalog = catalog
        self._catalog_failed = False
        self._catalog_rates: dict[str, Any] = {}
        self._launched: dict[str, Instance] = {}
        self._terminated: set[str] = set()
        self._region_zones: dict[str, tuple[list[str], str]] = {}
        self._init_coordinators(addresses, firewalls)

    @property
    def instances(self) -> Any:
        if self._client is None:
            self._client = compute_v1.InstancesClient()
        return self._client

    @property
    def zones_client(self) -> Any:
        if self._zones_client is None:
            self._zones_client = compute_v1.ZonesClient()
        return self._zones_client

    def project(self) -> str:
        project = (
            self.config.gcp_project
            or os.environ.get("GOOGLE_CLOUD_PROJECT")
            or os.environ.get("CLOUDSDK_CORE_PROJECT")
        )
        if project:
            return project
        project = None
        if self.has_credentials():  # else google.auth would probe the metadata server for nothing
            try:
                import google.auth

                _, project = google.auth.default()
            except Exception:  # noqa: BLE001 - google.auth raises several kinds
                project = None
        if not project:
            raise ConfigError(
                "Config.gcp_project: not set and no default project in the credentials; give the project id"
            )
        return project

    def coordinator_image(self) -> str:
        """The coordinator's image: gcp_coordinator_image, else the instances' image."""
        return str(self.config.gcp_coordinator_image or self.config.gcp_image or DEFAULT_IMAGE)

    def _where_to(self, spec: LaunchSpec) -> str:
        where = spec.region or self.config.region
        if not where:
            raise ConfigError(
                "Config.region: give a GCP region or zone such as 'us-central1' or 'us-central1-a'"
            )
        return where

    def zones(self, where: str) -> tuple[list[str], str]:
        """The zones to try for a region or zone, in order, and where that order came from.

        A region's zones are listed once per provider (they do not change during a job). Without
        Google credentials (checked on disk, no network: `has_credentials`) the API is not asked
        at all; when listing fails (permission denied, offline: bounded by `_LIST_TIMEOUT`) the
        built-in zone table answers (`gcp_zones`), and for a region it lacks the fallback
        suffixes."""
        if is_zone(where):
            return [where], "the configured zone"
        if where not in self._region_zones:
            if self._zones_client is None and not self.has_credentials():
                # google-auth would probe the metadata server first: seconds to minutes offline
                result = self._unlisted_zones(where, "no Google credentials")
            else:
                result = self._listed_zones(where)
            self._region_zones[where] = result
        zones, source = self._region_zones[where]
        return list(zones), source

    def _listed_zones(self, where: str) -> tuple[list[str], str]:
        project = self.project()
        try:
            listed = sorted(
                z.name
                for z in self.zones_client.list(request=zones_request(project, where), timeout=_LIST_TIMEOUT)
                if z.region.rsplit("/", 1)[-1] == where and z.status != "DOWN"
            )
        except (gexc.GoogleAPICallError, GoogleAuthError, RequestException) as exc:
            return self._unlisted_zones(where, type(exc).__name__)
        if not listed:
            raise ConfigError(
                f"Config.region: {where!r} has no zone that is UP in project "
                f"{project!r} (ZonesClient.list); check the region name"
            )
        return listed, "ZonesClient.list"

    def _unlisted_zones(self, where: str, why: str) -> tuple[list[str], str]:
        """The zones of `where` when the API cannot tell them: the table's, else the suffixes."""
        known = table_zones(where)
        if known:
            log.info("cannot list the zones of %s (%s); using the built-in table: %s", where, why, known)
            return known, f"built-in zone table of {ZONES_AS_OF} (zones could not be listed: {why})"
        log.warning(
            "cannot list the zones of %s (%s); trying %s-%s in turn",
            where,
            why,
            where,
            "/".join(FALLBACK_ZONE_SUFFIXES),
        )
        suffixes = [f"{where}-{s}" for s in FALLBACK_ZONE_SUFFIXES]
        return suffixes, f"fallback (zones could not be listed: {why})"

    # -- validation and planning -----------------------------------------------------------
    def _validate(self) -> None:
        require_remote_store(self.config, self.name)
        if not self.config.gcp_project and not (
            os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
        ):
            raise ConfigError("Config.gcp_project: give the project id (or set $GOOGLE_CLOUD_PROJECT)")
        regions = self.config.candidate_regions()
        if not regions:
            raise ConfigError(
                "Config.region: give a GCP region or zone such as 'us-central1' or "
                "'us-central1-a' (or regions=[...])"
            )
        field = "region" if self.config.region else "regions"
        for r in [] if regions == "cheapest" else regions:
            if not (is_zone(r) or is_region(r)):
                raise ConfigError(
                    f"Config.{field}: {r!r} is neither a GCP region nor a zone "
                    "(e.g. 'us-central1' or 'us-central1-a')"
                )
        if self.config.instances > 1:
            self._validate_one_region()

    def _plan_launch(self, spec: LaunchSpec) -> dict[str, Any]:
        where = spec.region or self.config.region
        project = self.project()
        if where:
            zones, source = self.zones(where)
        else:
            zones, source = ["<cheapest zone>"], "regions='cheapest'"
        zone = zones[0]
        req = insert_request(spec, self.config, project, zone)
        body = compute_v1.Instance.to_dict(req.instance_resource)
        for item in body["metadata"]["items"]:
            if item["key"] == "startup-script":
                item["value"] = "<the bootstrap script below>"
        name = instance_name(spec)
        requests: list[dict[str, Any]] = []
        with planned_hosting(self, spec.job_id) as planned:
            coordinator = self.plan_coordinator(spec.job_id, project, zone, requests) if planned else None
        requests.append(
            {
                "api": "compute_v1.InstancesClient.insert",
                "args": {"project": project, "zone": zone},
                "body": body,
            }
        )
        plan: dict[str, Any] = {
            "provider": "gcp",
            "instances": self.config.instances,
            "project": project,
            "zone": zone,
            "zones": zones,
            "zone_order": (
                f"{where}: tried in this order ({source}); a capacity error or a "
                "zone without the machine type moves on to the next"
                if len(zones) > 1
                else f"{zone} ({source})"
            ),
            "requests": requests,
            "bootstrap": gcp_startup_script(spec),
            "terminate": {
                "api": "compute_v1.InstancesClient.delete",
                "args": compute_v1.DeleteInstanceRequest.to_dict(delete_request(project, zone, name)),
            },
            "fault_injection": {
                "api": "compute_v1.InstancesClient.simulate_maintenance_event",
                "args": compute_v1.SimulateMaintenanceEventInstanceRequest.to_dict(
                    simulate_request(project, zone, name)
                ),
            },
        }
        if coordinator is not None:
            plan["coordinator"] = coordinator
        return plan

    # -- backend hooks ---------------------------------------------------------------------
    def _launch(self, spec: LaunchSpec) -> Instance:
        where = self._where_to(spec)
        project = self.project()
        zones, _ = self.zones(where)
        refused: list[str] = []
        capacity = False
        for zone in zones:
            try:
                return self._insert(spec, project, zone)
            except gexc.GoogleAPICallError as exc:
                missing = missing_resource(exc)
                if missing is not None:  # missing in every zone: trying the next one cannot help
                    raise missing_resource_error(missing, exc, zone) from exc
                # a quota (the region's GPUs or CPUs, or the project's GPUS_ALL_REGIONS) refuses
                # every zone of the region alike: final, not a shortage to wait out
                quota = gcp_quota_error(
                    error_texts(exc), project=project, region=_region_of(zone), codes=_codes(exc)
                )
                if quota is not None:
                    raise quota from exc
                if _is_capacity(exc):
                    capacity = True
                elif not (len(zones) > 1 and _not_in_zone(exc)):
                    raise
                log.info("%s: %s; trying the next zone", zone, exc)
                refused.append(f"{zone}: {exc}")
        if len(zones) == 1 and capacity:
            raise CapacityError(refused[0])
        if capacity:
            raise CapacityError(f"no capacity in any zone of {where}: " + "; ".join(refused))
        raise ConfigError(
            f"Config.instance_type: no zone of {where} can run {spec.instance_type!r}: " + "; ".join(refused)
        )

    def _insert(self, spec: LaunchSpec, project: str, zone: str) -> Instance:
        if self.config.instances > 1:  # the training ports, open to the job's members only
            self.ensure_job_network(spec.job_id, zone)
        req = insert_request(spec, self.config, project, zone)
        operation = self.instances.insert(request=req)
        operation.result(timeout=_INSERT_TIMEOUT)  # errors of the insert surface here
        name = req.instance_resource.name
        instance = Instance(
            id=name,
            provider="gcp",
            region=zone,
            instance_type=spec.instance_type,
            launched_at=time.time(),
            info={
                "project": project,
                "zone": zone,
                "incarnation": spec.incarnation,
                **self._coordinator_info(spec.job_id),
            },
        )
        self._launched[name] = instance
        return instance

    def _where(self, instance: Instance) -> tuple[str, str]:
        return instance.info.get("project") or self.project(), instance.info.get(
            "zone"
        ) or instance.region or ""

    def _describe(self, instance: Instance) -> InstanceStatus:
        project, zone = self._where(instance)
        try:
            data = self.instances.get(project=project, zone=zone, instance=instance.id)
        except gexc.NotFound:
            # deleted: by us, or by the platform after a preemption (termination action DELETE)
            state = InstanceState.TERMINATED if instance.id in self._terminated else InstanceState.PREEMPTED
            return InstanceStatus(state, detail={"gcp": "not found"})
        status = data.status
        detail = {"gcp_status": status}
        if status in ("PROVISIONING", "STAGING"):
            return InstanceStatus(InstanceState.PENDING, detail=detail)
        if status == "RUNNING":
            return InstanceStatus(InstanceState.RUNNING, detail=detail)
        if instance.id in self._terminated:
            return InstanceStatus(InstanceState.TERMINATED, detail=detail)
        # STOPPING / TERMINATED / SUSPENDED: the guest powered off (a preempted VM is deleted)
        return InstanceStatus(InstanceState.EXITED, detail=detail)

    def _terminate(self, instance: Instance) -> None:
        self._terminated.add(instance.id)
        project, zone = self._where(instance)
        if instance.info.get("job"):  # found by its labels (gc): `close` removes its job's network
            self._reaped_jobs.add((str(instance.info["job"]), zone))
        try:
            self.instances.delete(request=delete_request(project, zone, instance.id))
        except gexc.NotFound:
            pass

    def inject(self, instance: Instance) -> None:
        """Fault injection: a host maintenance event, which a Spot VM with on_host_maintenance
        TERMINATE experiences as a termination (with the maintenance-event notice)."""
        project, zone = self._where(instance)
        self.instances.simulate_maintenance_event(request=simulate_request(project, zone, instance.id))

    def _prices(self, instance_type: str, regions: list[str] | None) -> dict[str, Price]:
        """The Cloud Billing catalog's prices where credentials allow, else the dated table."""
        table = lookup_price(instance_type, "gcp")
        zones = (
            regions
            or (self.config.regions if isinstance(self.config.regions, list) else None)
            or ([self.config.region] if self.config.region else [])
        )
        found: dict[str, Price] = {}
        for z in zones:
            if not z:
                continue
            live = self._catalog_price(instance_type, z)
            if live is not None:
                found[z] = live
            elif table is not None:
                found[z] = Price(table.spot, table.on_demand, table.source)
        return found

    def _catalog_price(self, machine_type: str, where: str) -> Price | None:
        """`machine_type`'s $/h in `where` (a region or zone) from the Cloud Billing catalog
        (`spotnb.providers.gcp.catalog`); None without credentials to read it, or when the
        catalog cannot price the type (then the table answers). A failure is logged once."""
        from spotnb.market.price_cache import cached, describe_age
        from spotnb.providers.gcp.catalog import (
            CATALOG_TTL,
            MachineShape,
            catalog_skus,
            machine_price,
            rates_from_skus,
        )

        if self._catalog_failed:
            return None
        match = re.match(r"^(.*\d)-[a-z]$", where)  # a zone: its region is all but the letter
        region = match.group(1) if match else where
        try:
            session = self.catalog
            if session is None:
                return None
            skus, age = cached("gcp-catalog-skus", CATALOG_TTL, lambda: catalog_skus(session))
            if region not in self._catalog_rates:
                self._catalog_rates[region] = rates_from_skus(skus, region)
            zone = where if match else self.zones(region)[0][0]

            def shape() -> dict[str, Any]:
                mt = self.machine_types.get(project=self.project(), zone=zone, machine_type=machine_type)
                return {
                    "cpus": int(mt.guest_cpus),
                    "memory_gb": float(mt.memory_mb) / 1024,
                    "gpus": [
                        [a.guest_accelerator_type, int(a.guest_accelerator_count)] for a in mt.accelerators
                    ],
                }

            raw, _ = cached(f"gcp-machine-{machine_type}", 30 * CATALOG_TTL, shape)
            if not isinstance(skus, list):
                raise ValueError(f"the cached catalog is a {type(skus).__name__}, not a list of SKUs")
        except Exception as exc:  # noqa: BLE001 - no credentials, API off, quota: the table answers
            self._catalog_failed = True
            log.info("GCP prices: the Cloud Billing catalog is not readable (%s); using the dated table", exc)
            return None
        try:
            machine = MachineShape(
                int(raw["cpus"]), float(raw["memory_gb"]), tuple((str(g), int(c)) for g, c in raw["gpus"])
            )
        except (TypeError, ValueError, KeyError) as exc:  # a corrupt cache entry: not a crash
            log.info(
                "GCP prices: the cached shape of %s is unusable (%r); using the dated table",
                machine_type,
                exc,
            )
            return None
        prices = machine_price(machine_type, machine, self._catalog_rates[region])
        if prices is None:
            return None
        return Price(prices[0], prices[1], f"GCP Cloud Billing catalog, {region} ({describe_age(age)})")

    @property
    def catalog(self) -> Any:
        """An authorized `requests` session for the Cloud Billing catalog, from Application
        Default Credentials (None without any)."""
        if self._catalog is None:
            if not self.has_credentials():  # no metadata-server probe: nothing to find
                return None
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-billing.readonly"]
            )
            self._catalog = AuthorizedSession(credentials)
        return self._catalog

    @property
    def machine_types(self) -> Any:
        if self._machine_types is None:
            self._machine_types = compute_v1.MachineTypesClient()
        return self._machine_types

    def zone_location(self, zone: str | None) -> tuple[str | None, str | None]:
        where = zone or self.config.region
        return ("gcp", where.rsplit("-", 1)[0] if where and is_zone(where) else where)

    # -- cleanup ---------------------------------------------------------------------------
    def list_tagged(self) -> Iterator[tuple[Instance, str]]:
        project = self.project()
        request = compute_v1.AggregatedListInstancesRequest(project=project, filter=f"labels.{JOB_TAG}:*")
        for zone_path, scoped in self.instances.aggregated_list(request=request):
            zone = zone_path.rsplit("/", 1)[-1]
            for data in scoped.instances:
                labels = dict(data.labels)
                job, role = labels.get(JOB_TAG), labels.get(ROLE_TAG, "instance")
                # a powered-off coordinator still holds its disk and the job's address
                if job and (data.status not in ("TERMINATED",) or role == COORDINATOR_ROLE):
                    yield (
                        Instance(
                            id=data.name,
                            provider="gcp",
                            region=zone,
                            instance_type="",
                            launched_at=0.0,
                            info={"project": project, "zone": zone, "job": job, "role": role},
                        ),
                        job,
                    )

    def close(self) -> None:
        """Safety net: delete every VM this provider launched and did not end, then the
        coordinators it started or found, and the network of those jobs and of the jobs gc
        reaped (an on-demand VM left running costs the user money)."""
        for instance in list(self._launched.values()):
            if instance.id not in self._terminated:
                try:
                    self._terminate(instance)
                except gexc.GoogleAPICallError:
                    pass
        self.close_coordinators()
