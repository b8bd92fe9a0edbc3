"""`spotnb doctor --provider aws`: the AWS checks (see `spotnb.doctor.report`).

Every client has a 3 s connect and 5 s read timeout and makes one attempt. What is asked:
STS `GetCallerIdentity` (credentials), EC2 `DescribeRegions` / `DescribeAvailabilityZones`
(region), `DescribeInstanceTypes` / `DescribeInstanceTypeOfferings` (instance type), Service
Quotas `GetServiceQuota` (the family's spot vCPU quota), IAM `GetInstanceProfile` and
`SimulatePrincipalPolicy` (the VM's identity), SSM `GetParameter` and EC2 `DescribeImages`
(image), and the provider's own spot price fetch (`AWSProvider.prices`).
"""

from __future__ import annotations

import difflib
import itertools
import json
import threading
from typing import TYPE_CHECKING, Any

from spotnb.doctor.checks import (
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    Check,
    Result,
    brief,
    bucket_of,
    fail,
    is_unreachable,
    ok,
    price_result,
    store_check,
    unexpected,
    unknown,
)

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = ["checks", "spot_quota_of", "SOURCES"]

#: what botocore's `Credentials.method` says, in words
SOURCES = {
    "env": "environment variables ($AWS_ACCESS_KEY_ID)",
    "shared-credentials-file": "the shared credentials file (~/.aws/credentials)",
    "config-file": "the config file (~/.aws/config)",
    "sso": "AWS IAM Identity Center (SSO)",
    "iam-role": "the instance role (EC2 instance metadata)",
    "container-role": "the container role (ECS/EKS credentials endpoint)",
    "assume-role": "an assumed role (the profile's role_arn)",
    "assume-role-with-web-identity": "a web identity token ($AWS_WEB_IDENTITY_TOKEN_FILE)",
    "custom-process": "the profile's credential_process",
    "explicit": "credentials passed to the session",
}
#: error codes of credentials AWS refused (expired, revoked, mistyped)
_REFUSED = {
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
    "AuthFailure",
    "RequestExpired",
}
_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess"}
_STORE_ACTIONS = ["s3:PutObject", "s3:GetObject", "s3:DeleteObject"]
_CREATE_PROFILE = [
    "iam:CreateRole",
    "iam:PutRolePolicy",
    "iam:CreateInstanceProfile",
    "iam:AddRoleToInstanceProfile",
    "iam:PassRole",
]


#: EC2's spot vCPU quotas by instance family (the letters before the generation's digit)
_SPOT_QUOTAS = (
    ("trn", "All Trn Spot Instance Requests", "L-6B0D517C"),
    ("dl", "All DL Spot Instance Requests", "L-85EED4F7"),
    ("inf", "All Inf Spot Instance Requests", "L-B5D1601B"),
    ("vt", "All G and VT Spot Instance Requests", "L-3819A6DF"),
    ("g", "All G and VT Spot Instance Requests", "L-3819A6DF"),
    ("p", "All P Spot Instance Requests", "L-7212CCBC"),
    ("f", "All F Spot Instance Requests", "L-88CF9481"),
    ("x", "All X Spot Instance Requests", "L-E3A00192"),
)
_STANDARD = ("All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests", "L-34B43A08")


def spot_quota_of(instance_type: str) -> tuple[str, str]:
    """(name, Service Quotas code) of the spot vCPU quota `instance_type` counts against: the
    provider's own table where this spotnb has it (`spotnb.providers.quotas`, which also
    reads a refused launch), else the same table here."""
    try:  # the quota errors of issue #25 item 4 bring it
        from spotnb.providers.quotas import aws_spot_quota  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        family = "".join(itertools.takewhile(str.isalpha, instance_type.lower()))
        return next(((n, c) for start, n, c in _SPOT_QUOTAS if family.startswith(start)), _STANDARD)
    return aws_spot_quota(instance_type)


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Code") or "")
    return ""


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Message") or "")
    return str(exc)


class _Clients:
    """boto3 clients with short timeouts and one attempt, made one at a time (creating clients
    from one session is not thread-safe)."""

    def __init__(self, session: Any) -> None:
        from botocore.config import Config as BotoConfig

        self.session = session
        self.boto_config = BotoConfig(
            connect_timeout=CONNECT_TIMEOUT,
            read_timeout=READ_TIMEOUT,
            retries={"total_max_attempts": 1, "mode": "standard"},
        )
        self._lock = threading.Lock()
        self._made: dict[tuple[str, str], Any] = {}

    def __call__(self, service: str, region: str) -> Any:
        with self._lock:
            key = (service, region)
            if key not in self._made:
                self._made[key] = self.session.client(service, region_name=region, config=self.boto_config)
            return self._made[key]


def checks(config: Config, provider_cls: Any, session: Any = None, **_: Any) -> list[Check]:
    """The AWS checks for `config`; `session`: a boto3 Session (default: boto3's standard one)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from spotnb.providers.aws.requests import DEFAULT_IMAGE, split_zone

    session = session or boto3.session.Session()
    clients = _Clients(session)

    class _Provider(provider_cls):
        """The provider as spotnb runs it, with the doctor's short-timeout clients."""

        def client(self, service: str, region: str | None = None) -> Any:
            return clients(service, region or self.default_region())

    provider = _Provider(config, session=session)
    home = session.region_name or "us-east-1"  # where account-wide calls go
    regions = config.candidate_regions()
    first = next((r for r in regions if r), None) if isinstance(regions, list) else None
    region, zone = split_zone(first) if first else (provider.default_region(), None)
    if first:
        where_from = "Config.region" if config.region else "the first of Config.regions"
    elif regions == "cheapest":
        where_from = "regions='cheapest' ranks every region offering the type; checking the default"
    else:
        where_from = "the default: $AWS_DEFAULT_REGION or the profile's, else us-east-1"
    itype = (
        config.instance_type if isinstance(config.instance_type, str) else config.instance_type.get("aws", "")
    )
    store_url = config.store_url()
    on_s3 = store_url.startswith(("s3://", "s3a://"))

    def credentials(_: dict[str, Result]) -> Result:
        hint = provider_cls.credentials_hint
        try:
            creds = session.get_credentials()
        except BotoCoreError as exc:  # a profile that does not exist, a broken config file
            return fail(f"the AWS configuration cannot be read: {brief(exc)}", hint)
        if creds is None:
            return fail("no AWS credentials found", hint)
        source = SOURCES.get(getattr(creds, "method", ""), getattr(creds, "method", "") or "botocore")
        if session.profile_name and session.profile_name != "default" and "profile" not in source:
            source += f", profile {session.profile_name!r}"
        try:
            me = clients("sts", home).get_caller_identity()
        except ClientError as exc:
            code = _code(exc)
            if code in _REFUSED:
                return fail(
                    f"AWS refused the credentials from {source} ({code}: {_message(exc)})",
                    "they are expired, revoked or mistyped: get new ones (aws sso login, aws configure, "
                    "or a new session token)",
                )
            return unexpected("aws", exc)
        except BotoCoreError as exc:
            if is_unreachable(exc):
                return unexpected("aws", exc)
            # an SSO token that expired, a credential_process that failed
            return fail(
                f"the credentials from {source} cannot be used: {brief(exc)}", "aws sso login, or " + hint
            )
        arn = str(me.get("Arn", ""))
        return ok(f"{source}: account {me.get('Account')}, {arn}", arn=arn, account=me.get("Account"))

    def region_check(_: dict[str, Result]) -> Result:
        found = clients("ec2", home).describe_regions(AllRegions=True)["Regions"]
        names = {str(r["RegionName"]): str(r.get("OptInStatus", "")) for r in found}
        if region not in names:
            close = difflib.get_close_matches(region, list(names), n=2, cutoff=0.6)
            return fail(
                f"{region!r} is not an AWS region ({where_from})",
                (f"did you mean {' or '.join(close)}? " if close else "")
                + "set Config.region to an AWS region",
            )
        if names[region] == "not-opted-in":
            return fail(
                f"{region} is not enabled for this account",
                f"enable it: aws account enable-region --region-name {region} "
                "(or the console: Account, AWS Regions)",
            )
        if zone:
            try:
                clients("ec2", region).describe_availability_zones(ZoneNames=[zone])
            except ClientError as exc:
                if _code(exc).startswith("InvalidParameterValue") or "zone" in _message(exc).lower():
                    return fail(
                        f"{region} has no availability zone {zone!r}",
                        f"aws ec2 describe-availability-zones --region {region}",
                    )
                return unexpected("aws", exc)
        return ok(f"{zone or region} ({where_from})", region=region)

    def instance_type(_: dict[str, Result]) -> Result:
        ec2 = clients("ec2", region)
        try:
            info = ec2.describe_instance_types(InstanceTypes=[itype])["InstanceTypes"][0]
        except ClientError as exc:
            if _code(exc) in ("InvalidInstanceType", "InvalidParameterValue"):
                from spotnb.market.prices import known_instance_types

                close = difflib.get_close_matches(
                    itype, [t for t in known_instance_types() if t != itype], n=2, cutoff=0.7
                )
                return fail(
                    f"EC2 has no instance type {itype!r}",
                    (f"did you mean {' or '.join(close)}? " if close else "")
                    + "set Config.instance_type (aws ec2 describe-instance-types lists them)",
                )
            return unexpected("aws", exc)
        vcpus = int(info["VCpuInfo"]["DefaultVCpus"])
        gpus = [
            f"{g.get('Count', 1)} × {g.get('Manufacturer', '')} {g.get('Name', '')}".replace("  ", " ")
            for g in (info.get("GpuInfo") or {}).get("Gpus", [])
        ]
        filters = [{"Name": "instance-type", "Values": [itype]}]
        if zone:
            filters.append({"Name": "location", "Values": [zone]})
        offered = ec2.describe_instance_type_offerings(
            LocationType="availability-zone" if zone else "region", Filters=filters
        )["InstanceTypeOfferings"]
        shape = f"{vcpus} vCPUs" + (f", {', '.join(gpus)}" if gpus else ", no GPU")
        if not offered:
            return fail(
                f"{itype} ({shape}) is not offered in {zone or region}",
                "pick another region or zone, or regions='cheapest' (it ranks only those that offer it)",
            )
        return ok(f"{itype}: {shape}, offered in {zone or region}", vcpus=vcpus)

    def quota(inputs: dict[str, Result]) -> Result:
        vcpus = int(inputs["instance type"].data["vcpus"])
        need = vcpus * config.instances
        name, code = spot_quota_of(itype)
        sq = clients("service-quotas", region)
        try:
            try:
                got = sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)
            except ClientError as exc:
                if _code(exc) != "NoSuchResourceException":
                    raise
                got = sq.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)
            limit = float(got["Quota"]["Value"])
        except ClientError as exc:
            if _code(exc) in _DENIED:
                return unknown(
                    f"may not read Service Quotas ({_code(exc)}): {name!r} ({code}) not checked",
                    f"allow servicequotas:GetServiceQuota, or look in the console: "
                    f"https://{region}.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/{code}",
                )
            return unexpected("aws", exc)
        many = f"{config.instances} × " if config.instances > 1 else ""
        if limit < need:
            return fail(
                f"{name!r} ({code}) in {region} is {limit:g} vCPUs; {many}{itype} needs {need}",
                f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
                f"--desired-value {need} --region {region} (or the console: "
                f"https://{region}.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/{code})",
            )
        return ok(
            f"{name!r} ({code}) in {region}: {limit:g} vCPUs, {many}{itype} needs {need} "
            "(spot vCPUs already running count against it too)"
        )

    def store(_: dict[str, Result]) -> Result:
        return store_check(config)

    def identity(inputs: dict[str, Result]) -> Result:
        if not on_s3:
            return unknown(
                f"the store is not on S3 ({store_url}): a VM on AWS reaches it with credentials on its "
                "image; not checked"
            )
        bucket, prefix = bucket_of(store_url)
        iam = clients("iam", home)
        name = config.aws_instance_profile or provider.profile_name()
        caller = str(inputs["credentials"].data.get("arn", ""))
        try:
            profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        except ClientError as exc:
            if _code(exc) != "NoSuchEntity":
                if _code(exc) in _DENIED:
                    return unknown(
                        f"may not read instance profile {name!r} ({_code(exc)})",
                        "allow iam:GetInstanceProfile",
                    )
                return unexpected("aws", exc)
            if config.aws_instance_profile:
                return fail(
                    f"Config.aws_instance_profile: this account has no instance profile {name!r}",
                    "create it (a role EC2 may assume, allowed s3:GetObject/PutObject/DeleteObject on "
                    "the store), or leave aws_instance_profile unset: spotnb then creates one limited to "
                    "the store's bucket",
                )
            return _may_create(iam, caller, name, bucket)
        roles = profile.get("Roles") or []
        if not roles:
            return fail(
                f"instance profile {name!r} has no role",
                f"aws iam add-role-to-instance-profile --instance-profile-name {name} --role-name <role>",
            )
        role = roles[0]
        objects = f"arn:aws:s3:::{bucket}/{prefix + '/' if prefix else ''}jobs/spotnb-doctor"
        try:
            denied = _denied(iam, str(role["Arn"]), _STORE_ACTIONS, objects)
            denied += _denied(iam, str(role["Arn"]), ["s3:ListBucket"], f"arn:aws:s3:::{bucket}")
        except ClientError as exc:
            if _code(exc) in _DENIED:
                return unknown(
                    f"instance profile {name!r} (role {role['RoleName']}) exists; whether it may use the "
                    "store "
                    f"is not checked: iam:SimulatePrincipalPolicy denied",
                    "allow iam:SimulatePrincipalPolicy to check it",
                )
            return unexpected("aws", exc)
        scope = (
            "simulated on the role's IAM policies; not checked: the bucket policy, SCPs, a KMS key's policy"
        )
        if denied:
            policy = {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": _STORE_ACTIONS,
                        "Resource": f"arn:aws:s3:::{bucket}/{prefix + '/' if prefix else ''}*",
                    },
                    {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{bucket}"},
                ],
            }
            return fail(
                f"instance profile {name!r} (role {role['RoleName']}) may not {', '.join(denied)} in "
                f"{store_url} ({scope})",
                f"aws iam put-role-policy --role-name {role['RoleName']} --policy-name spotnb-store "
                f"--policy-document '{json.dumps(policy, separators=(',', ':'))}'",
            )
        return ok(
            f"instance profile {name!r} (role {role['RoleName']}) may read, write and delete in "
            f"{store_url} ({scope})"
        )

    def image(_: dict[str, Result]) -> Result:
        ref = config.aws_image_id or DEFAULT_IMAGE
        ami, via = ref, ""
        if ref.startswith("resolve:ssm:"):
            path = ref[len("resolve:ssm:") :]
            whose = "of Config.aws_image_id" if config.aws_image_id else "spotnb uses by default"
            try:
                ami = str(clients("ssm", region).get_parameter(Name=path)["Parameter"]["Value"])
            except ClientError as exc:
                if _code(exc) in ("ParameterNotFound", "ValidationException"):
                    return fail(
                        f"no SSM parameter {path} in {region}: the image {whose} is not published there",
                        "set Config.aws_image_id to an AMI of this region with CUDA and torch "
                        "(aws ssm get-parameters-by-path --path /aws/service/deeplearning/ami/x86_64 "
                        "lists the Deep Learning AMIs)",
                    )
                if _code(exc) in _DENIED:
                    return unknown(
                        f"may not read SSM parameter {path} ({_code(exc)})", "allow ssm:GetParameter"
                    )
                return unexpected("aws", exc)
            via = f" (from {path})"
        try:
            found = clients("ec2", region).describe_images(ImageIds=[ami])["Images"]
        except ClientError as exc:
            if _code(exc).startswith("InvalidAMIID"):
                found = []
            else:
                return unexpected("aws", exc)
        if not found:
            return fail(
                f"no image {ami} in {region}{via}",
                "set Config.aws_image_id to an AMI of this region (AMI ids differ per region)",
            )
        state = found[0].get("State", "available")
        if state != "available":
            return fail(
                f"image {ami} in {region} is {state}{via}", "set Config.aws_image_id to an available AMI"
            )
        return ok(f"{ami} {found[0].get('Name', '')!r} in {region}{via}")

    def prices(_: dict[str, Result]) -> Result:
        return price_result("aws", provider, itype, zone or region, live_word="EC2 spot price history")

    store_needs = ("credentials",) if on_s3 else ()
    return [
        Check("credentials", credentials, (), "aws"),
        Check("region", region_check, ("credentials",), "aws"),
        Check("instance type", instance_type, ("region",), "aws"),
        Check("spot quota", quota, ("instance type",), "aws"),
        Check("store", store, store_needs, "aws"),
        Check("identity", identity, ("credentials",), "aws"),
        Check("image", image, ("region",), "aws"),
        Check("prices", prices, ("region",), "aws"),
    ]


def _denied(iam: Any, source: str, actions: list[str], resource: str) -> list[str]:
    """The actions `source` (a role or user ARN) may not do on `resource`, as IAM simulates."""
    got = iam.simulate_principal_policy(PolicySourceArn=source, ActionNames=actions, ResourceArns=[resource])
    return [str(r["EvalActionName"]) for r in got["EvaluationResults"] if r.get("EvalDecision") != "allowed"]


def _iam_arn(caller: str) -> str | None:
    """The IAM ARN that SimulatePrincipalPolicy takes for a caller: an assumed role's role; None
    for the root user (it may do anything) or a federated user."""
    parts = caller.split(":", 5)
    if len(parts) < 6:
        return None
    kind, _, rest = parts[5].partition("/")
    if kind == "assumed-role":
        return f"arn:aws:iam::{parts[4]}:role/{rest.split('/', 1)[0]}"
    if kind in ("user", "role"):
        return caller.replace(":sts::", ":iam::")
    return None


def _may_create(iam: Any, caller: str, name: str, bucket: str) -> Result:
    """The default instance profile does not exist yet: spotnb creates it at the first launch,
    if the caller may."""
    from botocore.exceptions import ClientError

    what = (
        f"instance profile {name!r} does not exist yet: spotnb creates it at the first launch "
        f"(a role allowed s3:GetObject/PutObject/DeleteObject in bucket {bucket} only)"
    )
    source = _iam_arn(caller)
    if caller.endswith(":root"):
        return ok(f"{what}; you are the account's root user")
    if source is None:
        return unknown(f"{what}; whether you may create it is not checked ({caller or 'caller unknown'})")
    try:
        denied = _denied(iam, source, _CREATE_PROFILE, "*")
    except ClientError as exc:
        if _code(exc) in _DENIED:
            return unknown(
                f"{what}; whether you may create it is not checked (iam:SimulatePrincipalPolicy denied)"
            )
        return unexpected("aws", exc)
    if denied:
        return fail(
            f"{what}, but you may not: {', '.join(denied)} denied for {source}",
            "ask an administrator to create it (the dry run lists the requests) and set "
            "Config.aws_instance_profile",
        )
    return ok(f"{what}; you may create it")
