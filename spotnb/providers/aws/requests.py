"""The EC2 and IAM requests of an AWS spot instance, as plain dicts (`AWSProvider` sends them).

`run_instances_request` is one incarnation's `ec2.run_instances`: a one-time spot market option,
the Deep Learning AMI (`DEFAULT_IMAGE`, resolved by EC2 itself from its public SSM parameter, so
a dry run needs no lookup) or the user's image, spotnb's security group without inbound rules
(`security_group_request`), the instance profile that reaches the store's bucket only
(`instance_profile_requests`) and the bootstrap script as `UserData`. Building them apart from
the client lets the dry run show exactly what a launch sends, and lets the tests pin it. The
coordinator's requests live in `spotnb.providers.aws.coordinator`.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from spotnb.providers.base import LaunchSpec
from spotnb.providers.cleanup import job_tags

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "DEFAULT_IMAGE",
    "SECURITY_GROUP",
    "CAPACITY_CODES",
    "split_zone",
    "store_bucket",
    "run_instances_request",
    "security_group_request",
    "instance_profile_requests",
]

DEFAULT_IMAGE = (
    "resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
    "oss-nvidia-driver-gpu-pytorch-2.13-amazon-linux-2023/latest/ami-id"
)
SECURITY_GROUP = "spotnb-no-inbound"
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
_AZ = re.compile(r"^([a-z]{2}(?:-[a-z]+)+-\d+)([a-z])$")


def split_zone(name: str) -> tuple[str, str | None]:
    """ "us-east-1b" → ("us-east-1", "us-east-1b"); "us-east-1" → ("us-east-1", None)."""
    m = _AZ.match(name)
    return (m.group(1), name) if m else (name, None)


def store_bucket(store_url: str) -> tuple[str, str]:
    """ "s3://bucket/a/b" → ("bucket", "a/b")."""
    rest = store_url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def run_instances_request(
    spec: LaunchSpec,
    *,
    image_id: str,
    zone: str | None,
    security_group_ids: list[str],
    instance_profile: str | None,
    config: Config,
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


def security_group_request(vpc_id: str) -> dict[str, Any]:
    """`ec2.create_security_group` for spotnb's no-inbound group (one per VPC, shared by every
    job that names no `Config.aws_security_group_ids`)."""
    return {
        "GroupName": SECURITY_GROUP,
        "VpcId": vpc_id,
        "Description": "spotnb VMs: no inbound rule (all traffic goes out to the store)",
        "TagSpecifications": [
            {"ResourceType": "security-group", "Tags": [{"Key": "spotnb-managed", "Value": "true"}]}
        ],
    }


def instance_profile_requests(name: str, store_url: str, when: str) -> list[dict[str, Any]]:
    """The IAM calls that create the instance profile `name`, whose role may read and write
    the store's objects (`store_url`) and nothing else; `when` says in the plan when each runs."""
    bucket, prefix = store_bucket(store_url)
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
