"""Preemption processes: when does a spot instance die?

One source of truth for the offline simulator (`spotnb.sim`) and the local market's injector
(`spotnb.providers.local`), so a simulated scenario and a real local run can replay the same
schedule. Times are seconds on the job's clock (0 = the job's first launch).
"""
from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod

__all__ = ["PreemptionProcess", "Exponential", "Never", "Lifetimes"]


class PreemptionProcess(ABC):
    """Draws the time at which an instance that became ready at `start` is preempted."""

    @abstractmethod
    def next_preemption(self, start: float, rng: random.Random) -> float:
        """Absolute job-clock time of the preemption of an instance ready at `start` (inf = never)."""


class Never(PreemptionProcess):
    def next_preemption(self, start: float, rng: random.Random) -> float:
        return math.inf


class Exponential(PreemptionProcess):
    """Poisson preemptions: memoryless lifetimes with mean `mttp` seconds."""

    def __init__(self, mttp: float) -> None:
        if not mttp > 0:
            raise ValueError(f"mttp must be positive, got {mttp}")
        self.mttp = float(mttp)

    def next_preemption(self, start: float, rng: random.Random) -> float:
        return start + rng.expovariate(1.0 / self.mttp)

    def __repr__(self) -> str:
        return f"Exponential(mttp={self.mttp:g})"


class Lifetimes(PreemptionProcess):
    """A fixed list of instance lifetimes, one per incarnation, then never (deterministic tests)."""

    def __init__(self, lifetimes: list[float]) -> None:
        self.lifetimes = [float(x) for x in lifetimes]
        self._i = 0

    def next_preemption(self, start: float, rng: random.Random) -> float:
        if self._i >= len(self.lifetimes):
            return math.inf
        life = self.lifetimes[self._i]
        self._i += 1
        return start + life
