"""How the replicas of a job on several instances agree: `Config.sync`.

Shared by the notebook side (validation) and the runtime (which strategy to run); light: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SyncSpec", "parse_sync", "SYNC_FORMS"]

SYNC_FORMS = "'ddp', 'local_sgd:K' or 'diloco:K' (K: steps between synchronisations, e.g. 'diloco:50')"


@dataclass(frozen=True)
class SyncSpec:
    """`kind`: ddp (gradients averaged every step), local_sgd (weights averaged every `every`
    steps) or diloco (an outer Nesterov step on the averaged pseudo-gradient every `every` steps;
    DiLoCo, Douillard et al. 2023). The last two trade staleness for communicating K times
    less, which pays when a replica sits behind a slow link."""

    kind: str
    every: int = 1


def parse_sync(text: str) -> SyncSpec:
    """`SyncSpec` from the Config string; ValueError naming the valid forms otherwise."""
    m = re.fullmatch(r"\s*(ddp|local_sgd|diloco)\s*(?::\s*(\d+))?\s*", str(text))
    if m is None:
        raise ValueError(f"unknown sync {text!r}; give {SYNC_FORMS}")
    kind, every = m.group(1), m.group(2)
    if kind == "ddp":
        if every is not None:
            raise ValueError(f"sync {text!r}: 'ddp' averages every step and takes no ':K'")
        return SyncSpec("ddp", 1)
    if every is None:
        raise ValueError(f"sync {text!r}: say how many steps between synchronisations, e.g. '{kind}:50'")
    k = int(every)
    if not 1 <= k <= 100_000:
        raise ValueError(f"sync {text!r}: K must be between 1 and 100000 steps")
    return SyncSpec(kind, k)
