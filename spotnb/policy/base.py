"""The one decision interface shared by the runtime (on the VM) and the simulator.

A policy never sleeps or reads a clock: everything it needs arrives in an `Observation`, so
it is deterministic, testable without waiting, and cheap enough to consult once per save (not
once per step: both the runtime and the event-driven simulator ask *when* the next save is due
and count steps until then).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

from spotnb.core.protocol import SaveKind  # re-exported: policies name the saves they plan

__all__ = [
    "Observation",
    "SaveKind",
    "Policy",
    "Plan",
    "BatchPlan",
    "emergency_feasible",
    "EMERGENCY_MARGIN",
    "snapshot_estimate",
    "upload_estimate",
    "steps_for",
    "FOREVER",
    "PRIOR_MTTP",
    "PRIOR_RESTART",
]

#: "No limit" in steps (a plan that holds for the whole job).
FOREVER = 2**62
#: What a policy assumes of a market nobody has measured yet (the job DB then shrinks its
#: measurements toward these; the agent uses them when the controller sent none):
#: ~4 preemptions per 12 h (Azure NC12s_v3 GPUs) and a restart of ~110 s median GPU spot
#: allocation plus ~60 s of preparation.
PRIOR_MTTP = 3 * 3600.0
PRIOR_RESTART = 170.0
#: seconds an emergency save must have to spare before the kill (the model's rule)
EMERGENCY_MARGIN = 0.5


@dataclass(frozen=True)
class Observation:
    """What the runtime has measured so far; all times in seconds."""

    step: int  # steps completed so far (index of the next step)
    step_time: float  # running mean T_step
    snapshot_time: float  # δ: blocking part of a save (0.0 until measured)
    upload_time: float  # β: background write + upload (0.0 until measured)
    mttp: float  # mean time to preemption for this market (job DB or prior)
    restart_time: float  # R: allocation + preparation (job DB or prior)
    grace: float  # the market's notice lead time T_grace
    save_every: int | None = None  # the user's periodic interval in steps, if any
    state_bytes: int = 0  # size of the tracked state (lets a policy guess δ before a save)
    age: float = 0.0  # seconds since this instance became ready (VM-age hazard)
    now: float = 0.0  # unix time (time-of-day hazard)
    total_steps: int | None = None  # the job's length in steps, when known (end-of-job savings)
    snapshot_sd: float = 0.0  # spread (standard deviation) of δ, when measured
    upload_sd: float = 0.0  # spread of β: an emergency save must fit its slow uploads too
    #: bytes the next save would write (incremental saves: only what changed since the last
    #: one); 0 = unknown. With `upload_bps` it sizes β for that save instead of the mean.
    save_bytes: int = 0
    upload_bps: float = 0.0  # the store's measured upload bandwidth, bytes/s (0 = not yet)

    def with_(self, **changes: object) -> Observation:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Plan:
    """The next save a policy wants: at the boundary where `step` steps are complete."""

    step: int
    kind: SaveKind


@dataclass(frozen=True)
class BatchPlan:
    """A policy's whole-run decisions in closed form, for the simulator's vectorised path.

    Valid for every observation that differs from the one it was built from only in `step`,
    `age` and `now` (what changes while a simulated job runs when the step time is per step):

    * `next_save(obs', last)` is `Plan(last + stride, kind)` when `last + stride <= last_step`,
      else None (no planned save until the VM is gone); `stride=None`: always None.
    * `on_notice(obs', time_left)` is `time_left > notice_margin` (inf: never an emergency save).
    * `allocate_on_notice(obs')` is `allocate_on_notice`.

    The runtime never uses it; it only lets the simulator advance thousands of runs with array
    operations instead of asking the policy after every save.
    """

    stride: int | None
    kind: SaveKind
    last_step: int = FOREVER
    notice_margin: float = math.inf
    allocate_on_notice: bool = False


def snapshot_estimate(obs: Observation) -> float:
    """δ as measured, or guessed from the state size at 1 GB/s before the first save."""
    return obs.snapshot_time or obs.state_bytes / 1e9


def upload_estimate(obs: Observation) -> float:
    """β of the next save: its bytes over the measured bandwidth when both are known (β grows
    with size, and an incremental save's size varies: a delta after a full one), else β as
    measured, else guessed from the state size at 50 MB/s before the first save."""
    if obs.save_bytes and obs.upload_bps:
        return obs.save_bytes / obs.upload_bps
    return obs.upload_time or obs.state_bytes / 50e6


def emergency_feasible(obs: Observation, time_left: float, margin: float = EMERGENCY_MARGIN) -> bool:
    """The emergency-save rule (ARCHITECTURE.md, "The checkpoint model"), at a step boundary:
    the save (δ) and its upload (β, of what that save would write) must fit in what is left.

    Before any save is measured we estimate δ and β from the state size at conservative
    bandwidths (1 GB/s to copy, 50 MB/s to upload) rather than assume they are free.
    """
    return snapshot_estimate(obs) + upload_estimate(obs) + margin < time_left


class Policy(ABC):
    """Decides when to save. Subclasses implement `next_save`; `on_notice` has the model's default
    (ARCHITECTURE.md, "The checkpoint model")."""

    name: str = "policy"

    @abstractmethod
    def next_save(self, obs: Observation, last_save_step: int) -> Plan | None:
        """The next planned save after one at `last_save_step` (or the start/resume step), or None."""

    def on_notice(self, obs: Observation, time_left: float) -> bool:
        """At the first step boundary after a notice: do an emergency save with `time_left` seconds?"""
        return emergency_feasible(obs, time_left)

    def emergency_expected(self, obs: Observation) -> bool:
        """Whether a notice would leave room for an emergency save (insurance saves are moot)."""
        return obs.step_time + snapshot_estimate(obs) + upload_estimate(obs) < obs.grace

    def stationary_until(self, obs: Observation) -> int:
        """A step up to which the plan is a fixed stride: for every save at `last >= obs.step`
        whose next planned step is at most this, `next_save(obs', last)` is `obs`'s plan shifted
        by `last - obs.step` (same kind), obs' differing from obs only in step, age and now.
        Lets the simulator ask once per VM instead of after every save. 0 = always ask."""
        return 0

    def allocate_on_notice(self, obs: Observation) -> bool:
        """Whether the controller should request the replacement VM as soon as a notice arrives,
        overlapping allocation with the grace period (default: after the old VM is gone)."""
        return False

    def batch_plan(self, obs: Observation) -> BatchPlan | None:
        """This policy's decisions as a `BatchPlan` valid for the whole simulated run starting at
        `obs`, or None (the default) to have the simulator ask it event by event. Simulator only."""
        return None

    def _notice_rules(self, obs: Observation, owner: type) -> tuple[float, bool] | None:
        """`(notice_margin, allocate_on_notice)` when `on_notice` is `Policy`'s (the model's rule
        of `emergency_feasible`, or `owner`'s, which must then reduce to it for `obs`) and
        `allocate_on_notice` is `owner`'s or `Policy`'s, so a subclass that overrides either
        falls back to the event-by-event simulation."""
        cls = type(self)
        if cls.on_notice not in (Policy.on_notice, getattr(owner, "on_notice", None)):
            return None
        if cls.allocate_on_notice not in (
            Policy.allocate_on_notice,
            getattr(owner, "allocate_on_notice", None),
        ):
            return None
        needed = snapshot_estimate(obs) + upload_estimate(obs) + EMERGENCY_MARGIN
        return needed, bool(self.allocate_on_notice(obs))

    def _overrides(self, owner: type, *names: str) -> bool:
        """Whether the concrete class replaced any of `owner`'s methods `names` (then a
        `batch_plan` written for `owner` no longer describes it)."""
        cls = type(self)
        return any(getattr(cls, n) is not getattr(owner, n) for n in names)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def steps_for(seconds: float, step_time: float) -> int:
    """Whole steps that fit in `seconds` (at least one)."""
    if step_time <= 0:
        return 1
    if not math.isfinite(seconds):
        return 2**62
    return max(1, int(round(seconds / step_time)))
