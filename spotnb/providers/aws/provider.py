"""AWS EC2 spot instances through boto3 (`pip install 'spotnb[aws]'`).

One `run_instances` per incarnation (`spotnb.providers.aws.requests`: a one-time spot market
option, the Deep Learning AMI or the user's image, a security group without inbound rules, an
instance profile for the store, and the bootstrap script as `UserData`). The instance
terminates itself when the agent exits (`InstanceInitiatedShutdownBehavior=terminate`). Spot
prices per availability zone come from `describe_spot_price_history`, on-demand prices from the
built-in table (`spotnb.providers.aws.catalog`).

A job on several instances (`Config.instances > 1`) also gets a coordinator, an on-demand
instance behind a network interface fixed for the job (`spotnb.providers.aws.coordinator`).

Credentials come from boto3's standard chain (env, profile, SSO, instance role) and are never
copied anywhere. `AWS_ENDPOINT_URL` (honoured by boto3) points everything at moto in tests.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from spotnb.errors import CapacityError, ConfigError
from spotnb.providers.aws.catalog import AWSCatalog
from spotnb.providers.aws.coordinator import AWSCoordinator, job_group_name
from spotnb.providers.aws.requests import (
    CAPACITY_CODES,
    DEFAULT_IMAGE,
    SECURITY_GROUP,
    instance_profile_requests,
    run_instances_request,
    security_group_request,
    split_zone,
    store_bucket,
)
from spotnb.providers.base import (
    Feature,
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    Provider,
)
from spotnb.providers.bootstrap import aws_user_data, require_remote_store
from spotnb.providers.cleanup import JOB_TAG
from spotnb.providers.coordinator import ROLE_TAG, planned_hosting
from spotnb.providers.quotas import aws_quota_error, aws_spot_quota

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = ["AWSProvider"]

log = logging.getLogger("spotnb.providers.aws.provider")

_SPOT_REASONS = ("Server.SpotInstanceTermination", "Server.SpotInstanceShutdown")


class AWSProvider(AWSCoordinator, AWSCatalog, Provider):
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

    def __init__(self, config: Config, session: Any = None) -> None:
        super().__init__(config)
        self.session = session or boto3.session.Session()
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str | None], str] = {}
        self._profile_ready: str | None = None
        self._launched: dict[str, Instance] = {}
        self._terminated: set[str] = set()
        self._setup_lock = threading.Lock()  # the groups and the profile, set up once
        self._init_coordinators()

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
        return f"spotnb-{store_bucket(store)[0]}"[:64]

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
                    "body": security_group_request("<default VPC id>"),
                }
            )
        profile = self.profile_name()
        if profile and not self.config.aws_instance_profile:
            when = "once, if the instance profile is missing"
            steps.extend(instance_profile_requests(profile, self.config.store_url(), when))
        coordinator: dict[str, Any] | None = None
        with planned_hosting(self, spec.job_id) as planned:
            if planned:
                coordinator = self.plan_coordinator(spec, steps)
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
                group = ec2.create_security_group(**security_group_request(vpc))["GroupId"]
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
            for step in instance_profile_requests(name, self.config.store_url(), "now"):
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
        bucket = store_bucket(url)[0]

        def fetch() -> str:
            where = self.client("s3").get_bucket_location(Bucket=bucket).get("LocationConstraint")
            return str(where or "us-east-1")  # the API says None for us-east-1

        try:
            region, _ = cached(f"aws-bucket-region-{bucket}", 86400.0, fetch)
        except (ClientError, BotoCoreError, OSError) as exc:
            log.debug("region of bucket %s: %r", bucket, exc)
            return ("aws", None)
        return ("aws", str(region))

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
        self.close_coordinators()
