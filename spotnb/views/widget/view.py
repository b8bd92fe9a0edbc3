"""The live job widget: one plotly `FigureWidget` (metrics, instance timeline, breakdown), one
HTML pane (status badge, progress, cost meter, event feed, traceback) and a Stop button.

Threading and rate: `JobView.on_events` is a sink called from the job's background thread; it
only folds events into a `JobState` under a lock. A single flusher thread turns that state into
widget updates, at most every `interval` seconds, through a `MessageBudget` that counts every
comm message the widgets really send (plotly's update protocol costs ~4 per `batch_update`,
plus the front end's replies) and refuses a flush that would exceed `max_rate` messages in any
one-second window. So however fast the job logs, the front end gets ≤ 10 messages a second,
and the figure simply shows a newer state at its next turn.
"""

from __future__ import annotations

import collections
import html
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go

from spotnb.core.protocol import Event, JobStatus, JobWarning
from spotnb.core.state import JobState
from spotnb.views import logs, palette
from spotnb.views.html_safe import NO_MATH
from spotnb.views.widget.figures import (
    LIVE_PRICE_AXIS,
    PRICE_KEY,
    breakdown_traces,
    integer_ticks,
    live_layout,
    metric_panels,
    metric_traces,
    price_ticks,
    timeline_lanes,
    timeline_traces,
    waiting_for_first_step,
)
from spotnb.views.widget.responsive import ResponsiveFigureWidget
from spotnb.views.widget.text import error_title, event_text, pace_text

__all__ = ["JobView", "MessageBudget", "JobWidget", "render_info_html"]

log = logging.getLogger("spotnb.views.widget")

_FIGURE_COST = 4  # comm messages of one plotly batch_update (edit ids, update, reset)
_FIGURE_REPLY_COST = 4  # a live front end answers with trace/layout deltas (echo + reset each)


class MessageBudget:
    """Sliding one-second window of sent front-end messages, shared by the view's widgets."""

    def __init__(
        self, max_rate: float = 10.0, window: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_rate = max_rate
        self.clock = clock
        self.window = window
        self._sent: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()
        self.total = 0

    def record(self, n: int = 1) -> None:
        now = self.clock()
        with self._lock:
            self._sent.extend([now] * n)
            self.total += n

    def _trim(self, now: float) -> None:
        while self._sent and self._sent[0] <= now - self.window:
            self._sent.popleft()

    def allows(self, n: int) -> bool:
        """True if `n` more messages now keep the last window within `max_rate`."""
        now = self.clock()
        with self._lock:
            self._trim(now)
            return len(self._sent) + n <= self.max_rate * self.window

    def wait_time(self, n: int) -> float:
        """Seconds until `n` messages fit (0 if they fit now)."""
        now = self.clock()
        with self._lock:
            self._trim(now)
            excess = len(self._sent) + n - int(self.max_rate * self.window)
            if excess <= 0:
                return 0.0
            idx = min(excess - 1, len(self._sent) - 1)
            return max(0.0, self._sent[idx] + self.window - now)


class _Counted:
    """Mixin: count every message this widget sends to its front end in a MessageBudget."""

    _spotnb_budget: MessageBudget | None = None

    def _send(self, msg: Any, buffers: Any = None) -> None:
        budget = self._spotnb_budget
        if budget is not None and getattr(self, "comm", None) is not None:
            budget.record(1)
        super()._send(msg, buffers=buffers)  # type: ignore[misc]


#: the live layout's keys that never change after the first draw
_FIXED_LAYOUT = frozenset({"template", "barmode", "uniformtext", "margin", "legend", "uirevision"})


class _Figure(_Counted, ResponsiveFigureWidget):
    def __repr__(self) -> str:
        """Not plotly's: it deep-copies the figure's dict, which the job's feed thread updates
        meanwhile ("dictionary changed size during iteration" in a cell that displays `job`,
        whose text/plain part ipywidgets makes by repr-ing every child)."""
        return f"{type(self).__name__}(live figure)"


class _HTML(_Counted, widgets.HTML):
    pass


class _Button(_Counted, widgets.Button):
    pass


class JobWidget(widgets.VBox):
    """The displayed box; `.view` is the JobView that feeds it (for tests and benchmarks)."""

    view: JobView

    def close(self) -> None:
        """Close every widget of the box, not only the box: each holds a comm in the kernel
        and a model in the front end."""
        self.view.detach()
        pending: list[widgets.Widget] = [self]
        while pending:
            w = pending.pop()
            pending.extend(getattr(w, "children", ()))
            pending.extend(
                x
                for x in (getattr(w, "layout", None), getattr(w, "style", None))
                if isinstance(x, widgets.Widget)
            )
            widgets.Widget.close(w)


def _arrays(spec: dict[str, Any]) -> dict[str, Any]:
    """Long numeric lists as float arrays: plotly validates and serialises them in bulk."""
    out = dict(spec)
    for k in ("x", "y", "base"):
        v = out.get(k)
        if isinstance(v, list) and len(v) > 32 and all(isinstance(a, float) for a in v):
            out[k] = np.asarray(v, dtype=float)
    return out


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _feed_line(e: Event, t0: float) -> str:
    when = f"{float(e['t']) - t0:6.1f}s" if t0 else ""
    return f"<div class='spotnb-feed-line'><code>{when}</code> {_esc(event_text(e))}</div>"


def _compact_feed(feed: list[Event], limit: int) -> list[tuple[Event, int]]:
    """Last `limit` feed items; runs of periodic checkpoints collapse to the latest one (×n)."""
    out: list[tuple[Event, int]] = []
    for e in reversed(feed):
        periodic = e.get("kind") == "checkpoint" and e.get("save_kind") == "periodic"
        if (
            periodic
            and out
            and out[-1][0].get("kind") == "checkpoint"
            and out[-1][0].get("save_kind") == "periodic"
        ):
            out[-1] = (out[-1][0], out[-1][1] + 1)
            continue
        if len(out) >= limit:
            break
        out.append((e, 1))
    return list(reversed(out))


def render_info_html(state: JobState, job_id: str = "", feed_lines: int = 9) -> str:
    """Status badge, progress bar, cost meter, event feed and traceback, as one HTML string
    (one widget → one message per refresh). `data-*` attributes let browser tests read values."""
    b = state.breakdown()
    cost = state.cost(b)
    status = state.status
    color = palette.status_color(status)
    total = b.total_steps or state.total
    redo = state.recomputing()
    # the step training is at now: after a preemption the replacement redoes steps, and the
    # line and the bar move with it (tqdm keeps moving), the high-water mark shaded ahead
    step = state.front_step() if redo else max(b.step, state.step)
    frac = min(1.0, step / total) if total else 0.0
    high = min(1.0, max(b.step, state.step) / total) if total else 0.0
    last = ", ".join(f"{k} {v:.4g}" for k, v in list(state.last_metrics.items())[:3])
    proj = cost["projected"]
    # a job with an on-demand coordinator (several instances on a cloud) spent more than its
    # spot instances: the headline says the whole spend, the line below splits it
    headline = (
        f"<div style='font-size:18px'><b>${cost['spot']:.4f}</b> spot</div>"
        if cost.get("coordinator_price") is None
        else f"<div style='font-size:18px'><b>${cost['total']:.4f}</b> spent</div>"
    )
    tone = {"good": palette.GOOD, "bad": palette.BAD}.get(cost["savings_tone"], "#666")
    pace = pace_text(state)
    savings = "" if cost["savings"] is None else f"{cost['savings']:.4f}"
    price = ""
    if cost["spot_price"] is not None:
        # several instances: the prices are each one's, and what they all cost now comes first
        each = " per instance" if b.lanes > 1 else ""
        now = cost["instances_now"]
        fleet = f"now ${cost['hourly']:.3f}/h for {now} instances · " if now > 1 else ""
        price = (
            f"<div class='spotnb-price' data-hourly='{cost['hourly']:.6f}' style='color:#666;"
            f"font-size:11px'>{fleet}${cost['spot_price']:.3f}/h spot vs "
            f"${(cost['on_demand_price'] or 0):.3f}/h on demand{each}</div>"
        )
    name = _esc(state.name or job_id)
    badge = (
        f"<span class='spotnb-status' data-status='{_esc(status)}' style='background:{color};"
        f"color:white;border-radius:10px;padding:2px 10px;font-weight:600'>{_esc(status)}</span>"
    )
    ahead = (
        f"<div style='background:{palette.MARKS['redo']};opacity:0.35;width:{(high - frac) * 100:.1f}%;"
        f"height:8px'></div>"
        if redo and high > frac
        else ""
    )
    progress = (
        f"<div style='background:#eee;border-radius:4px;height:8px;width:100%;margin:4px 0;display:flex'>"
        f"<div style='background:{color};width:{frac * 100:.1f}%;height:8px;border-radius:4px'>"
        f"</div>{ahead}</div>"
    )
    redoing = ""
    if redo:
        first, current, end = redo
        done_frac = (current - first) / max(1, end - first)
        redoing = (
            f" · <span class='spotnb-redo' data-first='{first}' data-end='{end}' style='color:"
            f"{palette.MARKS['redo']}'>recomputing {first}→{end} ({done_frac:.0%})</span>"
        )
    head = (
        f"<div style='display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start'>"
        f"<div style='min-width:260px;flex:1'>"
        f"<div><b>{name}</b> <code style='color:#666'>{_esc(job_id)}</code> {badge}</div>"
        f"{progress}<div class='spotnb-progress' data-step='{step}' data-total='{total or ''}'>"
        f"step {step}{'/' + str(total) if total else ''}{redoing}{' · ' + pace if pace else ''} · "
        f"{b.preemptions} preemption(s) · {b.incarnations} instance(s)"
        f"{f' · {state.live_replicas} training now' if state.live_replicas is not None else ''}"
        f"{' · ' + _esc(last) if last else ''}</div></div>"
        f"<div class='spotnb-cost' data-spot='{cost['spot']:.8f}' data-on-demand='{cost['on_demand']:.8f}'"
        f" data-savings='{savings}' style='min-width:260px'>"
        f"{headline}"
        f"<div class='spotnb-savings' data-tone='{cost['savings_tone']}'>"
        f"<b style='color:{tone}'>{_esc(cost['savings_text'])}</b></div>"
        f"<div style='color:#666;font-size:11px'>{_esc(cost['savings_baseline'])}"
        f"{f' · projected total ${proj:.4f}' if proj is not None else ''}</div>{price}</div>"
        f"</div>"
    )
    t0 = state.job_start or 0.0
    lines = []
    for e, times in _compact_feed(state.feed, feed_lines):
        line = _feed_line(e, t0)
        if times > 1:
            line = line.replace("</div>", f" <span style='color:#666'>(×{times})</span></div>")
        lines.append(line)
    # the newest line is in view: a column-reverse box starts scrolled to its end (the feed
    # once showed its first lines and hid the job's last events below its fold)
    feed = (
        f"<div class='spotnb-feed' style='font-size:12px;margin-top:6px;max-height:190px;"
        f"overflow:auto;border-left:3px solid #ddd;padding-left:8px;display:flex;"
        f"flex-direction:column-reverse'><div>{''.join(lines)}</div></div>"
    )
    tb = ""
    if state.error is not None:
        tb = (
            f"<details open class='spotnb-traceback'><summary style='color:#c62828'><b>"
            f"{_esc(error_title(state.error.exc_type, state.error.message))}</b></summary>"
            f"<pre style='background:#fff5f5;color:#b71c1c;font-size:11px;overflow:auto;"
            f"max-height:300px'>{_esc(state.error.traceback)}</pre></details>"
        )
    legend = " ".join(f"<span style='color:{c}'>■</span> {label}" for c, label in palette.CATEGORIES.values())
    return (
        f"<div class='spotnb-job-info {NO_MATH}' style='font-family:sans-serif;font-size:13px'>{head}"
        f"{tb}{feed}<div style='font-size:11px;color:#666;margin-top:4px'>{legend}</div></div>"
    )


class JobView:
    """A sink that keeps a widget in step with a job, throttled and rate-limited.

    `interval`: the shortest time between two refreshes of the HTML pane; the figure refreshes
    at most every `figure_interval` and only when the message budget allows. `autostart=False`
    leaves flushing to explicit `flush()` calls and `clock` replaces the monotonic clock
    (deterministic tests and benchmarks)."""

    def __init__(
        self,
        job: Any = None,
        *,
        interval: float = 0.5,
        figure_interval: float = 0.5,
        max_rate: float = 10.0,
        autostart: bool = True,
        max_points: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = job
        self.job_id = getattr(job, "id", "") or ""
        self.state = JobState(max_points) if max_points else JobState()
        self.interval = interval
        self.figure_interval = figure_interval
        self.clock = clock
        self.budget = MessageBudget(max_rate, clock=clock)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._keys: list[str] = []
        self._last_specs: dict[str, dict[str, Any]] = {}
        self._sent_versions: dict[str, int] = {}
        self._last_html = ""
        self._last_figure = -1e9
        self._last_html_t = -1e9
        self.flushes = 0
        self.cpu_s = 0.0  # CPU seconds spent drawing (flusher thread)
        self.fold_cpu_s = 0.0  # CPU seconds spent folding events (caller's thread)
        self.figure_flushes = 0
        self.x_axis = "step"  # or "time": the metrics' x-axis (the user's choice, above the figure)
        self.smoothing = 0.0  # TensorBoard-style EMA weight of the metric lines
        self._view_version = 0  # bumped when the user changes the two above
        self._flusher_done = False  # the final state is shown and the flusher thread returned
        self._build()
        self._log_handler: logs.JobLogHandler | None = None
        if job is not None:
            job.add_sink(self, replay=True)
            self._log_handler = logs.attach(self.job_id, self._on_log)
        if autostart:
            self.start()

    # -- widgets -------------------------------------------------------------------------------
    def _build(self) -> None:
        # the fixed traces are part of the initial state (no messages); metrics are added later
        empty = JobState()
        self._layout_sig = self._layout_signature(empty)
        fig = go.Figure(layout=live_layout(empty, self.x_axis))
        initial = {
            "metrics": metric_traces(empty),
            "timeline": timeline_traces(empty, now=0.0),
            "breakdown": breakdown_traces(empty.breakdown(now=0.0)),
        }
        for panel, traces in initial.items():
            for key, spec in self._placed(panel, traces):
                fig.add_trace(spec)
                self._keys.append(key)
                self._last_specs[key] = {k: v for k, v in spec.items() if k != "type"}
        self.figure = _Figure(fig)
        self.figure._spotnb_budget = self.budget
        self.info = _HTML(value=render_info_html(self.state, self.job_id))
        self.info._spotnb_budget = self.budget
        self.stop_button = _Button(
            description="Stop",
            icon="stop",
            button_style="danger",
            tooltip="Terminate the instance; the job ends as stopped",
            layout=widgets.Layout(width="auto", min_width="90px"),
        )
        self.stop_button._spotnb_budget = self.budget
        self.stop_button.on_click(self._on_stop)
        header = widgets.HBox(
            [self.info, self.stop_button],
            layout=widgets.Layout(justify_content="space-between", width="100%"),
        )
        self.info.layout = widgets.Layout(flex="1 1 auto")
        self.x_axis_control = widgets.ToggleButtons(
            options=[("step", "step"), ("time", "time")],
            value=self.x_axis,
            tooltips=["metrics by step", "metrics by seconds since submission (the timeline's axis)"],
            style={"button_width": "60px"},
        )
        self.smoothing_control = widgets.FloatSlider(
            value=self.smoothing,
            min=0.0,
            max=0.99,
            step=0.01,
            description="smoothing",
            readout_format=".2f",
            continuous_update=False,
            style={"description_width": "70px"},
        )
        self.x_axis_control.observe(self._on_view_option, names="value")
        self.smoothing_control.observe(self._on_view_option, names="value")
        self.smoothing_control.layout.margin = "0 0 0 24px"
        # a label of its own: ToggleButtons' description wraps above its buttons in an HBox
        controls = widgets.HBox(
            [widgets.Label("x-axis"), self.x_axis_control, self.smoothing_control],
            layout=widgets.Layout(align_items="center"),
        )
        self.box = JobWidget([header, controls, self.figure])
        self.box.view = self
        self.box.add_class("spotnb-job-widget")

    def _on_view_option(self, _change: Any) -> None:
        """The user chose another x-axis or smoothing: redraw the metrics at the next flush, or
        now when the job has ended and its flusher is done (a finished run is where one reads
        curves)."""
        with self._lock:
            self.x_axis = self.x_axis_control.value
            self.smoothing = float(self.smoothing_control.value)
            self._view_version += 1
            idle = self._flusher_done
        if idle and not self._closed.is_set():
            self.flush(force=True)
        self._wake.set()

    def _layout_signature(self, state: JobState) -> tuple[Any, ...]:
        """What the figure's layout depends on: a change re-sends it (one message)."""
        return (
            tuple(map(tuple, metric_panels(state))),
            tuple(integer_ticks(state)),
            self.x_axis,
            waiting_for_first_step(state),
            tuple(timeline_lanes(state)[1]),  # a lane appears or is renamed
            # the timeline's $/h band appears, ticked at the zones' prices
            price_ticks(state),
        )

    def _on_stop(self, _button: Any) -> None:
        self.stop_button.disabled = True
        self.stop_button.description = "Stopping"
        if self.job is not None:
            threading.Thread(
                target=self.job.stop, kwargs={"wait": False}, daemon=True, name="spotnb-stop"
            ).start()

    # -- sink ------------------------------------------------------------------------------------
    def on_events(self, events: list[Event]) -> None:
        """Called from the job's thread: fold only; the flusher draws."""
        c0 = time.thread_time()
        with self._lock:
            self.state.feed_events(events)
        self.fold_cpu_s += time.thread_time() - c0
        self._wake.set()

    # -- flushing --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, daemon=True, name=f"spotnb-widget-{self.job_id}"
            )
            self._thread.start()

    def _on_log(self, record: logging.LogRecord) -> None:
        """A warning spotnb logged about this job, in this process (the controller of a job
        driven from this kernel, the follower): shown in the feed like the job's own."""
        self.on_events([JobWarning(message=record.getMessage(), t=record.created)])

    def _stop_logs(self) -> None:
        handler, self._log_handler = self._log_handler, None
        if handler is not None:
            logs.detach(handler)

    def detach(self) -> None:
        """Stop following (widget closed)."""
        self._closed.set()
        self._wake.set()
        self._stop_logs()
        if self.job is not None:
            self.job.remove_sink(self)

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(timeout=1.0)  # 1 s tick keeps the live bars growing during gaps
            self._wake.clear()
            c0 = time.thread_time()
            try:
                finished = self.flush()
            except Exception as exc:  # noqa: BLE001 - a drawing bug must not spin or kill the job
                # (no job_id: this is about the view, and must not feed the view itself)
                log.warning("job %s: widget refresh failed: %r", self.job_id, exc)
                finished = False
            self.cpu_s += time.thread_time() - c0
            if finished:
                with self._lock:  # an option changed since the flush: draw it first
                    if self._sent_versions.get("view") != self._view_version:
                        continue
                    self._flusher_done = True
                self._stop_logs()
                return
            self._closed.wait(self.interval)

    def flush(self, force: bool = False) -> bool:
        """Send what changed, within the budget. Returns True once the final state is shown."""
        cost = _FIGURE_COST + _FIGURE_REPLY_COST  # replies of a live front end come later
        with self._lock:
            st = self.state
            done = st.done
            versions = dict(st.versions)
            html_value = render_info_html(st, self.job_id)
            now = self.clock()
            sent = self._sent_versions
            versions["view"] = self._view_version
            metrics_changed = versions["metrics"] != sent.get("metrics") or versions["view"] != sent.get(
                "view"
            )
            fig_changed = (
                metrics_changed
                or versions["timeline"] != sent.get("timeline")
                or versions["breakdown"] != sent.get("breakdown")
                or not done
            )  # a running job's bars grow with the clock
            fig_due = force or done or now - self._last_figure >= self.figure_interval
            panels: dict[str, list[tuple[str, dict[str, Any]]] | None] | None = None
            layout: dict[str, Any] | None = None
            adds_only = False
            if fig_due and fig_changed and (force or self.budget.allows(cost)):
                signature = self._layout_signature(st)
                if signature != self._layout_sig:  # a new panel, another x-axis, the first step
                    layout, self._layout_sig = live_layout(st, self.x_axis), signature
                metrics = metric_traces(st, self.x_axis, self.smoothing) if metrics_changed else None
                known = set(self._keys)
                if metrics is not None and any(k not in known for k, _ in metrics):
                    # a new metric: one add_traces now (it carries its data), the rest next turn
                    panels, adds_only = {"metrics": metrics}, True
                else:
                    panels = {
                        "metrics": metrics,
                        "timeline": timeline_traces(st),
                        "breakdown": breakdown_traces(st.breakdown()),
                    }
        self.flushes += 1
        html_due = force or done or now - self._last_html_t >= self.interval
        if html_value != self._last_html and html_due and (force or self.budget.allows(1)):
            self.info.value = html_value
            self._last_html = html_value
            self._last_html_t = now
        pending_figure = fig_changed
        if layout is not None:
            # before traces that use a new panel's axes; whole axis objects, one relayout
            # (plotly.js refuses an update that sets a new axis and its domain together);
            # `autosize` said again, or plotly.js drops it with the new height and the figure
            # stops following the output's width
            changes = {k: v for k, v in layout.items() if k not in _FIXED_LAYOUT}
            self.figure.plotly_relayout({**changes, "autosize": True})
        if panels is not None:
            self._apply(panels, adds_only)
            self._last_figure = now
            self.figure_flushes += 1
            if not adds_only:
                self._sent_versions.update(versions)
                pending_figure = False
            elif force:
                return self.flush(force=True)
        if done and not pending_figure and self._last_html == html_value:
            with self.stop_button.hold_sync():  # one message, not four
                ok = st.status == JobStatus.SUCCEEDED
                self.stop_button.disabled = True
                self.stop_button.icon = "check" if ok else ""
                self.stop_button.description = "done" if ok else str(st.status)
                self.stop_button.button_style = "success" if ok else ""
            return True
        if pending_figure or self._last_html != html_value:
            self._wake.set()  # come back after the pause: there is more to send
        return False

    #: the live figure's axes of each panel's traces (the metric traces name their own panel)
    _AXES = {"timeline": ("x2", "y2"), "breakdown": ("x3", "y3")}

    def _placed(
        self, panel: str, traces: list[tuple[str, dict[str, Any]]]
    ) -> list[tuple[str, dict[str, Any]]]:
        """The traces with the axes of their row in the live figure."""
        out = []
        for key, spec in traces:
            spec = dict(spec)
            if panel in self._AXES:
                spec["xaxis"], spec["yaxis"] = self._AXES[panel]
            if key.startswith(PRICE_KEY):  # the zone prices: the timeline's $/h axis
                spec["yaxis"] = LIVE_PRICE_AXIS
            out.append((key, spec))
        return out

    def _apply(self, panels: dict[str, Any], adds_only: bool = False) -> None:
        """One `batch_update` for every changed trace, or one `add_traces` for new metrics."""
        fig = self.figure
        adds: list[tuple[str, dict[str, Any]]] = []
        index = {k: i for i, k in enumerate(self._keys)}
        with fig.batch_update():
            for panel, traces in panels.items():
                if traces is None:
                    continue
                for key, spec in self._placed(panel, traces):
                    if key not in index:
                        adds.append((key, spec))
                        continue
                    if adds_only:
                        continue
                    spec.pop("type", None)
                    last = self._last_specs.get(key, {})
                    changed = {k: v for k, v in spec.items() if k not in last or last[k] != v}
                    if changed:  # plotly validates what it is given: give it only news
                        fig.data[index[key]].update(_arrays(changed))
                        self._last_specs[key] = spec
        for key, spec in adds:
            self._last_specs[key] = {k: v for k, v in spec.items() if k != "type"}
        if adds:
            fig.add_traces([spec for _, spec in adds])
            self._keys.extend(key for key, _ in adds)

    def close(self) -> None:
        self.detach()
