"""Durations as users write them ("90s", "2m", "1h30m", 500ms) and the bounds that catch typos.

Light on purpose: `Config` and every provider's settings use it.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = [
    "parse_duration",
    "bounded",
    "human",
    "duration_range",
    "lifetime",
    "is_int",
    "Duration",
    "Range",
    "DAY",
]

DAY = 86400.0
Duration = float
Range = tuple[float, float]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|min|s|m|h|d)")


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like "90s", "2m", "1h30m", "500ms" (a bare number is seconds)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a bool")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_RE.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(
                    f"invalid duration {value!r}: use seconds (90) or a string like '90s', '2m', "
                    "'3h', '1h30m'"
                ) from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"expected a duration (seconds or '2m'), got {type(value).__name__}")
    if not math.isfinite(seconds):
        raise ValueError(
            f"{value!r} is not a finite duration: give seconds or a string like '2m'"
            " (None, where the field allows it, means 'no limit')"
        )
    if seconds < 0:
        raise ValueError(f"duration must be non-negative, got {value!r}")
    return seconds


def bounded(seconds: float, low: float, high: float, why: str) -> float:
    """`seconds` if within [low, high]; else a ValueError with the bounds and why they are there
    (an absurd duration is a typo, and a job that waits 1000 days for it is worse than an error)."""
    if not low <= seconds <= high:
        raise ValueError(f"{seconds:g} s is outside [{human(low)}, {human(high)}]: {why}")
    return seconds


def human(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def duration_range(value: Any) -> Range:
    """A duration, or a [low, high) pair of them."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"takes a duration or a [low, high) pair, got {len(value)} items")
        lo, hi = (parse_duration(v) for v in value)
        if hi < lo:
            raise ValueError(f"high ({hi}) is below low ({lo})")
        return (lo, hi)
    d = parse_duration(value)
    return (d, d)


def lifetime(value: Any) -> float:
    return bounded(parse_duration(value), 0.0, 30 * DAY, "a scheduled lifetime is at most 30 days")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
