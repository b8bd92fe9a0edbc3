"""`JobState`: an incremental reduction of a job's events into what the views draw.

Why a reducer and not `job.events` re-read on every refresh: a 1,000,000-step job logs a
million metric rows; the views refresh several times a second. The reducer folds each event
once (O(1) amortised per metric row) into downsampled series, per-incarnation timelines and a
compact event list for `spotnb.ledger.breakdown`, so a refresh costs the same at step 10 and
at step 1,000,000. It imports neither plotly nor ipywidgets, so it is cheap to test.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from spotnb.events import as_metric
from spotnb.ledger import Breakdown, breakdown

log = logging.getLogger("spotnb.widget")

__all__ = ["Series", "Incarnation", "JobState", "FEED_KINDS", "MAX_POINTS", "describe_kill"]

MAX_POINTS = 1500          # per plotted trace; beyond this buckets double in width
FEED_KINDS = frozenset({
    "allocated", "alloc_failed", "ready", "resumed", "notice", "evacuated", "emergency_skipped",
    "preempted", "exited", "checkpoint", "checkpoint_failed", "checkpoint_invalid", "error",
    "done", "stopped", "warning", "hint", "job_resumed",
})
# the only kinds `ledger.breakdown` looks at (progress: only the latest per incarnation matters)
_LEDGER_KINDS = frozenset({"submitted", "status", "allocating", "allocated", "ready",
                           "preempted", "exited"})


def describe_kill(e: dict[str, Any]) -> str:
    """How a `preempted` event ended the instance, in words."""
    if e.get("how") == "evacuated":
        return "left cleanly after an emergency save"
    phase = e.get("phase")
    what = {"save": "killed while saving a checkpoint",
            "upload": "killed while uploading a checkpoint"}.get(phase or "", "killed")
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

    __slots__ = ("width", "max_points", "_ids", "_sx", "_sy", "_n", "version", "count")

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.width = 1
        self.max_points = max_points
        self._ids: list[int] = []
        self._sx: list[float] = []
        self._sy: list[float] = []
        self._n: list[int] = []
        self.version = 0
        self.count = 0   # raw points seen

    def add(self, step: int, value: float) -> None:
        if not math.isfinite(value):
            return
        self.count += 1
        self.version += 1
        b = step // self.width
        if self._ids and self._ids[-1] == b:
            self._sx[-1] += step
            self._sy[-1] += value
            self._n[-1] += 1
            return
        self._ids.append(b)
        self._sx.append(float(step))
        self._sy.append(value)
        self._n.append(1)
        if len(self._ids) > self.max_points:
            self._halve()

    def _halve(self) -> None:
        self.width *= 2
        ids: list[int] = []
        sx: list[float] = []
        sy: list[float] = []
        n: list[int] = []
        for b, x, y, c in zip(self._ids, self._sx, self._sy, self._n):
            nb = b // 2
            if ids and ids[-1] == nb:
                sx[-1] += x
                sy[-1] += y
                n[-1] += c
            else:
                ids.append(nb)
                sx.append(x)
                sy.append(y)
                n.append(c)
        self._ids, self._sx, self._sy, self._n = ids, sx, sy, n

    def __len__(self) -> int:
        return len(self._ids)

    def xy(self) -> tuple[list[float], list[float]]:
        """Bucket means: (steps, values), ready to plot."""
        return ([x / c for x, c in zip(self._sx, self._n)],
                [y / c for y, c in zip(self._sy, self._n)])


@dataclass
class Incarnation:
    """What the timeline needs about one instance (one launch of the job)."""
    n: int
    allocating: float | None = None
    allocated: float | None = None
    started: float | None = None
    ready: float | None = None
    end: float | None = None
    end_how: str | None = None          # preempted (killed), evacuated, done, exited:<reason>
    instance_id: str | None = None
    region: str | None = None
    instance_type: str | None = None
    spot_price: float | None = None
    alloc_s: float | None = None
    prep_s: float | None = None
    from_step: int | None = None        # resumed from (None: fresh start)
    boundary: int | None = None         # steps <= boundary are recomputed here
    new_work_t: float | None = None     # first time a step beyond `boundary` was logged
    reached: int = -1                   # highest step known done by this instance
    notice: dict[str, Any] | None = None
    killed: dict[str, Any] | None = None
    save_spans: list[tuple[float, float, str]] = field(default_factory=list)
    evacuating: float | None = None


class JobState:
    """Everything the widget and the text view draw, folded from events as they arrive."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self.job_start: float | None = None
        self.status = "pending"
        self.status_reason: str | None = None
        self.name: str | None = None
        self.provider: str | None = None
        self.instance_type: str | None = None
        self.metric_names: list[str] = []
        self.first: dict[str, Series] = {}
        # recomputed steps: one segment per (metric, incarnation), drawn with gaps between them
        self.redo: dict[str, dict[int, Series]] = {}
        self.incs: dict[int, Incarnation] = {}
        self.preempt_marks: list[tuple[int, str]] = []   # (step, hover text)
        self.resume_marks: list[tuple[int, str]] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.feed: list[dict[str, Any]] = []
        self.step = 0
        self.total: int | None = None
        self.step_time: float | None = None
        self.last_metrics: dict[str, float] = {}
        self.error: dict[str, Any] | None = None
        self.result_step: int | None = None
        self.last_t: float | None = None
        self._ledger: list[dict[str, Any]] = []
        self._progress: dict[int, dict[str, Any]] = {}
        self._boundaries: dict[int, int] = {}
        self.n_events = 0
        # bumped when a panel has something new to draw
        self.n_skipped = 0
        self.versions = {"metrics": 0, "timeline": 0, "breakdown": 0, "info": 0}

    # -- folding ---------------------------------------------------------------------------
    def feed_events(self, events: Iterable[dict[str, Any]]) -> None:
        for e in events:
            try:
                self._fold(e)
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
                # a field of an unexpected type (a corrupt log, a newer writer): skip the
                # event, keep the view alive
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
            if any(m > inc.n for m in self._boundaries):   # late news about an old instance
                self._boundaries = {m: b for m, b in self._boundaries.items() if m <= inc.n}

    def _fold(self, e: dict[str, Any]) -> None:
        self.n_events += 1
        kind, t, n = e.get("kind"), float(e.get("t") or 0.0), int(e.get("incarnation") or 0)
        self.last_t = t if self.last_t is None else max(self.last_t, t)
        v = self.versions
        if kind in _LEDGER_KINDS:
            self._ledger.append(e)
            v["breakdown"] += 1
        if kind == "metrics":
            self._fold_metrics(e, n)
            return
        if kind == "progress":
            self._progress[n] = e
            self.step = max(self.step, int(e.get("step") or 0))
            self.total = e.get("total") or self.total
            if e.get("step_time"):
                self.step_time = float(e["step_time"])
            v["breakdown"] += 1
            v["info"] += 1
            return
        if kind in ("heartbeat",):
            return
        if kind in FEED_KINDS:
            self.feed.append(e)
            v["info"] += 1
        if kind == "submitted":
            self.job_start = t if self.job_start is None else min(self.job_start, t)
            self.name = e.get("name") or self.name
            self.provider = e.get("provider")
            self.instance_type = e.get("instance_type")
        elif kind == "status":
            self.status = e.get("status", self.status)
            self.status_reason = e.get("reason")
            v["info"] += 1
        elif kind == "error":
            self.error = e
        elif kind == "done":
            self.result_step = e.get("step")
        if n == 0:
            return
        inc = self._inc(n)
        v["timeline"] += 1
        if self.job_start is None:
            self.job_start = t
        if kind == "allocating" and inc.allocating is None:
            inc.allocating = t
        elif kind == "allocated":
            inc.allocated = t
            inc.instance_id = e.get("instance_id")
            inc.region = e.get("region")
            inc.instance_type = e.get("instance_type")
            inc.spot_price = e.get("spot_price")
            inc.alloc_s = e.get("alloc_s")
            if inc.allocating is None:
                inc.allocating = t - float(e.get("alloc_s") or 0.0)
        elif kind == "started":
            inc.started = t
        elif kind == "ready" and inc.ready is None:
            inc.ready = t
            inc.prep_s = e.get("prep_s")
            self._boundary(n)
        elif kind == "resumed":
            step = int(e.get("from_step") or 0)
            inc.from_step = step
            self.resume_marks.append((step, (
                f"#{n} resumed from step {step}<br>{e.get('save_kind', '?')} checkpoint "
                f"#{e.get('seq', '?')}, restore {float(e.get('restore_s') or 0):.2f} s")))
            v["metrics"] += 1
        elif kind == "checkpoint":
            snap, up = float(e.get("snapshot_s") or 0.0), float(e.get("upload_s") or 0.0)
            inc.save_spans.append((t - up - snap, t - up, str(e.get("save_kind"))))
            self.checkpoints.append(e)
            self._reach(inc, int(e.get("step") or 0) - 1)
        elif kind == "notice":
            inc.notice = e
        elif kind == "evacuating":
            inc.evacuating = t
        elif kind == "evacuated":
            if inc.evacuating is not None:
                inc.save_spans.append((inc.evacuating, t, "emergency"))
            inc.end_how = "evacuated"
        elif kind == "preempted":
            inc.end = t
            inc.killed = e
            inc.end_how = "evacuated" if e.get("how") == "evacuated" else "preempted"
            if e.get("step") is not None:
                self._reach(inc, int(e["step"]) - 1)
            bits = [f"#{n} {inc.instance_id or e.get('instance_id', '')} preempted",
                    f"at step ≈{max(inc.reached, 0)}", f"after {float(e.get('lifetime_s') or 0):.1f} s"]
            bits.append(describe_kill(e))
            self.preempt_marks.append((max(inc.reached, 0), "<br>".join(bits)))
            v["metrics"] += 1
        elif kind == "exited":
            inc.end = t
            inc.end_how = inc.end_how if inc.end_how == "evacuated" else (
                "done" if e.get("reason") == "done" else f"exited: {e.get('reason')}")

    def _fold_metrics(self, e: dict[str, Any], n: int) -> None:
        rows = e.get("rows") or ()
        if not rows:
            return
        inc = self._inc(n)
        boundary = self._boundary(n) if n else -1
        new_t = inc.new_work_t
        top = inc.reached
        last = self.last_metrics
        for row in rows:
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):
                continue
            redo = step <= boundary
            if not redo and new_t is None:
                new_t = row.get("t") or e.get("t")
            if step > top:
                top = step
            for key, value in row.items():
                if key == "step" or key == "t":
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
                    s.add(step, value)
                else:
                    s = self.first.get(key)
                    if s is None:
                        s = self.first[key] = Series(self.max_points)
                        self.metric_names.append(key)
                    s.add(step, value)
        inc.new_work_t = new_t
        self._reach(inc, top)
        self.versions["metrics"] += 1
        self.versions["info"] += 1

    # -- derived ---------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "stopped", "lost")

    def now(self) -> float:
        """The right edge of the timeline: the end of the job, or the wall clock while it runs."""
        if self.done and self.last_t is not None:
            return self.last_t
        return max(time.time(), self.last_t or 0.0)

    def breakdown(self, now: float | None = None) -> Breakdown:
        """`ledger.breakdown` over the compact event list (same numbers as job.breakdown())."""
        events = self._ledger + list(self._progress.values())
        return breakdown(events, now=now if now is not None else (None if not self.done else self.last_t))

    def cost(self, b: Breakdown | None = None) -> dict[str, float | None]:
        """Spent so far, on-demand equivalent, savings and the projected total at the current rate."""
        b = b or self.breakdown()
        projected: float | None = None
        total = b.total_steps or self.total
        if self.done:
            projected = b.spot_cost
        elif total and self.step_time and b.spot_price is not None:
            remaining = max(0, int(total) - int(b.step))
            projected = b.spot_cost + remaining * self.step_time * b.spot_price / 3600.0
        return {"spot": b.spot_cost, "on_demand": b.on_demand_cost, "savings": b.savings,
                "projected": projected, "spot_price": b.spot_price,
                "on_demand_price": b.on_demand_price}
