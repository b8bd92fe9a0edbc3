"""Real spot preemption traces (Bamboo NSDI'23, Parcae NSDI'24; MIT) and what to do with them:
MTTP estimates that respect censoring, hazard profiles, and replay as a `PreemptionProcess`.

    from spotnb.traces import load_trace, trace_process
    tr = load_trace("bamboo/p3"); tr.mttp / 3600        # hours
    proc = trace_process("bamboo/p3")                   # for spotnb.sim or the local injector
"""

from __future__ import annotations

from spotnb.traces.formats import FORMATS, detect_format, parse
from spotnb.traces.trace import BUNDLED, Trace, bundled_traces, load_trace, trace_process

__all__ = [
    "Trace",
    "load_trace",
    "trace_process",
    "bundled_traces",
    "BUNDLED",
    "FORMATS",
    "detect_format",
    "parse",
]
