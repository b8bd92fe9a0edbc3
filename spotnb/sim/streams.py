"""Counter-based random numbers for the vectorised simulator: one value per (run, slot, draw).

Why not `numpy.random.Generator`: the batch engine evaluates VM lifetimes of many runs at once
and sometimes evaluates a lifetime twice (once assuming nothing about the job's progress, once
exactly near the end of the job). A value addressed by its coordinates, rather than taken from
a stream in call order, is the same whichever way the work is batched, so

* a seed reproduces every run exactly, whatever `runs` is and however runs are chunked
  (run `r` of 10 runs equals run `r` of 1,000), and
* re-evaluating a lifetime reuses its own draws: no draw is ever discarded or redrawn, so
  no choice of what to evaluate can bias a result.

Layout: run `r` has key `k_r` = output `r` of a SplitMix64 sequence started from
`SeedSequence(seed)`; the value for VM attempt `slot` and draw `var` is
`mix(mix(k_r ^ slot·C) + var·γ)`, with `mix` the SplitMix64 finaliser (a bijection with full
avalanche), as 53-bit uniforms in [0, 1). Draw numbers: see `A, P, E, X, D_EMERG, B_EMERG`
and `save_vars`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["run_keys", "slot_keys", "uniform", "A", "P", "E", "X", "D_EMERG", "B_EMERG", "save_vars"]

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_SLOT = np.uint64(0xD1B54A32D192ED03)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53

#: Draw numbers within a VM attempt: allocation, preparation, life counted from allocation
#: (decides a preemption during preparation), life counted from ready (memoryless), and the
#: emergency save's snapshot and upload. Planned save j (1-based) uses `save_vars(j)`.
A, P, E, X, D_EMERG, B_EMERG = range(6)


def save_vars(j: int) -> tuple[int, int]:
    """Draw numbers of planned save `j` (1-based) of a VM: its snapshot and its upload."""
    return 4 + 2 * j, 5 + 2 * j


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def run_keys(seed: int, runs: np.ndarray) -> np.ndarray:
    """The key of each run index in `runs` (uint64)."""
    base = np.random.SeedSequence(int(seed)).generate_state(1, np.uint64)[0]
    with np.errstate(over="ignore"):
        return _mix(base + (np.asarray(runs, dtype=np.uint64) + np.uint64(1)) * _GAMMA)


def slot_keys(keys: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Per (run key, VM attempt) key; broadcasts."""
    with np.errstate(over="ignore"):
        return _mix(keys ^ (np.asarray(slots, dtype=np.uint64) * _SLOT))


def uniform(skeys: np.ndarray, var: int) -> np.ndarray:
    """Uniform [0, 1) draw number `var` for each slot key."""
    with np.errstate(over="ignore"):
        z = _mix(skeys + np.uint64(var) * _GAMMA)
    return (z >> _S11).astype(np.float64) * _TO_UNIT
