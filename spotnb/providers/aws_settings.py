"""Settings of the AWS EC2 Spot provider.

Fields carry the provider's prefix; `spot.Config` inherits them (see `spotnb.providers.info`).
Imports no SDK: `import spotnb` reads this module to compose `Config`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from spotnb.providers.info import COORDINATOR_IDLE_MINUTES, LIGHTHOUSE_PORT, ProviderSettings, no_bool

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
    aws_coordinator_instance_type: str = Field(
        "t3.small",
        min_length=1,
        description="On-demand instance that hosts the lighthouse of a job on several instances "
        "(it only counts replicas: a small burstable type is plenty).",
    )
    aws_coordinator_image_id: str | None = Field(
        None, description="AMI of the coordinator (default: aws_image_id, else the instances' default AMI)."
    )
    aws_coordinator_port: int = Field(
        LIGHTHOUSE_PORT,
        ge=1024,
        le=65535,
        description="Port of the coordinator's lighthouse (open to the job's group only).",
    )
    aws_coordinator_price: float | None = Field(
        None,
        gt=0,
        description="On-demand $/h of the coordinator for the cost ledger (default: the built-in "
        "figure for its instance type).",
    )
    aws_coordinator_idle_minutes: int = Field(
        COORDINATOR_IDLE_MINUTES,
        ge=10,
        description="The coordinator powers itself off after this long without any replica "
        "connected (a guard against a leak if no controller is left to end it).",
    )

    @field_validator("aws_disk_gb", "aws_coordinator_port", "aws_coordinator_idle_minutes", mode="before")
    @classmethod
    def _aws_no_bool(cls, v: Any) -> Any:
        return no_bool(v)
