"""AWS EC2 spot instances through boto3 (`pip install 'spotnb[aws]'`).

One `run_instances` per incarnation with a one-time spot market option, the Deep Learning AMI
(resolved by EC2 itself from its public SSM parameter, so a dry run needs no lookup) or the
user's image, a security group without inbound rules, an instance profile for the store, and
the bootstrap script as `UserData`. The instance terminates itself when the agent exits
(`InstanceInitiatedShutdownBehavior=terminate`). Spot prices per availability zone come from
`describe_spot_price_history`; on-demand prices from the built-in table.

Credentials come from boto3's standard chain (env, profile, SSO, instance role) and are never
copied anywhere. `AWS_ENDPOINT_URL` (honoured by boto3) points everything at moto in tests.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from spotnb.errors import CapacityError, ConfigError
from spotnb.prices import lookup_price
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
from spotnb.providers.cleanup import JOB_TAG, job_tags

__all__ = [
    "AWSProvider",
    "DEFAULT_IMAGE",
    "CAPACITY_CODES",
    "SECURITY_GROUP",
    "split_zone",
    "run_instances_request",
]

DEFAULT_IMAGE = (
    "resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
    "oss-nvidia-driver-gpu-pytorch-2.13-amazon-linux-2023/latest/ami-id"
)
SECURITY_GROUP = "spotnb-no-inbound"
CHEAPEST_REGIONS = ("us-east-1", "us-east-2", "us-west-2")
# Errors that mean "not here, not now": the controller moves on to the next candidate.
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


def _bucket(store_url: str) -> tuple[str, str]:
    rest = store_url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


class AWSProvider(Provider):
    """EC2 spot instances; regions are AWS regions or availability zones."""

    name = "aws"
    # memory:// and file:// stores are refused by _validate (require_remote_store) with a hint
    # towards a bucket; the base class's MEMORY_STORE message suggests file://, wrong here.
    unsupported: ClassVar[dict[Feature, str]] = {
        Feature.ELASTIC: "the small on-demand coordinator instance that hosts torchft's lighthouse "
        "(and opens the training ports between the job's instances) is not built for this cloud yet",
        Feature.NOTICE_ACK: "EC2 has no way to acknowledge an interruption notice",
        Feature.FAULT_INJECTION: "EC2 interruptions are injected with AWS FIS "
        "(aws:ec2:send-spot-instance-interruptions), outside spotnb",
    }

    def __init__(self, config: Any, session: Any = None) -> None:
        super().__init__(config)
        self.session = session or boto3.session.Session()
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str | None], str] = {}
        self._profile_ready: str | None = None
        self._launched: dict[str, Instance] = {}
        self._terminated: set[str] = set()

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

    def _plan_launch(self, spec: LaunchSpec) -> dict[str, Any]:
        region, zone = split_zone(spec.region or self.default_region())
        groups = self.config.aws_security_group_ids or [f"<id of security group {SECURITY_GROUP}>"]
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
        steps.append({"api": "ec2.run_instances", "region": region, "body": req})
        return {
            "provider": "aws",
            "region": region,
            "zone": zone,
            "requests": steps,
            "bootstrap": script,
            "terminate": {"api": "ec2.terminate_instances", "body": {"InstanceIds": ["<id>"]}},
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
        if self.config.aws_subnet_id:
            vpc = ec2.describe_subnets(SubnetIds=[self.config.aws_subnet_id])["Subnets"][0]["VpcId"]
        else:
            vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
            if not vpcs:
                raise ConfigError(f"region {region} has no default VPC: set Config.aws_subnet_id")
            vpc = vpcs[0]["VpcId"]
        key = (region, vpc)
        if key in self._groups:
            return [self._groups[key]]
        found = ec2.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [SECURITY_GROUP]}, {"Name": "vpc-id", "Values": [vpc]}]
        )["SecurityGroups"]
        if found:
            group = found[0]["GroupId"]
        else:
            group = ec2.create_security_group(**self._group_request(vpc))["GroupId"]
        self._groups[key] = group
        return [group]

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
        req = run_instances_request(
            spec,
            image_id=self.config.aws_image_id or DEFAULT_IMAGE,
            zone=zone,
            security_group_ids=self.ensure_security_group(region),
            instance_profile=self.ensure_instance_profile(),
            config=self.config,
            user_data=aws_user_data(spec),
        )
        for attempt in range(8):
            try:
                resp = ec2.run_instances(**req)
                break
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                message = exc.response["Error"].get("Message", "")
                if code in CAPACITY_CODES:
                    raise CapacityError(f"{code} in {zone or region}: {message}") from None
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
            },
        )
        self._launched[instance.id] = instance
        return instance

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
        ec2 = self.client("ec2", instance.info.get("aws_region") or split_zone(instance.region or "")[0])
        try:
            ec2.terminate_instances(InstanceIds=[instance.id])
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "InvalidInstanceID.NotFound":
                raise

    def _prices(self, instance_type: str, regions: list[str] | None) -> dict[str, Price]:
        """Latest spot price per availability zone (on-demand from the built-in table)."""
        table = lookup_price(instance_type, "aws")
        on_demand = table.on_demand if table else 0.0
        if regions is None and self.config.regions == "cheapest" and not self.config.region:
            wanted = list(CHEAPEST_REGIONS)
        else:
            wanted = [r for r in (regions or [self.default_region()]) if r]
        out: dict[str, Price] = {}
        since = datetime.now(timezone.utc) - timedelta(hours=3)
        for name in wanted:
            region, zone = split_zone(name)
            try:
                rows = self.client("ec2", region).describe_spot_price_history(
                    InstanceTypes=[instance_type],
                    ProductDescriptions=["Linux/UNIX"],
                    StartTime=since,
                    **({"AvailabilityZone": zone} if zone else {}),
                )["SpotPriceHistory"]
            except (ClientError, BotoCoreError):
                if table:
                    out[name] = Price(table.spot, table.on_demand, table.source)
                continue
            latest: dict[str, dict[str, Any]] = {}
            for row in rows:
                az = row["AvailabilityZone"]
                if zone and az != zone:
                    continue
                if az not in latest or row["Timestamp"] > latest[az]["Timestamp"]:
                    latest[az] = row
            for az, row in latest.items():
                out[az] = Price(
                    float(row["SpotPrice"]),
                    on_demand,
                    f"EC2 spot price history {row['Timestamp']:%Y-%m-%d %H:%M}; on-demand: built-in table",
                )
        return out

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
                                info={"aws_region": region},
                            ),
                            tags[JOB_TAG],
                        )

    def close(self) -> None:
        """Safety net: terminate anything this provider launched and did not end."""
        for instance in list(self._launched.values()):
            if instance.id not in self._terminated:
                try:
                    self._terminate(instance)
                except (ClientError, BotoCoreError):
                    pass
