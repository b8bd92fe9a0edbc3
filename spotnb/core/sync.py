"""How the replicas of a job on several instances agree: `Config.sync`.

Shared by the notebook side (validation) and the runtime (which strategy to run); light: no torch.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SyncSpec", "parse_sync", "choose_sync", "SYNC_FORMS", "SWITCH_UP", "SWITCH_DOWN", "TARGET"]

SYNC_FORMS = (
    "'ddp', 'local_sgd:K', 'diloco:K' (K: steps between synchronisations, e.g. 'diloco:50') or 'auto'"
)

#: `auto` leaves ddp when one all-reduce costs more than this share of a step's compute ...
SWITCH_UP = 0.5
#: ... and comes back when it costs less than this share (hysteresis: no flapping in between)
SWITCH_DOWN = 0.2
#: in local SGD, `auto` picks K so that the synchronisation costs about this share of the window
TARGET = 0.1
#: measurements (one per step in ddp, one per window otherwise) a decision needs
SAMPLES = 3
MAX_EVERY = 64


@dataclass(frozen=True)
class SyncSpec:
    """`kind`: ddp (gradients averaged every step), local_sgd (weights averaged every `every`
    steps) or diloco (an outer Nesterov step on the averaged pseudo-gradient every `every` steps;
    DiLoCo, Douillard et al. 2023). The last two trade staleness for communicating K times
    less, which pays when a replica sits behind a slow link."""

    kind: str
    every: int = 1

    def __str__(self) -> str:
        return self.kind if self.kind in ("ddp", "auto") else f"{self.kind}:{self.every}"


def parse_sync(text: str) -> SyncSpec:
    """`SyncSpec` from the Config string; ValueError naming the valid forms otherwise."""
    m = re.fullmatch(r"\s*(ddp|local_sgd|diloco|auto)\s*(?::\s*(\d+))?\s*", str(text))
    if m is None:
        raise ValueError(f"unknown sync {text!r}; give {SYNC_FORMS}")
    kind, every = m.group(1), m.group(2)
    if kind in ("ddp", "auto"):
        if every is not None:
            what = "averages every step" if kind == "ddp" else "chooses K itself"
            raise ValueError(f"sync {text!r}: '{kind}' {what} and takes no ':K'")
        return SyncSpec(kind, 1)
    if every is None:
        raise ValueError(f"sync {text!r}: say how many steps between synchronisations, e.g. '{kind}:50'")
    k = int(every)
    if not 1 <= k <= 100_000:
        raise ValueError(f"sync {text!r}: K must be between 1 and 100000 steps")
    return SyncSpec(kind, k)


def choose_sync(mode: str, every: int, samples: Sequence[tuple[float, float]]) -> tuple[str, int]:
    """`sync="auto"`: the strategy for the next step or window, from the last measurements
    `(compute_s, comm_s)`: seconds of one step's local compute and of one all-reduce of the
    model, averaged over the replicas (every replica holds the same numbers, so every replica
    decides the same without another message).

    SPOTNIK's switch: synchronise every step (`ddp`) while the all-reduce is cheap next to the
    step; when it costs more than `SWITCH_UP` of it (a replacement landed behind a slow link),
    average weights only every K steps (`local_sgd`), K chosen so the synchronisation costs
    about `TARGET` of the window; come back to `ddp` below `SWITCH_DOWN`. The median of the
    last `SAMPLES` measurements is used, so one slow step does not switch."""
    if len(samples) < SAMPLES:
        return mode, every
    compute = statistics.median(c for c, _ in samples[-SAMPLES:])
    comm = statistics.median(m for _, m in samples[-SAMPLES:])
    if compute <= 0.0:
        return mode, every
    ratio = comm / compute
    k = max(2, min(MAX_EVERY, math.ceil(ratio / TARGET)))
    if mode == "ddp":
        return ("local_sgd", k) if ratio > SWITCH_UP else (mode, every)
    if ratio < SWITCH_DOWN:
        return "ddp", 1
    if k > 2 * every or 2 * k < every:  # the link changed a lot: re-tune K
        return mode, k
    return mode, every
