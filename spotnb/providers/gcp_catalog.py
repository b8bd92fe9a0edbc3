"""GCP prices from the Cloud Billing catalog: a machine type's spot and on-demand $/h in a
region, priced as GCP bills it — per vCPU, per GB of memory and per attached GPU.

The catalog (`cloudbilling.googleapis.com`, service "Compute Engine" `6F81-5844-456A`) has no
price per machine type: it lists SKUs such as "Spot Preemptible N2 Instance Core running in
Americas" or "Nvidia L4 GPU attached to Spot Preemptible VMs running in Americas", each with the
regions it applies to (`serviceRegions`) and a rate per hour (per GiB-hour for memory). A
machine type's shape (vCPUs, memory, bundled GPUs) comes from Compute Engine's own
`machineTypes.get`. Reading the catalog needs credentials (application default credentials
with the billing read scope; an API key is not used): without them, or for a family or a GPU
this module does not know, the dated table in `spotnb/data/prices.json` stays the answer. The
SKU list (~5 MB over ~20 pages) is cached on disk for a day (`spotnb.price_cache`), so the
price shown says how old it is.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SERVICE",
    "CATALOG_TTL",
    "MachineShape",
    "Rates",
    "rates_from_skus",
    "machine_price",
    "catalog_skus",
]

log = logging.getLogger("spotnb.gcp.catalog")

#: The Compute Engine service in the Cloud Billing catalog.
SERVICE = "services/6F81-5844-456A"
#: Seconds the fetched SKU list is reused (list prices change rarely; spot ones at most monthly).
CATALOG_TTL = 24 * 3600.0

# A machine family's words in its SKUs' descriptions ("<words> Core" / "<words> Ram").
_FAMILY = {
    "n1": "N1 Predefined Instance",
    "n2": "N2 Instance",
    "n2d": "N2D AMD Instance",
    "n4": "N4 Instance",
    "e2": "E2 Instance",
    "c2": "Compute optimized",
    "c2d": "C2D AMD Instance",
    "c3": "C3 Instance",
    "a2": "A2 Instance",
    "a3": "A3 Instance",
    "g2": "G2 Instance",
}
# An accelerator type's name in its SKUs' descriptions ("<name> GPU ...").
_GPU = {
    "nvidia-tesla-t4": "Nvidia Tesla T4",
    "nvidia-tesla-v100": "Nvidia Tesla V100",
    "nvidia-tesla-p100": "Nvidia Tesla P100",
    "nvidia-tesla-p4": "Nvidia Tesla P4",
    "nvidia-tesla-a100": "Nvidia Tesla A100",
    "nvidia-a100-80gb": "Nvidia Tesla A100 80GB",
    "nvidia-l4": "Nvidia L4",
    "nvidia-h100-80gb": "Nvidia H100 80GB",
}


@dataclass(frozen=True)
class MachineShape:
    """What GCP bills a machine type by."""

    cpus: int
    memory_gb: float  # GiB, as the RAM SKUs' unit
    gpus: tuple[tuple[str, int], ...] = ()  # (accelerator type, count) bundled with the type


@dataclass(frozen=True)
class Rates:
    """One region's $/h per unit, spot and on demand: `core[family]`, `ram[family]`, `gpu[type]`."""

    spot: dict[str, dict[str, float]]
    on_demand: dict[str, dict[str, float]]


def _rate(sku: dict[str, Any]) -> float | None:
    """The SKU's hourly unit price (its first tier with a price above zero)."""
    for info in sku.get("pricingInfo") or []:
        expr = info.get("pricingExpression") or {}
        for tier in expr.get("tieredRates") or []:
            price = tier.get("unitPrice") or {}
            value = float(price.get("units") or 0) + float(price.get("nanos") or 0) / 1e9
            if value > 0:
                return value
    return None


def _kind(description: str) -> tuple[str, str] | None:
    """("core"|"ram", family) or ("gpu", accelerator type) for a description this module knows."""
    text = re.sub(r"^Spot Preemptible ", "", description)
    for family, words in _FAMILY.items():
        for part, key in ((" Core running in ", "core"), (" Ram running in ", "ram")):
            if text.startswith(words + part):
                return key, family
    for gpu, name in _GPU.items():
        if text.startswith(name + " GPU ") or description.startswith(name + " GPU "):
            return "gpu", gpu
    return None


def rates_from_skus(skus: list[dict[str, Any]], region: str) -> Rates:
    """The unit rates of `region` from the catalog's SKUs (REST JSON). Commitments, custom,
    sole-tenant and premium SKUs are left out: only the OnDemand and Preemptible (spot) ones."""
    spot: dict[str, dict[str, float]] = {"core": {}, "ram": {}, "gpu": {}}
    on_demand: dict[str, dict[str, float]] = {"core": {}, "ram": {}, "gpu": {}}
    for sku in skus:
        cat = sku.get("category") or {}
        usage = cat.get("usageType")
        if usage not in ("OnDemand", "Preemptible") or region not in (sku.get("serviceRegions") or []):
            continue
        description = str(sku.get("description") or "")
        if "Custom" in description or "Sole Tenancy" in description or "Commitment" in description:
            continue
        kind = _kind(description)
        rate = _rate(sku)
        if kind is None or rate is None:
            continue
        target = spot if usage == "Preemptible" else on_demand
        target[kind[0]].setdefault(kind[1], rate)
    return Rates(spot, on_demand)


def machine_price(machine_type: str, shape: MachineShape, rates: Rates) -> tuple[float, float] | None:
    """(spot, on demand) $/h of `machine_type`, or None when a part of it has no rate (a family
    or GPU this module does not know, or a region without that SKU)."""
    family = machine_type.split("-", 1)[0].lower()
    totals = []
    for table in (rates.spot, rates.on_demand):
        core, ram = table["core"].get(family), table["ram"].get(family)
        if core is None or ram is None:
            return None
        total = shape.cpus * core + shape.memory_gb * ram
        for gpu, count in shape.gpus:
            rate = table["gpu"].get(gpu)
            if rate is None:
                return None
            total += count * rate
        totals.append(round(total, 6))
    return totals[0], totals[1]


def catalog_skus(session: Any) -> list[dict[str, Any]]:
    """Every Compute Engine SKU of the catalog (REST JSON dicts), page by page, through an
    authorized `requests` session (google-auth's `AuthorizedSession`)."""
    url = f"https://cloudbilling.googleapis.com/v1/{SERVICE}/skus"
    skus: list[dict[str, Any]] = []
    token = ""
    for _ in range(200):  # ~20 pages in 2026; a bound against a token that never ends
        params = {"currencyCode": "USD", "pageSize": 5000}
        if token:
            params["pageToken"] = token
        response = session.get(url, params=params, timeout=30)
        response.raise_for_status()
        page = response.json()
        skus.extend(_slim(s) for s in page.get("skus") or [])
        token = page.get("nextPageToken") or ""
        if not token:
            break
    return skus


def _slim(sku: dict[str, Any]) -> dict[str, Any]:
    """What `rates_from_skus` reads of a SKU (the cache holds a tenth of the catalog)."""
    return {
        "description": sku.get("description"),
        "category": {"usageType": (sku.get("category") or {}).get("usageType")},
        "serviceRegions": sku.get("serviceRegions") or [],
        "pricingInfo": [
            {
                "pricingExpression": {
                    "tieredRates": (i.get("pricingExpression") or {}).get("tieredRates") or []
                }
            }
            for i in (sku.get("pricingInfo") or [])[:1]
        ],
    }
