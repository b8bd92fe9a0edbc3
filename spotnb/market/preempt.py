"""Preemption processes: when does a spot instance die?

One source of truth for the offline simulator (`spotnb.sim`) and the local market's injector
(`spotnb.providers.local.provider`), so a simulated scenario and a real local run can replay the same
schedule. Times are seconds on the job's clock (0 = the job's first launch).

A process is asked once per instance: "this instance exists from `start`; when is it killed?"
All randomness comes from the `rng` the caller passes, so a seed reproduces a schedule exactly.
Processes are immutable except `Lifetimes`, which walks its list; callers that replay one
process many times (the simulator's runs) take a `fresh()` copy per run.
"""

from __future__ import annotations

import bisect
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence

__all__ = ["PreemptionProcess", "Exponential", "Never", "Lifetimes", "Piecewise", "Schedule", "TraceReplay"]


class PreemptionProcess(ABC):
    """Draws the time at which an instance that became ready at `start` is preempted."""

    @abstractmethod
    def next_preemption(self, start: float, rng: random.Random) -> float:
        """Absolute job-clock time of the preemption of an instance ready at `start` (inf = never)."""

    @property
    def mttp(self) -> float:
        """Long-run mean time to preemption (what a policy is told); inf when unknown or never."""
        return math.inf

    def fresh(self) -> PreemptionProcess:
        """A copy with its own replay state (stateless processes return themselves)."""
        return self


class Never(PreemptionProcess):
    def next_preemption(self, start: float, rng: random.Random) -> float:
        return math.inf

    def __repr__(self) -> str:
        return "Never()"


class Exponential(PreemptionProcess):
    """Poisson preemptions: memoryless lifetimes with mean `mttp` seconds."""

    def __init__(self, mttp: float) -> None:
        if not mttp > 0:
            raise ValueError(f"mttp must be positive, got {mttp}")
        self._mttp = float(mttp)
        self._rate = 1.0 / self._mttp

    @property
    def mttp(self) -> float:
        return self._mttp

    def next_preemption(self, start: float, rng: random.Random) -> float:
        return start + rng.expovariate(self._rate)

    def __repr__(self) -> str:
        return f"Exponential(mttp={self._mttp:g})"


class Lifetimes(PreemptionProcess):
    """A fixed list of instance lifetimes, one per incarnation, then never (deterministic tests)."""

    def __init__(self, lifetimes: list[float]) -> None:
        self.lifetimes = [float(x) for x in lifetimes]
        self._i = 0

    @property
    def mttp(self) -> float:
        return sum(self.lifetimes) / len(self.lifetimes) if self.lifetimes else math.inf

    def next_preemption(self, start: float, rng: random.Random) -> float:
        if self._i >= len(self.lifetimes):
            return math.inf
        life = self.lifetimes[self._i]
        self._i += 1
        return start + life

    def fresh(self) -> Lifetimes:
        return Lifetimes(self.lifetimes)

    def __repr__(self) -> str:
        return f"Lifetimes({self.lifetimes!r})"


class Schedule(PreemptionProcess):
    """Preemptions at fixed job-clock times: an instance dies at the first one after its start.

    Adding times to a schedule can only add preemptions, which is what monotonicity tests need.
    """

    def __init__(self, times: Sequence[float]) -> None:
        self.times = sorted(float(t) for t in times)

    @property
    def mttp(self) -> float:
        if not self.times:
            return math.inf
        return self.times[-1] / len(self.times)

    def next_preemption(self, start: float, rng: random.Random) -> float:
        i = bisect.bisect_right(self.times, start)
        return self.times[i] if i < len(self.times) else math.inf

    def __repr__(self) -> str:
        return f"Schedule({self.times!r})"


class Piecewise(PreemptionProcess):
    """Poisson preemptions whose rate changes by phase on the job clock, cycling.

    `mttps[i]` holds for `durations[i]` seconds (default: each phase lasts `phase` seconds),
    then the next; after the last phase the cycle restarts. 24 hourly values give a
    time-of-day profile. Sampled exactly by inverting the integrated hazard.
    """

    def __init__(
        self, mttps: Sequence[float], durations: Sequence[float] | None = None, phase: float = 3600.0
    ) -> None:
        if not mttps:
            raise ValueError("Piecewise needs at least one MTTP")
        if any(not (m > 0) for m in mttps):
            raise ValueError(f"every MTTP must be positive (inf allowed), got {list(mttps)}")
        durs = [float(phase)] * len(mttps) if durations is None else [float(d) for d in durations]
        if len(durs) != len(mttps) or any(not d > 0 for d in durs):
            raise ValueError("Piecewise needs one positive duration per MTTP")
        self.mttps = [float(m) for m in mttps]
        self.durations = durs
        self._rates = [0.0 if math.isinf(m) else 1.0 / m for m in self.mttps]
        self._starts = [0.0]
        for d in durs[:-1]:
            self._starts.append(self._starts[-1] + d)
        self._cycle = sum(durs)
        self._cycle_hazard = sum(r * d for r, d in zip(self._rates, durs, strict=True))

    @property
    def mttp(self) -> float:
        return self._cycle / self._cycle_hazard if self._cycle_hazard > 0 else math.inf

    def next_preemption(self, start: float, rng: random.Random) -> float:
        if self._cycle_hazard <= 0:
            return math.inf
        need = rng.expovariate(1.0)
        # Whole cycles first, then walk the phases. (A cycle whose hazard overflows is never
        # skipped whole: 0 cycles times inf would make `need` NaN and the walk endless.)
        cycles = 0
        if need > self._cycle_hazard:
            whole = need / self._cycle_hazard
            if not math.isfinite(whole * self._cycle):
                return math.inf  # later than the clock can say
            cycles = math.floor(whole)
            # what is left is within one cycle's hazard (the float subtraction's rounding can
            # leave more than a cycle of tiny hazard could ever use up)
            need = min(max(need - cycles * self._cycle_hazard, 0.0), self._cycle_hazard)
        t = start + cycles * self._cycle
        n = len(self._rates)
        base = math.floor(t / self._cycle) * self._cycle
        # the walk keeps the time within the cycle apart from the cycle's start: far out on the
        # clock a short phase would vanish from `base + offset` and the walk never end
        offset = min(max(t - base, 0.0), self._cycle)
        i = min(bisect.bisect_right(self._starts, offset) - 1, n - 1)
        wrapped = math.nan  # `need` when the walk last began a cycle
        while True:
            end = self._starts[i] + self.durations[i]
            rate = self._rates[i]
            have = rate * max(end - offset, 0.0)
            if rate > 0 and have >= need:
                return base + offset + need / rate
            need -= have
            offset = end
            i += 1
            if i == n:
                if need == wrapped:  # a whole cycle used none of it: phases too short to count
                    return math.inf
                i, base, offset, wrapped = 0, base + self._cycle, 0.0, need

    def __repr__(self) -> str:
        return f"Piecewise(mttps={self.mttps!r}, durations={self.durations!r})"


class TraceReplay(PreemptionProcess):
    """Replays a cluster trace: at each drop of the live count, our instance is one of the `n`
    live ones and dies with probability `k/n` (k = instances removed).

    This works the same for traces that name nodes (Bamboo add/remove) and traces that only
    count them (Parcae, Bamboo GCP), keeps the trace's bursts and quiet hours, and needs no
    assumption about the lifetime distribution. The trace repeats after `span` seconds; `offset`
    is the trace time at job-clock 0.
    """

    def __init__(
        self,
        times: Sequence[float],
        alive: Sequence[int],
        removed: Sequence[int],
        span: float,
        offset: float = 0.0,
        mttp: float | None = None,
        name: str = "trace",
    ) -> None:
        if not (len(times) == len(alive) == len(removed)):
            raise ValueError("times, alive and removed must have the same length")
        if not span > 0:
            raise ValueError(f"trace span must be positive, got {span}")
        self.times = [float(t) for t in times]
        self.prob = [min(1.0, k / n) if n > 0 else 1.0 for n, k in zip(alive, removed, strict=True)]
        self.span = float(span)
        self.offset = float(offset)
        self.name = name
        self._mttp = mttp if mttp is not None else math.inf
        self._live = any(p > 0 for p in self.prob)

    @property
    def mttp(self) -> float:
        return self._mttp

    def next_preemption(self, start: float, rng: random.Random) -> float:
        if not self._live:
            return math.inf
        x = start + self.offset
        cycle = math.floor(x / self.span)
        base = cycle * self.span
        i = bisect.bisect_right(self.times, x - base)
        times, prob, n = self.times, self.prob, len(self.times)
        rand = rng.random
        while True:
            if i == n:
                i, base = 0, base + self.span
            if rand() < prob[i]:
                return base + times[i] - self.offset
            i += 1

    def __repr__(self) -> str:
        return f"TraceReplay({self.name!r}, offset={self.offset:g})"
