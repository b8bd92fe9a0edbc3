"""Settings of `provider="any"`: placement across the clouds the user has credentials for.

Instance type names differ between clouds, so a job on "any" gives one per cloud,
`instance_type={"aws": "g5.xlarge", "azure": "Standard_NC4as_T4_v3", "gcp": "g2-standard-4"}`
(the clouds it names are the ones considered); each cloud's own fields (`aws_*`, `azure_*`,
`gcp_*`) apply as they would with that provider. A zone is named `<cloud>/<zone>`
("aws/us-east-1a", "azure/eastus", "gcp/us-central1-a"), in `regions=[...]` and in the
`allocated` events. Light: no SDK is imported here (`spotnb.providers.multi` is the provider).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, field_validator

from spotnb.settings.aws import AWSSettings
from spotnb.settings.azure import AzureSettings
from spotnb.settings.base import ProviderSettings
from spotnb.settings.gcp import GCPSettings

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = ["ANY_CLOUDS", "AnySettings", "split_zone", "sub_config"]

#: the clouds provider="any" places across
ANY_CLOUDS = ("aws", "azure", "gcp")
#: each cloud's own settings, for its market priors (the settings are light: no SDK)
_CLOUD_SETTINGS: dict[str, type[ProviderSettings]] = {
    "aws": AWSSettings,
    "azure": AzureSettings,
    "gcp": GCPSettings,
}
_EXAMPLE = "{'aws': 'g5.xlarge', 'azure': 'Standard_NC4as_T4_v3', 'gcp': 'g2-standard-4'}"


def split_zone(name: str | None) -> tuple[str | None, str | None]:
    """ "aws/us-east-1a" → ("aws", "us-east-1a"); a name without a cloud → (None, name)."""
    if not name or "/" not in name:
        return None, name
    cloud, _, zone = name.partition("/")
    return cloud, zone or None


def sub_config(config: Config, cloud: str) -> Config:
    """The Config a job on "any" has on `cloud`: that cloud as the provider, its instance
    type, and the candidate zones of that cloud (copied, not validated again: the clouds'
    fields are set beside each other, which only provider="any" allows)."""
    mapping = config.instance_type if isinstance(config.instance_type, dict) else {}
    update: dict[str, Any] = {"provider": cloud, "instance_type": mapping.get(cloud, "")}
    r_cloud, r_zone = split_zone(config.region)
    update["region"] = r_zone if r_cloud == cloud else None
    if isinstance(config.regions, list):
        mine = [z for c, z in map(split_zone, config.regions) if c == cloud and z]
        update["regions"] = mine or None
    return config.model_copy(update=update)


class AnySettings(ProviderSettings):
    """Fields of provider="any" (each cloud's own fields apply too)."""

    prefix: ClassVar[str] = "any_"

    any_clouds: list[str] | None = Field(
        None,
        description="provider='any': the clouds to consider, in order (default: every cloud of "
        "instance_type's mapping for which credentials are found).",
    )

    @field_validator("any_clouds")
    @classmethod
    def _clouds(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        bad = [c for c in v if c not in ANY_CLOUDS]
        if bad or not v:
            raise ValueError(f"{bad or v!r}: give clouds among {list(ANY_CLOUDS)}")
        return v

    @classmethod
    def check_config(cls, config: Config) -> None:
        mapping = config.instance_type
        if not isinstance(mapping, dict):
            raise ValueError(
                f"instance_type: provider='any' needs one type per cloud (the names differ "
                f"between clouds), e.g. instance_type={_EXAMPLE}; got {mapping!r}"
            )
        bad = [c for c in mapping if c not in ANY_CLOUDS]
        if bad:
            raise ValueError(f"instance_type: {bad} are not clouds; the keys are among {list(ANY_CLOUDS)}")
        for wanted in config.any_clouds or []:
            if wanted not in mapping:
                raise ValueError(
                    f"any_clouds: {wanted!r} has no instance type; add instance_type[{wanted!r}] "
                    f"(e.g. {_EXAMPLE}) or leave {wanted!r} out"
                )
        named = [config.region] if config.region else []
        if isinstance(config.regions, list):
            if not config.regions:
                raise ValueError(
                    "regions: the list is empty; give zones as '<cloud>/<zone>' "
                    "(e.g. ['aws/us-east-1a', 'gcp/us-central1-a']) or regions='cheapest'"
                )
            named += config.regions
        elif config.regions != "cheapest" and not named:
            raise ValueError(
                "regions: provider='any' picks among zones of several clouds: set "
                "regions='cheapest' (every zone of the clouds you have credentials for) or "
                "regions=['aws/us-east-1', 'gcp/us-central1-a', ...]"
            )
        for name in named:
            cloud, zone = split_zone(name)
            if cloud not in ANY_CLOUDS or not zone:
                raise ValueError(
                    f"regions: {name!r} does not name its cloud; with provider='any' a zone is "
                    "'<cloud>/<zone>', e.g. 'aws/us-east-1a', 'azure/eastus', 'gcp/us-central1-a'"
                )
            if cloud not in mapping:
                raise ValueError(
                    f"instance_type: {name!r} is on {cloud}, which has no instance type in the "
                    f"mapping {mapping!r}; add instance_type[{cloud!r}] or remove the zone"
                )
            if config.any_clouds and cloud not in config.any_clouds:
                raise ValueError(
                    f"any_clouds: {name!r} is on {cloud}, which any_clouds={config.any_clouds!r} "
                    f"leaves out; add {cloud!r} to any_clouds or remove the zone"
                )
        if config.instances > 1:
            raise ValueError(
                "instances: a job on several instances trains in one network (its coordinator's); "
                "provider='any' places single-instance jobs: pick one cloud (provider='aws', …)"
            )

    @classmethod
    def market_priors(cls, config: Config, zone: str | None = None) -> dict[str, float]:
        """The zone's cloud's priors."""
        cloud, inner = split_zone(zone)
        settings = _CLOUD_SETTINGS.get(cloud or "")
        if settings is None or cloud is None:
            return {}
        return settings.market_priors(sub_config(config, cloud), inner)
