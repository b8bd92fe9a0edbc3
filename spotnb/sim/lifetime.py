"""One VM lifetime, for many VMs at once: the event-driven engine's inner loop as array code.

For a VM that became ready at relative time 0 with `lam` seconds to live, whose job has `F`
steps to go, and whose plan (a `BatchPlan`) saves every `S` steps at most `nS` times, this
computes what `engine.simulate_run` computes between "ready" and "the VM is gone": when it
stops, the save and training time, the committed progress, how far training got, the saves
made, whether it did an emergency save, and how early the replacement was requested. It mirrors
the engine's rules (the `engine.py` docstring) case by case:

* planned save j starts when its step is reached, `s_j = j·S·st + D_{j-1}` (D = snapshots so
  far), blocks for δ_j, and uploads serially: `u_j = max(u_{j-1}, e_j) + β_j`;
* the notice (`lam − grace`) is handled at the first step boundary after it (or right after the
  save it fell in); there the policy may request the replacement, and may leave with an
  emergency save (or at once if nothing new needs saving);
* otherwise the kill cuts a save or a step; committed = the last upload finished by then;
* reaching step F finishes the job.

Planned saves are evaluated column by column (save 1 of every VM, then save 2 of the VMs that
live long enough, ...), with VMs sorted by how many saves they can reach so each column is a
prefix slice: a Python loop over the save index, never over VMs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spotnb.sim import streams

__all__ = ["Consts", "Lives", "lifetimes"]


@dataclass(frozen=True)
class Consts:
    """Everything about a scenario and a `BatchPlan` the array engine needs (seconds, steps)."""

    steps: int
    st: float  # step time (the mean: per-step times average out between events)
    stride: float  # steps between planned saves; 0 = no planned saves
    last_step: float  # no planned save beyond this step
    grace: float
    notice_margin: float  # emergency save iff time left at the boundary > this
    prealloc: bool  # replacement requested at the notice
    insurance: bool  # planned saves count as insurance saves
    d_lo: float
    d_var: float
    b_lo: float
    b_var: float
    a_lo: float
    a_var: float
    p_lo: float
    p_var: float
    mttp: float  # exponential lifetimes; inf = never preempted
    initial_start: bool


@dataclass
class Lives:
    """Per-VM results of `lifetimes`, all relative to the VM's ready time."""

    stop: np.ndarray  # when the VM stopped (or the job finished)
    save: np.ndarray  # seconds in the save bucket
    train: np.ndarray  # seconds training (compute + recompute)
    progress: np.ndarray  # committed steps gained
    reached: np.ndarray  # most steps completed (F when finished)
    saves: np.ndarray  # planned saves completed
    emergency: np.ndarray  # bool: an emergency save was attempted
    finished: np.ndarray  # bool: the job finished on this VM
    lead: np.ndarray  # stop − when the replacement was requested (0 = at stop)


def _draw(lo: float, var: float, keys: np.ndarray, num: int) -> np.ndarray:
    if var:
        return lo + var * streams.uniform(keys, num)
    return np.full(keys.shape, lo)


def lifetimes(c: Consts, lam: np.ndarray, F: np.ndarray, nS: np.ndarray, keys: np.ndarray) -> Lives:
    """Evaluate VMs with lives `lam` (inf allowed), `F` steps to the end of the job (inf: not
    known, the job never finishes here) and at most `nS` planned saves; `keys` are their
    `streams.slot_keys`."""
    n = lam.shape[0]
    S, st = c.stride, c.st
    if S > 0 and n:
        with np.errstate(invalid="ignore", over="ignore"):
            reach = np.floor(lam / (S * st)) + 1.0
        J = np.minimum(nS, reach).astype(np.int64)
    else:
        J = np.zeros(n, dtype=np.int64)
    order = np.argsort(-J, kind="stable")
    Js, lam, F, nS, keys = J[order], lam[order], F[order], nS[order], keys[order]
    with np.errstate(invalid="ignore"):
        N = lam - c.grace
    finite = np.isfinite(lam)

    # -- planned saves, column by column ------------------------------------------------------
    max_j = int(Js[0]) if n else 0
    D = np.zeros(n)
    U = np.zeros(n)
    cs, ce, cu, cd, lens = [], [], [], [], []
    neg = -Js
    for j in range(1, max_j + 1):
        m = int(np.searchsorted(neg, -j, side="right"))
        dv, bv = streams.save_vars(j)
        k = keys[:m]
        d = _draw(c.d_lo, c.d_var, k, dv)
        b = _draw(c.b_lo, c.b_var, k, bv)
        s = j * S * st + D[:m]
        e = s + d
        u = np.maximum(U[:m], e) + b
        D[:m] += d
        U[:m] = u
        cs.append(s)
        ce.append(e)
        cu.append(u)
        cd.append(D[:m].copy())
        lens.append(m)

    if lens:
        s_f, e_f, u_f, d_f = (np.concatenate(x) for x in (cs, ce, cu, cd))
        lens_a = np.asarray(lens, dtype=np.int64)
        start = np.concatenate(([0], np.cumsum(lens_a)[:-1]))
        row = np.arange(s_f.size) - np.repeat(start, lens_a)
        col = np.repeat(np.arange(1, max_j + 1), lens_a)
    else:
        s_f = e_f = u_f = d_f = np.zeros(0)
        start = np.zeros(1, dtype=np.int64)
        row = col = np.zeros(0, dtype=np.int64)

    def count(mask: np.ndarray) -> np.ndarray:
        return np.bincount(row[mask], minlength=n).astype(np.int64)

    def at(flat: np.ndarray, j: np.ndarray) -> np.ndarray:
        """flat[save j of each VM], 0 where j == 0."""
        out = np.zeros(n)
        j = j.astype(np.int64)
        has = j > 0
        if has.any():
            idx = np.nonzero(has)[0]
            out[idx] = flat[start[j[idx] - 1] + idx]
        return out

    lam_r = lam[row]
    jN = count(s_f <= N[row])  # saves reached before the notice is seen
    nKs = count(s_f <= lam_r)  # saves started before the kill
    nKd = count(e_f <= lam_r)  # saves whose snapshot finished before the kill
    up_K = count(u_f <= lam_r)  # uploads finished before the kill

    eN, uN, DN = at(e_f, jN), at(u_f, jN), at(d_f, jN)
    with np.errstate(invalid="ignore"):
        k = np.ceil(np.maximum(0.0, N - eN) / st)
    tb = eN + k * st  # first boundary after the notice
    step_tb = jN * S + k
    before_tb = col <= jN[row]
    up_tb = count(before_tb & (u_f <= tb[row]))
    up_K_tb = count(before_tb & (u_f <= lam_r))

    nF = np.minimum(nS, Js)
    with np.errstate(invalid="ignore"):
        tF = F * st + at(d_f, nF)
    notice = finite & (tb <= lam)
    with np.errstate(invalid="ignore"):
        leave = notice & ((lam - tb) > c.notice_margin) & (step_tb < F)
        fin = ~leave & (tF <= lam)

    # -- killed (or notice without an emergency save): the kill cuts a save or a step ------
    DK, eK, sK = at(d_f, nKd), at(e_f, nKd), at(s_f, nKs)
    cut = nKs > nKd
    with np.errstate(invalid="ignore"):
        reached_k = np.where(cut, nKs * S, nKd * S + np.floor((lam - eK) / st))
        save_k = DK + np.where(cut, lam - sK, 0.0)

    # -- leave on the notice ---------------------------------------------------------------
    committed_tb = up_tb * S
    quit_now = leave & (step_tb == committed_tb)
    emergency = leave & ~quit_now
    de = _draw(c.d_lo, c.d_var, keys, streams.D_EMERG)
    be = _draw(c.b_lo, c.b_var, keys, streams.B_EMERG)
    ue = np.maximum(uN, tb + de) + be
    ok = (tb + de < lam) & (ue <= lam)
    stop_l = np.where(quit_now, tb, np.where(ok, ue, lam))

    with np.errstate(invalid="ignore"):
        stop = np.where(fin, tF, np.where(leave, stop_l, lam))
        save = np.where(fin, at(d_f, nF), np.where(leave, DN + (stop_l - tb), save_k))
        train = np.where(fin, F * st, np.where(leave, tb - DN, lam - save_k))
        progress = np.where(
            leave, np.where(quit_now, committed_tb, np.where(ok, step_tb, up_K_tb * S)), up_K * S
        )
        reached = np.where(fin, F, np.where(leave, step_tb, reached_k))
        saves = np.where(fin, nF, np.where(leave, jN, nKd))
        lead = np.where(notice & ~fin, stop - np.maximum(N, 0.0), 0.0) if c.prealloc else np.zeros(n)

    inv = np.empty_like(order)
    inv[order] = np.arange(n)
    return Lives(
        stop[inv],
        save[inv],
        train[inv],
        progress[inv].astype(np.float64),
        reached[inv],
        saves[inv].astype(np.float64),
        emergency[inv],
        fin[inv],
        lead[inv],
    )
