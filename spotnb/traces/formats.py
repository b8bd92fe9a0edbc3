"""Parsers for the published spot-availability trace formats (see data/README.md).

* Bamboo events (`p3-trace.csv`, `g4dn-trace.csv`): `time_ms,add|remove,nodeN`, no header.
* Bamboo counts (GCP `*.txt`): `YYYY-MM-DD, HH:MM:SS, live_count`, sampled.
* Parcae counts (`p3.csv`): `time_ms,available_count`, one row per change.

Each parser returns a `RawTrace`: rows of (seconds since start, added, removed, count after),
node lifetimes when the format names nodes, and the wall-clock start when it has one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

__all__ = ["RawTrace", "parse", "detect_format", "FORMATS"]

FORMATS = ("bamboo-events", "bamboo-counts", "parcae-counts")


@dataclass
class RawTrace:
    rows: list[tuple[float, int, int, int]]  # (t, added, removed, count after)
    lifetimes: list[tuple[float, bool]] | None  # (seconds, removal observed) per node
    start: datetime | None
    span: float
    fmt: str


def _lines(text: str) -> list[list[str]]:
    return [[f.strip() for f in line.split(",")] for line in text.splitlines() if line.strip()]


def detect_format(text: str) -> str:
    """Which of `FORMATS` a trace text is in (raises ValueError if none)."""
    rows = _lines(text)
    if not rows:
        raise ValueError("empty trace")
    first = rows[0]
    if len(first) == 3 and first[1].lower() in ("add", "remove"):
        return "bamboo-events"
    if len(first) == 3:
        try:
            datetime.strptime(f"{first[0]} {first[1]}", "%Y-%m-%d %H:%M:%S")
            return "bamboo-counts"
        except ValueError:
            pass
    if len(first) == 2:
        try:
            float(first[0]), int(first[1])
            return "parcae-counts"
        except ValueError:
            pass
    raise ValueError(
        f"unrecognised trace format (first row {','.join(first)!r}); expected "
        "'time_ms,add|remove,node', 'YYYY-MM-DD, HH:MM:SS, count' or 'time_ms,count'"
    )


def parse(text: str) -> RawTrace:
    """Parse any of `FORMATS`, detected from the first row."""
    fmt = detect_format(text)
    rows = _lines(text)
    if fmt == "bamboo-events":
        return _bamboo_events(rows)
    if fmt == "bamboo-counts":
        stamps = [datetime.strptime(f"{r[0]} {r[1]}", "%Y-%m-%d %H:%M:%S") for r in rows]
        t0 = stamps[0]
        counts = (((s - t0).total_seconds(), int(r[2])) for s, r in zip(stamps, rows, strict=True))
        return _counts(counts, start=t0, fmt=fmt)
    return _counts(((float(r[0]) / 1000.0, int(r[1])) for r in rows), start=None, fmt=fmt)


def _counts(samples: Iterable[tuple[float, int]], start: datetime | None, fmt: str) -> RawTrace:
    """Counts only: each drop is that many removals, each rise that many additions. A sampled
    count hides churn between samples (an add and a remove cancel), so removals are a floor.

    The Bamboo GCP logs repeat each reading twice more, a minute apart, so a reading can carry
    an earlier timestamp than the echo before it; rows are taken in file order (newest
    information last) and a timestamp earlier than one already seen is clamped to it.
    """
    rows: list[tuple[float, int, int, int]] = []
    prev = 0
    last_t = 0.0
    for t, count in samples:
        if count < 0:
            raise ValueError(f"negative live count {count} at t={t}")
        t = max(t, last_t)
        diff = count - prev
        rows.append((t, max(diff, 0), max(-diff, 0), count))
        prev, last_t = count, t
    return RawTrace(rows, None, start, last_t, fmt)


def _bamboo_events(rows: list[list[str]]) -> RawTrace:
    out: list[tuple[float, int, int, int]] = []
    born: dict[str, float] = {}
    lifetimes: list[tuple[float, bool]] = []
    count = 0
    last_t = 0.0
    for fields in rows:
        if len(fields) != 3:
            raise ValueError(f"bad bamboo event row {','.join(fields)!r}")
        t = float(fields[0]) / 1000.0
        if t < last_t:
            raise ValueError(f"trace times go backwards at t={t}")
        action, node = fields[1].lower(), fields[2]
        if action == "add":
            if node in born:
                raise ValueError(f"node {node!r} added twice without a removal")
            born[node] = t
            count += 1
            out.append((t, 1, 0, count))
        elif action == "remove":
            if node not in born:
                raise ValueError(f"node {node!r} removed but never added")
            lifetimes.append((t - born.pop(node), True))
            count -= 1
            out.append((t, 0, 1, count))
        else:
            raise ValueError(f"bad bamboo action {fields[1]!r}")
        last_t = t
    lifetimes.extend((last_t - b, False) for b in born.values())  # still alive: censored
    return RawTrace(out, lifetimes, None, last_t, "bamboo-events")
