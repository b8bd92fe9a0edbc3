"""GCP Spot VMs through google-cloud-compute (`pip install 'spotnb[gcp]'`).

One instance per incarnation with `Scheduling(provisioning_model="SPOT",
instance_termination_action="DELETE", on_host_maintenance="TERMINATE")`: a preempted VM is
deleted with its boot disk (`auto_delete`), so nothing is left billing; GPU VMs cannot
live-migrate, hence TERMINATE on host maintenance (the agent's GcpWatcher treats
TERMINATE_ON_HOST_MAINTENANCE as a preemption). The bootstrap is the `startup-script`
metadata item. Regions are zones ("us-central1-a").

Credentials come from google-auth's Application Default Credentials; the VM uses its service
account. Fault injection: `provider.inject(instance)` calls `simulate_maintenance_event`.
Spot prices: GCP publishes them only through the Cloud Billing Catalog API, which needs an API
key; spotnb uses its built-in table (the same price in every zone).
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, ClassVar, Iterator

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from spotnb.errors import CapacityError, ConfigError
from spotnb.prices import lookup_price
from spotnb.providers.base import (Feature, Instance, InstanceState, InstanceStatus, LaunchSpec,
                                   Price, Provider)
from spotnb.providers.bootstrap import gcp_startup_script, require_remote_store
from spotnb.providers.cleanup import JOB_TAG, job_tags

__all__ = ["GCPProvider", "DEFAULT_IMAGE", "CAPACITY_MARKERS", "build_instance", "instance_name",
           "insert_request", "delete_request", "simulate_request"]

DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
# Error reasons that mean "not in this zone now": the controller tries the next candidate.
CAPACITY_MARKERS = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                    "QUOTA_EXCEEDED", "RESOURCE_EXHAUSTED", "UNSUPPORTED_OPERATION",
                    "does not have enough resources available", "stockout")
_ZONE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
_INSERT_TIMEOUT = 180.0


def instance_name(spec: LaunchSpec) -> str:
    """RFC 1035 name: lowercase letters, digits and dashes, ≤ 63, starting with a letter."""
    return re.sub(r"[^a-z0-9-]", "-", f"spotnb-{spec.job_id}-{spec.incarnation}".lower())[:63]


def build_instance(spec: LaunchSpec, config: Any, zone: str) -> compute_v1.Instance:
    """The exact Instance resource sent to `InstancesClient.insert` for one incarnation."""
    name = instance_name(spec)
    disk = compute_v1.AttachedDisk(
        boot=True, auto_delete=True, type_="PERSISTENT",
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=config.gcp_image or DEFAULT_IMAGE, disk_size_gb=config.gcp_disk_gb,
            disk_type=f"zones/{zone}/diskTypes/pd-balanced", labels=job_tags(spec)))
    nic = compute_v1.NetworkInterface(
        network=config.gcp_network or "global/networks/default",
        # an ephemeral external IP for outbound pip installs; the default firewall admits no
        # inbound traffic to this VM beyond what the project's own rules allow
        access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")])
    if config.gcp_subnetwork:
        nic.subnetwork = config.gcp_subnetwork
    instance = compute_v1.Instance(
        name=name, machine_type=f"zones/{zone}/machineTypes/{spec.instance_type}",
        labels=job_tags(spec), disks=[disk], network_interfaces=[nic],
        scheduling=compute_v1.Scheduling(provisioning_model="SPOT",
                                         instance_termination_action="DELETE",
                                         on_host_maintenance="TERMINATE", automatic_restart=False),
        metadata=compute_v1.Metadata(items=[
            compute_v1.Items(key="startup-script", value=gcp_startup_script(spec)),
            compute_v1.Items(key="install-nvidia-driver", value="True")]),
        service_accounts=[compute_v1.ServiceAccount(
            email=config.gcp_service_account or "default",
            scopes=["https://www.googleapis.com/auth/cloud-platform"])])
    if config.gcp_accelerator_type:
        instance.guest_accelerators = [compute_v1.AcceleratorConfig(
            accelerator_type=f"zones/{zone}/acceleratorTypes/{config.gcp_accelerator_type}",
            accelerator_count=config.gcp_accelerator_count)]
    return instance


def insert_request(spec: LaunchSpec, config: Any, project: str, zone: str) -> compute_v1.InsertInstanceRequest:
    return compute_v1.InsertInstanceRequest(project=project, zone=zone,
                                            instance_resource=build_instance(spec, config, zone))


def delete_request(project: str, zone: str, name: str) -> compute_v1.DeleteInstanceRequest:
    return compute_v1.DeleteInstanceRequest(project=project, zone=zone, instance=name)


def simulate_request(project: str, zone: str, name: str) -> compute_v1.SimulateMaintenanceEventInstanceRequest:
    return compute_v1.SimulateMaintenanceEventInstanceRequest(project=project, zone=zone, instance=name)


def _is_capacity(text: str) -> bool:
    return any(marker in text for marker in CAPACITY_MARKERS)


class GCPProvider(Provider):
    """GCE Spot VMs; regions are zones."""

    name = "gcp"
    unsupported: ClassVar[dict[Feature, str]] = {
        Feature.NOTICE_ACK: "GCE has no way to acknowledge a preemption notice",
        Feature.REBALANCE_HINT: "GCE gives no early rebalance recommendation",
    }

    def __init__(self, config: Any, instances: Any = None) -> None:
        """`instances` is an InstancesClient (built from Application Default Credentials if None)."""
        super().__init__(config)
        self._client = instances
        self._launched: dict[str, Instance] = {}
        self._terminated: set[str] = set()

    @property
    def instances(self) -> Any:
        if self._client is None:
            self._client = compute_v1.InstancesClient()
        return self._client

    def project(self) -> str:
        project = self.config.gcp_project or os.environ.get("GOOGLE_CLOUD_PROJECT") \
            or os.environ.get("CLOUDSDK_CORE_PROJECT")
        if project:
            return project
        try:
            import google.auth
            _, project = google.auth.default()
        except Exception:  # noqa: BLE001 - google.auth raises several kinds
            project = None
        if not project:
            raise ConfigError("Config.gcp_project: not set and no default project in the "
                              "credentials; give the project id")
        return project

    def _zone(self, spec: LaunchSpec) -> str:
        zone = spec.region or self.config.region
        if not zone:
            raise ConfigError("Config.region: give a GCP zone such as 'us-central1-a'")
        return zone

    # -- validation and planning -----------------------------------------------------------
    def _validate(self) -> None:
        require_remote_store(self.config, self.name)
        if not self.config.gcp_project and not (os.environ.get("GOOGLE_CLOUD_PROJECT")
                                                or os.environ.get("CLOUDSDK_CORE_PROJECT")):
            raise ConfigError("Config.gcp_project: give the project id (or set $GOOGLE_CLOUD_PROJECT)")
        regions = self.config.candidate_regions()
        if not regions:
            raise ConfigError("Config.region: give a GCP zone such as 'us-central1-a' (or regions=[...])")
        for r in ([] if regions == "cheapest" else regions):
            if not _ZONE.match(r or ""):
                raise ConfigError(f"Config.regions: {r!r} is not a GCP zone (e.g. 'us-central1-a')")

    def _plan_launch(self, spec: LaunchSpec) -> dict[str, Any]:
        zone = spec.region or self.config.region or "<cheapest zone>"
        project = self.project()
        req = insert_request(spec, self.config, project, zone)
        body = compute_v1.Instance.to_dict(req.instance_resource)
        for item in body["metadata"]["items"]:
            if item["key"] == "startup-script":
                item["value"] = "<the bootstrap script below>"
        name = instance_name(spec)
        return {"provider": "gcp", "project": project, "zone": zone, "requests": [
            {"api": "compute_v1.InstancesClient.insert", "args": {"project": project, "zone": zone},
             "body": body}],
            "bootstrap": gcp_startup_script(spec),
            "terminate": {"api": "compute_v1.InstancesClient.delete",
                          "args": compute_v1.DeleteInstanceRequest.to_dict(delete_request(project, zone, name))},
            "fault_injection": {"api": "compute_v1.InstancesClient.simulate_maintenance_event",
                                "args": compute_v1.SimulateMaintenanceEventInstanceRequest.to_dict(
                                    simulate_request(project, zone, name))}}

    # -- backend hooks ---------------------------------------------------------------------
    def _launch(self, spec: LaunchSpec) -> Instance:
        zone = self._zone(spec)
        project = self.project()
        req = insert_request(spec, self.config, project, zone)
        try:
            operation = self.instances.insert(request=req)
            operation.result(timeout=_INSERT_TIMEOUT)  # errors of the insert surface here
        except gexc.GoogleAPICallError as exc:
            if _is_capacity(str(exc)) or isinstance(exc, (gexc.ResourceExhausted, gexc.TooManyRequests)):
                raise CapacityError(f"{zone}: {exc}") from None
            raise
        name = req.instance_resource.name
        instance = Instance(id=name, provider="gcp", region=zone, instance_type=spec.instance_type,
                            launched_at=time.time(),
                            info={"project": project, "zone": zone, "incarnation": spec.incarnation})
        self._launched[name] = instance
        return instance

    def _where(self, instance: Instance) -> tuple[str, str]:
        return instance.info.get("project") or self.project(), instance.info.get("zone") or instance.region or ""

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
        table = lookup_price(instance_type, "gcp")
        if table is None:
            return {}
        zones = regions or (self.config.regions if isinstance(self.config.regions, list) else None) \
            or ([self.config.region] if self.config.region else [])
        return {z: Price(table.spot, table.on_demand, table.source) for z in zones if z}

    # -- cleanup ---------------------------------------------------------------------------
    def list_tagged(self) -> Iterator[tuple[Instance, str]]:
        project = self.project()
        request = compute_v1.AggregatedListInstancesRequest(project=project,
                                                            filter=f"labels.{JOB_TAG}:*")
        for zone_path, scoped in self.instances.aggregated_list(request=request):
            zone = zone_path.rsplit("/", 1)[-1]
            for data in scoped.instances:
                job = dict(data.labels).get(JOB_TAG)
                if job and data.status not in ("TERMINATED",):
                    yield (Instance(id=data.name, provider="gcp", region=zone, instance_type="",
                                    launched_at=0.0, info={"project": project, "zone": zone}), job)

    def close(self) -> None:
        for instance in list(self._launched.values()):
            if instance.id not in self._terminated:
                try:
                    self._terminate(instance)
                except gexc.GoogleAPICallError:
                    pass
