"""Settings of the GCP Spot VM provider.

Fields carry the provider's prefix; `spot.Config` inherits them (see `spotnb.settings.base`).
Imports no SDK: `import spotnb` reads this module to compose `Config`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from spotnb.settings.base import ProviderSettings, no_bool

__all__ = ["GCPSettings"]


class GCPSettings(ProviderSettings):
    """GCP Spot VMs: project, image, service account, network, accelerators, disk, and the image of
    the coordinator of a job on several instances."""

    prefix: ClassVar[str] = "gcp_"

    gcp_project: str | None = Field(None, description="Default: the credentials' project.")
    gcp_image: str | None = Field(
        None, description="Image URL (default: the Deep Learning VM PyTorch image family with CUDA)."
    )
    gcp_service_account: str | None = Field(
        None,
        description="Service account email the VM reaches the store with (default: the project's default).",
    )
    gcp_network: str | None = Field(None, description="Network URL (default: global/networks/default).")
    gcp_subnetwork: str | None = Field(None, description="Subnetwork URL (default: the network's).")
    gcp_accelerator_type: str | None = Field(
        None,
        description="GPU type for N1 machine types, e.g. nvidia-tesla-t4 (A2/A3/G2 types include theirs).",
    )
    gcp_accelerator_count: int = Field(1, ge=1, description="GPUs of gcp_accelerator_type.")
    gcp_disk_gb: int = Field(100, ge=10, description="Boot disk size.")
    gcp_coordinator_image: str | None = Field(
        None,
        description="Image of the coordinator of a job on several instances "
        "(default: gcp_image, else the instances' default).",
    )

    @field_validator("gcp_accelerator_count", "gcp_disk_gb", mode="before")
    @classmethod
    def _gcp_no_bool(cls, v: Any) -> Any:
        return no_bool(v)
