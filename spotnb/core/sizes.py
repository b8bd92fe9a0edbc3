"""Byte sizes as users write them (512MB, "2GiB", 1_000_000) and the host's free memory.

Light on purpose: `Config` parses with it at import time of every notebook.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["parse_size", "human_bytes", "available_memory", "total_memory"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)")


def parse_size(value: Any) -> int:
    """Bytes from a number or a string like "512MB", "2GiB", "1.5 GB" (a bare number is bytes;
    KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024)."""
    if isinstance(value, bool):
        raise ValueError("expected a size, got a bool; give bytes or a string like '512MB'")
    if isinstance(value, (int, float)):
        size = float(value)
    elif isinstance(value, str):
        match = _SIZE_RE.fullmatch(value.strip().lower().replace("_", ""))
        if match is None or match.group(2) not in _UNITS:
            raise ValueError(
                f"invalid size {value!r}: use bytes (536870912) or a string like '512MB', '2GiB'"
            )
        size = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise ValueError(f"expected a size (bytes or '512MB'), got {type(value).__name__}")
    if not math.isfinite(size):
        raise ValueError(f"{value!r} is not a finite size: give bytes or a string like '512MB'")
    if size < 0:
        raise ValueError(f"size must be non-negative, got {value!r}")
    return int(size)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KB' (powers of 1000, as `parse_size` reads them back)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory() -> int | None:
    """Bytes the host can still give without swapping (psutil's `available`, else the
    kernel's MemAvailable); None when neither can tell."""
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]  # optional: /proc/meminfo else

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - not installed, or no /proc: try the kernel's own figure
        return _meminfo("MemAvailable")


def total_memory() -> int | None:
    """The host's RAM in bytes, None when unknown."""
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]  # optional: /proc/meminfo else

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001
        return _meminfo("MemTotal")
