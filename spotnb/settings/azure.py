"""Settings of the Azure Spot VM provider.

Fields carry the provider's prefix; `spot.Config` inherits them (see `spotnb.settings.base`).
Imports no SDK: `import spotnb` reads this module to compose `Config`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from spotnb.settings.base import ProviderSettings, no_bool

__all__ = ["AzureSettings"]


class AzureSettings(ProviderSettings):
    """Azure Spot VMs: subscription, resource group, image, eviction policy, identity, disk, and the
    image of the coordinator of a job on several instances."""

    prefix: ClassVar[str] = "azure_"

    azure_subscription_id: str | None = Field(None, description="Default: $AZURE_SUBSCRIPTION_ID.")
    azure_resource_group: str | None = Field(None, description="Resource group for the VMs.")
    azure_image: str | None = Field(
        None,
        description="'publisher:offer:sku:version' or an image "
        "resource id (default: Microsoft's Ubuntu HPC image with GPU drivers).",
    )
    azure_eviction_policy: Literal["Deallocate", "Delete"] = Field(
        "Delete", description="What Azure does to an evicted VM (Delete: nothing left to pay for)."
    )
    azure_max_price: float = Field(
        -1.0, description="Spot max $/h; -1: up to the on-demand price, never evicted for price."
    )
    azure_subnet_id: str | None = Field(None, description="Subnet resource id for the VM's NIC.")
    azure_identity_id: str | None = Field(
        None,
        description="User-assigned managed identity the VM "
        "reaches the store with (Storage Blob Data Contributor).",
    )
    azure_storage_account: str | None = Field(
        None, description="Storage account of an az:// store (default: $AZURE_STORAGE_ACCOUNT_NAME)."
    )
    azure_ssh_public_key: str | None = Field(
        None, description="Admin SSH public key (default: a throwaway key whose private half is never kept)."
    )
    azure_disk_gb: int | None = Field(None, ge=30, description="OS disk size (default: the image's).")
    azure_coordinator_image: str | None = Field(
        None,
        description="Image of the coordinator of a job on several instances "
        "('publisher:offer:sku:version' or an id; default: azure_image, else the instances' default).",
    )

    @field_validator("azure_disk_gb", mode="before")
    @classmethod
    def _azure_no_bool(cls, v: Any) -> Any:
        return no_bool(v)
