"""The zones of each Compute Engine region, for when `ZonesClient.list` cannot be asked.

A dry run offline (or without Google credentials) and a launch whose credentials may not list
zones expand a region with this table instead of the API. It is the public list of GCE zones
(cloud.google.com/compute/docs/regions-zones) as of `ZONES_AS_OF`; a zone added since is simply
not tried, a zone retired since answers "not found" and the next one is tried. A region missing
from it falls back to `FALLBACK_ZONE_SUFFIXES` in `spotnb.providers.gcp.provider`.
"""

from __future__ import annotations

__all__ = ["REGION_ZONES", "ZONES_AS_OF", "table_zones"]

ZONES_AS_OF = "2025-06"

_ABC = ("a", "b", "c")
#: region → its zone suffixes (most regions have a, b and c; the exceptions are spelled out)
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "africa-south1": _ABC,
    "asia-east1": _ABC,
    "asia-east2": _ABC,
    "asia-northeast1": _ABC,
    "asia-northeast2": _ABC,
    "asia-northeast3": _ABC,
    "asia-south1": _ABC,
    "asia-south2": _ABC,
    "asia-southeast1": _ABC,
    "asia-southeast2": _ABC,
    "australia-southeast1": _ABC,
    "australia-southeast2": _ABC,
    "europe-central2": _ABC,
    "europe-north1": _ABC,
    "europe-north2": _ABC,
    "europe-southwest1": _ABC,
    "europe-west1": ("b", "c", "d"),
    "europe-west2": _ABC,
    "europe-west3": _ABC,
    "europe-west4": _ABC,
    "europe-west6": _ABC,
    "europe-west8": _ABC,
    "europe-west9": _ABC,
    "europe-west10": _ABC,
    "europe-west12": _ABC,
    "me-central1": _ABC,
    "me-central2": _ABC,
    "me-west1": _ABC,
    "northamerica-northeast1": _ABC,
    "northamerica-northeast2": _ABC,
    "northamerica-south1": _ABC,
    "southamerica-east1": _ABC,
    "southamerica-west1": _ABC,
    "us-central1": ("a", "b", "c", "f"),
    "us-east1": ("b", "c", "d"),
    "us-east4": _ABC,
    "us-east5": _ABC,
    "us-south1": _ABC,
    "us-west1": _ABC,
    "us-west2": _ABC,
    "us-west3": _ABC,
    "us-west4": _ABC,
}

REGION_ZONES: dict[str, tuple[str, ...]] = {
    region: tuple(f"{region}-{s}" for s in suffixes) for region, suffixes in _SUFFIXES.items()
}


def table_zones(region: str) -> list[str] | None:
    """The region's zones from the table, sorted by name as `ZonesClient.list` is; None for a
    region the table does not know."""
    zones = REGION_ZONES.get(region)
    return sorted(zones) if zones else None
