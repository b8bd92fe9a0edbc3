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

from spotnb.market.preempt import Exponential, Never, Piecewise, PreemptionProcess

__all__ = ["Scenario", "ScenarioError", "Dist", "as_range", "mean_of", "MAX_STEPS", "MAX_SECONDS"]

Dist = float | int | Sequence[float]


class ScenarioError(ValueError):
    """A scenario value the simulators cannot use: the message names the key and the fix (as
    `spot.Config` words its errors), before anything is simulated."""


def _refuse(name: str, value: Any, fix: str) -> ScenarioError:
    return ScenarioError(f"scenario key {name!r}: got {value!r}; {fix}")


def _number(value: Any, name: str, fix: str) -> float:
    """A number from a scenario file: an int or a float, or a string that is one (YAML 1.1 reads
    `1e5` as a string, and JSON files are read as YAML); never a bool."""
    if isinstance(value, bool):
        raise _refuse(name, value, fix)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise _refuse(name, value, fix) from None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int past a float's range
            raise _refuse(name, value, fix) from None
    raise _refuse(name, value, fix)


#: Longest duration a scenario may give (about 31 years): past it the simulated clock, a float,
#: loses the seconds that steps and phases are made of.
MAX_SECONDS = 1e9


def as_range(value: Dist, name: str = "value") -> tuple[float, float]:
    """`(low, high)` from a number or a two-element range; checks it is a valid duration."""
    fix = (
        f"give seconds, a number or a [low, high] pair with 0 <= low <= high <= {MAX_SECONDS:.0e} "
        "(e.g. [60, 120])"
    )
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise _refuse(name, value, fix)
        low, high = (_number(v, name, fix) for v in value)
    else:
        low = high = _number(value, name, fix)
    if not (0 <= low <= high <= MAX_SECONDS):
        raise _refuse(name, value, fix)
    return low, high


def mean_of(value: Dist) -> float:
    low, high = as_range(value)
    return (low + high) / 2.0


#: Most phases a list of `mttp` values may have (with phases of 1 s to MAX_SECONDS, the cycle's
#: clock still resolves each phase).
MAX_PHASES = 100_000
#: Most steps a scenario may have: a float counts steps exactly up to 2**53, and the simulators'
#: progress is a float.
MAX_STEPS = 10**15


def _whole(value: Any, name: str, fix: str) -> int:
    """A whole number >= 1 (an integral float or numeric string too); never a bool."""
    v = _number(value, name, fix)
    if not (1 <= v < math.inf) or v != int(v):
        raise _refuse(name, value, fix)
    return int(v)


def _steps(value: Any) -> int:
    fix = f"give a whole number of training steps, 1 to {MAX_STEPS:.0e} (e.g. steps: 100000)"
    steps = _whole(value, "steps", fix)
    if steps > MAX_STEPS:
        raise _refuse("steps", value, fix)
    return steps


def _mttp(value: Any) -> float | list[Any] | None:
    """The scenario's `mttp`: None or inf (no preemptions: None), a positive number, a list of
    positive MTTPs (inf: a phase without preemptions), or a list of [duration, mttp] pairs."""
    fix = (
        "give the mean seconds between preemptions (> 0), null or .inf for none, a list of them "
        "(phases of mttp_phase seconds) or a list of [duration, mttp] pairs"
    )
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        m = _number(value, "mttp", fix)
        if not m > 0:
            raise _refuse("mttp", value, fix)
        return None if math.isinf(m) else m
    items = list(value)
    if not items:
        raise _refuse("mttp", value, fix)
    if len(items) > MAX_PHASES:
        raise _refuse("mttp", f"a list of {len(items)}", f"give at most {MAX_PHASES:,} phases")
    if all(isinstance(x, (list, tuple)) for x in items):
        pairs = []
        for pair in items:
            if len(pair) != 2:
                raise _refuse("mttp", value, fix)
            d = _number(pair[0], "mttp", fix)
            m = _number(pair[1], "mttp", fix)
            if not (1 <= d <= MAX_SECONDS) or not m > 0:
                raise _refuse("mttp", value, fix + f" (each duration from 1 s to {MAX_SECONDS:.0e} s)")
            pairs.append([d, m])
        return pairs
    mttps = [_number(x, "mttp", fix) for x in items]
    if any(not m > 0 for m in mttps):
        raise _refuse("mttp", value, fix)
    return mttps


@dataclass
class Scenario:
    """A job on a spot market (the inputs of ARCHITECTURE.md, "The checkpoint model"). All
    times in seconds, prices in $/h.

    The preemption process is `trace` if given (a bundled name such as "bamboo/p3" or a file in
    the Bamboo or Parcae format), else `mttp`: a number for exponential lifetimes, a list for
    piecewise phases of `mttp_phase` seconds each (cycling; 24 values = time of day), or a list
    of `[duration, mttp]` pairs; None (or inf, `.inf` in YAML) means no preemptions. The first
    instance is ready at time 0 unless `initial_start` also charges it an allocation and a
    preparation. A value the simulators cannot use is a `ScenarioError` naming the key.
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
        self.steps = _steps(self.steps)
        for key in ("step_time", "save_time", "backup_time", "alloc_time", "prep_time"):
            low, high = as_range(getattr(self, key), key)
            setattr(self, key, low if low == high else (low, high))
        if as_range(self.step_time)[1] <= 0:
            raise _refuse("step_time", self.step_time, "a step takes time: give seconds > 0")
        for key, what, most in (
            ("grace", "seconds of notice before a preemption", MAX_SECONDS),
            ("spot_price", "$/h", math.inf),
            ("on_demand_price", "$/h", math.inf),
        ):
            fix = f"give {what}, a finite number >= 0" + (f" and <= {most:.0e}" if most < math.inf else "")
            v = _number(getattr(self, key), key, fix)
            if not 0 <= v < math.inf or v > most:
                raise _refuse(key, getattr(self, key), fix)
            setattr(self, key, v)
        fix = f"give the seconds each phase of a list of mttp values lasts, from 1 to {MAX_SECONDS:.0e}"
        self.mttp_phase = _number(self.mttp_phase, "mttp_phase", fix)
        if not 1 <= self.mttp_phase <= MAX_SECONDS:
            raise _refuse("mttp_phase", self.mttp_phase, fix)
        self.mttp = _mttp(self.mttp)
        fix = "give the trace's time at the job's start in seconds, a finite number"
        self.trace_offset = _number(self.trace_offset, "trace_offset", fix)
        if not math.isfinite(self.trace_offset):
            raise _refuse("trace_offset", self.trace_offset, fix)
        if self.trace is not None and (not isinstance(self.trace, str) or not self.trace.strip()):
            raise _refuse("trace", self.trace, "give a bundled trace's name (e.g. bamboo/p3) or a trace file")
        if self.save_every is not None:
            self.save_every = _whole(self.save_every, "save_every", "give a step count >= 1, or null")
        if self.step_time_per not in ("step", "instance"):
            raise _refuse("step_time_per", self.step_time_per, "give 'step' or 'instance'")
        if not isinstance(self.initial_start, bool):
            raise _refuse("initial_start", self.initial_start, "give true or false")
        self.name = "" if self.name is None else str(self.name)
        self.notes = "" if self.notes is None else str(self.notes)
        try:
            self.process()  # fail early on a bad trace
        except (OSError, ValueError) as exc:
            raise ScenarioError(
                f"scenario key {'trace' if self.trace is not None else 'mttp'!r}: {exc}"
            ) from None

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
        if self.mttp is None or self.mttp == math.inf:
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
        valid = sorted(f.name for f in fields(cls))
        unknown = sorted(str(k) for k in data if k not in valid)
        if unknown:
            raise ScenarioError(f"unknown scenario key(s) {unknown}; valid keys: {valid}")
        if "steps" not in data:
            raise ScenarioError(
                "scenario key 'steps' is missing; give the job's training steps (e.g. steps: 100000)"
            )
        return cls(**dict(data))

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        """From a YAML or JSON file (JSON is YAML, so one parser reads both); an error names
        the file."""
        import yaml

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ScenarioError(f"{p}: not a text file; a scenario is YAML or JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ScenarioError(f"{p}: not valid YAML or JSON: {exc}") from None
        if data is None:
            raise ScenarioError(
                f"{p}: the file is empty; a scenario needs at least steps (e.g. steps: 100000)"
            )
        if not isinstance(data, dict):
            raise ScenarioError(f"{p}: a scenario file holds a mapping of keys, got {type(data).__name__}")
        data.setdefault("name", p.stem)
        try:
            return cls.from_dict(data)
        except ScenarioError as exc:
            raise ScenarioError(f"{p}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def replace(self, **changes: Any) -> Scenario:
        data = asdict(self)
        data.update(changes)
        return Scenario(**data)
