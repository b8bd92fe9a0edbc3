"""The coordinator of a job on several instances on AWS (mixed into `AWSProvider`).

A job on several instances (`Config.instances > 1`) also gets a coordinator: a small on-demand
instance running torchft's lighthouse, `t3.small` unless `Config.coordinator_instance_type`
says otherwise, which must outlive every spot instance. Per job, created once and tagged with
the job id, so `spotnb gc` and a later controller find them:

- a network interface in the coordinator's subnet: every coordinator instance of the job is
  started on it, so one that died is replaced at the private address the replicas already know;
- a job security group whose only inbound rule opens TCP to members of that group: every
  instance of the job and the coordinator's interface join it.

`close` (the controller's way out) and `spotnb gc` end the coordinator and delete the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from botocore.exceptions import BotoCoreError, ClientError

from spotnb.errors import ConfigError
from spotnb.market.prices import Price
from spotnb.providers.aws.requests import CAPACITY_CODES, DEFAULT_IMAGE, split_zone
from spotnb.providers.base import LaunchSpec
from spotnb.providers.cleanup import JOB_TAG, MANAGED_TAG
from spotnb.providers.coordinator import (
    COORDINATOR_ROLE,
    MAX_COORDINATOR_LAUNCHES,
    ROLE_TAG,
    SETTLED_S,
    HostedController,
    coordinator_boot_script,
    coordinator_price,
    coordinator_type,
    failed_starts,
    host_on_coordinator,
)

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "AWSCoordinator",
    "COORDINATOR_PRICES",
    "COORDINATOR_TYPE",
    "JOB_GROUP_PREFIX",
    "job_group_name",
    "job_group_request",
    "job_group_ingress",
    "coordinator_interface_request",
    "coordinator_request",
]

log = logging.getLogger("spotnb.providers.aws.provider")

JOB_GROUP_PREFIX = "spotnb-job-"
#: On-demand $/h (us-east-1, Linux) of the small types a coordinator runs on, for the ledger and
#: the dry run when the built-in table (spotnb/market/data/prices.json, GPU types) has no row for them.
COORDINATOR_PRICES = {
    "t3.micro": 0.0104,
    "t3.small": 0.0208,
    "t3.medium": 0.0416,
    "t3.large": 0.0832,
    "t3a.small": 0.0188,
    "t3a.medium": 0.0376,
    "m5.large": 0.096,
    "m6i.large": 0.096,
    "c5.large": 0.085,
}
#: The coordinator's type when Config.coordinator_instance_type is not set.
COORDINATOR_TYPE = "t3.small"
_UNENDED = ["pending", "running", "stopping", "stopped"]
_BURSTABLE = ("t2.", "t3.", "t3a.", "t4g.")


def _tag_list(job_id: str, role: str | None = None) -> list[dict[str, str]]:
    tags = {JOB_TAG: job_id.lower(), MANAGED_TAG: "true"}
    if role:
        tags[ROLE_TAG] = role
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def job_group_name(job_id: str) -> str:
    """The job security group's name: one per job and VPC."""
    return f"{JOB_GROUP_PREFIX}{job_id.lower()}"[:255]


def job_group_request(job_id: str, vpc_id: str) -> dict[str, Any]:
    """`ec2.create_security_group` for the job's group (EC2 allows ASCII letters, digits and
    ` ._-:/()#,@[]+=&;{}!$*` in descriptions: no apostrophe)."""
    return {
        "GroupName": job_group_name(job_id),
        "VpcId": vpc_id,
        "Description": f"spotnb job {job_id} - training ports open only between the members of this group",
        "TagSpecifications": [{"ResourceType": "security-group", "Tags": _tag_list(job_id)}],
    }


def job_group_ingress(group_id: str) -> dict[str, Any]:
    """`ec2.authorize_security_group_ingress`: all TCP from members of the same group, and from
    nothing else. All TCP because torchft's ports are not fixed: besides the lighthouse's, each
    replica's Manager (gRPC), its checkpoint server (HTTP, a recovering peer reads the live
    state there), the replica group's store and the gloo/NCCL sockets of the cross-replica
    process group all bind ephemeral ports."""
    pair = {
        "GroupId": group_id,
        "Description": "spotnb job members only (torchft quorum, peer state, gradients)",
    }
    return {
        "GroupId": group_id,
        "IpPermissions": [{"IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535, "UserIdGroupPairs": [pair]}],
    }


def coordinator_interface_request(job_id: str, subnet_id: str, group_id: str) -> dict[str, Any]:
    """`ec2.create_network_interface`: the coordinator's fixed private address. It outlives any
    one coordinator instance, so a replacement answers at the address the replicas know."""
    return {
        "SubnetId": subnet_id,
        "Groups": [group_id],
        "Description": f"spotnb job {job_id} coordinator (a fixed private address)",
        "TagSpecifications": [
            {"ResourceType": "network-interface", "Tags": _tag_list(job_id, COORDINATOR_ROLE)}
        ],
    }


def coordinator_request(
    job_id: str,
    *,
    image_id: str,
    instance_type: str,
    interface_id: str,
    user_data: str,
    key_name: str | None = None,
    instance_profile: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of `ec2.run_instances` for the job's coordinator: on demand (no
    `InstanceMarketOptions`, so the spot market cannot take it back), on the job's network
    interface (which carries the job group), terminated, not stopped, when it powers off, and
    no instance profile (the lighthouse reads nothing of the job) unless it hosts the job's
    controller (`instance_profile`: Config.controller_identity, to launch and read the store)."""
    tags = _tag_list(job_id, COORDINATOR_ROLE)
    req: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "UserData": user_data,
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {
            "HttpTokens": "required",
            "HttpEndpoint": "enabled",
            "HttpPutResponseHopLimit": 1,
        },
        "NetworkInterfaces": [
            {"NetworkInterfaceId": interface_id, "DeviceIndex": 0, "DeleteOnTermination": False}
        ],
        "TagSpecifications": [
            {
                "ResourceType": "instance",
                "Tags": [*tags, {"Key": "Name", "Value": f"spotnb-{job_id}-coordinator"}],
            },
            {"ResourceType": "volume", "Tags": tags},
        ],
    }
    if instance_type.startswith(_BURSTABLE):
        # standard credits: the hourly price is the whole price (no surplus-credit charges)
        req["CreditSpecification"] = {"CpuCredits": "standard"}
    if key_name:
        req["KeyName"] = key_name
    if instance_profile:
        req["IamInstanceProfile"] = {"Name": instance_profile}
    return req


@dataclass
class _Coordinator:
    """What the provider knows of one job's coordinator."""

    job_id: str
    region: str
    group_id: str
    interface_id: str
    private_ip: str
    instance_id: str | None = None
    instance_type: str = ""
    started: float | None = None  # its launch time (billing starts)
    checked: float = 0.0  # when it was last described
    launches: int = 0  # started by this provider without staying up


class AWSCoordinator:
    """`Provider.coordinator` on AWS, and the cleanup of the job's network (a mixin of
    `AWSProvider`, which gives `config`, `client`, `default_region`, `_vpc_id` and `_terminated`)."""

    config: Config
    describe_interval: ClassVar[float]
    network_cleanup_timeout: ClassVar[float] = 300.0  # seconds `close` waits to delete the network
    _terminated: set[str]
    _hosted: dict[str, HostedController]

    if TYPE_CHECKING:  # what AWSProvider supplies; declared for mypy, never defined here

        def client(self, service: str, region: str | None = None) -> Any: ...
        def default_region(self) -> str: ...
        def _vpc_id(self, region: str) -> str: ...

    def _init_coordinators(self) -> None:
        self._coordinator_lock = threading.Lock()
        self._coordinators: dict[str, _Coordinator] = {}  # by job id
        self._job_groups: dict[tuple[str, str], str] = {}  # (job id, region) → group id
        self._reaped_jobs: set[tuple[str, str]] = set()  # (job id, region) of instances gc ended
        # (job id, region) of every job group this provider made or found: `close` removes
        # their network even when the coordinator never got started (a failure half-way)
        self._job_networks: set[tuple[str, str]] = set()

    def coordinator_region(self) -> str:
        """Where the coordinator runs: the region of the first candidate (`_validate` made sure
        there is only one), else the default region."""
        regions = self.config.candidate_regions()
        first = next((r for r in regions if r), None) if isinstance(regions, list) else None
        return split_zone(first)[0] if first else self.default_region()

    def coordinator_price(self) -> Price | None:
        """The coordinator's on-demand $/h: Config.coordinator_price, else the built-in table,
        else spotnb's figures for small types (`COORDINATOR_PRICES`); None if unknown."""
        itype = coordinator_type(self.config, COORDINATOR_TYPE)
        return coordinator_price(self.config, "aws", itype, COORDINATOR_PRICES)

    def coordinator_user_data(self, job_id: str, min_replicas: int | None = None) -> str:
        """The coordinator's boot script: it installs spotnb[elastic] as an instance's script
        installs spotnb and runs the lighthouse; it carries no credential and no job key."""
        script = coordinator_boot_script(self.config, job_id, "aws", min_replicas, self._hosted.get(job_id))
        if len(script.encode()) > 16 * 1024:
            raise ValueError("EC2 UserData is limited to 16 KB; the coordinator script is too long")
        return script

    def _coordinator_request(self, job_id: str, interface_id: str, user_data: str) -> dict[str, Any]:
        return coordinator_request(
            job_id,
            image_id=self.config.aws_coordinator_image_id or self.config.aws_image_id or DEFAULT_IMAGE,
            instance_type=coordinator_type(self.config, COORDINATOR_TYPE),
            interface_id=interface_id,
            user_data=user_data,
            key_name=self.config.aws_key_name,
            instance_profile=self.config.controller_identity if job_id in self._hosted else None,
        )

    def host_controller(self, job_id: str, store_url: str, job_key: str) -> None:
        """The job's coordinator, started (or found) with the controller on board and
        Config.controller_identity as its instance profile; then forgotten, so `close` leaves it."""
        name = str(self.config.controller_identity)
        try:
            self.client("iam").get_instance_profile(InstanceProfileName=name)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "NoSuchEntity":
                raise
            raise ConfigError(
                f"Config.controller_identity: this account has no instance profile {name!r}; create "
                "one whose role may run, describe and terminate EC2 instances and use the store's "
                "bucket (the controller launches the job's instances from the coordinator)"
            ) from None
        host_on_coordinator(self, job_id, store_url, job_key)

    def ensure_job_group(self, job_id: str, region: str) -> str:
        """The job's security group (created once, idempotently): TCP open between its members
        only. Every instance of the job and its coordinator's interface are in it."""
        key = (job_id.lower(), region)
        if key in self._job_groups:
            return self._job_groups[key]
        ec2 = self.client("ec2", region)
        vpc = self._vpc_id(region)
        group = self._find_job_group(job_id, region, vpc)
        if group is None:
            try:
                group = str(ec2.create_security_group(**job_group_request(job_id, vpc))["GroupId"])
            except ClientError as exc:  # another controller created it a moment ago
                if exc.response["Error"]["Code"] != "InvalidGroup.Duplicate":
                    raise
                group = self._find_job_group(job_id, region, vpc)
                assert group is not None
        self._job_networks.add((job_id, region))
        self._authorize_members(ec2, group)
        self._job_groups[key] = group
        return group

    def _find_job_group(self, job_id: str, region: str, vpc: str | None = None) -> str | None:
        filters = [{"Name": "group-name", "Values": [job_group_name(job_id)]}]
        if vpc:
            filters.append({"Name": "vpc-id", "Values": [vpc]})
        found = self.client("ec2", region).describe_security_groups(Filters=filters)["SecurityGroups"]
        return str(found[0]["GroupId"]) if found else None

    @staticmethod
    def _authorize_members(ec2: Any, group: str) -> None:
        """Add the members-only rule; already there (a group found, not created) is fine."""
        try:
            ec2.authorize_security_group_ingress(**job_group_ingress(group))
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "InvalidPermission.Duplicate":
                raise

    def _coordinator_subnet(self, region: str) -> str:
        """Config.aws_subnet_id, else the default subnet of the first candidate zone (or of any
        zone) in the default VPC."""
        if self.config.aws_subnet_id:
            return str(self.config.aws_subnet_id)
        regions = self.config.candidate_regions()
        zones = [split_zone(r)[1] for r in regions if r] if isinstance(regions, list) else []
        filters = [
            {"Name": "vpc-id", "Values": [self._vpc_id(region)]},
            {"Name": "default-for-az", "Values": ["true"]},
        ]
        if zones and zones[0]:
            filters.append({"Name": "availability-zone", "Values": [zones[0]]})
        subnets = self.client("ec2", region).describe_subnets(Filters=filters)["Subnets"]
        if not subnets:
            raise ConfigError(f"no default subnet for the coordinator in {region}: set Config.aws_subnet_id")
        return str(sorted(subnets, key=lambda n: n["AvailabilityZone"])[0]["SubnetId"])

    def _ensure_interface(self, job_id: str, region: str, group: str) -> tuple[str, str]:
        """The coordinator's network interface (id, private IP), found by tag or created."""
        ec2 = self.client("ec2", region)
        found = ec2.describe_network_interfaces(Filters=self._role_filters(job_id, COORDINATOR_ROLE))[
            "NetworkInterfaces"
        ]
        if found:
            eni = found[0]
        else:
            request = coordinator_interface_request(job_id, self._coordinator_subnet(region), group)
            eni = ec2.create_network_interface(**request)["NetworkInterface"]
            log.info(
                "job %s: coordinator address %s (%s)",
                job_id,
                eni["PrivateIpAddress"],
                eni["NetworkInterfaceId"],
            )
        return str(eni["NetworkInterfaceId"]), str(eni["PrivateIpAddress"])

    @staticmethod
    def _role_filters(job_id: str, role: str | None = None) -> list[dict[str, Any]]:
        filters: list[dict[str, Any]] = [{"Name": f"tag:{JOB_TAG}", "Values": [job_id.lower()]}]
        if role:
            filters.append({"Name": f"tag:{ROLE_TAG}", "Values": [role]})
        return filters

    def _job_instances(
        self, job_id: str, region: str, states: list[str], role: str | None = None
    ) -> list[dict[str, Any]]:
        """The job's instances (of one role, or all) in `states`, as describe_instances gives them."""
        filters = [*self._role_filters(job_id, role), {"Name": "instance-state-name", "Values": states}]
        pages = self.client("ec2", region).get_paginator("describe_instances").paginate(Filters=filters)
        return [data for page in pages for res in page["Reservations"] for data in res["Instances"]]

    def coordinator(self, job_id: str, min_replicas: int) -> str:
        """The job's coordinator (torchft's lighthouse on a small on-demand instance): found by
        its tags, or started; one that died is replaced behind the same network interface, so
        the address (`http://<private IP>:<port>`) never changes. The fleet controller calls
        this every loop: between describes (`describe_interval`) the known address is returned."""
        with self._coordinator_lock:
            known = self._coordinators.get(job_id)
            if known is not None and time.time() - known.checked < self.describe_interval:
                return self._address(known)
            return self._address(self._refresh_coordinator(job_id, min_replicas))

    def _address(self, known: _Coordinator) -> str:
        return f"http://{known.private_ip}:{self.config.coordinator_port}"

    def _refresh_coordinator(self, job_id: str, min_replicas: int) -> _Coordinator:
        """Describe the coordinator; start one if none is pending or running."""
        known = self._coordinators.get(job_id)
        if known is None:
            region = self.coordinator_region()
            group = self.ensure_job_group(job_id, region)
            interface, private_ip = self._ensure_interface(job_id, region, group)
            known = _Coordinator(job_id, region, group, interface, private_ip)
            self._coordinators[job_id] = known
        live = self._job_instances(job_id, known.region, ["pending", "running"], COORDINATOR_ROLE)
        if live:
            data = max(live, key=lambda d: d["LaunchTime"])
            if data["InstanceId"] != known.instance_id:
                self._adopt(known, data)
            if data["State"]["Name"] == "running" and time.time() - (known.started or 0.0) > SETTLED_S:
                known.launches = 0  # it stayed up: only a run of failed starts ends the job
        else:
            self._launch_coordinator(known, min_replicas)
        known.checked = time.time()
        return known

    @staticmethod
    def _adopt(known: _Coordinator, data: dict[str, Any]) -> None:
        known.instance_id = str(data["InstanceId"])
        known.instance_type = str(data["InstanceType"])
        known.started = data["LaunchTime"].timestamp()

    def _launch_coordinator(self, known: _Coordinator, min_replicas: int) -> None:
        """Start the coordinator on the job's interface. While the previous one still holds the
        interface (shutting down) or the type has no capacity, try again at the next call: the
        replicas keep asking the same address until it answers."""
        if known.launches >= MAX_COORDINATOR_LAUNCHES:
            raise failed_starts(
                known,
                "the EC2 console (its console output)",
                "Check Config.aws_coordinator_image_id / coordinator_instance_type",
            )
        ec2 = self.client("ec2", known.region)
        request = self._coordinator_request(
            known.job_id, known.interface_id, self.coordinator_user_data(known.job_id, min_replicas)
        )
        try:
            data = ec2.run_instances(**request)["Instances"][0]
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            if code not in CAPACITY_CODES and code != "InvalidNetworkInterface.InUse":
                raise
            log.warning("job %s: the coordinator could not start yet (%s); trying again", known.job_id, code)
            return
        known.launches += 1
        self._adopt(known, data)
        price = self.coordinator_price()
        log.info(
            "job %s: coordinator %s (%s, on demand, %s) at %s",
            known.job_id,
            known.instance_id,
            known.instance_type,
            f"${price.on_demand:.4f}/h" if price else "price unknown",
            self._address(known),
        )

    def end_coordinator(self, job_id: str, region: str | None = None) -> list[str]:
        """Terminate the job's coordinator (found by its tags, so also one that another
        controller started); returns the instance ids it ended."""
        region = region or self.coordinator_region()
        ids = [str(d["InstanceId"]) for d in self._job_instances(job_id, region, _UNENDED, COORDINATOR_ROLE)]
        if ids:
            self._terminated.update(ids)
            self.client("ec2", region).terminate_instances(InstanceIds=ids)
            log.info("job %s: coordinator %s terminated", job_id, ", ".join(ids))
        with self._coordinator_lock:
            self._coordinators.pop(job_id, None)
        return ids

    def remove_job_network(
        self, job_id: str, region: str | None = None, timeout: float | None = None
    ) -> bool:
        """Delete the job's coordinator interface and security group once no instance of the
        job is left (EC2 refuses to delete them while an instance uses them); True when nothing
        of them remains. Gives up after `timeout` seconds, or at once while an instance of the
        job that nobody ended still runs; they cost nothing, and `spotnb gc` retries."""
        region = region or self.coordinator_region()
        ec2 = self.client("ec2", region)
        interfaces = ec2.describe_network_interfaces(Filters=self._role_filters(job_id, COORDINATOR_ROLE))[
            "NetworkInterfaces"
        ]
        group = self._find_job_group(job_id, region)
        if not interfaces and group is None:
            return True
        deadline = time.time() + (self.network_cleanup_timeout if timeout is None else timeout)
        if not self._wait_job_instances_gone(job_id, region, deadline):
            return False
        done = all(
            self._delete_when_free(
                lambda i=i: ec2.delete_network_interface(NetworkInterfaceId=i["NetworkInterfaceId"]),
                "InvalidNetworkInterface.InUse",
                deadline,
            )
            for i in interfaces
        )
        if group is not None:
            done = (
                self._delete_when_free(
                    lambda: ec2.delete_security_group(GroupId=group), "DependencyViolation", deadline
                )
                and done
            )
        with self._coordinator_lock:
            self._job_groups.pop((job_id.lower(), region), None)
        if not done:
            log.warning(
                "job %s: its network (interface, group %s) is still in use; spotnb gc removes it",
                job_id,
                group,
            )
        return done

    def _wait_job_instances_gone(self, job_id: str, region: str, deadline: float) -> bool:
        """Wait until no instance of the job is left but terminated ones; False at once when one
        that nobody ended still runs (its job may be live), or when the deadline passes."""
        while True:
            left = self._job_instances(job_id, region, [*_UNENDED, "shutting-down"])
            if not left:
                return True
            running = [d["InstanceId"] for d in left if d["State"]["Name"] != "shutting-down"]
            if any(i not in self._terminated for i in running):
                log.info("job %s: instances %s still run: its network stays", job_id, running)
                return False
            if time.time() > deadline:
                log.warning(
                    "job %s: instances %s did not end in time", job_id, [d["InstanceId"] for d in left]
                )
                return False
            time.sleep(5.0)

    @staticmethod
    def _delete_when_free(delete: Any, busy_code: str, deadline: float) -> bool:
        """Call `delete` until EC2 stops answering `busy_code` (a detaching interface takes
        seconds after its instance ended); gone already counts as deleted."""
        while True:
            try:
                delete()
                return True
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                if code.endswith(".NotFound"):
                    return True
                if code != busy_code or time.time() > deadline:
                    return False
            time.sleep(5.0)

    def plan_coordinator(self, spec: LaunchSpec, steps: list[dict[str, Any]]) -> dict[str, Any]:
        """Append the requests that set up a job's coordinator to `steps`; return what the dry
        run says about it (its type, market, price, address and boot script)."""
        job, region = spec.job_id, self.coordinator_region()
        group = f"<id of security group {job_group_name(job)}>"
        interface = "<id of the coordinator's network interface>"
        script = self.coordinator_user_data(job)
        when = "once per job, if missing"
        steps.extend(
            [
                {
                    "api": "ec2.create_security_group",
                    "when": when,
                    "body": job_group_request(job, "<VPC id>"),
                },
                {
                    "api": "ec2.authorize_security_group_ingress",
                    "when": when,
                    "body": job_group_ingress(group),
                },
                {
                    "api": "ec2.create_network_interface",
                    "when": when,
                    "body": coordinator_interface_request(
                        job, self.config.aws_subnet_id or "<default subnet>", group
                    ),
                },
                {
                    "api": "ec2.run_instances",
                    "region": region,
                    "when": "the job's coordinator, on demand; again only if it dies",
                    "body": self._coordinator_request(job, interface, "<the coordinator script below>"),
                },
            ]
        )
        price = self.coordinator_price()
        return {
            "instance_type": coordinator_type(self.config, COORDINATOR_TYPE),
            "market": "on-demand",
            "price_on_demand": price.on_demand if price else None,
            "price_source": price.source if price else "unknown: set Config.coordinator_price",
            "address": f"http://<private IP of its network interface>:{self.config.coordinator_port}",
            "ports": f"all TCP between members of {job_group_name(job)} only",
            "ends": "terminated with the job, then its network interface and security group are deleted",
            "bootstrap": script,
        }

    def _coordinator_info(self, job_id: str) -> dict[str, Any]:
        """What an instance's `info` (and so its `launched`/`allocated` events) records of the
        coordinator it trains with, for the cost ledger (`ledger.coordinator_overheads`)."""
        with self._coordinator_lock:
            known = self._coordinators.get(job_id)
        if known is None or known.instance_id is None:
            return {}
        price = self.coordinator_price()
        return {
            "coordinator": {
                "id": known.instance_id,
                "instance_type": known.instance_type,
                "started": known.started,
                "price": price.on_demand if price else 0.0,
            }
        }

    def close_coordinators(self) -> None:
        """End the coordinators this provider started or found (an on-demand instance left
        running costs the user money) and delete the network of those jobs and of the jobs gc
        reaped (`AWSProvider.close`, after the instances it launched)."""
        with self._coordinator_lock:
            jobs = {(c.job_id, c.region) for c in self._coordinators.values()}
            jobs |= self._reaped_jobs | self._job_networks
        for job_id, region in sorted(jobs):
            try:
                self.end_coordinator(job_id, region)
                self.remove_job_network(job_id, region)
            except (ClientError, BotoCoreError) as exc:
                log.warning(
                    "job %s: could not end its coordinator or network (%s); run spotnb gc", job_id, exc
                )
        self._reaped_jobs.clear()
        self._job_networks.clear()
