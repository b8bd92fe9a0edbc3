"""AWS EC2 spot instances through boto3 (`pip install 'spotnb[aws]'`).

One `run_instances` per incarnation with a one-time spot market option, the Deep Learning AMI
(resolved by EC2 itself from its public SSM parameter, so a dry run needs no lookup) or the
user's image, a security group without inbound rules, an instance profile for the store, and
the bootstrap script as `UserData`. The instance terminates itself when the agent exits
(`InstanceInitiatedShutdownBehavior=terminate`). Spot prices per availability zone come from
`describe_spot_price_history`; on-demand prices from the built-in table.

A job on several instances (`Config.instances > 1`) also gets a coordinator (`coordinator`):
a small on-demand instance running torchft's lighthouse, which must outlive every spot
instance. It sits behind a network interface created once per job, so a coordinator that died
is replaced at the same private address the replicas already know, and every instance of the
job joins a job security group whose only inbound rule opens TCP to members of that group.
Coordinator, interface and group are tagged with the job id; `close` (the controller's way
out) and `spotnb gc` end the coordinator and delete the rest.

Credentials come from boto3's standard chain (env, profile, SSO, instance role) and are never
copied anywhere. `AWS_ENDPOINT_URL` (honoured by boto3) points everything at moto in tests.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

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
from spotnb.providers.bootstrap import aws_user_data, require_remote_store
from spotnb.providers.cleanup import JOB_TAG, MANAGED_TAG, job_tags
from spotnb.providers.coordinator import (
    COORDINATOR_ROLE,
    MAX_COORDINATOR_LAUNCHES,
    ROLE_TAG,
    SETTLED_S,
    coordinator_boot_script,
    coordinator_type,
    failed_starts,
    host_on_coordinator,
    planned_hosting,
)
from spotnb.providers.coordinator import coordinator_price as _coordinator_price
from spotnb.providers.quotas import aws_quota_error, aws_spot_quota

__all__ = [
    "AWSProvider",
    "DEFAULT_IMAGE",
    "CAPACITY_CODES",
    "SECURITY_GROUP",
    "split_zone",
    "run_instances_request",
    "ROLE_TAG",
    "COORDINATOR_ROLE",
    "COORDINATOR_PRICES",
    "COORDINATOR_TYPE",
    "MAX_COORDINATOR_LAUNCHES",
    "job_group_name",
    "job_group_request",
    "job_group_ingress",
    "coordinator_interface_request",
    "coordinator_request",
]

log = logging.getLogger("spotnb.providers.aws.provider")

DEFAULT_IMAGE = (
    "resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
    "oss-nvidia-driver-gpu-pytorch-2.13-amazon-linux-2023/latest/ami-id"
)
SECURITY_GROUP = "spotnb-no-inbound"
#: how long fetched spot prices / the regions offering a type are reused (spotnb.market.price_cache)
PRICE_TTL = 600.0
OFFERING_TTL = 86400.0
# Errors that mean "not here, not now": the controller moves on to the next candidate. (A spot
# instance's launch tells the account's quotas apart first, `quotas.AWS_QUOTA_CODES`: those are
# final; the coordinator's on-demand launch still retries them.)
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "VcpuLimitExceeded",
        "Unsupported",
        "InsufficientFreeAddressesInSubnet",
        "RequestLimitExceeded",
        "SpotCapacityNotAvailable",
    }
)
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
_AZ = re.compile(r"^([a-z]{2}(?:-[a-z]+)+-\d+)([a-z])$")
_SPOT_REASONS = ("Server.SpotInstanceTermination", "Server.SpotInstanceShutdown")


def split_zone(name: str) -> tuple[str, str | None]:
    """ "us-east-1b" → ("us-east-1", "us-east-1b"); "us-east-1" → ("us-east-1", None)."""
    m = _AZ.match(name)
    return (m.group(1), name) if m else (name, None)


def run_instances_request(
    spec: LaunchSpec,
    *,
    image_id: str,
    zone: str | None,
    security_group_ids: list[str],
    instance_profile: str | None,
    config: Any,
    user_data: str,
) -> dict[str, Any]:
    """The exact keyword arguments of `ec2.run_instances` for one incarnation."""
    tags = [{"Key": k, "Value": v} for k, v in job_tags(spec).items()]
    spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
    if config.aws_max_price is not None:
        spot["MaxPrice"] = f"{config.aws_max_price:.4f}"
    req: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": spec.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "UserData": user_data,
        "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": spot},
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {
            "HttpTokens": "required",
            "HttpEndpoint": "enabled",
            "HttpPutResponseHopLimit": 1,
        },
        "SecurityGroupIds": list(security_group_ids),
        "TagSpecifications": [
            {
                "ResourceType": "instance",
                "Tags": [*tags, {"Key": "Name", "Value": f"spotnb-{spec.job_id}-{spec.incarnation}"}],
            },
            {"ResourceType": "volume", "Tags": tags},
        ],
    }
    if zone:
        req["Placement"] = {"AvailabilityZone": zone}
    if config.aws_subnet_id:
        req["SubnetId"] = config.aws_subnet_id
    if instance_profile:
        req["IamInstanceProfile"] = {"Name": instance_profile}
    if config.aws_key_name:
        req["KeyName"] = config.aws_key_name
    if config.aws_disk_gb:
        req["BlockDeviceMappings"] = [
            {
                "DeviceName": "/dev/xvda",
                "Ebs": {"VolumeSize": config.aws_disk_gb, "VolumeType": "gp3", "DeleteOnTermination": True},
            }
        ]
    return req


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


def _bucket(store_url: str) -> tuple[str, str]:
    rest = store_url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


class AWSProvider(Provider):
    """EC2 spot instances; regions are AWS regions or availability zones."""

    name = "aws"
    ships_code = True  # its VMs install the notebook's spotnb from the store
    # memory:// and file:// stores are refused by _validate (require_remote_store) with a hint
    # towards a bucket; the base class's MEMORY_STORE message suggests file://, wrong here.
    unsupported: ClassVar[dict[Feature, str]] = {
        Feature.NOTICE_ACK: "EC2 has no way to acknowledge an interruption notice",
        Feature.FAULT_INJECTION: "EC2 interruptions are injected with AWS FIS "
        "(aws:ec2:send-spot-instance-interruptions), outside spotnb",
    }

    credentials_hint: ClassVar[str] = (
        "AWS: `aws configure` (or `aws sso login`), or $AWS_ACCESS_KEY_ID and "
        "$AWS_SECRET_ACCESS_KEY, or $AWS_PROFILE"
    )

    @classmethod
    def has_credentials(cls) -> bool:
        """botocore's credential chain (environment, shared files, SSO, instance role) finds
        a set; resolving it calls no AWS API."""
        try:
            return boto3.session.Session().get_credentials() is not None
        except BotoCoreError:  # a broken profile: no usable credentials
            return False

    def __init__(self, config: Any, session: Any = None) -> None:
        super().__init__(config)
        self.session = session or boto3.session.Session()
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str | None], str] = {}
        self._profile_ready: str | None = None
        self._launched: dict[str, Instance] = {}
        self._terminated: set[str] = set()
        self._setup_lock = threading.Lock()  # the groups and the profile, set up once
        self._coordinator_lock = threading.Lock()
        self._coordinators: dict[str, _Coordinator] = {}  # by job id
        self._job_groups: dict[tuple[str, str], str] = {}  # (job id, region) → group id
        self._reaped_jobs: set[tuple[str, str]] = set()  # (job id, region) of instances gc ended
        # (job id, region) of every job group this provider made or found: `close` removes
        # their network even when the coordinator never got started (a failure half-way)
        self._job_networks: set[tuple[str, str]] = set()

    # -- helpers ---------------------------------------------------------------------------
    def client(self, service: str, region: str | None = None) -> Any:
        region = region or self.default_region()
        with self._lock:
            key = (service, region)
            if key not in self._clients:
                # Capacity errors come back as 5xx, which botocore retries with backoff; one
                # retry is enough before the controller moves on to the next candidate.
                retries = BotoConfig(retries={"mode": "standard", "total_max_attempts": 2})
                self._clients[key] = self.session.client(service, region_name=region, config=retries)
            return self._clients[key]

    def default_region(self) -> str:
        if self.config.region:
            return split_zone(self.config.region)[0]
        return self.session.region_name or "us-east-1"

    def profile_name(self) -> str | None:
        if self.config.aws_instance_profile:
            return self.config.aws_instance_profile
        store = self.config.store_url()
        if not store.startswith(("s3://", "s3a://")):
            return None  # a non-S3 store is reached with its own cloud's credentials
        return f"spotnb-{_bucket(store)[0]}"[:64]

    # -- validation and planning -----------------------------------------------------------
    def _validate(self) -> None:
        require_remote_store(self.config, self.name)
        regions = self.config.candidate_regions()
        for r in [] if regions == "cheapest" else regions:
            if not re.match(r"^[a-z]{2}(-[a-z]+)+-\d+[a-z]?$", r or ""):
                raise ConfigError(
                    f"Config.regions: {r!r} is not an AWS region or availability "
                    "zone (e.g. 'us-east-1' or 'us-east-1b')"
                )
        if self.config.instances > 1:
            self._validate_one_network(regions)

    def _validate_one_network(self, regions: list[str] | str) -> None:
        """The instances of a job on several instances reach each other and their coordinator
        by private address, through one security group: all in one VPC, so one region."""
        if regions == "cheapest":
            raise ConfigError(
                "Config.regions: a job on several instances trains in one VPC (its coordinator's): "
                "give one region, e.g. region='us-east-1', instead of 'cheapest'"
            )
        names = {split_zone(r)[0] for r in regions if r}
        if len(names) > 1:
            raise ConfigError(
                f"Config.regions: {sorted(names)} are several AWS regions; the instances of a job on "
                "several instances reach each other by private address, so they must share one "
                "region (availability zones of one region are fine)"
            )

    def _plan_launch(self, spec: LaunchSpec) -> dict[str, Any]:
        region, zone = split_zone(spec.region or self.default_region())
        groups = self.config.aws_security_group_ids or [f"<id of security group {SECURITY_GROUP}>"]
        elastic = self.config.instances > 1
        if elastic:
            groups = [*groups, f"<id of security group {job_group_name(spec.job_id)}>"]
        script = aws_user_data(spec)
        req = run_instances_request(
            spec,
            image_id=self.config.aws_image_id or DEFAULT_IMAGE,
            zone=zone,
            security_group_ids=groups,
            instance_profile=self.profile_name(),
            config=self.config,
            user_data="<the bootstrap script below; boto3 base64-encodes it>",
        )
        steps: list[dict[str, Any]] = []
        if not self.config.aws_security_group_ids:
            steps.append(
                {
                    "api": "ec2.create_security_group",
                    "when": f"once, if {SECURITY_GROUP} is missing in the VPC",
                    "body": self._group_request("<default VPC id>"),
                }
            )
        profile = self.profile_name()
        if profile and not self.config.aws_instance_profile:
            steps.extend(self._profile_requests(profile, "once, if the instance profile is missing"))
        coordinator: dict[str, Any] | None = None
        with planned_hosting(self, spec.job_id) as planned:
            if planned:
                coordinator = self._plan_coordinator(spec, steps)
        steps.append({"api": "ec2.run_instances", "region": region, "body": req})
        plan: dict[str, Any] = {
            "provider": "aws",
            "region": region,
            "zone": zone,
            "instance_type": spec.instance_type,
            "instances": self.config.instances,
            "requests": steps,
            "bootstrap": script,
            "terminate": {"api": "ec2.terminate_instances", "body": {"InstanceIds": ["<id>"]}},
        }
        if coordinator is not None:
            plan["coordinator"] = coordinator
        return plan

    def _plan_coordinator(self, spec: LaunchSpec, steps: list[dict[str, Any]]) -> dict[str, Any]:
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

    @staticmethod
    def _group_request(vpc_id: str) -> dict[str, Any]:
        return {
            "GroupName": SECURITY_GROUP,
            "VpcId": vpc_id,
            "Description": "spotnb VMs: no inbound rule (all traffic goes out to the store)",
            "TagSpecifications": [
                {"ResourceType": "security-group", "Tags": [{"Key": "spotnb-managed", "Value": "true"}]}
            ],
        }

    def _profile_requests(self, name: str, when: str) -> list[dict[str, Any]]:
        bucket, prefix = _bucket(self.config.store_url())
        objects = f"arn:aws:s3:::{bucket}/{prefix + '/' if prefix else ''}*"
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ],
        }
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                    "Resource": objects,
                },
                {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{bucket}"},
            ],
        }
        return [
            {
                "api": "iam.create_role",
                "when": when,
                "body": {
                    "RoleName": name,
                    "AssumeRolePolicyDocument": json.dumps(trust),
                    "Description": "spotnb VMs: read and write the job store only",
                },
            },
            {
                "api": "iam.put_role_policy",
                "when": when,
                "body": {
                    "RoleName": name,
                    "PolicyName": "spotnb-store",
                    "PolicyDocument": json.dumps(policy),
                },
            },
            {"api": "iam.create_instance_profile", "when": when, "body": {"InstanceProfileName": name}},
            {
                "api": "iam.add_role_to_instance_profile",
                "when": when,
                "body": {"InstanceProfileName": name, "RoleName": name},
            },
        ]

    # -- setup done once per provider ------------------------------------------------------
    def ensure_security_group(self, region: str) -> list[str]:
        """The configured groups, or spotnb's no-inbound group in the subnet's (default) VPC."""
        if self.config.aws_security_group_ids:
            return list(self.config.aws_security_group_ids)
        ec2 = self.client("ec2", region)
        vpc = self._vpc_id(region)
        key = (region, vpc)
        if key in self._groups:
            return [self._groups[key]]
        filters = [{"Name": "group-name", "Values": [SECURITY_GROUP]}, {"Name": "vpc-id", "Values": [vpc]}]
        found = ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
        if found:
            group = found[0]["GroupId"]
        else:
            try:
                group = ec2.create_security_group(**self._group_request(vpc))["GroupId"]
            except ClientError as exc:  # another process created it a moment ago
                if exc.response["Error"]["Code"] != "InvalidGroup.Duplicate":
                    raise
                group = ec2.describe_security_groups(Filters=filters)["SecurityGroups"][0]["GroupId"]
        self._groups[key] = group
        return [group]

    def _vpc_id(self, region: str) -> str:
        """The VPC of Config.aws_subnet_id, else the region's default VPC."""
        ec2 = self.client("ec2", region)
        if self.config.aws_subnet_id:
            return str(ec2.describe_subnets(SubnetIds=[self.config.aws_subnet_id])["Subnets"][0]["VpcId"])
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise ConfigError(f"region {region} has no default VPC: set Config.aws_subnet_id")
        return str(vpcs[0]["VpcId"])

    def ensure_instance_profile(self) -> str | None:
        """The configured profile, or one spotnb creates that can use the store's bucket only."""
        name = self.profile_name()
        if name is None or self.config.aws_instance_profile or self._profile_ready == name:
            return name
        iam = self.client("iam")
        try:
            iam.get_instance_profile(InstanceProfileName=name)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "NoSuchEntity":
                raise
            for step in self._profile_requests(name, "now"):
                method = getattr(iam, step["api"].split(".", 1)[1])
                try:
                    method(**step["body"])
                except ClientError as e:
                    if e.response["Error"]["Code"] != "EntityAlreadyExists":
                        raise
        self._profile_ready = name
        return name

    # -- backend hooks ---------------------------------------------------------------------
    def _launch(self, spec: LaunchSpec) -> Instance:
        region, zone = split_zone(spec.region or self.default_region())
        ec2 = self.client("ec2", region)
        # the slots of a job on several instances launch in parallel: one of them sets up
        # the groups and the profile, the others find them (EC2 refuses a second group of the
        # same name, IAM a second role in a profile)
        with self._setup_lock:
            groups = self.ensure_security_group(region)
            if self.config.instances > 1:  # the training ports, open to the job's members only
                groups = [*groups, self.ensure_job_group(spec.job_id, region)]
            profile = self.ensure_instance_profile()
        req = run_instances_request(
            spec,
            image_id=self.config.aws_image_id or DEFAULT_IMAGE,
            zone=zone,
            security_group_ids=groups,
            instance_profile=profile,
            config=self.config,
            user_data=aws_user_data(spec),
        )
        for attempt in range(8):
            try:
                resp = ec2.run_instances(**req)
                break
            except ClientError as exc:
                error = exc.response.get("Error") or {}
                code, message = str(error.get("Code") or ""), str(error.get("Message") or "")
                quota = self._quota_error(code, message, spec.instance_type, region, zone or region)
                if quota is not None:
                    raise quota from None
                if code in CAPACITY_CODES:
                    raise CapacityError(f"{code} in {zone or region}: {message}") from None
                status = int((exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
                if status >= 500:  # EC2 unavailable after botocore's retry (any body, or none)
                    raise CapacityError(
                        f"EC2 answered HTTP {status} ({code or 'no error code'}) in {zone or region}: "
                        f"{message or 'no message'}; asking again later"
                    ) from None
                if code == "InvalidParameterValue" and "iamInstanceProfile" in message and attempt < 7:
                    time.sleep(5)  # a new instance profile takes seconds to propagate
                    continue
                raise
        data = resp["Instances"][0]
        instance = Instance(
            id=data["InstanceId"],
            provider="aws",
            region=data.get("Placement", {}).get("AvailabilityZone") or zone or region,
            instance_type=spec.instance_type,
            launched_at=time.time(),
            info={
                "aws_region": region,
                "incarnation": spec.incarnation,
                "spot_request": data.get("SpotInstanceRequestId"),
                **self._coordinator_info(spec.job_id),
            },
        )
        self._launched[instance.id] = instance
        return instance

    def _quota_error(self, code: str, message: str, instance_type: str, region: str, where: str) -> Any:
        """The QuotaError of a refused launch (None: not a quota), with the quota's value from
        Service Quotas and the type's vCPUs from EC2 where those answer (each best effort)."""
        if not aws_quota_error(code, message, instance_type=instance_type, region=region, where=where):
            return None
        limit: float | None = None
        vcpus: int | None = None
        try:
            got = self.client("service-quotas", region).get_service_quota(
                ServiceCode="ec2", QuotaCode=aws_spot_quota(instance_type)[1]
            )
            limit = float(got["Quota"]["Value"])
        except (ClientError, BotoCoreError, KeyError, TypeError, ValueError):
            pass  # no permission to read quotas, or no answer: the error's own words say less
        try:
            types = self.client("ec2", region).describe_instance_types(InstanceTypes=[instance_type])
            vcpus = int(types["InstanceTypes"][0]["VCpuInfo"]["DefaultVCpus"])
        except (ClientError, BotoCoreError, KeyError, IndexError, TypeError, ValueError):
            pass
        return aws_quota_error(
            code, message, instance_type=instance_type, region=region, where=where, limit=limit, vcpus=vcpus
        )

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

    def _describe(self, instance: Instance) -> InstanceStatus:
        ec2 = self.client("ec2", instance.info.get("aws_region") or split_zone(instance.region or "")[0])
        try:
            resp = ec2.describe_instances(InstanceIds=[instance.id])
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "InvalidInstanceID.NotFound":
                state = InstanceState.TERMINATED if instance.id in self._terminated else InstanceState.UNKNOWN
                return InstanceStatus(state)
            raise
        data = resp["Reservations"][0]["Instances"][0]
        name = data["State"]["Name"]
        reason = (data.get("StateReason") or {}).get("Code", "")
        detail = {"aws_state": name, "reason": reason}
        if name == "pending":
            return InstanceStatus(InstanceState.PENDING, detail=detail)
        if name == "running":
            return InstanceStatus(InstanceState.RUNNING, detail=detail)
        if instance.id in self._terminated:
            return InstanceStatus(InstanceState.TERMINATED, detail=detail)
        if reason.startswith(_SPOT_REASONS):
            return InstanceStatus(InstanceState.PREEMPTED, detail=detail)
        if reason == "Client.InstanceInitiatedShutdown":
            return InstanceStatus(InstanceState.EXITED, detail=detail)
        return InstanceStatus(InstanceState.TERMINATED, detail=detail)

    def _terminate(self, instance: Instance) -> None:
        self._terminated.add(instance.id)
        region = instance.info.get("aws_region") or split_zone(instance.region or "")[0]
        if instance.info.get("job"):  # found by its tags (gc): `close` removes its job's network
            self._reaped_jobs.add((str(instance.info["job"]), region))
        ec2 = self.client("ec2", region)
        try:
            ec2.terminate_instances(InstanceIds=[instance.id])
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "InvalidInstanceID.NotFound":
                raise

    def _prices(self, instance_type: str, regions: list[str] | None) -> dict[str, Price]:
        """Latest spot price per availability zone (on-demand from the built-in table). With
        `regions="cheapest"` the candidates are every region enabled for the account that
        offers the type (`describe_regions`, then each region's `describe_instance_type_offerings`),
        not a list; prices are cached on disk for `PRICE_TTL` and say how old they are."""
        from spotnb.market.price_cache import cached, describe_age

        table = lookup_price(instance_type, "aws")
        on_demand = table.on_demand if table else 0.0
        if regions is None and self.config.regions == "cheapest" and not self.config.region:
            wanted = self.offering_regions(instance_type)
        else:
            wanted = [r for r in (regions or [self.default_region()]) if r]
        key = f"aws-spot-{instance_type}-{'+'.join(sorted(wanted))}"
        if len(key) > 100:  # every region: one key per type
            key = f"aws-spot-{instance_type}-all-{len(wanted)}"
        try:
            rows, age = cached(key, PRICE_TTL, lambda: self._fetch_spot(instance_type, wanted))
        except OSError:
            rows, age = {name: (None, "") for name in wanted}, 0.0
        out: dict[str, Price] = {}
        for name, (spot, stamp) in rows.items():
            if spot is None:
                if table:
                    out[name] = Price(table.spot, table.on_demand, table.source)
                continue
            out[name] = Price(
                float(spot),
                on_demand,
                f"EC2 spot price history {stamp} ({describe_age(age)}); on-demand: built-in table",
            )
        return out

    def _fetch_spot(self, instance_type: str, wanted: list[str]) -> dict[str, tuple[float | None, str]]:
        """{zone: (latest spot $/h, its time)} for each wanted region or zone, asked in
        parallel; a region that cannot be asked maps to (None, "") (the table then stands in)."""
        from concurrent.futures import ThreadPoolExecutor

        since = datetime.now(timezone.utc) - timedelta(hours=3)

        def one(name: str) -> dict[str, tuple[float | None, str]]:
            region, zone = split_zone(name)
            try:
                rows = self.client("ec2", region).describe_spot_price_history(
                    InstanceTypes=[instance_type],
                    ProductDescriptions=["Linux/UNIX"],
                    StartTime=since,
                    **({"AvailabilityZone": zone} if zone else {}),
                )["SpotPriceHistory"]
            except (ClientError, BotoCoreError) as exc:
                log.debug("spot prices of %s in %s: %r", instance_type, name, exc)
                return {name: (None, "")}
            latest: dict[str, dict[str, Any]] = {}
            for row in rows:
                az = row["AvailabilityZone"]
                if zone and az != zone:
                    continue
                if az not in latest or row["Timestamp"] > latest[az]["Timestamp"]:
                    latest[az] = row
            stamp = "%Y-%m-%d %H:%M"
            return {az: (float(r["SpotPrice"]), f"{r['Timestamp']:{stamp}}") for az, r in latest.items()}

        out: dict[str, tuple[float | None, str]] = {}
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(wanted)))) as pool:
            for part in pool.map(one, wanted):
                out.update(part)
        if not any(spot is not None for spot, _ in out.values()):
            raise OSError("no region answered")  # not cached: the next allocation asks again
        return out

    def offering_regions(self, instance_type: str) -> list[str]:
        """Every region enabled for this account that offers `instance_type`, from the API
        (cached for `OFFERING_TTL`): new regions and types appear without a spotnb release."""
        from concurrent.futures import ThreadPoolExecutor

        from spotnb.market.price_cache import cached

        def fetch() -> list[str]:
            names = [r["RegionName"] for r in self.client("ec2").describe_regions()["Regions"]]

            def offered(region: str) -> bool:
                try:
                    rows = self.client("ec2", region).describe_instance_type_offerings(
                        LocationType="region",
                        Filters=[{"Name": "instance-type", "Values": [instance_type]}],
                    )["InstanceTypeOfferings"]
                except (ClientError, BotoCoreError) as exc:
                    log.debug("offerings of %s in %s: %r", instance_type, region, exc)
                    return False
                return bool(rows)

            with ThreadPoolExecutor(max_workers=16) as pool:
                return [r for r, ok in zip(names, pool.map(offered, names), strict=True) if ok]

        regions, _ = cached(f"aws-offering-{instance_type}", OFFERING_TTL, fetch)
        if not regions:
            raise ConfigError(
                f"Config.instance_type: no AWS region enabled for this account offers "
                f"{instance_type!r}; check the name (e.g. 'g4dn.xlarge') or enable a region"
            )
        return list(regions)

    def zone_location(self, zone: str | None) -> tuple[str | None, str | None]:
        return ("aws", split_zone(zone)[0] if zone else self.default_region())

    def store_location(self) -> tuple[str | None, str | None]:
        """An s3:// store's bucket region (`GetBucketLocation`, cached for a day); None when
        it cannot be asked (no permission: the store is then priced as another region)."""
        from spotnb.market.price_cache import cached
        from spotnb.market.transfer import store_cloud

        url = self.config.store_url()
        cloud = store_cloud(url)
        if cloud != "aws":
            return (cloud, None)
        bucket = _bucket(url)[0]

        def fetch() -> str:
            where = self.client("s3").get_bucket_location(Bucket=bucket).get("LocationConstraint")
            return str(where or "us-east-1")  # the API says None for us-east-1

        try:
            region, _ = cached(f"aws-bucket-region-{bucket}", 86400.0, fetch)
        except (ClientError, BotoCoreError, OSError) as exc:
            log.debug("region of bucket %s: %r", bucket, exc)
            return ("aws", None)
        return ("aws", str(region))

    # -- the coordinator of a job on several instances -------------------------------------
    network_cleanup_timeout: ClassVar[float] = 300.0  # seconds `close` waits to delete the network

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
        return _coordinator_price(self.config, "aws", itype, COORDINATOR_PRICES)

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

    # -- cleanup ---------------------------------------------------------------------------
    def list_tagged(self, regions: list[str] | None = None) -> Iterator[tuple[Instance, str]]:
        """Live (not terminated) instances carrying a spotnb job tag, with their job id."""
        names = regions or (
            [split_zone(r)[0] for r in self.config.regions]
            if isinstance(self.config.regions, list)
            else [self.default_region()]
        )
        for region in dict.fromkeys(names):
            pages = (
                self.client("ec2", region)
                .get_paginator("describe_instances")
                .paginate(
                    Filters=[
                        {"Name": "tag-key", "Values": [JOB_TAG]},
                        {
                            "Name": "instance-state-name",
                            "Values": ["pending", "running", "stopping", "stopped"],
                        },
                    ]
                )
            )
            for page in pages:
                for res in page["Reservations"]:
                    for data in res["Instances"]:
                        tags = {t["Key"]: t["Value"] for t in data.get("Tags", [])}
                        yield (
                            Instance(
                                id=data["InstanceId"],
                                provider="aws",
                                region=region,
                                instance_type=data["InstanceType"],
                                launched_at=0.0,
                                info={
                                    "aws_region": region,
                                    "job": tags[JOB_TAG],
                                    "role": tags.get(ROLE_TAG, "instance"),
                                },
                            ),
                            tags[JOB_TAG],
                        )

    def close(self) -> None:
        """Safety net: terminate anything this provider launched and did not end, then the
        coordinators it started or found (an on-demand instance left running costs the user
        money), and delete the network of those jobs and of the jobs gc reaped."""
        for instance in list(self._launched.values()):
            if instance.id not in self._terminated:
                try:
                    self._terminate(instance)
                except (ClientError, BotoCoreError):
                    pass
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
