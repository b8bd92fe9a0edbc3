"""The built-in price table (spotnb/market/data/prices.json): spot and on-demand $/h by instance type.

It prices the local market's runs (which mimic a cloud instance type) and is the fallback for
cloud providers when live spot prices cannot be read. Its date and source are in the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["Price", "price_table", "lookup_price", "table_date"]


@dataclass(frozen=True)
class Price:
    """A zone's price for one instance type, $/h, and where it was read (a provider's
    `prices()` answers these; the built-in table below is the fallback). It lives with the
    market, not the provider contract, so that the settings and the market can price a run
    without importing a provider."""

    spot: float  # $/h
    on_demand: float  # $/h
    source: str = ""


@lru_cache(maxsize=1)
def price_table() -> dict[str, Any]:
    return json.loads(resources.files("spotnb.market").joinpath("data/prices.json").read_text())


def table_date() -> str:
    return price_table()["_meta"]["date"]


def lookup_price(instance_type: str, cloud: str | None = None) -> Price | None:
    """Price of `instance_type` on `cloud` (or on whichever cloud sells it)."""
    table = price_table()
    clouds = [cloud] if cloud in table else [c for c in table if not c.startswith("_")]
    for name in clouds:
        row = table[name].get(instance_type)
        if row:
            return Price(
                spot=row["spot"], on_demand=row["on_demand"], source=f"built-in table {table_date()} ({name})"
            )
    return None


def known_instance_types() -> list[str]:
    table = price_table()
    return sorted({t for c, rows in table.items() if not c.startswith("_") for t in rows})
