"""A multi-node availability trace replayed as the local market's capacity for one job.

The Bamboo and Parcae traces record how many spot nodes of a cluster were alive over time.
A job on N instances replays one as *node counts*: at market time t the market has room for

    capacity(t) = round(N · count(t · speed) / peak)

of the job's instances (`peak`: the trace's largest count; `speed`: trace seconds per second
of the market, `Config.local_trace_speed`). When the count falls below the job's live
instances the market kills the newest ones (no notice: a trace does not say whether the cloud
gave one), and while the job has as many instances as the count allows an allocation fails
for lack of capacity, which the controller retries: a trace's waves reach the job as waves.
"""

from __future__ import annotations

from spotnb.traces.trace import Trace

__all__ = ["NodeCounts"]


class NodeCounts:
    """The capacity a trace gives a job of `instances` instances, over market time."""

    def __init__(self, trace: Trace, instances: int, speed: float = 1.0) -> None:
        if not trace.counts or max(trace.counts) <= 0:
            raise ValueError(f"trace {trace.name!r} never has a live node: nothing to replay")
        self.trace, self.instances, self.speed = trace, instances, speed
        self.peak = max(trace.counts)
        self.span = max(trace.span, trace.times[-1] if trace.times else 0.0) or 1.0

    def trace_time(self, t: float) -> float:
        """Where in the trace market time `t` falls (it cycles)."""
        return (t * self.speed) % self.span

    def capacity(self, t: float) -> int:
        count = self.trace.count_at(self.trace_time(t))
        return max(0, min(self.instances, round(self.instances * count / self.peak)))
