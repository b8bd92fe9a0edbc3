"""Settings of the AWS EC2 Spot provider.

Fields carry the provider's prefix; `spot.Config` inherits them (see `spotnb.settings.base`).
Imports no SDK: `import spotnb` reads this module to compose `Config`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from spotnb.settings.base import ProviderSettings, no_bool

__all__ = ["AWSSettings"]


class AWSSettings(ProviderSettings):
    """AWS EC2 Spot: image, key pair, instance profile, network, max price, disk, and the
    on-demand coordinator of a job on several instances."""

    prefix: ClassVar[str] = "aws_"

    aws_image_id: str | None = Field(
        None,
        description="AMI id or 'resolve:ssm:/path' (default: "
        "the latest Deep Learning OSS Nvidia Driver AMI, PyTorch).",
    )
    aws_key_name: str | None = Field(None, description="EC2 key pair (none: no SSH key at all).")
    aws_instance_profile: str | None = Field(
        None,
        description="IAM instance profile the VM uses "
        "to reach the store (default: spotnb creates one "
        "limited to the store's bucket).",
    )
    aws_subnet_id: str | None = Field(None, description="Subnet (default: the default VPC).")
    aws_max_price: float | None = Field(None, gt=0, description="Spot max $/h (default: on-demand).")
    aws_security_group_ids: list[str] | None = Field(
        None, description="Security groups (default: spotnb-no-inbound, created with no inbound rule)."
    )
    aws_disk_gb: int | None = Field(None, ge=8, description="Root volume size (default: the AMI's).")
    # -- the coordinator of a job on several instances (torchft's lighthouse, on demand) --
    # the coordinator's type, price, port and idle time are provider-neutral fields of Config
    # (coordinator_instance_type, …); the image is this cloud's
    aws_coordinator_image_id: str | None = Field(
        None, description="AMI of the coordinator (default: aws_image_id, else the instances' default AMI)."
    )

    @field_validator("aws_disk_gb", mode="before")
    @classmethod
    def _aws_no_bool(cls, v: Any) -> Any:
        return no_bool(v)
