"""A small on-disk cache for market data fetched from the clouds (spot prices, the regions that
offer an instance type): asking ~30 regions takes seconds and every allocation asks, while the
prices themselves move hourly. Entries live in `$SPOTNB_HOME/cache/` as JSON with the time they
were fetched, so what is shown can say how old it is."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

from spotnb.core.home import spotnb_home

__all__ = ["cached", "describe_age"]

log = logging.getLogger("spotnb.market.price_cache")


def _path(key: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key)[:120]
    return str(spotnb_home() / "cache" / f"{safe}.json")


def cached(key: str, ttl: float, fetch: Callable[[], Any]) -> tuple[Any, float]:
    """`fetch()`'s JSON-able value, from the cache when younger than `ttl` seconds; returns
    (value, age in seconds). A cache file that cannot be read is fetched again; one that
    cannot be written only costs the next caller a fetch."""
    path = _path(key)
    now = time.time()
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        age = now - float(entry["fetched"])
        if 0 <= age < ttl:
            return entry["value"], age
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = fetch()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"fetched": now, "value": value}, f)
        os.replace(tmp, path)  # readers see the old entry or the new one, never half of one
    except OSError as exc:
        log.debug("price cache %s not written: %r", path, exc)
    return value, 0.0


def describe_age(age: float) -> str:
    """'fetched just now' / 'fetched 4 min ago' / 'fetched 2.0 h ago'."""
    if age < 60:
        return "fetched just now"
    if age < 3600:
        return f"fetched {age / 60:.0f} min ago"
    return f"fetched {age / 3600:.1f} h ago"
