"""A lazy registry of providers (fsspec's `known_implementations` pattern).

Names map to "module:Class" strings and are imported on first use, so `import spotnb` never
imports a cloud SDK. Third parties register through the `spotnb.providers` entry point group.
"""
from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from spotnb.errors import ProviderUnavailable

if TYPE_CHECKING:
    from spotnb.providers.base import Provider

__all__ = ["registry", "get_provider_class", "known_providers"]

_KNOWN: dict[str, dict[str, str]] = {
    "local": {"class": "spotnb.providers.local:LocalProvider", "err": ""},
    "aws": {"class": "spotnb.providers.aws:AWSProvider", "err": "pip install 'spotnb[aws]'"},
    "azure": {"class": "spotnb.providers.azure:AzureProvider", "err": "pip install 'spotnb[azure]'"},
    "gcp": {"class": "spotnb.providers.gcp:GCPProvider", "err": "pip install 'spotnb[gcp]'"},
}
known_providers: Mapping[str, Mapping[str, str]] = MappingProxyType(_KNOWN)
_entry_points_loaded = False


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points
    for ep in entry_points(group="spotnb.providers"):
        _KNOWN.setdefault(ep.name, {"class": ep.value.replace(":", ":", 1), "err": ""})


def registry() -> Mapping[str, Mapping[str, str]]:
    """Read-only view of every provider name spotnb knows."""
    _load_entry_points()
    return known_providers


def get_provider_class(name: str) -> "type[Provider]":
    """Import and return the provider class; a missing extra raises with the pip command."""
    entry = registry().get(name)
    if entry is None:
        raise ProviderUnavailable(f"unknown provider {name!r}; known: {sorted(registry())}")
    module_name, _, cls_name = entry["class"].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = entry.get("err") or "install its package"
        raise ProviderUnavailable(f"provider {name!r} needs packages that are not installed "
                                  f"({exc.name}): {hint}") from exc
    return getattr(module, cls_name)
