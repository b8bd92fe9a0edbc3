"""`Hedged`: insurance saves sized to the preemptions an emergency save cannot cover.

Why it beats Adaptive (ARCHITECTURE.md, "The checkpoint model") (measured in `benchmarks/POLICY_GAINS.md`):

* **Partial emergency coverage.** Adaptive's test T_step + δ + β < T_grace is all or nothing,
  on mean times. When δ + β varies (uploads do), a mean that fits still leaves many notices
  whose save does not, and Adaptive, taking no insurance, then loses everything since the
  start of the VM; Hedged insures against exactly that share (given `upload_sd`).
  A notice lands at a uniformly random point of a step, so after finishing that step the time
  left is T_grace − U·T_step; the emergency save fits with probability
  p = (T_grace − δ − β)/T_step (clipped to [0, 1]). Only the other 1 − p of preemptions cost
  lost work, so they arrive with mean MTTP/(1 − p) and the insurance interval is
  τ = sqrt(2·δ·(MTTP/(1 − p) + R)). Adaptive, seeing the test fail, insures as if every
  preemption were unprotected (p = 0) and over-saves; when p = 1 both save nothing.
* **Replacement allocated on the notice** (`allocate_on_notice`): the controller requests the
  next VM while the old one finishes its step and emergency save, so the grace period overlaps
  the allocation wait (DeepSpotCloud). The cost is paying for two VMs for that overlap.
* **End of job.** A save whose expected saving (work since the last save × chance of an
  unprotected preemption before the end) is below its cost δ is skipped.
* **Short-lived instances.** When an instance's expected life is shorter than its start-up
  plus one save (`short_lived`), the notice cannot be counted on: the kill often lands during
  start-up or the first save, and a save only guessed from the state size (never measured on
  this instance) may not fit the grace at all under load. Then every preemption is taken as
  unprotected (p = 0), the first save comes right after the first step (everything done before
  it is otherwise lost with near certainty: Daly's τ assumes a life of many intervals), later
  ones every max(τ, β) with τ = sqrt(2·δ·(MTTP + R)) (not more often than an upload takes,
  so uploads do not queue behind each other), and the emergency save is taken only when
  measured δ + β fit, because `save_now` would abandon the insurance upload in flight for it.
  Without this, 15 jobs with `local_mttp=6s` on 2 cores made no progress at all: start-up
  exceeded the lifetime and a 1 s grace "looked sufficient" for a save that never finished.
* **Optional hazard.** `hazard(obs) -> rate/s` replaces the single MTTP by a rate that depends
  on the instance's age or the time of day (e.g. estimated from a trace by
  `spotnb.traces.Trace.hazard_by_time`); the interval is recomputed after every save.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from spotnb.policy.base import FOREVER, BatchPlan, Observation, Plan, Policy, SaveKind, steps_for
from spotnb.policy.intervals import daly_interval
from spotnb.policy.static import periodic_plan, snapshot_estimate, upload_estimate

__all__ = ["Hedged", "unprotected_fraction", "short_lived"]

Hazard = Callable[[Observation], float]


def unprotected_fraction(obs: Observation, margin: float = 0.5) -> float:
    """Share of notices after which an emergency save would not fit in the grace period.

    The runtime finishes the step in progress first; with the notice uniform within a step,
    the save fits when the remainder of the step is below T_grace − δ − β − margin. When the
    observation carries the spread of δ and β, their sum is taken as normal and the chance
    that it does not fit is averaged over the remainder of the step.
    """
    mean = snapshot_estimate(obs) + upload_estimate(obs) + margin
    return _fail_share(obs.grace, obs.step_time, mean, math.hypot(obs.snapshot_sd, obs.upload_sd))


def short_lived(obs: Observation, mttp: float | None = None) -> bool:
    """Whether an instance is expected to die before it has started and committed one save.

    The controller measures MTTP from allocation and R from request to ready, so
    MTTP < R + one save + one step means the typical instance ends before its first save
    could land: start-up alone outlasts the mean life (the livelock of issue 14)."""
    mttp = obs.mttp if mttp is None else mttp
    return mttp < obs.restart_time + snapshot_estimate(obs) + upload_estimate(obs) + obs.step_time


@lru_cache(maxsize=256)
def _fail_share(grace: float, step_time: float, mean: float, sd: float) -> float:
    """P(δ + β + margin > grace − U·T_step), U uniform; cached because a policy asks it several
    times per decision with the same averages."""
    if sd <= 0:
        slack = grace - mean
        if slack <= 0:
            return 1.0
        if step_time <= 0 or slack >= step_time:
            return 0.0
        return 1.0 - slack / step_time
    points = 16 if step_time > 0 else 1
    fail = 0.0
    for i in range(points):
        rest = step_time * (i + 0.5) / points
        z = (grace - rest - mean) / sd
        fail += 0.5 * math.erfc(z / math.sqrt(2.0))  # P(δ + β > grace − rest)
    return fail / points


class Hedged(Policy):
    """Insurance only against uncovered preemptions, replacement requested on the notice."""

    name = "hedged"

    def __init__(
        self, prealloc: bool = True, end_aware: bool = True, hazard: Hazard | None = None, margin: float = 0.5
    ) -> None:
        self.prealloc = prealloc
        self.end_aware = end_aware
        self.hazard = hazard
        self.margin = margin

    def market_mttp(self, obs: Observation) -> float:
        """Mean time to preemption: the observation's, or the hazard's at this moment."""
        if self.hazard is not None:
            rate = self.hazard(obs)
            return 1.0 / rate if rate > 0 else math.inf
        return obs.mttp

    def fragile(self, obs: Observation) -> bool:
        """Whether instances die too young for the notice to protect anything (see `short_lived`)."""
        return short_lived(obs, self.market_mttp(obs))

    def effective_mttp(self, obs: Observation) -> float:
        """Mean time between preemptions that an emergency save will not cover."""
        mttp = self.market_mttp(obs)
        if short_lived(obs, mttp):
            return mttp  # no notice can be relied on
        unprotected = unprotected_fraction(obs, self.margin)
        if unprotected <= 0.0:
            return math.inf
        return mttp / unprotected

    def on_notice(self, obs: Observation, time_left: float) -> bool:
        """The model's rule, except on short-lived instances: there, only a save measured to fit.
        An emergency save abandons the insurance upload in flight, and one that then does not
        finish before the kill loses both."""
        if self.fragile(obs) and not (obs.snapshot_time and obs.upload_time):
            return False
        return super().on_notice(obs, time_left)

    def interval(self, obs: Observation) -> float:
        """Seconds of compute between insurance saves (inf = none needed)."""
        mttp = self.effective_mttp(obs)
        if math.isinf(mttp):
            return math.inf
        return daly_interval(snapshot_estimate(obs), mttp, obs.restart_time)

    def next_save(self, obs: Observation, last_save_step: int) -> Plan | None:
        periodic = periodic_plan(obs, last_save_step)
        mttp = self.effective_mttp(obs)
        if math.isinf(mttp):
            return periodic
        tau = daly_interval(snapshot_estimate(obs), mttp, obs.restart_time)
        if self.fragile(obs):
            if not obs.snapshot_time:  # nothing saved on this instance yet: right after a step
                tau = 0.0
            else:  # at most one upload in flight: a queue of them only adds CPU load
                tau = max(tau, upload_estimate(obs))
        step = last_save_step + steps_for(tau, obs.step_time)
        worth: int | None = step
        if self.end_aware and obs.total_steps is not None:
            worth = self._worth_it(obs, last_save_step, step, mttp)
        if worth is None:
            return periodic
        step = worth
        if periodic is not None and periodic.step <= step:
            return periodic
        return Plan(step, SaveKind.INSURANCE)

    def _worth_it(self, obs: Observation, last: int, step: int, mttp: float) -> int | None:
        """The planned step, stretched or dropped near the end of the job.

        A save at `step` costs δ; it saves the work since `last` if an unprotected preemption
        strikes before the end. If the remaining job is short, one longer segment is cheaper.
        """
        total = obs.total_steps or 0
        if step >= total:
            return None
        if obs.step_time <= 0:
            return step  # no step timed yet: the remaining work is unknown, not zero
        remaining = (total - step) * obs.step_time
        at_risk = (step - last) * obs.step_time
        saving = at_risk * (1.0 - math.exp(-remaining / mttp))
        if saving < snapshot_estimate(obs):
            return None
        return step

    def stationary_until(self, obs: Observation) -> int:
        if obs.save_every or self.hazard is not None or self.fragile(obs):
            return 0
        if not (self.end_aware and obs.total_steps is not None):
            return 2**62
        # `_worth_it` keeps every save that leaves more than this much work after it.
        mttp = self.effective_mttp(obs)
        if math.isinf(mttp) or obs.step_time <= 0:
            return 0
        at_risk = steps_for(self.interval(obs), obs.step_time) * obs.step_time
        if at_risk <= snapshot_estimate(obs):
            return 0
        tail = -mttp * math.log(1.0 - snapshot_estimate(obs) / at_risk)
        return max(0, obs.total_steps - math.ceil(tail / obs.step_time) - 1)

    def allocate_on_notice(self, obs: Observation) -> bool:
        return self.prealloc

    def batch_plan(self, obs: Observation) -> BatchPlan | None:
        """Insurance every `steps_for(interval)` steps up to the last step `_worth_it` keeps.

        `_worth_it` only looks at the step a save would land on (the stride and every average
        are fixed within a run), and the saving it weighs shrinks as that step nears the end,
        so the saves it keeps are exactly those up to one threshold, found by bisection."""
        rules = self._notice_rules(obs, Hedged)
        if (
            rules is None
            or obs.save_every
            or self.hazard is not None
            or self.fragile(obs)
            or self._overrides(Hedged, "next_save", "effective_mttp", "_worth_it", "market_mttp", "fragile")
        ):
            return None
        mttp = self.effective_mttp(obs)
        if math.isinf(mttp):
            return BatchPlan(None, SaveKind.INSURANCE, FOREVER, *rules)
        tau = daly_interval(snapshot_estimate(obs), mttp, obs.restart_time)
        stride = steps_for(tau, obs.step_time)
        last = FOREVER
        if self.end_aware and obs.total_steps is not None:

            def kept(step: int) -> bool:
                return self._worth_it(obs, step - stride, step, mttp) is not None

            lo, hi = stride - 1, obs.total_steps  # kept(lo) assumed, kept(hi) is False
            if not kept(stride):
                last = stride - 1
            else:
                lo = stride
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if kept(mid) else (lo, mid)
                last = lo
        return BatchPlan(stride, SaveKind.INSURANCE, last, *rules)

    def __repr__(self) -> str:
        args = []
        if not self.prealloc:
            args.append("prealloc=False")
        if not self.end_aware:
            args.append("end_aware=False")
        if self.hazard is not None:
            args.append(f"hazard={self.hazard!r}")
        return f"Hedged({', '.join(args)})"
