"""The registry of providers: name → `ProviderInfo` (settings model, class to import lazily).

Built-in providers are listed here; third parties register through the `spotnb.providers`
entry-point group (the entry point names a `ProviderInfo`; the group keeps that name for them).
Provider classes are imported on first use (fsspec's `known_implementations` pattern), so
`import spotnb` imports no cloud SDK; the settings models are light and are read at import to
compose `spot.Config`. It lives in `spotnb.settings`, not in `spotnb.providers`, because
`Config` is composed from it: the settings side must not import the providers' package.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from spotnb.errors import ProviderUnavailable
from spotnb.settings.any import AnySettings
from spotnb.settings.aws import AWSSettings
from spotnb.settings.azure import AzureSettings
from spotnb.settings.base import ProviderSettings
from spotnb.settings.gcp import GCPSettings
from spotnb.settings.local import LocalSettings

if TYPE_CHECKING:
    from spotnb.providers.base import Provider

__all__ = [
    "registry",
    "get_provider_class",
    "provider_info",
    "describe_providers",
    "ProviderInfo",
    "ENTRY_POINT_GROUP",
]

# the logger and the entry-point group keep their names: users filter on the one, and third
# parties register under the other
log = logging.getLogger("spotnb.providers")

ENTRY_POINT_GROUP = "spotnb.providers"


@dataclass(frozen=True)
class ProviderInfo:
    """One registered provider. `provider`: "module:Class", imported on first use;
    `settings`: its settings model (light); `install`: what to install for its SDK."""

    name: str
    provider: str
    settings: type[ProviderSettings]
    install: str = ""
    description: str = ""
    builtin: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        prefix = f"{self.name}_"
        bad = [f for f in self.settings.model_fields if not f.startswith(prefix)]
        if bad:
            raise ValueError(
                f"provider {self.name!r}: settings fields {bad} do not start with "
                f"{prefix!r} (every provider's fields carry its prefix)"
            )

    def load(self) -> type[Provider]:
        module_name, _, cls_name = self.provider.partition(":")
        module = importlib.import_module(module_name)
        cls: type[Provider] = getattr(module, cls_name)
        return cls


_BUILTIN = (
    ProviderInfo(
        "local",
        "spotnb.providers.local.provider:LocalProvider",
        LocalSettings,
        description="the local spot market: processes on this machine, really killed",
        builtin=True,
    ),
    ProviderInfo(
        "aws",
        "spotnb.providers.aws.provider:AWSProvider",
        AWSSettings,
        install="pip install 'spotnb[aws]'",
        description="AWS EC2 Spot",
        builtin=True,
    ),
    ProviderInfo(
        "azure",
        "spotnb.providers.azure.provider:AzureProvider",
        AzureSettings,
        install="pip install 'spotnb[azure]'",
        description="Azure Spot VMs",
        builtin=True,
    ),
    ProviderInfo(
        "gcp",
        "spotnb.providers.gcp.provider:GCPProvider",
        GCPSettings,
        install="pip install 'spotnb[gcp]'",
        description="GCP Spot VMs",
        builtin=True,
    ),
    ProviderInfo(
        "any",
        "spotnb.providers.multi:AnyCloudProvider",
        AnySettings,
        install="pip install 'spotnb[aws,azure,gcp]' (the clouds you use)",
        description="the cheapest zone of the clouds you have credentials for (AWS, Azure, GCP)",
        builtin=True,
    ),
)
_KNOWN: dict[str, ProviderInfo] = {info.name: info for info in _BUILTIN}
_entry_points_loaded = False
#: plugins that failed to load, by name: what went wrong, for "unknown provider"
_BROKEN: dict[str, str] = {}


def _load_entry_points() -> None:
    """Add the providers other packages register. One that cannot be loaded is left out with
    a warning naming it (a broken plugin must not stop `import spotnb`)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _KNOWN:
            continue
        try:
            info = ep.load()
        except Exception as exc:  # noqa: BLE001 - any error of a third party's import
            log.warning(
                "provider %r (entry point %s) could not be loaded and is left out: %r", ep.name, ep.value, exc
            )
            _BROKEN[ep.name] = f"its plugin (entry point {ep.value}) failed to load: {exc!r}"
            continue
        if not isinstance(info, ProviderInfo) or info.name != ep.name:
            log.warning(
                "provider %r: entry point %s is not a ProviderInfo named %r; left out",
                ep.name,
                ep.value,
                ep.name,
            )
            _BROKEN[ep.name] = f"its plugin's entry point {ep.value} is not a ProviderInfo named {ep.name!r}"
            continue
        _KNOWN[info.name] = info


def registry() -> Mapping[str, ProviderInfo]:
    """Read-only view of every provider spotnb knows, built-ins first."""
    _load_entry_points()
    return MappingProxyType(_KNOWN)


def provider_info(name: str) -> ProviderInfo:
    info = registry().get(name)
    if info is None:
        if name in _BROKEN:  # installed, but broken: "unknown" would send the user to the wrong fix
            raise ProviderUnavailable(
                f"provider {name!r} is installed, but {_BROKEN[name]}; fix or reinstall the package "
                f"that provides it (the providers that load: {sorted(registry())})"
            )
        raise ProviderUnavailable(f"unknown provider {name!r}; choose one of {sorted(registry())}")
    return info


def get_provider_class(name: str) -> type[Provider]:
    """Import and return the provider class; a missing extra raises with the pip command."""
    info = provider_info(name)
    try:
        return info.load()
    except ImportError as exc:
        hint = info.install or "install its package"
        raise ProviderUnavailable(
            f"provider {name!r} needs packages that are not installed ({exc.name}): {hint}"
        ) from exc


def describe_providers() -> list[dict[str, Any]]:
    """What `spotnb providers` and the dry run show: each provider, whether its SDK imports,
    what it cannot do (with the reason) and its Config fields."""
    rows = []
    for name, info in registry().items():
        try:
            cls = info.load()
        except ImportError:
            installed, unsupported = False, {}
        else:
            installed = True
            unsupported = {feature.value: why for feature, why in cls.unsupported.items()}
        rows.append(
            {
                "name": name,
                "description": info.description,
                "installed": installed,
                "install": info.install,
                "builtin": info.builtin,
                "unsupported": unsupported,
                "fields": list(info.settings.model_fields),
            }
        )
    return rows
