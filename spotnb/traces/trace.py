"""`Trace`: a cluster's spot availability over time, and what a job can learn from it.

The MTTP estimate treats each instance's life as exponential and uses the maximum-likelihood
estimate under right-censoring: total exposure (instance-seconds observed alive, including
instances still alive when the trace ends) divided by the number of observed removals. Taking
the mean of the observed lifetimes only would be biased low, because the long-lived instances
are exactly the ones the trace stops watching before they die.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path

from spotnb.market.preempt import Piecewise, TraceReplay
from spotnb.traces.formats import RawTrace, parse

__all__ = ["Trace", "load_trace", "trace_process", "bundled_traces", "BUNDLED"]

#: Bundled name → file under spotnb/traces/data (MIT licensed, LICENSE beside each).
BUNDLED = {
    "bamboo/p3": "bamboo/p3-trace.csv",
    "bamboo/g4dn": "bamboo/g4dn-trace.csv",
    "bamboo/a100x1-east1b": "bamboo/a100x1-east1b.txt",
    "bamboo/v100x1-east1c": "bamboo/v100x1-east1c.txt",
    "parcae/p3": "parcae/p3.csv",
}


@dataclass(frozen=True)
class Trace:
    """Change points of the live count: at `times[i]`, `added[i]` instances arrived,
    `removed[i]` were preempted, and `counts[i]` are live until the next change."""

    name: str
    times: tuple[float, ...]
    added: tuple[int, ...]
    removed: tuple[int, ...]
    counts: tuple[int, ...]
    span: float
    lifetimes: tuple[tuple[float, bool], ...] | None = None
    start: datetime | None = None
    fmt: str = ""

    @classmethod
    def from_raw(cls, name: str, raw: RawTrace) -> Trace:
        # Merge rows that share a timestamp (Parcae writes one row per instance).
        times: list[float] = []
        added: list[int] = []
        removed: list[int] = []
        counts: list[int] = []
        for t, a, r, c in raw.rows:
            if times and times[-1] == t:
                added[-1] += a
                removed[-1] += r
                counts[-1] = c
            else:
                times.append(t)
                added.append(a)
                removed.append(r)
                counts.append(c)
        return cls(
            name,
            tuple(times),
            tuple(added),
            tuple(removed),
            tuple(counts),
            raw.span,
            tuple(raw.lifetimes) if raw.lifetimes is not None else None,
            raw.start,
            raw.fmt,
        )

    # -- estimates ---------------------------------------------------------------------------
    @property
    def exposure(self) -> float:
        """Instance-seconds observed alive (the integral of the live count)."""
        total = 0.0
        for i, c in enumerate(self.counts):
            end = self.times[i + 1] if i + 1 < len(self.times) else self.span
            total += c * (end - self.times[i])
        return total

    @property
    def removals(self) -> int:
        return sum(self.removed)

    @property
    def mttp(self) -> float:
        """Exponential MLE with censoring: exposure / observed removals (inf if none)."""
        n = self.removals
        return self.exposure / n if n else math.inf

    def observed_mean_lifetime(self) -> float | None:
        """Mean of the completed lifetimes only (biased low; for comparison), if nodes are named."""
        if not self.lifetimes:
            return None
        done = [life for life, seen in self.lifetimes if seen]
        return sum(done) / len(done) if done else None

    def binned(self, bin_s: float) -> tuple[list[int], list[float]]:
        """(removals, exposure in instance-seconds) in consecutive `bin_s` windows. Removals at
        a change point count in the window of that time; the live count after it is exposure
        until the next change, so the totals are exactly `removals` and `exposure`."""
        if not bin_s > 0:
            raise ValueError(f"bin_s must be positive, got {bin_s}")
        n = max(1, math.ceil(self.span / bin_s))
        exposure = [0.0] * n
        events = [0] * n
        for i, c in enumerate(self.counts):
            a = self.times[i]
            b = self.times[i + 1] if i + 1 < len(self.times) else self.span
            if self.removed[i]:
                events[min(n - 1, max(0, int(a // bin_s)))] += self.removed[i]
            while a < b and c:
                k = min(n - 1, max(0, int(a // bin_s)))
                edge = b if k == n - 1 else min(b, (k + 1) * bin_s)
                exposure[k] += c * (edge - a)
                a = edge
        return events, exposure

    def hazard_by_time(self, bin_s: float = 3600.0) -> list[float]:
        """Preemption rate per instance (1/s) in consecutive `bin_s` windows of the trace:
        removals in the window / exposure in the window (0 when nothing was alive)."""
        events, exposure = self.binned(bin_s)
        return [e / x if x > 0 else 0.0 for e, x in zip(events, exposure, strict=True)]

    def hazard_by_age(self, bin_s: float = 1800.0) -> list[float] | None:
        """Preemption rate (1/s) by instance age, censoring-aware (events / exposure per age
        bin); None for traces that only count instances."""
        if not self.lifetimes:
            return None
        n = max(1, math.ceil(max(life for life, _ in self.lifetimes) / bin_s) + 1)
        exposure = [0.0] * n
        events = [0] * n
        for life, seen in self.lifetimes:
            full = int(life // bin_s)
            for k in range(min(full, n)):
                exposure[k] += bin_s
            if full < n:
                exposure[full] += life - full * bin_s
                if seen:
                    events[full] += 1
        return [e / x if x > 0 else 0.0 for e, x in zip(events, exposure, strict=True)]

    def scaled(self, speed: float) -> Trace:
        """The same trace played `speed` times faster (the local market's `local_trace_speed`)."""
        if speed == 1.0:
            return self
        from dataclasses import replace

        return replace(
            self,
            times=tuple(t / speed for t in self.times),
            span=self.span / speed,
            lifetimes=tuple((x / speed, seen) for x, seen in self.lifetimes) if self.lifetimes else None,
        )

    # -- processes -------------------------------------------------------------------------
    def process(self, offset: float = 0.0) -> TraceReplay:
        """Replay this trace (cycling) as the preemption process of one instance."""
        times, alive, removed = [], [], []
        before = 0
        for t, r, c, a in zip(self.times, self.removed, self.counts, self.added, strict=True):
            if r:
                times.append(t)
                alive.append(max(before + a, r))  # order within a timestamp is unknown
                removed.append(r)
            before = c
        span = self.span if self.span > 0 else 1.0
        if times and times[-1] >= span:
            span = times[-1] + 1e-6
        return TraceReplay(times, alive, removed, span, offset=offset, mttp=self.mttp, name=self.name)

    def piecewise(self, bin_s: float = 3600.0) -> Piecewise:
        """Poisson process with the trace's hourly (or `bin_s`) rate profile, cycling: keeps the
        time-of-day shape but not the exact bursts."""
        rates = self.hazard_by_time(bin_s)
        mttps = [1.0 / r if r > 0 else math.inf for r in rates]
        if all(math.isinf(m) for m in mttps):
            raise ValueError(f"trace {self.name!r} has no removals")
        return Piecewise(mttps, phase=bin_s)

    def rate_at(self, t: float, bin_s: float = 3600.0, offset: float = 0.0) -> float:
        """The binned rate at job-clock time `t` of a replay that starts at trace time `offset`."""
        rates = self._rates(bin_s)
        x = (t + offset) % max(self.span, bin_s)
        return rates[min(len(rates) - 1, int(x // bin_s))]

    def _rates(self, bin_s: float) -> list[float]:
        cache = self.__dict__.setdefault("_rate_cache", {})
        if bin_s not in cache:
            cache[bin_s] = self.hazard_by_time(bin_s)
        return cache[bin_s]

    def count_at(self, t: float) -> int:
        i = bisect.bisect_right(self.times, t) - 1
        return self.counts[i] if i >= 0 else 0

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "format": self.fmt,
            "span_h": self.span / 3600.0,
            "removals": self.removals,
            "additions": sum(self.added),
            "max_live": max(self.counts, default=0),
            "mttp_h": self.mttp / 3600.0,
            "observed_mean_lifetime_h": (lambda m: m / 3600.0 if m else None)(self.observed_mean_lifetime()),
        }

    def __repr__(self) -> str:
        return (
            f"Trace({self.name!r}, span={self.span / 3600:.1f} h, removals={self.removals}, "
            f"mttp={self.mttp / 3600:.2f} h)"
        )


def bundled_traces() -> list[str]:
    return sorted(BUNDLED)


def _data_dir() -> Path:
    return Path(str(resources.files("spotnb.traces").joinpath("data")))


def load_trace(name_or_path: str | Path) -> Trace:
    """A bundled trace by name ("bamboo/p3", see `bundled_traces()`) or a trace file."""
    key = str(name_or_path)
    if key in BUNDLED:
        path, name = _data_dir() / BUNDLED[key], key
    else:
        path, name = Path(key).expanduser(), Path(key).stem
        if not path.exists():
            bundled = _data_dir() / key
            if bundled.is_file():
                path = bundled
            else:
                raise FileNotFoundError(
                    f"no trace {key!r}: not a file, and not one of the bundled traces {bundled_traces()}"
                )
    text = path.read_text()
    try:
        return Trace.from_raw(name, parse(text))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def trace_process(name_or_path: str | Path, offset: float = 0.0) -> TraceReplay:
    """The replay process of a bundled or file trace, for the simulator or the local injector."""
    return load_trace(name_or_path).process(offset=offset)
