"""Settings of the AWS EC2 Spot provider.

Fields carry the provider's prefix; `spot.Config` inherits them (see `spotnb.providers.info`).
Imports no SDK: `import spotnb` reads this module to compose `Config`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from spotnb.providers.info import ProviderSettings, no_bool

__all__ = ["AWSSettings"]


class AWSSettings(ProviderSettings):
    """AWS EC2 Spot: image, key pair, instance profile, network, max price, disk."""

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

    @field_validator("aws_disk_gb", mode="before")
    @classmethod
    def _aws_no_bool(cls, v: Any) -> Any:
        return no_bool(v)
