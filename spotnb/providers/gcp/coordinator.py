"""The coordinator of a job on several instances on GCP (mixed into `GCPProvider`).

torchft's lighthouse must outlive every Spot VM, so it runs on a small standard (on-demand)
VM, `e2-small` unless `Config.coordinator_instance_type` says otherwise. Per job, created once
and labelled (or named) with the job id, so `spotnb gc` and a later controller find them:

- a reserved static internal address `spotnb-<job>-coordinator` in the job's region: every
  coordinator VM of the job takes it (`network_i_p`), so one that died is replaced at the
  address the replicas know (a dead VM is deleted first: a stopped VM still holds it);
- two firewall rules on the job's network tag `spotnb-job-<job>`, carried by the Spot VMs and
  the coordinator: all TCP allowed from the tag to the tag, and all TCP to the tag from anywhere
  else denied one priority later (the default network's `default-allow-internal` would admit
  the whole network). Firewall rules take no labels: their names carry the job.

`close` and `spotnb gc` delete the coordinator, then the address and the rules.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from spotnb.errors import ConfigError
from spotnb.market.prices import Price
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
from spotnb.providers.gcp.errors import missing_resource, missing_resource_error

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "GCPCoordinator",
    "COORDINATOR_MACHINE",
    "COORDINATOR_PRICES",
    "COORDINATOR_DISK_GB",
    "job_network_tag",
    "firewall_names",
    "job_firewalls",
    "address_name",
    "address_resource",
    "build_coordinator_instance",
]

log = logging.getLogger("spotnb.providers.gcp.provider")

#: The coordinator's machine type when Config.coordinator_instance_type is not set.
COORDINATOR_MACHINE = "e2-small"
#: Its boot disk: the Deep Learning VM images need 50 GB; standard PD, the cheapest.
COORDINATOR_DISK_GB = 50
#: On-demand $/h (us-central1) of small machine types, for the ledger and the dry run when the
#: built-in table (GPU types) has no row for them.
COORDINATOR_PRICES = {
    "e2-micro": 0.0084,
    "e2-small": 0.0168,
    "e2-medium": 0.0335,
    "e2-standard-2": 0.067,
    "n2-standard-2": 0.0971,
    "n1-standard-1": 0.0475,
}
_NAME_MAX = 63
_LIVE = ("PROVISIONING", "STAGING", "RUNNING", "REPAIRING")
#: Insert errors that mean "not yet": the address still belongs to a VM being deleted, or no
#: capacity for the type in the zone; the next call retries.
_RETRY_MARKERS = ("IP_IN_USE", "already being used", "ZONE_RESOURCE_POOL_EXHAUSTED", "RESOURCE_EXHAUSTED")
_OP_TIMEOUT = 180.0


def _slug(job_id: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", job_id.lower()).strip("-") or "job"


def _name(prefix: str, job_id: str, suffix: str = "") -> str:
    """A valid GCE name of at most 63 characters that keeps `suffix` whole."""
    head = f"{prefix}{_slug(job_id)}"[: _NAME_MAX - len(suffix)].rstrip("-")
    return head + suffix


def job_network_tag(job_id: str) -> str:
    """The network tag of every VM of the job (the firewall rules' source and target)."""
    return _name("spotnb-job-", job_id)


def firewall_names(job_id: str) -> tuple[str, str]:
    """(the members' allow rule, the deny rule for everyone else)."""
    return _name("spotnb-job-", job_id, "-members"), _name("spotnb-job-", job_id, "-deny")


def address_name(job_id: str) -> str:
    return _name("spotnb-", job_id, "-coordinator")


def _labels(job_id: str, role: str | None = None) -> dict[str, str]:
    labels = {JOB_TAG: _slug(job_id)[:_NAME_MAX], MANAGED_TAG: "true"}
    if role:
        labels[ROLE_TAG] = role
    return labels


def job_firewalls(job_id: str, network: str) -> list[compute_v1.Firewall]:
    """The job's two rules: TCP from its members to its members (torchft's ports are not fixed:
    the lighthouse's, each Manager's gRPC, the checkpoint server a recovering peer reads, the
    gloo sockets), then TCP from anywhere else to its members denied."""
    tag = job_network_tag(job_id)
    allow, deny = firewall_names(job_id)
    return [
        compute_v1.Firewall(
            name=allow,
            network=network,
            description=f"spotnb job {job_id}: members only (torchft quorum, peer state, gradients)",
            direction="INGRESS",
            priority=1000,
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["0-65535"])],
            source_tags=[tag],
            target_tags=[tag],
        ),
        compute_v1.Firewall(
            name=deny,
            network=network,
            description=f"spotnb job {job_id}: nothing else reaches its VMs "
            "(overrides default-allow-internal)",
            direction="INGRESS",
            priority=1001,
            denied=[compute_v1.Denied(I_p_protocol="tcp")],
            source_ranges=["0.0.0.0/0"],
            target_tags=[tag],
        ),
    ]


def address_resource(job_id: str, subnetwork: str | None) -> compute_v1.Address:
    """The coordinator's reserved internal address (regional, in the subnetwork's range; the
    default network's subnet of the region when none is configured)."""
    address = compute_v1.Address(
        name=address_name(job_id),
        address_type="INTERNAL",
        purpose="GCE_ENDPOINT",
        description=f"spotnb job {job_id} coordinator (a fixed private address)",
        labels=_labels(job_id, COORDINATOR_ROLE),
    )
    if subnetwork:
        address.subnetwork = subnetwork
    return address


def build_coordinator_instance(
    job_id: str,
    config: Config,
    *,
    zone: str,
    machine_type: str,
    image: str,
    ip: str,
    name: str,
    script: str,
    service_account: str | None = None,
) -> compute_v1.Instance:
    """The Instance inserted for the job's coordinator: the STANDARD provisioning model (on
    demand, never preempted; GCE restarts it after a host failure), on the job's reserved
    address and network tag, no service account (the lighthouse reads nothing of the job)
    unless it hosts the job's controller (`service_account`: Config.controller_identity, which
    launches the job's instances and reads the store)."""
    nic = compute_v1.NetworkInterface(
        network=config.gcp_network or "global/networks/default",
        network_i_p=ip,
        # an ephemeral external IP for the outbound pip install; the job's deny rule and the
        # project's own rules keep inbound traffic out
        access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")],
    )
    if config.gcp_subnetwork:
        nic.subnetwork = config.gcp_subnetwork
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{machine_type}",
        labels=_labels(job_id, COORDINATOR_ROLE),
        tags=compute_v1.Tags(items=[job_network_tag(job_id)]),
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                type_="PERSISTENT",
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=image,
                    disk_size_gb=COORDINATOR_DISK_GB,
                    disk_type=f"zones/{zone}/diskTypes/pd-standard",
                    labels=_labels(job_id, COORDINATOR_ROLE),
                ),
            )
        ],
        network_interfaces=[nic],
        scheduling=compute_v1.Scheduling(
            provisioning_model="STANDARD", automatic_restart=True, on_host_maintenance="MIGRATE"
        ),
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value=script)]),
        service_accounts=[
            compute_v1.ServiceAccount(
                email=service_account, scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
        ]
        if service_account
        else [],
    )


def _started(data: Any) -> float:
    stamp = getattr(data, "creation_timestamp", "") or ""
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return time.time()


class GCPCoordinator:
    """`Provider.coordinator` on GCP, and the cleanup of the job's network (a mixin of
    `GCPProvider`, which gives `config`, `instances`, `project`, `zones`, `coordinator_image`
    and `_terminated`)."""

    config: Config
    instances: Any
    describe_interval: ClassVar[float]
    _terminated: set[str]

    _hosted: dict[str, HostedController]

    if TYPE_CHECKING:  # what GCPProvider supplies; declared for mypy, never defined here

        def project(self) -> str: ...
        def zones(self, where: str) -> tuple[list[str], str]: ...
        def coordinator_image(self) -> str: ...

    def _init_coordinators(self, addresses: Any, firewalls: Any) -> None:
        self._addresses_client = addresses
        self._firewalls_client = firewalls
        self._coordinators: dict[str, KnownCoordinator] = {}
        self._job_networks: set[tuple[str, str]] = set()  # (job id, zone) set up or found
        self._reaped_jobs: set[tuple[str, str]] = set()  # (job id, zone) of VMs gc ended
        self._coordinator_lock = threading.Lock()
        self._network_lock = threading.Lock()
        self._networks_ready: set[str] = set()  # job ids whose firewall rules exist

    @property
    def addresses(self) -> Any:
        if self._addresses_client is None:
            self._addresses_client = compute_v1.AddressesClient()
        return self._addresses_client

    @property
    def firewalls(self) -> Any:
        if self._firewalls_client is None:
            self._firewalls_client = compute_v1.FirewallsClient()
        return self._firewalls_client

    # -- settings --------------------------------------------------------------------------
    def coordinator_machine(self) -> str:
        return coordinator_type(self.config, COORDINATOR_MACHINE)

    def coordinator_price(self) -> Price | None:
        return coordinator_price(self.config, "gcp", self.coordinator_machine(), COORDINATOR_PRICES)

    def coordinator_zone(self) -> str:
        """The first candidate zone, else the first zone of the first candidate region."""
        regions = self.config.candidate_regions()
        first = next((r for r in regions if r), None) if isinstance(regions, list) else None
        if not first:
            raise ConfigError("Config.region: give a GCP region or zone such as 'us-central1'")
        return self.zones(first)[0][0]

    def host_controller(self, job_id: str, store_url: str, job_key: str) -> None:
        """The job's coordinator, started (or found) with the controller on board and
        Config.controller_identity as its service account; then forgotten, so `close` leaves it."""
        host_on_coordinator(self, job_id, store_url, job_key)

    def _validate_one_region(self) -> None:
        """The job's reserved address is regional: its VMs share one region (zones are fine)."""
        regions = self.config.candidate_regions()
        if regions == "cheapest":
            raise ConfigError(
                "Config.regions: a job on several instances trains around its coordinator's "
                "address, which is regional: give one region, e.g. region='us-central1', "
                "instead of 'cheapest'"
            )
        if self.config.gcp_network and not self.config.gcp_subnetwork:
            raise ConfigError(
                "Config.gcp_subnetwork: a job on several instances reserves its coordinator's "
                "address in a subnetwork; with gcp_network set, give the subnetwork of the "
                "job's region too"
            )
        names = {re.sub(r"-[a-z]$", "", r) for r in regions if r}
        if len(names) > 1:
            raise ConfigError(
                f"Config.regions: {sorted(names)} are several GCP regions; the VMs of a job on "
                "several instances reach each other and their coordinator by internal address, "
                "so they must share one region (zones of one region are fine)"
            )

    # -- the job's network -----------------------------------------------------------------
    def ensure_job_network(self, job_id: str, zone: str) -> None:
        """The job's firewall rules (found, or created once)."""
        with self._network_lock:  # the slots launch in parallel: one sets up, the others wait
            if job_id in self._networks_ready:
                return
            project = self.project()
            self._job_networks.add((job_id, zone))
            for rule in job_firewalls(job_id, self.config.gcp_network or "global/networks/default"):
                try:
                    self.firewalls.get(project=project, firewall=rule.name)
                except gexc.NotFound:
                    try:
                        self.firewalls.insert(project=project, firewall_resource=rule).result(
                            timeout=_OP_TIMEOUT
                        )
                    except gexc.Conflict:
                        pass  # another controller created it a moment ago
            self._networks_ready.add(job_id)

    def _ensure_address(self, job_id: str, region: str) -> str:
        """The coordinator's reserved internal address (found or reserved); its IP."""
        project, name = self.project(), address_name(job_id)
        try:
            found = self.addresses.get(project=project, region=region, address=name)
        except gexc.NotFound:
            resource = address_resource(job_id, self.config.gcp_subnetwork)
            try:
                self.addresses.insert(project=project, region=region, address_resource=resource).result(
                    timeout=_OP_TIMEOUT
                )
            except gexc.Conflict:
                pass
            found = self.addresses.get(project=project, region=region, address=name)
            log.info("job %s: coordinator address %s (%s)", job_id, found.address, name)
        if not found.address:
            raise RuntimeError(f"job {job_id}: GCP reserved no IP in address {name}")
        return str(found.address)

    # -- the coordinator -------------------------------------------------------------------
    def coordinator(self, job_id: str, min_replicas: int) -> str:
        """The job's coordinator: found by its labels, or started; one that died (deleted, or
        powered off: its idle guard, a failed install) is deleted and replaced at the same
        reserved address, so `http://<internal IP>:<port>` never changes. Between describes
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
            zone = self.coordinator_zone()
            self.ensure_job_network(job_id, zone)
            ip = self._ensure_address(job_id, zone.rsplit("-", 1)[0])
            known = KnownCoordinator(job_id, zone, ip)
            self._coordinators[job_id] = known
        live = []
        listed = self._coordinator_vms(job_id, known.region)
        if (
            known.instance_id
            and known.instance_id not in {d.name for d in listed}
            and self._is_up(known.region, known.instance_id)
        ):  # started a moment ago: the list does not show it yet; never start a second one
            known.checked = time.time()
            return known
        for data in listed:
            if data.status in _LIVE and data.name not in self._terminated:
                live.append(data)
            else:  # powered off (its idle guard, a failed install): it still holds the address
                log.warning("job %s: coordinator %s is %s; deleting it", job_id, data.name, data.status)
                self._delete(known.region, data.name, wait=True)
        if live:
            data = max(live, key=_started)
            if data.name != known.instance_id:
                known.instance_id, known.started = str(data.name), _started(data)
                known.instance_type = str(data.machine_type).rsplit("/", 1)[-1]
            if data.status == "RUNNING" and time.time() - (known.started or 0.0) > SETTLED_S:
                known.launches = 0  # it stayed up: only a run of failed starts ends the job
        else:
            self._launch_coordinator(known, min_replicas)
        known.checked = time.time()
        return known

    def _is_up(self, zone: str, name: str) -> bool:
        if name in self._terminated:
            return False
        try:
            data = self.instances.get(project=self.project(), zone=zone, instance=name)
        except gexc.NotFound:
            return False
        return data.status in _LIVE

    def _coordinator_vms(self, job_id: str, zone: str) -> list[Any]:
        labels = _labels(job_id, COORDINATOR_ROLE)
        request = compute_v1.ListInstancesRequest(
            project=self.project(),
            zone=zone,
            filter=f'(labels.{JOB_TAG} = "{labels[JOB_TAG]}") AND (labels.{ROLE_TAG} = "{COORDINATOR_ROLE}")',
        )
        return [
            d
            for d in self.instances.list(request=request)
            if dict(d.labels).get(JOB_TAG) == labels[JOB_TAG]
            and dict(d.labels).get(ROLE_TAG) == COORDINATOR_ROLE
        ]

    def _launch_coordinator(self, known: KnownCoordinator, min_replicas: int) -> None:
        if known.launches >= MAX_COORDINATOR_LAUNCHES:
            raise failed_starts(
                known,
                "the Cloud console (its serial port output)",
                "Check Config.gcp_coordinator_image / coordinator_instance_type",
            )
        name = _name("spotnb-", known.job_id, f"-coord-{uuid.uuid4().hex[:8]}")
        instance = build_coordinator_instance(
            known.job_id,
            self.config,
            zone=known.region,
            machine_type=self.coordinator_machine(),
            image=self.coordinator_image(),
            ip=known.private_ip,
            name=name,
            script=coordinator_boot_script(
                self.config, known.job_id, "gcp", min_replicas, self._hosted.get(known.job_id)
            ),
            service_account=self.config.controller_identity if known.job_id in self._hosted else None,
        )
        try:
            self.instances.insert(
                request=compute_v1.InsertInstanceRequest(
                    project=self.project(), zone=known.region, instance_resource=instance
                )
            ).result(timeout=_OP_TIMEOUT)
        except gexc.GoogleAPICallError as exc:
            missing = missing_resource(
                exc,
                image_field="gcp_coordinator_image" if self.config.gcp_coordinator_image else "gcp_image",
                service_account_field="controller_identity",  # the only one it carries
            )
            if missing is not None:
                raise missing_resource_error(missing, exc, known.region) from exc
            if not any(marker in str(exc) for marker in _RETRY_MARKERS):
                raise
            log.warning("job %s: the coordinator could not start yet (%s); trying again", known.job_id, exc)
            return
        known.launches += 1
        known.instance_id, known.instance_type, known.started = name, self.coordinator_machine(), time.time()
        price = self.coordinator_price()
        log.info(
            "job %s: coordinator %s (%s, standard, %s) at %s",
            known.job_id,
            name,
            known.instance_type,
            f"${price.on_demand:.4f}/h" if price else "price unknown",
            self._coordinator_address(known),
        )

    def _coordinator_info(self, job_id: str) -> dict[str, Any]:
        return coordinator_record(self._coordinators.get(job_id), self.coordinator_price())

    def _delete(self, zone: str, name: str, wait: bool = False) -> None:
        self._terminated.add(name)
        try:
            op = self.instances.delete(
                request=compute_v1.DeleteInstanceRequest(project=self.project(), zone=zone, instance=name)
            )
            if wait:
                op.result(timeout=_OP_TIMEOUT)
        except gexc.NotFound:
            pass

    # -- the end ---------------------------------------------------------------------------
    def end_coordinator(self, job_id: str, zone: str | None = None) -> list[str]:
        """Delete the job's coordinator VMs (found by their labels), waiting until they are
        gone (the address is free only then); returns their names."""
        zone = zone or self.coordinator_zone()
        names = [str(d.name) for d in self._coordinator_vms(job_id, zone)]
        for name in names:
            self._delete(zone, name, wait=True)
        if names:
            log.info("job %s: coordinator %s deleted", job_id, ", ".join(names))
        with self._coordinator_lock:
            self._coordinators.pop(job_id, None)
        return names

    def remove_job_network(self, job_id: str, zone: str | None = None) -> bool:
        """Release the job's address and delete its firewall rules; True when none is left."""
        zone = zone or self.coordinator_zone()
        project, region = self.project(), zone.rsplit("-", 1)[0]
        done = True
        deletions = [
            lambda: self.addresses.delete(project=project, region=region, address=address_name(job_id)),
            *(
                lambda name=name: self.firewalls.delete(project=project, firewall=name)
                for name in firewall_names(job_id)
            ),
        ]
        for delete in deletions:
            try:
                delete().result(timeout=_OP_TIMEOUT)
            except gexc.NotFound:
                pass
            except gexc.GoogleAPICallError as exc:
                log.warning("job %s: %s; spotnb gc removes it", job_id, exc)
                done = False
        self._job_networks.discard((job_id, zone))
        self._networks_ready.discard(job_id)
        return done

    def close_coordinators(self) -> None:
        """End every coordinator this provider started or found and delete the network of
        those jobs and of the jobs gc reaped (an on-demand VM left running costs money)."""
        jobs = {(c.job_id, c.region) for c in self._coordinators.values()}
        jobs |= self._reaped_jobs | self._job_networks
        for job_id, zone in sorted(jobs):
            try:
                self.end_coordinator(job_id, zone)
                self.remove_job_network(job_id, zone)
            except gexc.GoogleAPICallError as exc:
                log.warning(
                    "job %s: could not end its coordinator or network (%s); run spotnb gc", job_id, exc
                )
        self._reaped_jobs.clear()
        self._job_networks.clear()

    def plan_coordinator(
        self, job_id: str, project: str, zone: str, requests: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Append the coordinator's requests to `requests`; return what the dry run says of it."""
        region = zone.rsplit("-", 1)[0]
        when = "once per job, if missing"
        script = coordinator_boot_script(self.config, job_id, "gcp", None, self._hosted.get(job_id))
        for rule in job_firewalls(job_id, self.config.gcp_network or "global/networks/default"):
            requests.append(
                {
                    "api": "compute_v1.FirewallsClient.insert",
                    "when": when,
                    "args": {"project": project},
                    "body": compute_v1.Firewall.to_dict(rule),
                }
            )
        requests.append(
            {
                "api": "compute_v1.AddressesClient.insert",
                "when": when,
                "args": {"project": project, "region": region},
                "body": compute_v1.Address.to_dict(address_resource(job_id, self.config.gcp_subnetwork)),
            }
        )
        instance = build_coordinator_instance(
            job_id,
            self.config,
            zone=zone,
            machine_type=self.coordinator_machine(),
            image=self.coordinator_image(),
            ip="<the reserved address>",
            name=_name("spotnb-", job_id, "-coord-<n>"),
            script="<the coordinator script below>",
            service_account=self.config.controller_identity if job_id in self._hosted else None,
        )
        requests.append(
            {
                "api": "compute_v1.InstancesClient.insert",
                "when": "the job's coordinator, standard (on demand); again only if it dies",
                "args": {"project": project, "zone": zone},
                "body": compute_v1.Instance.to_dict(instance),
            }
        )
        price = self.coordinator_price()
        return {
            "instance_type": self.coordinator_machine(),
            "market": "on-demand",
            "price_on_demand": price.on_demand if price else None,
            "price_source": price.source if price else "unknown: set Config.coordinator_price",
            "address": f"http://<reserved internal address {address_name(job_id)}>:"
            f"{self.config.coordinator_port}",
            "ports": f"all TCP between VMs tagged {job_network_tag(job_id)} only (firewall rules "
            f"{', '.join(firewall_names(job_id))})",
            "ends": "deleted with the job, then its address is released and its firewall rules deleted",
            "bootstrap": script,
        }
