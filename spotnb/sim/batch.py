"""The vectorised simulator: many runs, many VM attempts per run, in a few array passes.

Why it is exact (same model as `engine.simulate_run`, different random numbers):

* With exponential lifetimes a VM that survived its preparation lives on for a fresh
  exponential time (memorylessness), so each VM attempt ("slot") can draw its life counted from
  allocation (`E`, decides whether preparation is preempted) and its life counted from ready
  (`X`) independently. Given a `BatchPlan` whose stride does not depend on the job's progress,
  what happens on a VM (`lifetime.lifetimes`) then does not depend on the run's state at all,
  except near the end of the job (the finish, `last_step`). So a batch of slots per run is
  evaluated at once "as if far from the end", the run's state is chained with cumulative sums,
  and the first slot whose VM gets near the end ("boundary") is evaluated again exactly from the
  known progress, with the same draws (`streams`: addressed, not sequential). Runs that have
  not finished take another batch.
* The replacement VM cannot start before the old one stopped; with allocation on notice that
  couples a slot to its predecessor through how early it was requested (`lead`). Whether a
  preparation is preempted therefore depends on the previous slot's outcome; it is resolved by
  iterating to the fixed point (a chain of such dependencies is as long as a run of back-to-back
  preemptions during preparation, so this converges in a few passes).

`plan_for` says when this applies; `engine.simulate` falls back to the event-by-event engine
otherwise (traces, piecewise MTTP, per-instance step times, policies without a `BatchPlan`).
"""

from __future__ import annotations

import math

import numpy as np

from spotnb.market.preempt import Exponential, Never, PreemptionProcess
from spotnb.policy.base import BatchPlan, Observation, Policy, SaveKind
from spotnb.sim import streams
from spotnb.sim.bounds import PLAN_EVENTS, STALL_EVENTS, Budget, NoProgress
from spotnb.sim.lifetime import Consts, Lives, lifetimes
from spotnb.sim.scenario import Scenario, as_range

__all__ = ["plan_for", "simulate_batch", "consts_for", "mean_obs"]

#: VM attempts ("slots") and expected planned saves evaluated per pass and chunk of runs:
#: bounds memory (tens of MB) without giving up long array operations.
_SLOT_BUDGET = 1 << 17
_SAVE_BUDGET = 1 << 21


def mean_obs(sc: Scenario, process: PreemptionProcess) -> Observation:
    """The observation the engine shows the policy at the job's start (step 0, age 0)."""
    st_lo, st_hi = as_range(sc.step_time)
    d_lo, d_hi = as_range(sc.save_time)
    b_lo, b_hi = as_range(sc.backup_time)
    return Observation(
        0,
        (st_lo + st_hi) / 2,
        (d_lo + d_hi) / 2,
        (b_lo + b_hi) / 2,
        process.mttp,
        sc.restart_time,
        float(sc.grace),
        sc.save_every,
        0,
        0.0,
        0.0,
        sc.steps,
        (d_hi - d_lo) / math.sqrt(12.0),
        (b_hi - b_lo) / math.sqrt(12.0),
    )


def plan_for(sc: Scenario, policy: Policy, process: PreemptionProcess | None = None) -> BatchPlan | None:
    """The policy's `BatchPlan` if the vectorised path can simulate this pair, else None."""
    process = sc.process() if process is None else process
    if type(process) not in (Exponential, Never):
        return None
    st_lo, st_hi = as_range(sc.step_time)
    if sc.step_time_per == "instance" and st_hi > st_lo:
        return None
    return policy.batch_plan(mean_obs(sc, process))


def consts_for(sc: Scenario, plan: BatchPlan, process: PreemptionProcess) -> Consts:
    st_lo, st_hi = as_range(sc.step_time)
    d_lo, d_hi = as_range(sc.save_time)
    b_lo, b_hi = as_range(sc.backup_time)
    a_lo, a_hi = as_range(sc.alloc_time)
    p_lo, p_hi = as_range(sc.prep_time)
    return Consts(
        sc.steps,
        (st_lo + st_hi) / 2,
        float(plan.stride or 0),
        float(plan.last_step),
        float(sc.grace),
        plan.notice_margin,
        plan.allocate_on_notice,
        plan.kind is SaveKind.INSURANCE,
        d_lo,
        d_hi - d_lo,
        b_lo,
        b_hi - b_lo,
        a_lo,
        a_hi - a_lo,
        p_lo,
        p_hi - p_lo,
        process.mttp,
        bool(sc.initial_start),
    )


def _slots_guess(c: Consts) -> int:
    """VM attempts per run to evaluate in the first pass: a generous Eq. 4.4-style guess (runs
    needing more just take further passes; the guess never changes any result)."""
    if math.isinf(c.mttp):
        return 1
    work = c.steps * c.st
    delta = c.d_lo + c.d_var / 2
    restart = c.a_lo + c.a_var / 2 + c.p_lo + c.p_var / 2
    tau = min(work, c.stride * c.st if c.stride else c.mttp)
    wall = work + (work / tau) * delta * (c.stride > 0) + (work / c.mttp) * (restart + tau / 2)
    slots = wall / (c.mttp + restart) + 1.0
    return int(min(1 << 17, math.ceil(1.2 * slots + 3.0 * math.sqrt(slots) + 4)))


class _Runs:
    """Per-run state and accumulated figures (one entry per run)."""

    def __init__(self, n: int) -> None:
        self.slot = np.zeros(n, dtype=np.int64)  # next VM attempt
        self.committed = np.zeros(n)
        self.lead = np.zeros(n)  # of the last VM (0 after a failed prep)
        self.done = np.zeros(n, dtype=bool)
        # accumulated figures, seconds or counts
        self.alloc = np.zeros(n)
        self.prep = np.zeros(n)
        self.save = np.zeros(n)
        self.train = np.zeros(n)
        self.billed = np.zeros(n)
        self.total = np.zeros(n)
        self.preemptions = np.zeros(n)
        self.saves = np.zeros(n)
        self.emergency = np.zeros(n)


def simulate_batch(
    sc: Scenario,
    plan: BatchPlan,
    process: PreemptionProcess,
    runs: int,
    seed: int,
    *,
    budget: Budget | None = None,
    name: str = "",
) -> tuple[np.ndarray, int]:
    """Figures in `engine.METRICS` order, one row per run (runs × len(METRICS)), and the
    events it took (VM attempts and planned saves evaluated). A pass that would take `budget`
    past its limit is `TooMuchWork` before it runs; a run whose checkpointed progress has not
    moved in `STALL_EVENTS` VM attempts is `NoProgress` (`spotnb.sim.bounds`)."""
    budget = Budget(PLAN_EVENTS, "the simulation") if budget is None else budget
    c = consts_for(sc, plan, process)
    keys = streams.run_keys(seed, np.arange(runs))
    state = _Runs(runs)
    first_pass = _slots_guess(c)
    later = max(8, first_pass // 4)
    # planned saves are evaluated per slot too: budget them (a stride of a few steps on long
    # lives would otherwise hold millions of saves in memory at once)
    saves_per_slot = 1.0
    if c.stride and math.isfinite(c.mttp):
        saves_per_slot += min(c.mttp, c.steps * c.st) / (c.stride * c.st)
    per_chunk = max(1, min(_SLOT_BUDGET // first_pass, int(_SAVE_BUDGET // (first_pass * saves_per_slot))))
    events = 0
    stalled = np.zeros(runs, dtype=np.int64)  # VM attempts since the run's last progress
    # what a VM attempt costs: itself and its planned saves (all of the job's, without preemptions)
    per_slot = 1.0 + (min(c.mttp, c.steps * c.st) / (c.stride * c.st) if c.stride else 0.0)
    for lo in range(0, runs, per_chunk):
        rows = np.arange(lo, min(runs, lo + per_chunk))
        width = first_pass
        while rows.size:
            cost = int(rows.size * width * per_slot)
            if cost > budget.left:
                raise budget.exceeded(f"{name or 'a policy'}, {rows.size} run(s) still going")
            before = state.committed[rows].copy()
            _pass(c, state, rows, keys[rows], width)
            budget.spend(cost)
            events += cost
            moved = (state.committed[rows] > before) | state.done[rows]
            stalled[rows] = np.where(moved, 0, stalled[rows] + width)
            if stalled[rows].max() > STALL_EVENTS:
                raise NoProgress(
                    f"no progress: after {STALL_EVENTS:,} VM attempts in a row a run of "
                    f"{name or 'the policy'} has got no further than step "
                    f"{int(state.committed[rows].min()):,} of {sc.steps:,}: "
                    f"its VMs are preempted (MTTP {c.mttp:g} s) before they are ready, finish a "
                    "step or a save that counts; raise mttp, or shorten prep_time, step_time or "
                    "save_time, or save less often"
                )
            rows = rows[~state.done[rows]]
            width = later
    return _figures(c, sc, state), events


def _pass(c: Consts, r: _Runs, rows: np.ndarray, keys: np.ndarray, width: int) -> None:
    """Evaluate `width` VM attempts of each run in `rows`, keep those before the run's first
    boundary slot, and settle that slot exactly."""
    n = rows.size
    T, S = float(c.steps), c.stride
    slots = r.slot[rows][:, None] + np.arange(width)[None, :]
    sk = streams.slot_keys(keys[:, None], slots)
    first = (slots == 0) if not c.initial_start else np.zeros(slots.shape, dtype=bool)
    A = np.where(first, 0.0, c.a_lo + c.a_var * streams.uniform(sk, streams.A) if c.a_var else c.a_lo)
    P = np.where(first, 0.0, c.p_lo + c.p_var * streams.uniform(sk, streams.P) if c.p_var else c.p_lo)
    if math.isinf(c.mttp):
        E = lam = np.full(slots.shape, math.inf)
    else:
        E = -c.mttp * np.log1p(-streams.uniform(sk, streams.E))
        lam = -c.mttp * np.log1p(-streams.uniform(sk, streams.X))

    # -- every VM as if far from the end of the job -------------------------------------------
    c0 = r.committed[rows]
    if S:
        bound = np.ceil((T - c0) / S)
        nS = np.repeat(bound, width)
    else:
        nS = np.zeros(n * width)
    life = lifetimes(c, lam.ravel(), np.full(n * width, math.inf), nS, sk.ravel())
    lead = life.lead.reshape(n, width)

    # -- chain the slots: was preparation preempted? (depends on the previous VM's lead) ------
    carry = r.lead[rows]

    def prev_lead(ok: np.ndarray) -> np.ndarray:
        gp = np.empty((n, width))
        gp[:, 0] = carry
        gp[:, 1:] = np.where(ok[:, :-1], lead[:, :-1], 0.0)
        return gp

    ok = first | (E > P)
    gp = prev_lead(ok)
    if c.prealloc:
        for _ in range(width + 1):
            new = first | (P + np.maximum(0.0, gp - A) < E)
            if np.array_equal(new, ok):
                break
            ok = new
            gp = prev_lead(ok)
    wait = np.where(first, 0.0, np.maximum(0.0, gp - A))  # new VM waits for the old to stop
    alloc = np.where(first, 0.0, np.maximum(A - gp, 0.0))
    prep = np.where(ok, P, np.maximum(E - wait, 0.0))
    L = life.stop.reshape(n, width)
    progress = np.where(ok, life.progress.reshape(n, width), 0.0)
    before = c0[:, None] + np.cumsum(progress, axis=1) - progress
    limit = T - before
    if S:
        limit = np.minimum(limit, S * (np.floor((c.last_step - before) / S) + 1.0))
    boundary = ok & (life.reached.reshape(n, width) >= limit)
    has = boundary.any(axis=1)
    b = np.where(has, boundary.argmax(axis=1), width)
    keep = np.arange(width)[None, :] < b[:, None]

    def total(x: np.ndarray) -> np.ndarray:
        return np.where(keep, x, 0.0).sum(axis=1)

    r.alloc[rows] += total(alloc)
    r.prep[rows] += total(prep)
    r.save[rows] += total(np.where(ok, life.save.reshape(n, width), 0.0))
    r.train[rows] += total(np.where(ok, life.train.reshape(n, width), 0.0))
    r.billed[rows] += total(np.where(ok, P + wait + L, E))
    r.total[rows] += total(alloc + prep + np.where(ok, L, 0.0))
    r.preemptions[rows] += b
    r.saves[rows] += total(np.where(ok, life.saves.reshape(n, width), 0.0))
    r.emergency[rows] += total(np.where(ok, life.emergency.reshape(n, width), 0.0))
    r.committed[rows] += total(progress)
    last_lead = np.where(ok[:, -1], lead[:, -1], 0.0)
    r.lead[rows] = np.where(has, 0.0, last_lead)
    r.slot[rows] += np.where(has, 0, width)

    # -- the boundary slot, exactly ------------------------------------------------------------
    if not has.any():
        return
    i = np.nonzero(has)[0]
    j = b[i]
    at = rows[i]
    c_b = before[i, j]
    F = T - c_b
    if S:
        nS_b = np.maximum(0.0, np.minimum(np.floor((c.last_step - c_b) / S), np.ceil(F / S) - 1))
    else:
        nS_b = np.zeros(i.size)
    ex: Lives = lifetimes(c, lam[i, j], F, nS_b, sk[i, j])
    r.alloc[at] += alloc[i, j]
    r.prep[at] += P[i, j]
    r.save[at] += ex.save
    r.train[at] += ex.train
    r.billed[at] += P[i, j] + wait[i, j] + ex.stop
    r.total[at] += alloc[i, j] + P[i, j] + ex.stop
    r.saves[at] += ex.saves
    r.emergency[at] += ex.emergency
    r.preemptions[at] += np.where(ex.finished, 0.0, 1.0)
    r.committed[at] = c_b + np.where(ex.finished, 0.0, ex.progress)
    r.lead[at] = np.where(ex.finished, 0.0, ex.lead)
    r.slot[at] = slots[i, j] + 1
    r.done[at] = ex.finished


def _figures(c: Consts, sc: Scenario, r: _Runs) -> np.ndarray:
    compute = c.steps * c.st
    recompute = np.maximum(0.0, r.train - compute)
    work = c.steps * c.st
    insurance = r.saves if c.insurance else np.zeros_like(r.saves)
    return np.column_stack(
        [
            np.full_like(r.total, compute),
            recompute,
            r.save,
            r.alloc,
            r.prep,
            r.total,
            r.preemptions,
            r.billed * sc.spot_price / 3600.0,
            np.full_like(r.total, compute * sc.on_demand_price / 3600.0),
            r.total / work - 1.0,
            r.saves,
            insurance,
            r.emergency,
        ]
    )
