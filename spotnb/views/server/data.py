"""What the JupyterLab extension shows, computed from the job DB and the job's event log.

No tornado here, so it is tested directly. `JobViews` keeps, per job it was asked about, an
`EventReader` (which remembers its offsets) and the widget's `JobState` reducer, so polling a
job every few seconds costs only the events that arrived since the last poll and the metrics
it returns are already downsampled.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import fields
from typing import Any

from spotnb.control.jobdb import JobDB
from spotnb.core.events import EventReader, json_safe
from spotnb.core.protocol import TERMINAL, Event, JobStatus
from spotnb.core.savings import describe_savings
from spotnb.core.state import Incarnation, JobState
from spotnb.core.store import Store
from spotnb.market.prices import lookup_price
from spotnb.views.widget.text import event_text

__all__ = ["ACTIVE", "JobViews", "list_payload", "pid_alive"]

# shown first, in this order
ACTIVE = (JobStatus.RUNNING, JobStatus.RESTORING, JobStatus.PREEMPTED, JobStatus.PENDING)
MAX_POINTS = 400  # per metric trace sent to the browser
MAX_FEED = 40  # recent events sent with a job
MAX_CACHED_JOBS = 32


def pid_alive(pid: int | None) -> bool | None:
    """Whether a process with this id exists on this machine (None: unknown)."""
    if not pid or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def _controller_gone(db: JobDB, r: dict[str, Any], now: float) -> bool:
    """True when nothing drives the job any more: no unexpired controller lease (when the DB
    keeps leases) and its recorded controller process no longer exists on this machine."""
    lease_of = getattr(db, "lease", None)
    if lease_of is not None:
        lease = lease_of(r["id"])
        if lease is not None and float(lease.get("expires") or 0.0) > now:
            return False
    return pid_alive(r.get("controller_pid")) is False


def _row(r: dict[str, Any], now: float, db: JobDB | None = None) -> dict[str, Any]:
    """A job DB row plus what the panel derives from it."""
    status = r.get("status") or "pending"
    spot = float(r.get("spot_cost") or 0.0)
    on_demand = float(r.get("on_demand_cost") or 0.0)
    # a job still marked active whose controller is gone (its kernel died) is not being
    # driven (nor billed through spotnb) any more; say so instead of counting it as running
    orphaned = status in ACTIVE and db is not None and _controller_gone(db, r, now)
    sv = describe_savings(spot, on_demand, status, _useful_s(r, on_demand))
    return {
        **r,
        "status": status,
        "active": status in ACTIVE and not orphaned,
        "orphaned": orphaned,
        # the one definition of savings (spotnb.core.savings): withheld (None) until it means
        # something, none for a failed job; the money saved counts only where it is shown
        "saved": max(0.0, on_demand - spot) if sv.fraction is not None else 0.0,
        "savings": sv.fraction,
        "savings_text": sv.text,
        "savings_tone": sv.tone,
        "savings_baseline": sv.baseline,
        "age": max(0.0, now - float(r.get("created") or now)),
        "burn_rate": float(r.get("burn_rate") or 0.0) if status in ACTIVE and not orphaned else 0.0,
    }


def _useful_s(r: dict[str, Any], on_demand_cost: float) -> float:
    """Seconds of useful compute behind a job DB row: its on-demand cost is exactly that time
    at the on-demand price (`spotnb.core.ledger`), and the row keeps the cost, not the time."""
    price = lookup_price(str(r.get("instance_type") or ""))
    hourly = price.on_demand if price else 0.0
    if hourly > 0:
        return on_demand_cost / hourly * 3600.0
    # a price the table does not know (the job set its own): the row cannot say how long;
    # any on-demand cost at all means training happened, so the figure is not withheld
    return math.inf if on_demand_cost > 0 else 0.0


def _sort_key(row: dict[str, Any]) -> tuple[int, float]:
    rank = ACTIVE.index(row["status"]) if row["active"] else len(ACTIVE)
    return (rank, -float(row.get("created") or 0.0))


def list_payload(db: JobDB, now: float | None = None) -> dict[str, Any]:
    """GET /spotnb/api/jobs: every job, running ones first, and the totals for the status bar."""
    now = time.time() if now is None else now
    rows = sorted((_row(r, now, db) for r in db.jobs()), key=_sort_key)
    running = [r for r in rows if r["active"] and r["status"] in ("running", "restoring")]
    return json_safe(
        {
            "now": now,
            "db": str(db.path),
            "jobs": rows,
            "running": len(running),
            "active": sum(r["active"] for r in rows),
            "burn_rate": sum(r["burn_rate"] for r in rows),
            "spent": sum(float(r.get("spot_cost") or 0.0) for r in rows),
            "saved": sum(r["saved"] for r in rows),
        }
    )


class _Entry:
    def __init__(self, store: Store, job_id: str) -> None:
        self.store = store
        self.reader = EventReader(store, job_id)
        self.state = JobState(max_points=MAX_POINTS)
        self.kinds: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.figures: dict[str, Any] | None = None
        self.figures_version: tuple[int, ...] | None = None


class JobViews:
    """Per-job incremental state for GET /spotnb/api/jobs/<id>; thread-safe."""

    def __init__(self, db: JobDB | None = None) -> None:
        self._db = db
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def db(self) -> JobDB:
        # opened lazily: SPOTNB_HOME is read when the first request comes, not at import
        if self._db is None:
            self._db = JobDB()
        return self._db

    def jobs(self) -> dict[str, Any]:
        return list_payload(self.db)

    def _entry(self, row: dict[str, Any]) -> _Entry:
        with self._lock:
            entry = self._entries.get(row["id"])
            if entry is None:
                entry = self._entries[row["id"]] = _Entry(Store(row["store"]), row["id"])
                while len(self._entries) > MAX_CACHED_JOBS:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(row["id"])
            return entry

    def detail(self, job_id: str, figures: bool = True) -> dict[str, Any] | None:
        """GET /spotnb/api/jobs/<id>; None when the DB has no such job (id prefixes work)."""
        row = self.db.job(job_id)
        if row is None:
            return None
        now = time.time()
        out: dict[str, Any] = {"job": _row(row, now, self.db), "now": now}
        try:
            entry = self._entry(row)
        except Exception as exc:  # noqa: BLE001 - a store we cannot open (credentials, offline)
            out["error"] = f"cannot open store {row['store']!r}: {type(exc).__name__}: {exc}"
            return json_safe(out)
        with entry.lock:
            try:
                events = entry.reader.poll()
            except (OSError, ValueError) as exc:
                events = []
                out["error"] = f"cannot read events: {type(exc).__name__}: {exc}"
            entry.state.feed_events(events)
            entry.kinds.update(e.kind for e in events)
            out.update(self._summary(entry))
            if figures:
                out["figures"] = self._figures(entry)
        if row.get("status") == JobStatus.LOST:  # the store is gone: only the job DB remembers it
            out.update(status=JobStatus.LOST, status_reason=row.get("status_reason"))
        return json_safe(out)

    @staticmethod
    def _summary(entry: _Entry) -> dict[str, Any]:
        st = entry.state
        b = st.breakdown()
        metrics = {name: dict(zip(("x", "y"), s.xy(), strict=True)) for name, s in st.first.items()}
        redo = {
            name: [{"incarnation": n, **dict(zip(("x", "y"), s.xy(), strict=True))} for n, s in per.items()]
            for name, per in st.redo.items()
        }
        timeline = []
        for n in sorted(st.incs):
            timeline.append(_incarnation_json(st.incs[n]))
        # the widget's words for each event (one describer for every view), beside its fields
        feed = [
            {
                **{k: v for k, v in e.to_json().items() if k not in ("traceback", "config", "rows")},
                "text": event_text(e),
            }
            for e in st.feed[-MAX_FEED:]
        ]
        return {
            "status": st.status,
            "status_reason": st.status_reason,
            "name": st.name,
            "provider": st.provider,
            "instance_type": st.instance_type,
            "job_start": st.job_start,
            "last_t": st.last_t,
            "step": st.step,
            "total": st.total,
            "step_time": st.step_time,
            "last_metrics": dict(st.last_metrics),
            "breakdown": b.as_dict(),
            "cost": st.cost(b),
            "metrics": metrics,
            "redo": redo,
            "preempt_marks": [list(m) for m in st.preempt_marks],
            "resume_marks": [list(m) for m in st.resume_marks],
            "timeline": timeline,
            "events": {"count": st.n_events, "kinds": dict(entry.kinds), "recent": feed},
            "failure": (
                {"message": st.error.message, "exc_type": st.error.exc_type, "traceback": st.error.traceback}
                if st.error
                else None
            ),
        }

    @staticmethod
    def _figures(entry: _Entry) -> dict[str, Any] | None:
        """The notebook widget's static plotly figures as JSON, rebuilt only when the state
        changed (building plotly figures costs tens of ms). None without plotly/the widget."""
        st = entry.state
        version = (*st.versions.values(), int(not st.done and time.time() // 5))
        if entry.figures_version == version:
            return entry.figures
        try:
            from spotnb.views.widget.figures import static_figures_from_state

            figs = static_figures_from_state(st)
            entry.figures = {k: json.loads(f.to_json()) for k, f in figs.items()}
        except ImportError:
            entry.figures = None
        entry.figures_version = version
        return entry.figures

    def stop(self, job_id: str) -> dict[str, Any] | None:
        """POST /spotnb/api/jobs/<id>/stop: write the STOP marker the controller obeys."""
        from spotnb.job import Job

        row = self.db.job(job_id)
        if row is None:
            return None
        if row.get("status") in TERMINAL:
            return {
                "id": row["id"],
                "stopped": False,
                "status": row["status"],
                "message": f"job already {row['status']}",
            }
        Job(row["id"], Store(row["store"]), self.db, {"name": row.get("name")}).stop(wait=False)
        return {
            "id": row["id"],
            "stopped": True,
            "status": row.get("status"),
            "message": "stop requested; the job's controller terminates its instance",
        }


def _incarnation_json(inc: Incarnation) -> dict[str, Any]:
    """One instance for the panel's timeline: its plain fields, its notice and kill as the
    events' JSON, its save spans as lists (what reached the reducer, not how it is stored)."""
    out: dict[str, Any] = {}
    for f in fields(inc):
        value = getattr(inc, f.name)
        if f.name in ("kinds", "progress"):
            continue
        if isinstance(value, Event):
            value = value.to_json()
        elif f.name == "save_spans":
            value = [list(span) for span in value]
        out[f.name] = value
    return out
