"""`JobState`: the one reducer of a job's events — what every view and the controller read.

`JobState.apply(event)` folds one typed event (`spotnb.core.protocol`); `Job`, the controller, the
ledger (`breakdown()`), the CLI, the server extension and the widget all read a job through
it, so a status, a cost or a count of preemptions means the same everywhere.

Why incremental and not `job.events` re-read on every refresh: a 1,000,000-step job logs a
million metric rows; the views refresh several times a second. Each event is folded once
(O(1) amortised per metric row) into downsampled series, per-incarnation records and running
totals, so a refresh costs the same at step 10 and at step 1,000,000. It imports neither
plotly nor ipywidgets, and nothing that runs on the instance.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spotnb.core import protocol as ev
from spotnb.core.billing import CONTINUOUS, Billing
from spotnb.core.ledger import MAX_HOURLY, Breakdown, Span, compute_breakdown, coordinator_overheads
from spotnb.core.protocol import Event, JobStatus, Outcome, as_metric, from_json
from spotnb.core.savings import describe_savings

log = logging.getLogger("spotnb.core.state")

__all__ = ["Series", "Incarnation", "JobState", "FEED_KINDS", "MAX_POINTS", "describe_kill"]

MAX_POINTS = 1500  # per plotted trace; beyond this buckets double in width
MAX_PRICE_ZONES = 16  # zones whose price is drawn (a cloud's "cheapest" lists dozens: the first)
PACE_WINDOW = 30.0  # seconds of progress reports the steps/s and the ETA are measured over
PACE_POINTS = 120
#: kinds the event feed shows (and any kind this spotnb does not know: a newer writer's)
FEED_KINDS = frozenset(
    {
        "allocated",
        "alloc_failed",
        "moving",
        "checkpoint_placed",
        "ready",
        "resumed",
        "notice",
        "evacuated",
        "emergency_skipped",
        "preempted",
        "exited",
        "checkpoint",
        "checkpoint_failed",
        "checkpoint_invalid",
        "error",
        "done",
        "stopped",
        "warning",
        "hint",
        "job_resumed",
        "sync",
    }
)
_SILENT = frozenset({"heartbeat", "segment"})


def _merged_info(known: dict[str, Any], new: Any) -> dict[str, Any]:
    """An instance's `info` with a later event's added (a corrupt one, not a dict, is ignored)."""
    return {**known, **new} if isinstance(new, Mapping) else known


def describe_kill(e: Event | Mapping[str, Any]) -> str:
    """How a `preempted` event ended the instance, in words."""
    if e.get("how") == "evacuated":  # whether it saved is the checkpoint's own mark
        return "left cleanly after the notice"
    phase = e.get("phase")
    what = {"save": "killed while saving a checkpoint", "upload": "killed while uploading a checkpoint"}.get(
        phase or "", "killed"
    )
    if e.get("noticed") is False:
        what += " without notice"
    elif e.get("noticed"):
        what += " after the notice"
    return what


class Series:
    """(step, value) pairs downsampled into at most `max_points` buckets of equal step width.

    Steps must arrive in increasing order (true within one incarnation and for first-time
    steps). A bucket is drawn at its mean step and mean value, so a long run shows a smoothed
    curve rather than an aliased one. Width doubles (adjacent buckets merge) when full, so the
    cost per point is O(1) amortised and memory stays O(max_points)."""

    __slots__ = ("width", "max_points", "_ids", "_sx", "_my", "_mt", "_n", "version", "count", "integral")

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.width = 1
        self.max_points = max_points
        self._ids: list[int] = []
        self._sx: list[float] = []  # sums of steps (exact: steps are below 2**53)
        # means, not sums, of values and wall times: two finite values near the float maximum
        # overflow a sum, never a mean
        self._my: list[float] = []
        self._mt: list[float] = []
        self._n: list[int] = []
        self.version = 0
        self.count = 0  # raw points seen
        self.integral = True  # every value seen is a whole number (a count: ticks 2, 3, not 2.5)

    def add(self, step: int, value: float, t: float = 0.0) -> None:
        if not math.isfinite(value):
            return
        if self.integral and not float(value).is_integer():
            self.integral = False
        self.count += 1
        self.version += 1
        b = step // self.width
        if self._ids and self._ids[-1] == b:
            n = self._n[-1] + 1
            self._sx[-1] += step
            self._my[-1] = _mean(self._my[-1], n - 1, value, 1)
            self._mt[-1] = _mean(self._mt[-1], n - 1, t, 1)
            self._n[-1] = n
            return
        self._ids.append(b)
        self._sx.append(float(step))
        self._my.append(value)
        self._mt.append(t)
        self._n.append(1)
        if len(self._ids) > self.max_points:
            self._halve()

    def _halve(self) -> None:
        self.width *= 2
        ids: list[int] = []
        sx: list[float] = []
        my: list[float] = []
        mt: list[float] = []
        n: list[int] = []
        for b, x, y, t, c in zip(self._ids, self._sx, self._my, self._mt, self._n, strict=True):
            nb = b // 2
            if ids and ids[-1] == nb:
                sx[-1] += x
                my[-1] = _mean(my[-1], n[-1], y, c)
                mt[-1] = _mean(mt[-1], n[-1], t, c)
                n[-1] += c
            else:
                ids.append(nb)
                sx.append(x)
                my.append(y)
                mt.append(t)
                n.append(c)
        self._ids, self._sx, self._my, self._mt, self._n = ids, sx, my, mt, n

    def __len__(self) -> int:
        return len(self._ids)

    def xy(self) -> tuple[list[float], list[float]]:
        """Bucket means: (steps, values), ready to plot."""
        return [x / c for x, c in zip(self._sx, self._n, strict=True)], list(self._my)

    def times(self) -> list[float]:
        """Bucket means of the wall times the points were logged at (epoch seconds)."""
        return list(self._mt)


def _mean(a: float, na: int, b: float, nb: int) -> float:
    """The mean of `na` values averaging `a` and `nb` averaging `b`, without a sum that can
    overflow."""
    n = na + nb
    return a * (na / n) + b * (nb / n)


def _seconds(value: Any, default: float) -> float:
    """A row's wall time as a finite float, else `default` (the event's time)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            f = float(value)
        except OverflowError:
            return default
        if math.isfinite(f):
            return f
    return default


#: steps beyond this are not steps (a float no longer holds them exactly)
MAX_STEP = 2**53


@dataclass
class Incarnation:
    """What is known about one instance (one launch of the job)."""

    n: int
    allocating: float | None = None
    asked: float | None = None  # first `allocating` event (the ledger's alloc start)
    allocated: float | None = None
    # its latest `launched` not followed by `alloc_failed`: billed from there if its controller
    # died before recording the allocation (the instance ran all the same)
    launched: float | None = None
    launch_region: str | None = None
    started: float | None = None
    ready: float | None = None
    end: float | None = None
    end_how: str | None = None  # preempted (killed), evacuated, done, exited:<reason>
    preempted: bool = False  # ended by a `preempted` event (the ledger's view)
    instance_id: str | None = None
    region: str | None = None
    instance_type: str | None = None
    spot_price: float | None = None
    on_demand_price: float | None = None
    alloc_s: float | None = None
    prep_s: float | None = None
    from_step: int | None = None  # resumed from (None: fresh start)
    boundary: int | None = None  # steps <= boundary are recomputed here
    new_work_t: float | None = None  # first time a step beyond `boundary` was logged
    reached: int = -1  # highest step known done by this instance
    progress: ev.Progress | None = None  # the latest time accounts of this instance
    kinds: set[str] = field(default_factory=set)  # every kind it reported
    notice: ev.Notice | None = None
    moving: ev.Moving | None = None  # the controller moved the job away from this instance
    killed: ev.Preempted | None = None
    save_spans: list[tuple[float, float, str]] = field(default_factory=list)
    evacuating: float | None = None
    slot: int = 0  # which of the job's instances (lane) it filled
    replaces: int | None = None  # a replica move's new instance: the incarnation it replaces
    replicas: int | None = None  # the size of its latest quorum (jobs on several instances)
    # what the provider recorded of the instance (`launched`/`allocated` events); on a cloud,
    # a job on several instances names its coordinator there (the ledger's coordinator line)
    info: dict[str, Any] = field(default_factory=dict)

    def span(
        self, zone_prices: Mapping[str, list[tuple[float, float]]] | None = None, spot: float | None = None
    ) -> Span:
        """The ledger's view. `zone_prices`: the prices the controller saw per zone, which
        bill a price change while it ran where its provider recorded no schedule. `spot`: the
        job's spot price, for an instance whose allocation its controller never recorded."""
        allocated, price = self.allocated, self.spot_price or 0.0
        if allocated is None and self.launched is not None and (self.end or self.started) is not None:
            # launched, then its controller died before the `allocated` event; it ran (it
            # started, or a successor closed it): billed from its launch at its zone's last
            # price seen then (else the job's), continuously (its increments were not recorded)
            allocated = self.launched
            seen = [p for t, p in (zone_prices or {}).get(self.launch_region or "", ()) if t <= allocated]
            price = seen[-1] if seen else (spot or 0.0)
        return Span(
            self.n,
            self.asked,
            allocated,
            self.ready,
            self.end,
            # an instance that left after a notice lost no work: its tail after the last
            # report is the leave (upload, goodbye), not recompute
            self.preempted and self.end_how != "evacuated",
            self.progress,
            price,
            self.on_demand_price or 0.0,
            self.slot,
            Billing.from_info(self.info.get("billing")) or CONTINUOUS,
            self._price_steps(zone_prices or {}),
            self.replaces,
        )

    def _price_steps(
        self, zone_prices: Mapping[str, list[tuple[float, float]]]
    ) -> tuple[tuple[float, float], ...]:
        """Its zone's price changes: the schedule its provider recorded (the local market's),
        else the prices seen after its allocation (unless its price was the Config's own)."""
        schedule = self.info.get("price_schedule")
        if isinstance(schedule, list):
            steps = []
            for pair in schedule:
                if isinstance(pair, (list, tuple)) and len(pair) == 2:
                    t, p = pair
                    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in pair) and (
                        math.isfinite(t) and 0 <= p < MAX_HOURLY
                    ):
                        steps.append((float(t), float(p)))
            return tuple(sorted(steps))
        if self.allocated is None or self.info.get("price_fixed") or not self.region:
            return ()
        return tuple((t, p) for t, p in zone_prices.get(self.region, ()) if t > self.allocated)


class JobState:
    """Everything known about a job, folded from its events as they arrive."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self.job_start: float | None = None
        self.status: str = JobStatus.PENDING
        self.status_reason: str | None = None
        self.name: str | None = None
        self.provider: str | None = None
        self.instance_type: str | None = None
        self.submitted: ev.Submitted | None = None
        self.metric_names: list[str] = []
        self.first: dict[str, Series] = {}
        # recomputed steps: one segment per (metric, incarnation), drawn with gaps between them
        self.redo: dict[str, dict[int, Series]] = {}
        self.incs: dict[int, Incarnation] = {}
        # (step, hover text, wall time): drawn at the step, or at the time on a wall-time axis
        self.preempt_marks: list[tuple[int, str, float]] = []
        self.resume_marks: list[tuple[int, str, float]] = []
        self.checkpoints: list[ev.Checkpoint] = []
        self._placed: dict[int, float] = {}  # incarnation -> $ of its placement (a copy, a restore)
        self._saves_across = 0.0  # $ of saves written across regions
        self._placed_copy: dict[int, bool] = {}  # incarnation -> its latest placement copied
        self._copied_before = 0.0  # $ of copies made by placements a later one replaced
        # the store the latest placement writes the saves to (`Config.regional_stores`); None:
        # the home store
        self.checkpoint_store: str | None = None
        self._save_per_gb: dict[int, float] = {}  # incarnation -> $/GB of each of its saves
        self.feed: list[Event] = []
        self.step = 0
        self.total: int | None = None
        self.step_time: float | None = None
        self._pace: collections.deque[tuple[float, int]] = collections.deque(maxlen=PACE_POINTS)
        self.last_metrics: dict[str, float] = {}
        self.error: ev.Error | None = None
        self.result_step: int | None = None
        self.last_t: float | None = None
        self.preemptions = 0
        self.spot_price: float | None = None
        self.on_demand_price: float | None = None
        self.ledger_start: float | None = None  # first submission or allocation
        self.ended_at: float | None = None  # the last status, if it ended the job
        self._boundaries: dict[int, int] = {}
        # jobs on several instances: the live replica count over time (from `quorum` events),
        # and the highest step replica 0 logged (its rows are the job's series; a step logged
        # again at or below it was redone)
        self.replica_counts: list[tuple[float, int]] = []
        # (zone, time) of the latest capacity failures (`alloc_failed`): placement's penalty
        self.alloc_failures: collections.deque[tuple[str, float]] = collections.deque(maxlen=1000)
        # the spot price of each candidate zone over time (`prices` events): (t, $/h) steps
        self.zone_prices: dict[str, list[tuple[float, float]]] = {}
        self._replica_top = -1
        self.n_events = 0
        self.n_skipped = 0
        # bumped when a panel has something new to draw
        self.versions = {"metrics": 0, "timeline": 0, "breakdown": 0, "info": 0}

    @classmethod
    def from_events(cls, events: Iterable[Event | Mapping[str, Any]], **kwargs: Any) -> JobState:
        state = cls(**kwargs)
        state.feed_events(events)
        return state

    # -- folding ---------------------------------------------------------------------------
    def feed_events(self, events: Iterable[Event | Mapping[str, Any]]) -> None:
        """Fold events in order. A JSON record (a dict, e.g. from a synthetic stream) is read
        with the protocol's lenient `from_json` first."""
        for e in events:
            if not isinstance(e, Event):
                if not isinstance(e, Mapping) or not isinstance(e.get("kind"), str):
                    self.n_skipped += 1
                    continue
                e = from_json(e)
            try:
                self.apply(e)
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
                # a value no fold expected (a corrupt log, a newer writer): skip the event,
                # keep every view alive
                self.n_skipped += 1
                log.warning("skipped an event the view cannot read (%r): %.200s", exc, e)

    def _inc(self, n: int) -> Incarnation:
        inc = self.incs.get(n)
        if inc is None:
            inc = self.incs[n] = Incarnation(n)
        return inc

    def _boundary(self, n: int) -> int:
        """Highest step any earlier incarnation reached: steps at or below it are redone."""
        b = self._boundaries.get(n)
        if b is None:
            b = max((i.reached for m, i in self.incs.items() if m < n), default=-1)
            self._boundaries[n] = b
            self._inc(n).boundary = b
        return b

    def _reach(self, inc: Incarnation, step: int) -> None:
        if step > inc.reached:
            inc.reached = step
            if any(m > inc.n for m in self._boundaries):  # late news about an old instance
                self._boundaries = {m: b for m, b in self._boundaries.items() if m <= inc.n}

    def apply(self, e: Event) -> None:
        """Fold one event. The only place where an event kind changes what a job is."""
        self.n_events += 1
        kind, t, n = e.kind, e.t, e.incarnation
        self.last_t = t if self.last_t is None else max(self.last_t, t)
        v = self.versions
        if isinstance(e, ev.Metrics):
            self._fold_metrics(e, n)
            return
        if isinstance(e, ev.Progress):
            if not (isinstance(e.step, int) and not isinstance(e.step, bool) and 0 <= e.step < MAX_STEP):
                self.n_skipped += 1  # a step no job reaches (a corrupt log): every view divides by it
                return
            inc = self._inc(n) if n else None
            if inc is not None:
                inc.progress = e
                inc.kinds.add(kind)
            self.step = max(self.step, e.step)
            self._pace.append((e.t, self.front_step()))
            self.total = e.total or self.total
            if e.step_time:
                self.step_time = e.step_time
            v["breakdown"] += 1
            v["info"] += 1
            return
        if isinstance(e, ev.Quorum):
            if n:
                inc = self._inc(n)
                inc.kinds.add(kind)
                inc.replicas = e.replicas
            if not self.replica_counts or self.replica_counts[-1][1] != e.replicas:
                self.replica_counts.append((t, e.replicas))
                v["timeline"] += 1
            return
        if isinstance(e, ev.Prices):
            zones = e.zones if isinstance(e.zones, Mapping) else {}
            for zone, price in zones.items():
                if not (
                    isinstance(price, (int, float)) and not isinstance(price, bool) and math.isfinite(price)
                ):
                    continue
                series = self.zone_prices.get(str(zone))
                if series is None:
                    if len(self.zone_prices) >= MAX_PRICE_ZONES:
                        continue  # the first zones are drawn, not hundreds
                    series = self.zone_prices[str(zone)] = []
                series.append((t, float(price)))
            v["timeline"] += 1
            return
        if kind in _SILENT:
            if n:
                self._inc(n).kinds.add(kind)
            return
        if kind in FEED_KINDS or isinstance(e, ev.UnknownEvent):
            known = self.incs.get(n) if n else None
            if isinstance(e, ev.Ready) and known is not None and known.allocated is not None:
                # one preparation time for every view: the ledger's and the timeline's, from
                # the instance's allocation (billing) to its first step, not the agent's own
                # count from its process start (which leaves out the boot)
                e = dataclasses.replace(e, prep_s=max(0.0, t - known.allocated))
            self.feed.append(e)
            v["info"] += 1
        if isinstance(e, ev.Submitted):
            self.submitted = e
            self.job_start = t if self.job_start is None else min(self.job_start, t)
            self.ledger_start = t if self.ledger_start is None else min(self.ledger_start, t)
            self.name = e.name or self.name
            self.provider = e.provider
            self.instance_type = e.instance_type
            v["breakdown"] += 1
        elif isinstance(e, ev.Status):
            self.status = e.status
            self.status_reason = e.reason
            if n == 0:  # a resumed job ends again later: only the last end counts
                self.ended_at = t if e.status in _LEDGER_ENDS else None
            v["info"] += 1
            v["breakdown"] += 1
        elif isinstance(e, ev.Error):
            self.error = e
        elif isinstance(e, ev.Done):
            self.result_step = e.step
        if n == 0:
            return
        inc = self._inc(n)
        inc.kinds.add(kind)
        v["timeline"] += 1
        if self.job_start is None:
            self.job_start = t
        if isinstance(e, ev.Launched):
            inc.info = _merged_info(inc.info, e.info)
            inc.launched, inc.launch_region = t, e.region
            v["breakdown"] += 1
        elif isinstance(e, ev.AllocFailed):
            inc.launched = None  # that launch never ran (terminated); a later one may
            if e.region:
                self.alloc_failures.append((str(e.region), t))
        elif isinstance(e, ev.Allocating):
            inc.slot = e.slot
            if inc.asked is None:
                inc.asked = t
                if inc.allocating is None:
                    inc.allocating = t
                self.ledger_start = t if self.ledger_start is None else min(self.ledger_start, t)
                v["breakdown"] += 1
        elif isinstance(e, ev.Allocated):
            inc.allocated = t
            inc.instance_id = e.instance_id
            inc.region = e.region
            inc.instance_type = e.instance_type
            inc.info = _merged_info(inc.info, e.info)
            inc.spot_price = self.spot_price = e.spot_price or 0.0
            inc.on_demand_price = self.on_demand_price = e.on_demand_price or 0.0
            inc.alloc_s = e.alloc_s
            if inc.allocating is None:
                inc.allocating = t - (e.alloc_s or 0.0)
            v["breakdown"] += 1
        elif isinstance(e, ev.Started):
            inc.started = t
        elif isinstance(e, ev.Ready):
            if inc.ready is None:
                inc.ready = t
                inc.prep_s = e.prep_s
                self._boundary(n)
                v["breakdown"] += 1
        elif isinstance(e, ev.Resumed):
            step = e.from_step
            inc.from_step = step
            self.resume_marks.append(
                (
                    step,
                    (
                        f"#{n} resumed from step {step}<br>{e.save_kind or '?'} checkpoint "
                        f"(save {e.seq}), restore {e.restore_s or 0.0:.2f} s"
                    ),
                    t,
                )
            )
            v["metrics"] += 1
        elif isinstance(e, ev.Checkpoint):
            inc.save_spans.append((t - e.upload_s - e.snapshot_s, t - e.upload_s, str(e.save_kind)))
            self.checkpoints.append(e)
            self._reach(inc, e.step - 1)
            if self._save_per_gb.get(n):
                self._saves_across += (e.nbytes or 0) / 1e9 * self._save_per_gb[n]
                v["breakdown"] += 1
        elif isinstance(e, ev.CheckpointPlaced):
            # the latest placement of an incarnation counts (a successor controller that placed
            # it again after a kill replaces the first), but a copy the first one made was paid
            # for: its bytes moved (the restore across is the instance's, spent once)
            if self._placed_copy.get(n):
                self._copied_before += self._placed[n]
            self._placed[n] = max(0.0, e.cost or 0.0)
            self._placed_copy[n] = e.action == "copy"
            self._save_per_gb[n] = max(0.0, e.save_per_gb or 0.0)
            # where its saves go: the zone's store after a copy, else the store it reads from
            self.checkpoint_store = e.target if e.action == "copy" else e.source
            v["breakdown"] += 1
        elif isinstance(e, ev.Notice):
            inc.notice = e
        elif isinstance(e, ev.Moving):
            inc.moving = e
            to = e.to_incarnation
            if isinstance(to, int) and not isinstance(to, bool) and to > n:  # a replica's move
                self._inc(to).replaces = n
                v["breakdown"] += 1
        elif isinstance(e, ev.Evacuating):
            inc.evacuating = t
        elif isinstance(e, ev.Evacuated):
            self._reach(inc, e.step - 1)  # it saved after step e.step - 1 and left
            if inc.evacuating is not None:
                moved = "moving" in inc.kinds and inc.notice is None
                inc.save_spans.append((inc.evacuating, t, "move" if moved else "emergency"))
            inc.end_how = "evacuated"
        elif isinstance(e, ev.Preempted):
            inc.end = t
            inc.killed = e
            inc.preempted = True
            self.preemptions += 1
            inc.end_how = "evacuated" if e.how == Outcome.EVACUATED else "preempted"
            if e.step is not None:
                self._reach(inc, e.step - 1)
            if inc.progress is not None:  # its latest report, when its rows were not its own
                self._reach(inc, inc.progress.step - 1)
            bits = [
                f"#{n} {inc.instance_id or e.instance_id} preempted",
                f"at step ≈{max(inc.reached, 0)}",
                f"after {e.lifetime_s:.1f} s",
            ]
            bits.append(describe_kill(e))
            self.preempt_marks.append((max(inc.reached, 0), "<br>".join(bits), t))
            v["metrics"] += 1
            v["breakdown"] += 1
        elif isinstance(e, ev.Exited):
            inc.end = t
            inc.preempted = False
            inc.end_how = (
                inc.end_how
                if inc.end_how == "evacuated"
                else ("done" if e.reason == Outcome.DONE else f"exited: {e.reason}")
            )
            v["breakdown"] += 1

    def _fold_metrics(self, e: ev.Metrics, n: int) -> None:
        rows = e.rows
        if not rows:
            return
        inc = self._inc(n)
        inc.kinds.add("metrics")
        boundary = self._boundary(n) if n else -1
        new_t = inc.new_work_t
        top = inc.reached
        last = self.last_metrics
        for row in rows:
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(step, int) or isinstance(step, bool) or not -MAX_STEP < step < MAX_STEP:
                continue
            if step > top:  # whichever replica logged it, this instance reached the step
                top = step
            replica = row.get("replica")
            if replica is not None:  # several instances: replica 0 draws the job's series
                if replica != 0:
                    continue
                redo = step <= self._replica_top
                self._replica_top = max(self._replica_top, step)
            else:
                redo = step <= boundary
            rt = _seconds(row.get("t"), e.t)
            if not redo and new_t is None:
                new_t = rt
            for key, value in row.items():
                if key == "step" or key == "t" or key == "replica":
                    continue
                value = as_metric(value)
                if value is None:
                    continue
                last[key] = value
                if redo:
                    per = self.redo.get(key)
                    if per is None:
                        per = self.redo[key] = {}
                    s = per.get(n)
                    if s is None:
                        s = per[n] = Series(self.max_points // 4)
                    s.add(step, value, rt)
                else:
                    s = self.first.get(key)
                    if s is None:
                        s = self.first[key] = Series(self.max_points)
                        self.metric_names.append(key)
                    s.add(step, value, rt)
        inc.new_work_t = new_t
        self._reach(inc, top)
        self.versions["metrics"] += 1
        self.versions["info"] += 1

    # -- derived ---------------------------------------------------------------------------
    @property
    def live_replicas(self) -> int | None:
        """How many replicas trained the latest step of a job on several instances (None for a
        one-instance job, or before the first quorum)."""
        return self.replica_counts[-1][1] if self.replica_counts else None

    @property
    def done(self) -> bool:
        return self.status in ev.TERMINAL

    @property
    def checkpointed(self) -> bool:
        """Whether any checkpoint of this job was ever committed."""
        return bool(self.checkpoints)

    def now(self) -> float:
        """The right edge of the timeline: the end of the job, or the wall clock while it runs."""
        if self.done and self.last_t is not None:
            return self.last_t
        return max(time.time(), self.last_t or 0.0)

    @property
    def transfer_cost(self) -> float:
        """$ of moving checkpoints between regions (`checkpoint_placed`: a copy or a restore read
        across, then each save of that incarnation written across): the ledger's transfer line."""
        return sum(self._placed.values()) + self._saves_across + self._copied_before

    def breakdown(self, now: float | None = None) -> Breakdown:
        """Where the time and the money went (`spotnb.core.ledger`): the same figures for
        job.breakdown(), the widget, the panel, the CLI and the job DB."""
        if now is None:
            now = self.last_t if self.done and self.last_t is not None else time.time()
        b = compute_breakdown(
            [inc.span(self.zone_prices, self.spot_price) for inc in self.incs.values()],
            self.ledger_start,
            self.ended_at,
            now,
            overheads=coordinator_overheads(inc.info for inc in self.incs.values()),
        )
        b.preemptions = self.preemptions
        b.step, b.total_steps = self.step, self.total
        b.spot_price, b.on_demand_price = self.spot_price, self.on_demand_price
        b.transfer_cost = self.transfer_cost
        return b

    def live_instances(self) -> list[Incarnation]:
        """The instances the job holds now (allocated, not ended): what it is billed for."""
        return [i for i in self.incs.values() if i.allocated is not None and i.end is None]

    def hourly_rate(self, now: float | None = None) -> float:
        """What the job costs per hour now: each instance it holds at its zone's current spot
        price, plus its on-demand coordinator; 0 once it ended. Three instances cost three
        prices (the status bar once showed the last one allocated)."""
        if self.done:
            return 0.0
        now = time.time() if now is None else now
        rate = 0.0
        for inc in self.live_instances():
            price = inc.spot_price or 0.0
            for t, p in inc._price_steps(self.zone_prices):
                if t <= now:
                    price = p
            rate += price
        for item in coordinator_overheads(inc.info for inc in self.incs.values()):
            if item.end is None:
                rate += item.price
        return rate

    def front_step(self) -> int:
        """The step training is at now: the furthest latest report of an instance the job
        holds (after a preemption, the replacement's, which may be redoing steps), else the
        furthest step ever reported."""
        live = [i.progress.step for i in self.live_instances() if i.progress is not None]
        return max(live) if live else self.step

    def recomputing(self) -> tuple[int, int, int] | None:
        """(first, current, end) while the job redoes the steps a preemption lost: it resumed
        from `first`, is at `current`, and steps before `end` were done once already. None
        while it does new work."""
        live = [
            i
            for i in self.live_instances()
            if i.progress is not None and i.boundary is not None and i.from_step is not None
        ]
        if not live:
            return None
        inc = max(live, key=lambda i: i.progress.step if i.progress is not None else -1)
        current, end = inc.progress.step if inc.progress is not None else 0, (inc.boundary or 0) + 1
        first = inc.from_step or 0
        if (
            current >= end
            or end <= first
            or any(i.progress is not None and i.progress.step >= end for i in self.live_instances())
        ):
            return None
        return first, current, end

    def pace(self) -> tuple[float | None, float | None]:
        """(steps per second over the last `PACE_WINDOW` seconds of reports, seconds to the end
        at that rate), as tqdm shows them: the job's progress in wall time, so preemptions,
        restarts and saves slow it down as they do the user's wait. Measured from the current
        step (`front_step`), since the latest restart (a replacement redoing steps moves on
        from where it resumed: its pace, not a frozen figure). None while unknown."""
        points = list(self._pace)
        for k in range(len(points) - 1, 0, -1):
            if points[k][1] < points[k - 1][1]:  # a restart: the pace starts again there
                points = points[k:]
                break
        if len(points) < 2:
            return None, None
        t_end, s_end = points[-1]
        t0, s0 = next(((t, st) for t, st in points if t_end - t <= PACE_WINDOW), points[0])
        if t_end - t0 <= 0 or s_end <= s0:
            return None, None
        rate = (s_end - s0) / (t_end - t0)
        total = self.total
        eta = max(0.0, (int(total) - s_end) / rate) if total and not self.done else None
        return rate, eta

    def cost(self, b: Breakdown | None = None) -> dict[str, Any]:
        """Spent so far, on-demand equivalent, savings and the projected total at the current
        rate. `spot` is the spot instances' spend; `coordinator` the on-demand coordinator's
        of a job on several instances on a cloud (0.0 without one); `total` both, which the
        savings and the projection are measured from."""
        b = b or self.breakdown()
        projected: float | None = None
        total = b.total_steps or self.total
        if self.done:
            projected = b.total_cost
        elif total and self.step_time and b.spot_price is not None:
            remaining_s = max(0, int(total) - int(b.step)) * self.step_time
            projected = b.total_cost + remaining_s * self.hourly_rate() / 3600.0
        sv = describe_savings(b.total_cost, b.on_demand_cost, str(self.status), b.compute, b.lanes)
        baseline = sv.baseline
        if b.coordinator_price is not None:
            baseline += (
                f"; spent ${b.total_cost:.4f}: spot instances ${b.spot_cost:.4f} + "
                f"coordinator ${b.coordinator_cost:.4f} (on demand)"
            )
        return {
            "spot": b.spot_cost,
            "coordinator": b.coordinator_cost,
            "coordinator_price": b.coordinator_price,
            "total": b.total_cost,
            "on_demand": b.on_demand_cost,
            "savings": sv.fraction,  # None while withheld (spotnb.core.savings), and for a failed job
            "savings_text": sv.text,
            "savings_tone": sv.tone,
            "savings_baseline": baseline,
            "projected": projected,
            "spot_price": b.spot_price,
            "on_demand_price": b.on_demand_price,
            "hourly": self.hourly_rate(),  # $/h of everything the job holds now
            "instances_now": len(self.live_instances()),
        }


# the statuses after which the ledger stops the clock (`lost` is known only to the job DB)
_LEDGER_ENDS = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED})
