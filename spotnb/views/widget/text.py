"""`TextView`: the widget's information as text, for scripts, terminals and CI logs.

Like tqdm's autonotebook fallback: on a TTY one progress line is redrawn in place (at most
`tty_interval` apart); elsewhere (CI logs, files) a progress line is printed every
`interval` seconds. Notable events (allocations, notices, preemptions, non-periodic
checkpoints, relaunches, errors with the remote traceback, the end) always get their own line.
It is a plain sink: no widgets, no plotly, no thread of its own.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

from spotnb.core.protocol import Event
from spotnb.core.state import JobState, describe_kill
from spotnb.views.widget.figures import format_bytes

__all__ = [
    "TextView",
    "error_title",
    "event_text",
    "event_line",
    "progress_line",
    "pace_text",
    "savings_text",
]


def error_title(exc_type: object, message: object) -> str:
    """ "ValueError: bad input", once: the agent's message already starts with the type."""
    kind, text = str(exc_type or "Error"), str(message or "")
    return text if text.startswith(f"{kind}:") else f"{kind}: {text}"


def event_text(e: Event | Mapping[str, Any]) -> str:
    """One plain line describing any event: the text view and the widget's feed both use it."""
    kind, n = e.get("kind"), e.get("incarnation", 0)
    who = f"#{n} " if n else ""
    num = lambda key: float(e.get(key) or 0)  # noqa: E731
    if kind == "submitted":
        return f"submitted ({e.get('provider')}, {e.get('instance_type')})"
    if kind == "allocated":
        return (
            f"{who}allocated {e.get('instance_id')} in {e.get('region')} "
            f"({e.get('instance_type')}) after {num('alloc_s'):.1f} s, spot "
            f"${num('spot_price'):.3f}/h vs on-demand ${num('on_demand_price'):.3f}/h"
        )
    if kind == "alloc_failed":
        return f"{who}no capacity in {e.get('region')}: {e.get('reason')}; retry in {e.get('retry_in')} s"
    if kind == "moving":
        return (
            f"{who}→ MOVING from {e.get('from_region')} to {e.get('to_region')}: expected saving "
            f"${num('saving'):.4f} after the move's ${num('move_cost'):.4f} ({e.get('reason')})"
        )
    if kind == "checkpoint_placed":
        return f"{who}checkpoint {e.get('action')}: {e.get('reason')}"
    if kind == "ready":
        return f"{who}ready at step {e.get('step')} after {num('prep_s'):.1f} s prep"
    if kind == "resumed":
        rnd = e.get("group_round") or 0
        how = f"group restarted (round {rnd})" if rnd > 1 else "relaunched"
        return (
            f"{who}{how}: resumed from step {e.get('from_step')} ({e.get('save_kind')} "
            f"checkpoint, save {e.get('seq')}, restore {num('restore_s'):.2f} s)"
        )
    if kind == "notice":
        return f"{who}⚠ PREEMPTION NOTICE ({e.get('source')}): {num('time_left'):.1f} s left"
    if kind == "evacuated":
        return f"{who}saved and left cleanly at step {e.get('step')}"
    if kind == "emergency_skipped":
        size = f" of {format_bytes(e.get('bytes'))}" if e.get("bytes") else ""
        left = f"{num('time_left'):.1f} s left, needs {num('needed'):.1f} s"
        return f"{who}emergency save{size} skipped ({left})"
    if kind == "preempted":
        return f"{who}✖ PREEMPTED: {describe_kill(e)}, lifetime {num('lifetime_s'):.1f} s"
    if kind == "exited" and e.get("reason") == "moved":
        return f"{who}saved and left for a cheaper zone, lifetime {num('lifetime_s'):.1f} s"
    if kind == "exited":
        return f"{who}exited: {e.get('reason')} (code {e.get('code')})"
    if kind == "checkpoint":
        same = e.get("referenced_bytes")
        return (
            f"{who}checkpoint {e.get('save_kind')} at step {e.get('step')}: "
            f"{format_bytes(e.get('bytes'))} in {num('snapshot_s'):.3f} s "
            f"+ {num('upload_s'):.3f} s upload"
            + (f" ({format_bytes(same)} unchanged, referenced)" if same else "")
        )
    if kind in ("checkpoint_failed", "checkpoint_invalid"):
        return f"{who}{kind.replace('_', ' ')}: {e.get('error') or e.get('reason') or ''}"
    if kind == "error":
        return f"{who}ERROR {error_title(e.get('exc_type'), e.get('message'))}"
    if kind == "done":
        return f"{who}done at step {e.get('step')}"
    if kind == "stopped":
        return f"stopped: {e.get('reason')}"
    if kind == "job_resumed":
        what = ["new function"] if e.get("new_fn") else []
        what += [f"{k} changed" for k in e.get("changed") or []]
        return (
            f"resumed after it {e.get('from_status')}"
            + (f" ({', '.join(what)})" if what else "")
            + ": continuing from the latest checkpoint"
        )
    if kind == "files":
        return f"{who}{e.get('count')} shipped file(s) in {e.get('workdir')} ({e.get('written')} written)"
    return f"{who}{kind}: {e.get('message') or ''}"


_LOUD = frozenset(
    {
        "submitted",
        "allocated",
        "alloc_failed",
        "moving",
        "checkpoint_placed",
        "resumed",
        "notice",
        "evacuated",
        "emergency_skipped",
        "preempted",
        "checkpoint",
        "checkpoint_failed",
        "checkpoint_invalid",
        "error",
        "warning",
        "hint",
        "stopped",
        "job_resumed",
    }
)


def event_line(e: Event | Mapping[str, Any]) -> str | None:
    """The line a terminal shows for a notable event (errors with the remote traceback), or
    None for events that only feed the progress line (periodic checkpoints included)."""
    kind = e.get("kind")
    if kind not in _LOUD or (kind == "checkpoint" and e.get("save_kind") == "periodic"):
        return None
    text = event_text(e)
    tb = (e.get("traceback") or "").rstrip() if kind == "error" else ""
    return text + (f"\n{tb}" if tb else "")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def pace_text(state: JobState) -> str:
    """ "12.3 steps/s · ETA 1:23" (tqdm's figures), or "" while unknown."""
    rate, eta = state.pace()
    if rate is None:
        return ""
    speed = f"{rate:.3g} steps/s" if rate >= 1 else f"{1 / rate:.3g} s/step"
    return speed + (f" · ETA {_clock(eta)}" if eta is not None else "")


def savings_text(state: JobState) -> str:
    """The savings sentence every view shows, with its baseline (`spotnb.core.savings`)."""
    cost = state.cost()
    return f"spot ${cost['spot']:.4f}: {cost['savings_text']} ({cost['savings_baseline']})"


def progress_line(state: JobState, width: int = 20) -> str:
    """`[#####.....] 150/300 50% loss 0.0123 | running | 2 preemptions | spot $0.0003 (-70%)`."""
    b = state.breakdown()
    total = b.total_steps or state.total
    redo = state.recomputing()
    step = state.front_step() if redo else max(b.step, state.step)
    if total:
        frac = min(1.0, step / total)
        filled = int(frac * width)
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {step}/{total} {frac:4.0%}"
    else:
        bar = f"step {step}"
    if redo:
        first, current, end = redo
        bar += f" recomputing {first}→{end} ({(current - first) / max(1, end - first):.0%})"
    metrics = " ".join(f"{k} {v:.4g}" for k, v in list(state.last_metrics.items())[:3])
    cost = state.cost(b)
    money = f"spot ${cost['spot']:.4f}: {cost['savings_text']}"
    live = f"{state.live_replicas} replicas training" if state.live_replicas is not None else ""
    parts = [bar, pace_text(state), metrics, state.status, live, f"{b.preemptions} preemption(s)", money]
    return " | ".join(p for p in parts if p)


class TextView:
    """A sink printing the job's story as text. `job.add_sink(TextView(job))`, or let
    `spotnb.views.widget.job_widget` pick it when there is no kernel to render widgets."""

    def __init__(
        self,
        job: Any = None,
        file: TextIO | None = None,
        interval: float = 10.0,
        tty_interval: float = 0.5,
        attach: bool = True,
    ) -> None:
        self.job = job
        self.file = file if file is not None else sys.stdout
        isatty = getattr(self.file, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.interval = tty_interval if self.tty else interval
        self.state = JobState()
        self._lock = threading.Lock()
        self._last_progress = 0.0
        self._progress_shown = False
        self._finished = False
        self.prefix = f"spotnb {getattr(job, 'id', '')}".rstrip() + ": "
        if job is not None and attach:
            job.add_sink(self, replay=True)

    def _write(self, text: str) -> None:
        if self.tty and self._progress_shown:
            self.file.write("\r\x1b[2K")  # clear the in-place progress line first
            self._progress_shown = False
        self.file.write(text)

    def on_events(self, events: list[dict[str, Any]]) -> None:
        with self._lock:
            if self._finished:
                return
            for e in events:
                self.state.feed_events([e])
                line = event_line(e)
                if line:
                    t0 = self.state.job_start or float(e["t"])
                    self._write(f"{self.prefix}[{float(e['t']) - t0:7.1f}s] {line}\n")
            now = time.monotonic()
            if self.state.done:
                self._finished = True
                self._write(f"{self.prefix}{self.state.status}: {progress_line(self.state)}\n")
            elif now - self._last_progress >= self.interval:
                self._last_progress = now
                if self.tty:
                    self._write(f"{self.prefix}{progress_line(self.state)}")
                    self._progress_shown = True
                else:
                    self._write(f"{self.prefix}{progress_line(self.state)}\n")
            try:
                self.file.flush()
            except (OSError, ValueError):
                pass

    def detach(self) -> None:
        if self.job is not None:
            self.job.remove_sink(self)

    def __repr__(self) -> str:
        summary = getattr(self.job, "summary", None)
        return summary() if callable(summary) else progress_line(self.state)
