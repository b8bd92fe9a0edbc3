"""`Scenario`: everything the simulator needs to know about a job and its spot market.

Durations are a number or a `(low, high)` range sampled uniformly in [low, high) each time
the event happens (each save, each allocation, each preparation). The step time is per step
by default: thousands of i.i.d. steps between two events sum to n × mean within a fraction
of a percent, so the event-driven engine uses the mean (never looping per step). With
`step_time_per: instance` each VM instead draws one speed for its whole life (slow and fast
VMs), which makes compute differ from steps × mean (fast VMs finish more steps).
Loadable from YAML or JSON with the same keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from spotnb.preempt import Exponential, Never, Piecewise, PreemptionProcess

__all__ = ["Scenario", "Dist", "as_range", "mean_of"]

Dist = float | int | Sequence[float]


def as_range(value: Dist, name: str = "value") -> tuple[float, float]:
    """`(low, high)` from a number or a two-element range; checks it is a valid duration."""
    if isinstance(value, (int, float)):
        low = high = float(value)
    else:
        try:
            low, high = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number or a [low, high] pair, got {value!r}") from None
    if not (0 <= low <= high) or math.isinf(high):
        raise ValueError(f"{name} needs 0 <= low <= high < inf, got {value!r}")
    return low, high


def mean_of(value: Dist) -> float:
    low, high = as_range(value)
    return (low + high) / 2.0


@dataclass
class Scenario:
    """A job on a spot market (the inputs of ARCHITECTURE.md, "The checkpoint model"). All
    times in seconds, prices in $/h.

    The preemption process is `trace` if given (a bundled name such as "bamboo/p3" or a file in
    the Bamboo or Parcae format), else `mttp`: a number for exponential lifetimes, a list for
    piecewise phases of `mttp_phase` seconds each (cycling; 24 values = time of day), or a list
    of `[duration, mttp]` pairs; None means no preemptions. The first instance is ready at time
    0 unless `initial_start` also charges it an allocation and a preparation.
    """

    steps: int
    step_time: Dist = 1.0
    save_time: Dist = 0.0
    backup_time: Dist = 0.0
    alloc_time: Dist = 0.0
    prep_time: Dist = 0.0
    grace: float = 0.0
    mttp: float | list[Any] | None = None
    mttp_phase: float = 3600.0
    trace: str | None = None
    trace_offset: float = 0.0
    spot_price: float = 0.0
    on_demand_price: float = 0.0
    save_every: int | None = None
    step_time_per: str = "step"
    initial_start: bool = False
    name: str = ""
    notes: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if int(self.steps) != self.steps or self.steps < 1:
            raise ValueError(f"steps must be a positive integer, got {self.steps!r}")
        self.steps = int(self.steps)
        for key in ("step_time", "save_time", "backup_time", "alloc_time", "prep_time"):
            low, high = as_range(getattr(self, key), key)
            setattr(self, key, low if low == high else (low, high))
        if as_range(self.step_time)[1] <= 0:
            raise ValueError("step_time must be positive")
        if self.grace < 0 or self.spot_price < 0 or self.on_demand_price < 0:
            raise ValueError("grace and prices must be non-negative")
        if self.step_time_per not in ("step", "instance"):
            raise ValueError(f"step_time_per is 'step' or 'instance', got {self.step_time_per!r}")
        if self.save_every is not None and self.save_every < 1:
            raise ValueError("save_every must be a positive step count or None")
        if self.mttp is not None and not isinstance(self.mttp, (list, tuple)) and not self.mttp > 0:
            raise ValueError(f"mttp must be positive, got {self.mttp!r}")
        self.process()  # fail early on a bad mttp list or trace

    # -- derived ---------------------------------------------------------------------------
    @property
    def mean_step_time(self) -> float:
        return mean_of(self.step_time)

    @property
    def work(self) -> float:
        """T_p: seconds of compute the job needs without preemptions."""
        return self.steps * self.mean_step_time

    @property
    def restart_time(self) -> float:
        """R = mean allocation + mean preparation."""
        return mean_of(self.alloc_time) + mean_of(self.prep_time)

    def process(self) -> PreemptionProcess:
        """The preemption process this scenario describes."""
        if self.trace is not None:
            from spotnb.traces import trace_process

            return trace_process(self.trace, offset=self.trace_offset)
        if self.mttp is None:
            return Never()
        if isinstance(self.mttp, (list, tuple)):
            items = list(self.mttp)
            if items and all(isinstance(x, (list, tuple)) for x in items):
                return Piecewise([float(m) for _, m in items], [float(d) for d, _ in items])
            return Piecewise([float(m) for m in items], phase=self.mttp_phase)
        return Exponential(float(self.mttp))

    # -- I/O -------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """From a mapping; an unknown key is an error that lists the valid ones."""
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise ValueError(f"unknown scenario key(s) {unknown}; valid keys: {sorted(valid)}")
        return cls(**dict(data))

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        """From a YAML or JSON file (JSON is YAML, so one parser reads both)."""
        import yaml

        p = Path(path)
        data = yaml.safe_load(p.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{p}: a scenario file holds a mapping of keys, got {type(data).__name__}")
        data.setdefault("name", p.stem)
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def replace(self, **changes: Any) -> Scenario:
        data = asdict(self)
        data.update(changes)
        return Scenario(**data)
