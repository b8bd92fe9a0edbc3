"""A job on several instances, simulated: liveput, cost and recompute, and how many instances
to rent (Parcae's question) — `spotnb plan --scenario FILE --instances 1,2,4`.

The model is what `spotnb.control.fleet` and `spotnb.runtime.group.elastic` do:

* `instances` slots; each is preempted by the scenario's process (its own draw per slot, or
  the same trace for every slot: a trace's waves then hit every instance at once, which is
  what traces of real markets show); a preempted slot is refilled after `alloc_time` +
  `prep_time` + `join_time` (the replacement's allocation, start and state transfer from a
  peer) and billed from allocation on.
* With k live replicas a step of the global batch takes `step_time / k + sync_time / K` (data
  parallel; `sync_time` is one all-reduce of the model, K the steps between synchronisations
  of `sync`: 1 for ddp, K for `local_sgd:K` / `diloco:K`, and for `auto` what
  `spotnb.core.sync.choose_sync` picks from the all-reduce's share of a step with k replicas).
  A kill without notice costs the survivors `pause` seconds (the lighthouse's detection;
  measured by benchmarks/bench_elastic.py) and the work the failed synchronisation undoes: the
  step in flight in ddp, the window in flight with K > 1 (`runtime.elastic` restores the
  window's snapshot). A notice costs nothing (the replica leaves after its step).
  What the simulator does not know is how many more steps local SGD / DiLoCo need for the same
  loss (benchmarks/bench_sync.py measures it on a model): `spotnb plan` says so.
* After the whole group was lost, the first replacement back waits up to `cold_wait` seconds
  for the others before it restores from the store and trains (`runtime.elastic`'s
  `COLD_START_WAIT`). Below `min_instances` live replicas nobody trains. When none is live
  the job restores from the store: the work since the last store checkpoint is redone.
  Store checkpoints are taken every `save_every` steps if set, else at Daly's interval for
  the *group* MTTP (`spotnb.policy.group`), each blocking the step for `save_time`.

Time is wall time; cost is instance-seconds at the spot price, plus, for several instances on
a cloud, the on-demand coordinator for the whole run (`coordinator_price`). `liveput` samples
the steps per second over time (at most `MAX_SAMPLES`: a long run samples less often).

The work is bounded: a scenario that cannot progress (instances preempted before they start or
finish a step) is a `NoProgress` verdict, up front where the MTTP says so and otherwise after
`STALL_EVENTS` events without a new step; a run is stopped at `MAX_EVENTS` events and a plan at
`PLAN_EVENTS` (`TooMuchWork`, naming what to lower), refused up front where an estimate says
so. Both are ValueErrors: `spotnb plan` prints them and exits 2.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from spotnb.core.sync import SAMPLES, choose_sync, parse_sync
from spotnb.market.preempt import PreemptionProcess
from spotnb.policy.group import group_mttp
from spotnb.policy.intervals import daly_interval
from spotnb.sim.bounds import (
    MAX_EVENTS,
    PLAN_EVENTS,
    STALL_EVENTS,
    NoProgress,
    TooMuchWork,
    best_mttp,
    check_hopeless,
    fitting_steps,
)
from spotnb.sim.scenario import Scenario, mean_of

__all__ = [  # the bounds are `sim.bounds`'s, shared with `spotnb simulate`
    "FleetResult",
    "simulate_fleet",
    "plan_instances",
    "estimate_events",
    "NoProgress",
    "TooMuchWork",
    "MAX_EVENTS",
    "PLAN_EVENTS",
    "STALL_EVENTS",
    "MAX_SAMPLES",
]

#: Most liveput samples kept per run.
MAX_SAMPLES = 1000


@dataclass
class FleetResult:
    instances: int
    wall: float
    cost: float
    recompute: float  # wall seconds of training redone (steps in flight at kills, store restores)
    group_losses: int
    preemptions: int
    liveput: list[tuple[float, float]] = field(default_factory=list)  # (t, steps/s) samples
    events: int = 0  # loop steps the run took (events and saves)

    @property
    def steps_per_dollar(self) -> float:
        return math.inf if self.cost <= 0 else 1.0 / self.cost

    def as_dict(self) -> dict[str, Any]:
        return {
            "instances": self.instances,
            "wall": self.wall,
            "cost": self.cost,
            "recompute": self.recompute,
            "group_losses": self.group_losses,
            "preemptions": self.preemptions,
        }


@dataclass
class _Setup:
    """What a run derives from the scenario before it starts (shared by the run and the
    estimate of its work)."""

    process: PreemptionProcess
    window: Any  # live replicas -> steps between synchronisations
    step1: float  # mean seconds of one step on one instance
    replace: float  # allocation + preparation + join of a replacement
    start: float  # preparation + join: an allocated instance's exposure before it trains
    mttp: float  # the process's long-run MTTP (inf: never)
    best_mttp: float  # the longest MTTP the process has in any phase (inf: unknown or never)
    save: float
    save_every_s: float
    rate_full: float  # steps/s with every instance live


def _setup(scenario: Scenario, instances: int, join_time: float, sync_time: float, sync: str) -> _Setup:
    window = _windows(parse_sync(sync), scenario.mean_step_time, sync_time)
    process = scenario.process()
    step1 = scenario.mean_step_time
    replace = mean_of(scenario.alloc_time) + mean_of(scenario.prep_time) + join_time
    mttp = float(getattr(process, "mttp", None) or 3600.0)
    gm = group_mttp(mttp, instances, replace) if math.isfinite(mttp) else math.inf
    save = mean_of(scenario.save_time)
    if scenario.save_every:
        save_every_s = scenario.save_every * (step1 / instances + sync_time / window(instances))
    elif math.isfinite(gm):
        save_every_s = daly_interval(save, gm, replace)
    else:
        save_every_s = math.inf
    # a save that costs nothing would be taken continuously (Daly's interval is 0): take it at
    # most once per step of the full group, which is what the runtime can do
    save_every_s = max(save_every_s, step1 / instances + sync_time / window(instances))
    return _Setup(
        process=process,
        window=window,
        step1=step1,
        replace=replace,
        start=mean_of(scenario.prep_time) + join_time,
        mttp=mttp,
        best_mttp=best_mttp(process),
        save=save,
        save_every_s=save_every_s,
        rate_full=instances / (step1 + instances * sync_time / window(instances)),
    )


def _check_progress(scenario: Scenario, setup: _Setup, instances: int, join_time: float) -> None:
    """The verdict, before anything runs, on a scenario whose instances die long before they
    could progress (Poisson preemptions; even the best phase of a piecewise one)."""
    check_hopeless(
        steps=scenario.steps,
        rate=setup.rate_full,
        mttp=setup.best_mttp,
        start=setup.start,
        start_words=f"prep_time {mean_of(scenario.prep_time):g} s + join {join_time:g} s",
        step=setup.step1,
        who="instance",
    )


def estimate_events(
    scenario: Scenario, instances: int, *, join_time: float = 0.1, sync_time: float = 0.0, sync: str = "ddp"
) -> float:
    """About how many events one run of `simulate_fleet` takes (saves, and per preemption a
    kill, an allocation and a join): a lower bound, since recompute is left out."""
    return _estimate(scenario, _setup(scenario, instances, join_time, sync_time, sync), instances)


def _estimate(scenario: Scenario, setup: _Setup, instances: int) -> float:
    wall = scenario.steps / setup.rate_full
    saves = wall / setup.save_every_s if math.isfinite(setup.save_every_s) else 0.0
    kills = instances * wall / setup.mttp if math.isfinite(setup.mttp) else 0.0
    if setup.save == 0:  # free saves are taken once between two events (simulate_fleet)
        saves = min(saves, 3.0 * kills + 1.0)
    return 1.0 + saves + 3.0 * kills


def _fitting_steps(scenario: Scenario, estimate: float, limit: float) -> str:
    return fitting_steps(scenario.steps, estimate, limit)


def simulate_fleet(
    scenario: Scenario,
    instances: int,
    rng: random.Random,
    *,
    min_instances: int = 1,
    join_time: float = 0.1,
    sync_time: float = 0.0,
    sync: str = "ddp",
    pause: float = 0.25,
    cold_wait: float = 5.0,
    sample_every: float | None = None,
    coordinator_price: float = 0.0,
    max_events: int = MAX_EVENTS,
) -> FleetResult:
    """One run of `scenario` on `instances` instances (see the module docstring).
    `coordinator_price`: $/h of the on-demand coordinator that a job on several instances pays
    for the whole run on a cloud (0: the local market's lighthouse, free). Raises `NoProgress`
    for a job that cannot finish and `TooMuchWork` past `max_events` events."""
    if instances < 1 or min_instances < 1 or min_instances > instances:
        raise ValueError(f"need 1 <= min_instances <= instances, got {min_instances}, {instances}")
    for name, value in (
        ("join_time", join_time),
        ("sync_time", sync_time),
        ("pause", pause),
        ("cold_wait", cold_wait),
    ):
        if not 0 <= value < math.inf:
            raise ValueError(f"{name}: give seconds, a finite number >= 0; got {value!r}")
    if not 0 <= coordinator_price < math.inf:
        raise ValueError(f"coordinator_price: give $/h, a finite number >= 0; got {coordinator_price!r}")
    setup = _setup(scenario, instances, join_time, sync_time, sync)
    _check_progress(scenario, setup, instances, join_time)
    estimate = _estimate(scenario, setup, instances)
    if estimate > max_events:
        raise TooMuchWork(
            f"steps: simulating {scenario.steps:,} steps on {instances} instance(s) takes about "
            f"{estimate:.2g} events per run (saves and preemptions), past the limit of {max_events:,}; "
            f"lower steps to about {_fitting_steps(scenario, estimate, max_events)} (a shorter job has "
            "the same rates)"
        )
    window, step1, replace, save = setup.window, setup.step1, setup.replace, setup.save
    save_every_s, process = setup.save_every_s, setup.process
    # each slot its own copy of the process (a trace replays the same waves in every slot:
    # real markets reclaim capacity from all instances of a zone at once) and its own draws
    procs = [process.fresh() for _ in range(instances)]
    rngs = [random.Random(rng.random()) for _ in range(instances)]
    up = [True] * instances  # training in the group
    gen = [0] * instances  # the slot's current instance: events of an earlier one are stale
    events: list[tuple[float, int, str, int]] = []

    def next_kill(now: float, slot: int) -> float:
        return procs[slot].next_preemption(now, rngs[slot])

    for k in range(instances):
        heapq.heappush(events, (next_kill(0.0, k), k, "kill", 0))
    t, done, last_ckpt_step, last_ckpt_t = 0.0, 0.0, 0.0, 0.0
    billed = [0.0] * instances  # when each slot's current instance started billing
    cost = recompute = 0.0
    losses = preemptions = 0
    liveput: list[tuple[float, float]] = []
    sample = sample_every or max(1.0, scenario.work / 200)
    next_sample = 0.0
    total = float(scenario.steps)
    price = scenario.spot_price / 3600.0
    alloc = mean_of(scenario.alloc_time)
    waiting: set[int] = set()  # cold-starting instances waiting for their peers (runtime.elastic)
    steps_taken = 0  # events and saves: bounded by max_events
    best, quiet = 0.0, 0  # the job's furthest progress, and the events since it was passed

    def release() -> None:
        nonlocal last_ckpt_t
        if waiting:
            for j in waiting:
                up[j] = True
            waiting.clear()
            last_ckpt_t = t

    while done < total:
        steps_taken += 1
        if done > best:
            best, quiet = done, 0
        else:
            quiet += 1
            if quiet > STALL_EVENTS:
                raise NoProgress(_stalled(scenario, setup, instances, t, best, quiet))
        if steps_taken > max_events:
            raise TooMuchWork(
                f"steps: one run of {scenario.steps:,} steps on {instances} instance(s) took more than "
                f"{max_events:,} events (at step {done:,.0f}, {t / 3600:.3g} h simulated) and was "
                f"stopped; lower steps (a shorter job has the same rates)"
            )
        live = sum(up)
        every = window(live)
        rate = live / (step1 + live * sync_time / every) if live >= min_instances else 0.0
        t_next = events[0][0] if events else math.inf
        # time to finish, and the next store checkpoint while training
        t_finish = t + (total - done) / rate if rate > 0 else math.inf
        t_ckpt = max(t, last_ckpt_t + save_every_s) if rate > 0 else math.inf
        if save == 0 and t < t_ckpt < math.inf:
            # free saves: only the last before the next event (or the end) matters, so jump to
            # it instead of taking each (one per step with Daly's interval of 0)
            whole = math.floor((min(t_next, t_finish) - last_ckpt_t) / save_every_s)
            if whole > 1:
                t_ckpt = max(t, last_ckpt_t + whole * save_every_s)
        # an event due during a save or a pause happens when it ends
        t_step = max(t, min(t_next, t_finish, t_ckpt))
        if not math.isfinite(t_step):
            raise NoProgress(
                "no progress: the simulated job can never finish (no live instance, none coming)"
            )
        while next_sample <= t_step:
            liveput.append((next_sample, rate))
            next_sample += sample
            if len(liveput) >= 2 * MAX_SAMPLES:  # a long run: every other sample, half as often
                del liveput[1::2]
                sample *= 2
                next_sample = liveput[-1][0] + sample
        done += rate * (t_step - t)
        t = t_step
        if t == t_finish:
            break
        if t == t_ckpt and t_ckpt <= t_next:
            t += save  # the save blocks the step
            last_ckpt_step, last_ckpt_t = done, t
            continue
        _, k, what, g = heapq.heappop(events)
        if what == "cold_end":
            release()
            continue
        if g != gen[k]:
            continue  # an event of an instance that is gone
        if what == "kill":
            # an instance is exposed from its allocation on: a replacement can be preempted
            # while it starts, before it ever trains
            preemptions += 1
            cost += (t - billed[k]) * price
            gen[k] += 1
            waiting.discard(k)
            if up[k]:
                up[k] = False
                if sum(up) == 0:  # the whole group is gone: back to the store's checkpoint
                    losses += 1
                    lost_steps = done - last_ckpt_step
                    recompute += lost_steps * step1 / instances
                    done = last_ckpt_step
                elif rate > 0:  # the survivors undo the step (window) in flight, after a pause
                    # (their own snapshot of the window's start, whatever the store holds)
                    lost = min(done, 1.0 if every == 1 else done % every)
                    done -= lost
                    last_ckpt_step = min(last_ckpt_step, done)
                    recompute += lost / rate + pause
                    t += pause
            billed[k] = math.inf  # not billing until the replacement is allocated
            heapq.heappush(events, (t + alloc, k, "billed", gen[k]))
        elif what == "billed":
            billed[k] = t
            heapq.heappush(events, (t + (replace - alloc), k, "join", gen[k]))
            heapq.heappush(events, (next_kill(t, k), k, "kill", gen[k]))
        elif any(up):  # join live peers: healed from one of them
            up[k] = True
        else:  # a cold start restores from the store, after waiting for its peers a moment
            if not waiting:
                heapq.heappush(events, (t + cold_wait, -1, "cold_end", 0))
            waiting.add(k)
            if len(waiting) == instances:
                release()
    for k in range(instances):
        if math.isfinite(billed[k]):
            cost += (t - billed[k]) * price
    if instances > 1:
        cost += t * coordinator_price / 3600.0
    return FleetResult(instances, t, cost, recompute, losses, preemptions, liveput, steps_taken)


def _stalled(scenario: Scenario, setup: _Setup, instances: int, t: float, best: float, quiet: int) -> str:
    return (
        f"no progress: after {quiet:,} events ({t / 3600:.3g} h simulated) the job on {instances} "
        f"instance(s) has got no further than step {best:,.0f} of {scenario.steps:,}: its instances "
        f"are preempted (MTTP {setup.mttp:g} s) before they start (allocation + start "
        f"{setup.replace:g} s) or finish work that counts (a step: {setup.step1:g} s; a save: "
        f"{setup.save:g} s); raise mttp, or shorten alloc_time, prep_time, step_time or save_time"
    )


def _windows(spec: Any, step_time: float, sync_time: float) -> Any:
    """live replicas → steps between synchronisations (K) under `spec`; `auto` decides as the
    runtime does, from one step's compute (the global batch split k ways) and one all-reduce."""

    def every(live: int) -> int:
        if spec.kind != "auto":
            return int(spec.every)
        samples = [(step_time / max(live, 1), sync_time)] * SAMPLES
        mode, k = choose_sync("ddp", 1, samples)
        return 1 if mode == "ddp" else k

    return every


def plan_instances(
    scenario: Scenario,
    counts: list[int],
    runs: int = 20,
    seed: int = 0,
    syncs: tuple[str, ...] = ("ddp",),
    *,
    max_events: int = PLAN_EVENTS,
    **kw: Any,
) -> list[dict[str, Any]]:
    """Mean wall time, cost and progress per dollar for each instance count and sync strategy,
    best first (by steps per dollar, then time). Parcae's question: how many instances to
    rent; SPOTNIK's: how often to synchronise them. The same seeds for every combination.
    The whole plan takes at most `max_events` events (`TooMuchWork`), refused up front when
    the estimate is past it. A count that cannot progress is a row with its `verdict` (no
    figures; last); when none can, `NoProgress` says why."""
    if runs < 1:
        raise ValueError(f"runs: give 1 or more, got {runs!r}")
    combos = [(n, sync) for n in counts for sync in dict.fromkeys(syncs if n > 1 else ("ddp",))]
    join_time, sync_time = kw.get("join_time", 0.1), kw.get("sync_time", 0.0)
    estimate, verdicts = 0.0, {}
    for n, sync in combos:
        setup = _setup(scenario, n, join_time, sync_time, sync)
        try:
            _check_progress(scenario, setup, n, join_time)
        except NoProgress as exc:
            verdicts[n, sync] = str(exc)
            continue
        estimate += runs * _estimate(scenario, setup, n)
    if estimate > max_events:
        raise TooMuchWork(
            f"simulating {len(combos)} count(s) and strategies x {runs} run(s) of {scenario.steps:,} "
            f"steps takes about {estimate:.2g} events, past the plan's limit of {max_events:,}; "
            f"lower steps to about {_fitting_steps(scenario, estimate, max_events)} (a shorter job has "
            "the same rates), or the runs, or the counts"
        )
    budget = {"left": max_events, "limit": max_events}  # the plan's events, spent run by run
    rows = []
    for n, sync in combos:
        try:
            if (n, sync) in verdicts:
                raise NoProgress(verdicts[n, sync])
            rows.append(_plan_row(scenario, n, sync, runs, seed, budget, **kw))
        except NoProgress as exc:
            verdicts[n, sync] = str(exc)
            rows.append(_verdict_row(n, sync, str(exc)))
    if len(verdicts) == len(combos):  # nothing can progress: one verdict (the first) says why
        raise NoProgress(next(iter(verdicts.values())))
    return sorted(rows, key=lambda r: (-r["steps_per_dollar"], r["wall_s"]))


def _verdict_row(n: int, sync: str, verdict: str) -> dict[str, Any]:
    """A count that cannot progress: no figures, ranked last, and why."""
    nothing = {
        k: math.inf for k in ("wall_s", "wall_sd", "cost", "recompute_s", "group_losses", "preemptions")
    }
    return {"instances": n, "sync": sync, **nothing, "steps_per_dollar": 0.0, "verdict": verdict}


def _plan_row(
    scenario: Scenario, n: int, sync: str, runs: int, seed: int, budget: dict[str, int], **kw: Any
) -> dict[str, Any]:
    results = []
    for i in range(runs):
        cap = min(MAX_EVENTS, budget["left"])
        try:
            r = simulate_fleet(scenario, n, random.Random(seed * 1000 + i), sync=sync, max_events=cap, **kw)
        except TooMuchWork:
            if cap == MAX_EVENTS:
                raise
            raise TooMuchWork(
                f"the plan took more than its limit of {budget['limit']:,} events and "
                f"was stopped at {n} instance(s), {sync}, run {i + 1} of {runs}; lower steps, the runs "
                "or the counts"
            ) from None
        budget["left"] -= r.events
        results.append(r)
    wall = statistics.mean(r.wall for r in results)
    cost = statistics.mean(r.cost for r in results)
    return {
        "instances": n,
        "sync": sync,
        "wall_s": wall,
        "wall_sd": statistics.pstdev(r.wall for r in results),
        "cost": cost,
        "steps_per_dollar": scenario.steps / cost if cost > 0 else math.inf,
        "recompute_s": statistics.mean(r.recompute for r in results),
        "group_losses": statistics.mean(r.group_losses for r in results),
        "preemptions": statistics.mean(r.preemptions for r in results),
    }
