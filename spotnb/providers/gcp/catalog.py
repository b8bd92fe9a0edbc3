"""GCP prices from the Cloud Billing catalog: a machine type's spot and on-demand $/h in a
region, priced as GCP bills it — per vCPU, per GB of memory and per attached GPU.

The catalog (`cloudbilling.googleapis.com`, service "Compute Engine" `6F81-5844-456A`) has no
price per machine type: it lists SKUs such as "Spot Preemptible N2 Instance Core running in
Americas" or "Nvidia L4 GPU attached to Spot Preemptible VMs running in Americas", each with the
regions it applies to (`serviceRegions`) and a rate per hour (per GiB-hour for memory). A
machine type's shape (vCPUs, memory, bundled GPUs) comes from Compute Engine's own
`machineTypes.get`. Reading the catalog needs credentials (application default credentials
with the billing read scope; an API key is not used): without them, or for a family or a GPU
this module does not know, the dated table in `spotnb/market/data/prices.json` stays the answer. The
SKU list (~5 MB over ~20 pages) is cached on disk for a day (`spotnb.market.price_cache`), so the
price shown says how old it is.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SERVICE",
    "CATALOG_TTL",
    "MAX_PAGES",
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
#: Pages read at most (~20 in 2026): a catalog that pages on past this is a failed read.
MAX_PAGES = 200

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
    """The SKU's hourly unit price (its first tier with a finite price above zero); None for
    a SKU whose pricing is missing or malformed (it is skipped, not the whole catalog)."""
    infos = sku.get("pricingInfo")
    for info in infos if isinstance(infos, list) else []:
        expr = info.get("pricingExpression") if isinstance(info, dict) else None
        tiers = expr.get("tieredRates") if isinstance(expr, dict) else None
        for tier in tiers if isinstance(tiers, list) else []:
            price = tier.get("unitPrice") if isinstance(tier, dict) else None
            if not isinstance(price, dict):
                continue
            try:
                value = float(price.get("units") or 0) + float(price.get("nanos") or 0) / 1e9
            except (TypeError, ValueError):
                return None
            if math.isfinite(value) and value > 0:
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
        if not isinstance(sku, dict):
            continue
        cat = sku.get("category")
        usage = cat.get("usageType") if isinstance(cat, dict) else None
        regions = sku.get("serviceRegions")
        if usage not in ("OnDemand", "Preemptible") or not isinstance(regions, list) or region not in regions:
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
    or GPU this module does not know, or a region without that SKU), or the shape or rates
    add up to no price at all (a machine is never priced at $0)."""
    family = machine_type.split("-", 1)[0].lower()
    if shape.cpus <= 0 or not shape.memory_gb > 0:
        return None
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
        if not (math.isfinite(total) and total > 0):
            return None
        totals.append(round(total, 6))
    return totals[0], totals[1]


def catalog_skus(session: Any) -> list[dict[str, Any]]:
    """Every Compute Engine SKU of the catalog (REST JSON dicts), page by page, through an
    authorized `requests` session (google-auth's `AuthorizedSession`)."""
    url = f"https://cloudbilling.googleapis.com/v1/{SERVICE}/skus"
    skus: list[dict[str, Any]] = []
    token = ""
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        params = {"currencyCode": "USD", "pageSize": 5000}
        if token:
            params["pageToken"] = token
        response = session.get(url, params=params, timeout=30)
        response.raise_for_status()
        page = response.json()
        skus.extend(_slim(s) for s in page.get("skus") or [])
        token = page.get("nextPageToken") or ""
        if not token:
            return skus
        if token in seen:  # the same page again and again: no catalog, not a repeated one
            raise ValueError(f"the catalog's nextPageToken {token[:20]!r} repeats after {len(seen)} page(s)")
        seen.add(token)
    # a partial list cached for a day would price some families from a subset
    raise ValueError(f"the catalog did not end within {MAX_PAGES} pages")


def _slim(sku: Any) -> dict[str, Any]:
    """What `rates_from_skus` reads of a SKU (the cache holds a tenth of the catalog); a field
    of the wrong shape is dropped, so one malformed SKU is skipped later, not the catalog."""

    def field(obj: Any, name: str, kind: type) -> Any:
        value = obj.get(name) if isinstance(obj, dict) else None
        return value if isinstance(value, kind) else kind()

    infos = field(sku, "pricingInfo", list)[:1]
    return {
        "description": field(sku, "description", str),
        "category": {"usageType": field(field(sku, "category", dict), "usageType", str) or None},
        "serviceRegions": field(sku, "serviceRegions", list),
        "pricingInfo": [
            {
                "pricingExpression": {
                    "tieredRates": field(field(i, "pricingExpression", dict), "tieredRates", list)
                }
            }
            for i in infos
        ],
    }
