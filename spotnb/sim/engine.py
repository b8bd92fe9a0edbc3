"""The event-driven simulator: one job on one spot VM at a time, many independent runs.

`simulate` runs the vectorised engine (`spotnb.sim.batch`, same model, array code across runs
and VM lifetimes) whenever it applies, and this event-by-event engine (`simulate_run`, the
reference) otherwise; `SimResult.engine` says which.

It jumps from event to event (next planned save, notice, kill, allocation, ready), asking the
policy exactly when the runtime would: at start/resume and after every save (`next_save`), and
at the first step boundary after a notice (`on_notice`, `allocate_on_notice`). The cost of a
run therefore grows with the number of preemptions and saves, never with the number of steps.

Semantics (the runtime's, see ARCHITECTURE.md, "The checkpoint model"):
* A save happens at a step boundary, blocks training for δ (snapshot), then uploads in the
  background for β. Uploads are serial (one background writer); a checkpoint counts once its
  upload has finished; a preemption before that loses it.
* A notice comes `grace` seconds before the kill. The runtime finishes the current step; if
  the policy says so it does an emergency save, waits for its upload and leaves (the VM stops
  there); otherwise it trains on until the kill.
* After the VM is gone, allocation (alloc_time, not billed) then preparation (prep_time,
  billed, may itself be preempted) then training resumes from the last committed checkpoint.
  With `allocate_on_notice` the replacement is requested at the notice; the old and the new VM
  are then both billed while they overlap.
* The policy sees what the runtime would have measured: the step time, the mean δ and β and
  their spread (of the scenario's ranges), MTTP of the process and R = mean alloc + prep.
* Time is put in exactly one bucket: compute (a step's first completion), recompute (steps
  redone and partial steps cut by a kill), save (snapshots, emergency upload waits, saves cut
  by a kill), alloc, prep; so total = the sum of the five.

The work is bounded as `spotnb plan`'s is (`spotnb.sim.bounds`): a scenario whose VM dies
before it can start or finish a step is a `NoProgress` verdict up front, a run without
progress for `STALL_EVENTS` events is one too, a run stops at `MAX_EVENTS` events and a
`simulate` call at `max_events` (every run together), refused up front where the estimate
(`estimate_events`) is past it (`TooMuchWork`).
"""

from __future__ import annotations

import math
import numbers
import random
from dataclasses import dataclass, field
from typing import Any

from spotnb.market.preempt import PreemptionProcess
from spotnb.policy.base import Observation, Policy, SaveKind
from spotnb.sim.bounds import (
    MAX_EVENTS,
    PLAN_EVENTS,
    STALL_EVENTS,
    Budget,
    NoProgress,
    TooMuchWork,
    best_mttp,
    check_hopeless,
    fitting_steps,
)
from spotnb.sim.scenario import Scenario, as_range, mean_of

__all__ = [
    "SimResult",
    "simulate",
    "simulate_run",
    "METRICS",
    "run_seeds",
    "ENGINES",
    "estimate_events",
    "check_progress",
]

#: Per-run figures, in the order tables show them.
METRICS = (
    "compute",
    "recompute",
    "save",
    "alloc",
    "prep",
    "total",
    "preemptions",
    "cost",
    "on_demand_cost",
    "overhead",
    "saves",
    "insurance_saves",
    "emergency_saves",
)
_N = len(METRICS)
_INSURANCE = SaveKind.INSURANCE


@dataclass
class SimResult:
    """Mean and standard deviation (over runs, ddof=1) of every figure in `METRICS`."""

    policy: str
    runs: int
    seed: int
    mean: dict[str, float]
    std: dict[str, float]
    samples: list[dict[str, float]] | None = field(default=None, repr=False)
    #: Which engine ran: "batch" (vectorised, `spotnb.sim.batch`) or "event" (run by run).
    engine: str = "event"
    #: Why this policy's job can never finish (`NoProgress`; its figures are then NaN), or None.
    verdict: str | None = None
    #: Events the runs took (`spotnb.sim.bounds`).
    events: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "runs": self.runs,
            "seed": self.seed,
            "mean": dict(self.mean),
            "std": dict(self.std),
            "engine": self.engine,
            **({"verdict": self.verdict} if self.verdict else {}),
        }

    def __getitem__(self, key: str) -> float:
        return self.mean[key]


def run_seeds(seed: int, run: int) -> tuple[int, int]:
    """Independent, reproducible seeds for run `run`: one stream for the market (when the VMs
    die), one for durations, so policies compared on one seed face the same preemptions."""
    base = (int(seed) * 1_000_003 + int(run)) * 2
    return base, base + 1


ENGINES = ("auto", "batch", "event")
#: Most planned saves in one VM's life for which "auto" picks the vectorised engine: it walks
#: them column by column, about 18 µs each whatever the runs (900,000 saves of one VM that is
#: never preempted took 17 s there and 0.5 s here).
BATCH_COLUMNS = 20_000


def _batch_columns(scenario: Scenario, plan: Any, process: PreemptionProcess) -> float:
    """About the most planned saves one VM of a run lives through (the batch engine's columns)."""
    if not plan.stride:
        return 0.0
    mttp = float(getattr(process, "mttp", math.inf) or math.inf)
    life = min(scenario.work, 10.0 * mttp)  # the longest of many exponential lives, about
    return life / (plan.stride * scenario.mean_step_time)


def simulate(
    scenario: Scenario,
    policy: Policy | str,
    runs: int = 100,
    seed: int = 0,
    keep_samples: bool = False,
    *,
    engine: str = "auto",
    max_events: int | Budget = PLAN_EVENTS,
) -> SimResult:
    """Simulate `runs` independent executions of `scenario` under `policy`.

    `engine="auto"` uses the vectorised engine (`spotnb.sim.batch`: exponential or no
    preemptions, per-step step times, a policy with a `BatchPlan`) and the event-by-event
    engine otherwise; `result.engine` says which ran. Both follow the same model; they use
    different random numbers, so one seed gives different (equally distributed) runs on each.
    "batch" raises if the vectorised engine does not apply; "event" forces the reference.
    The runs take at most `max_events` events together (a number, or the `Budget` of a whole
    command): `TooMuchWork`, up front where the estimate says so; a job that cannot finish is
    `NoProgress`.
    """
    from spotnb.policy import resolve_policy

    pol = resolve_policy(policy)
    if isinstance(runs, bool) or not isinstance(runs, numbers.Integral) or runs < 1:
        raise ValueError(f"runs must be a whole number >= 1, got {runs!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine is one of {ENGINES}, got {engine!r}")
    process = scenario.process()
    name = policy if isinstance(policy, str) else repr(pol)
    budget = max_events if isinstance(max_events, Budget) else Budget(max_events, "the simulation")
    check_progress(scenario, process)
    per_run = estimate_events(scenario, pol, process)
    if per_run > MAX_EVENTS:
        raise TooMuchWork(
            f"steps: one run of {scenario.steps:,} steps under {name} takes about {per_run:.2g} "
            f"events (saves and preemptions), past the limit of {MAX_EVENTS:,} a run; lower steps "
            f"to about {fitting_steps(scenario.steps, per_run, MAX_EVENTS)} (a shorter job has the "
            "same rates)"
        )
    estimate = runs * per_run
    if estimate > budget.left:
        raise TooMuchWork(
            f"steps: simulating {runs} run(s) of {scenario.steps:,} steps under {name} takes about "
            f"{estimate:.2g} events (saves and preemptions), past {budget.what}'s limit of "
            f"{budget.limit:,}; lower steps to about {fitting_steps(scenario.steps, estimate, budget.left)} "
            "(a shorter job has the same rates), or the runs"
        )
    if engine != "event":
        from spotnb.sim.batch import plan_for, simulate_batch

        plan = plan_for(scenario, pol, process)
        if plan is not None and engine == "auto" and _batch_columns(scenario, plan, process) > BATCH_COLUMNS:
            plan = None  # one VM's many saves are a column loop there: the reference is faster
        if plan is not None:
            table, events = simulate_batch(scenario, plan, process, runs, seed, budget=budget, name=name)
            result = _summarise(name, runs, seed, table, keep_samples)
            result.events = events
            return result
        if engine == "batch":
            raise ValueError(
                f"the vectorised engine does not cover {pol!r} on this scenario "
                "(needs exponential or no preemptions, per-step step times and a "
                "policy with a batch_plan)"
            )
    sums = [0.0] * _N
    sq = [0.0] * _N
    samples: list[dict[str, float]] | None = [] if keep_samples else None
    events = 0
    for r in range(runs):
        pre_seed, dur_seed = run_seeds(seed, r)
        cap, spent = budget.cap(), [0]
        try:
            row = simulate_run(
                scenario,
                pol,
                process.fresh(),
                random.Random(pre_seed),
                random.Random(dur_seed),
                max_events=cap,
                spent=spent,
            )
        except TooMuchWork:
            if cap >= MAX_EVENTS:
                raise
            raise budget.exceeded(f"{name}, run {r + 1} of {runs}") from None
        budget.spend(spent[0])
        events += spent[0]
        for i, v in enumerate(row):
            sums[i] += v
            sq[i] += v * v
        if samples is not None:
            samples.append(dict(zip(METRICS, row, strict=True)))
    mean = {k: sums[i] / runs for i, k in enumerate(METRICS)}
    std = {}
    for i, k in enumerate(METRICS):
        if runs > 1:
            var = (sq[i] - sums[i] * sums[i] / runs) / (runs - 1)
            std[k] = math.sqrt(var) if var > 0 else 0.0
        else:
            std[k] = 0.0
    return SimResult(name, runs, seed, mean, std, samples, events=events)


def check_progress(scenario: Scenario, process: PreemptionProcess | None = None) -> None:
    """`NoProgress` up front for a scenario whose VM dies long before it could start (a
    replacement's preparation) or finish a step: `spotnb plan`'s rule for one instance."""
    process = scenario.process() if process is None else process
    check_hopeless(
        steps=scenario.steps,
        rate=1.0 / scenario.mean_step_time,
        mttp=best_mttp(process),
        start=mean_of(scenario.prep_time),
        start_words=f"prep_time {mean_of(scenario.prep_time):g} s",
        step=scenario.mean_step_time,
        who="VM",
    )


def estimate_events(
    scenario: Scenario, policy: Policy | str, process: PreemptionProcess | None = None
) -> float:
    """About how many events one run takes: the planned saves (the policy's first stride over
    the job) and, per preemption, a kill and an allocation; a lower bound (recompute is left
    out), as `spotnb plan`'s."""
    from spotnb.policy import resolve_policy
    from spotnb.sim.batch import mean_obs

    pol = resolve_policy(policy)
    process = scenario.process() if process is None else process
    mttp = float(getattr(process, "mttp", math.inf) or math.inf)
    kills = scenario.work / mttp if math.isfinite(mttp) else 0.0
    plan = pol.next_save(mean_obs(scenario, process), 0)
    saves = scenario.steps / plan.step if plan is not None and plan.step > 0 else 0.0
    return 1.0 + min(saves, float(scenario.steps)) + 2.0 * kills


def _stalled(sc: Scenario, mttp: float, t: float, high: int, quiet: int) -> NoProgress:
    return NoProgress(
        f"no progress: after {quiet:,} events ({t / 3600:.3g} h simulated) the job has got no "
        f"further than step {high:,} of {sc.steps:,}: its VM is preempted (MTTP {mttp:g} s) before "
        f"it is ready (prep_time {mean_of(sc.prep_time):g} s), finishes a step ({sc.mean_step_time:g} s) "
        f"or a save that counts (save_time {mean_of(sc.save_time):g} s + backup_time "
        f"{mean_of(sc.backup_time):g} s); raise mttp, or shorten those, or save less often"
    )


def _summarise(name: str, runs: int, seed: int, table: Any, keep_samples: bool) -> SimResult:
    """A `SimResult` from the batch engine's runs × METRICS array."""
    import numpy as np

    mean_v = table.mean(axis=0)
    std_v = table.std(axis=0, ddof=1) if runs > 1 else np.zeros(_N)
    mean = {k: float(mean_v[i]) for i, k in enumerate(METRICS)}
    std = {k: float(std_v[i]) for i, k in enumerate(METRICS)}
    samples = [dict(zip(METRICS, map(float, row), strict=True)) for row in table] if keep_samples else None
    return SimResult(name, runs, seed, mean, std, samples, engine="batch")


def simulate_run(
    sc: Scenario,
    policy: Policy,
    process: PreemptionProcess,
    rng_pre: random.Random,
    rng_dur: random.Random,
    *,
    max_events: int = MAX_EVENTS,
    spent: list[int] | None = None,
) -> tuple[float, ...]:
    """One execution; returns the figures in `METRICS` order. Past `max_events` events (VM
    attempts and planned saves) it raises `TooMuchWork`, after `STALL_EVENTS` of them without
    a new step or checkpoint `NoProgress`; `spent[0]` gets the events it took."""
    events = quiet = 0
    mark = -1
    total_steps = sc.steps
    st_lo, st_hi = as_range(sc.step_time)
    d_lo, d_hi = as_range(sc.save_time)
    b_lo, b_hi = as_range(sc.backup_time)
    a_lo, a_hi = as_range(sc.alloc_time)
    p_lo, p_hi = as_range(sc.prep_time)
    d_var, b_var, a_var, p_var, st_var = (d_hi - d_lo, b_hi - b_lo, a_hi - a_lo, p_hi - p_lo, st_hi - st_lo)
    work = total_steps * (st_lo + st_hi) / 2
    if sc.step_time_per == "step":  # i.i.d. per step: the mean over the many steps between events
        st_lo, st_var = (st_lo + st_hi) / 2, 0.0
    grace = float(sc.grace)
    rand = rng_dur.random
    next_kill = process.next_preemption
    mean_delta, mean_beta = (d_lo + d_hi) / 2, (b_lo + b_hi) / 2
    sd_delta, sd_beta = d_var / math.sqrt(12.0), b_var / math.sqrt(12.0)
    mttp, restart = process.mttp, sc.restart_time
    save_every = sc.save_every
    next_save = policy.next_save

    compute = recompute = save = alloc = prep = billed = 0.0
    preemptions = saves = insurance = emergency = 0
    committed = high = 0  # last committed step; most steps ever completed
    t = 0.0
    alloc_from = 0.0  # when the current replacement was requested
    stop = 0.0  # when the previous VM stopped (clean exit or kill)
    first = not sc.initial_start

    while True:
        # ---- get a ready VM -------------------------------------------------------------
        if first:
            first = False
            ta = 0.0
            kill = next_kill(0.0, rng_pre)
        else:
            while True:
                events += 1
                quiet += 1
                if quiet > STALL_EVENTS:
                    raise _stalled(sc, mttp, t, high, quiet)
                if events > max_events:
                    raise _too_much(sc, max_events, committed, t)
                ta = alloc_from + (a_lo + a_var * rand() if a_var else a_lo)
                kill = next_kill(ta, rng_pre)
                start = ta if ta > stop else stop  # the new VM cannot restore before the old left
                alloc += start - t if start > t else 0.0
                ready = start + (p_lo + p_var * rand() if p_var else p_lo)
                if kill > ready:
                    prep += ready - start
                    billed += ready - ta
                    t = ready
                    break
                # preempted while preparing: start over, no notice handling on a VM not running
                preemptions += 1
                t = kill if kill > start else start
                prep += t - start
                billed += max(0.0, kill - ta)
                stop = alloc_from = t
        # ---- run on it ------------------------------------------------------------------
        ready_t = t
        alloc_from = -1.0  # replacement not requested yet
        st = st_lo + st_var * rand() if st_var else st_lo
        step = committed
        notice = kill - grace
        notified = False
        upload_free = t
        pending: list[tuple[float, int]] = []
        finished = False
        obs = Observation(
            step,
            st,
            mean_delta,
            mean_beta,
            mttp,
            restart,
            grace,
            save_every,
            0,
            t - ready_t,
            t,
            total_steps,
            sd_delta,
            sd_beta,
        )
        plan = next_save(obs, step)
        plan_step = plan.step if plan is not None else total_steps
        stride = plan_step - step
        horizon = policy.stationary_until(obs) if plan is not None and stride > 0 else 0
        plan_ins = plan is not None and plan.kind is _INSURANCE
        while True:
            events += 1
            if high + committed > mark:
                mark, quiet = high + committed, 0
            else:
                quiet += 1
                if quiet > STALL_EVENTS:
                    raise _stalled(sc, mttp, t, high, quiet)
            if events > max_events:
                raise _too_much(sc, max_events, committed, t)
            target = plan_step if plan_step < total_steps else total_steps
            # target == step only right after a notice handled exactly at a planned save's
            # step without leaving: that save is due now (it used to slip by one step)
            if target < step or (target == step and not notified):
                target = step + 1
            t_target = t + (target - step) * st
            if not notified and notice < t_target:
                notified = True
                k = 0 if notice <= t else math.ceil((notice - t) / st)
                tb = t + k * st
                if tb <= kill:
                    if k:
                        end = step + k
                        new = end - high if end > high else 0
                        compute += new * st
                        recompute += (k - new) * st
                        if end > high:
                            high = end
                        step, t = end, tb
                    if step >= total_steps:
                        finished = True
                        break
                    while pending and pending[0][0] <= t:
                        committed = pending.pop(0)[1]
                    obs = Observation(
                        step,
                        st,
                        mean_delta,
                        mean_beta,
                        mttp,
                        restart,
                        grace,
                        save_every,
                        0,
                        t - ready_t,
                        t,
                        total_steps,
                        sd_delta,
                        sd_beta,
                    )
                    if policy.allocate_on_notice(obs):
                        alloc_from = max(notice, ready_t)
                    if policy.on_notice(obs, kill - t):
                        if step == committed:
                            stop = t  # nothing new to save: leave now
                            break
                        emergency += 1
                        d = d_lo + d_var * rand() if d_var else d_lo
                        b = b_lo + b_var * rand() if b_var else b_lo
                        if t + d >= kill:
                            save += kill - t
                            t = kill
                            break
                        u = (upload_free if upload_free > t + d else t + d) + b
                        if u <= kill:
                            save += u - t
                            t = u
                            committed = step
                            stop = u
                            break
                        save += kill - t
                        t = kill
                        break
                    continue
            if t_target > kill:
                done = int((kill - t) // st)
                end = step + done
                new = end - high if end > high else 0
                compute += new * st
                recompute += (kill - t) - new * st
                if end > high:
                    high = end
                t = kill
                break
            n = target - step
            new = target - high if target > high else 0
            compute += new * st
            recompute += (n - new) * st
            if target > high:
                high = target
            t, step = t_target, target
            if step >= total_steps:
                finished = True
                break
            d = d_lo + d_var * rand() if d_var else d_lo
            if t + d > kill:
                save += kill - t
                t = kill
                break
            t += d
            save += d
            saves += 1
            if plan_ins:
                insurance += 1
            b = b_lo + b_var * rand() if b_var else b_lo
            upload_free = (upload_free if upload_free > t else t) + b
            pending.append((upload_free, step))
            if step + stride <= horizon:
                plan_step = step + stride  # the policy said its stride holds here
                continue
            plan = next_save(
                Observation(
                    step,
                    st,
                    mean_delta,
                    mean_beta,
                    mttp,
                    restart,
                    grace,
                    save_every,
                    0,
                    t - ready_t,
                    t,
                    total_steps,
                    sd_delta,
                    sd_beta,
                ),
                step,
            )
            plan_step = plan.step if plan is not None else total_steps
            plan_ins = plan is not None and plan.kind is _INSURANCE

        if finished:
            billed += t - ready_t
            break
        # ---- the VM is gone ---------------------------------------------------------------
        if t >= kill:
            while pending and pending[0][0] <= kill:
                committed = pending.pop(0)[1]
            stop = kill
        preemptions += 1
        billed += stop - ready_t
        if alloc_from < 0:
            alloc_from = stop
        if alloc_from > stop:
            alloc_from = stop

    if spent is not None:
        spent[0] = events
    total = t
    cost = billed * sc.spot_price / 3600.0
    od_cost = compute * sc.on_demand_price / 3600.0
    return (
        compute,
        recompute,
        save,
        alloc,
        prep,
        total,
        float(preemptions),
        cost,
        od_cost,
        total / work - 1.0,
        float(saves),
        float(insurance),
        float(emergency),
    )


def _too_much(sc: Scenario, limit: int, committed: int, t: float) -> TooMuchWork:
    return TooMuchWork(
        f"steps: one run of {sc.steps:,} steps took more than {limit:,} events (at step "
        f"{committed:,}, {t / 3600:.3g} h simulated) and was stopped; lower steps (a shorter job "
        "has the same rates)"
    )
