"""`Job`: the notebook's handle on a spot job. Its state is derived from the event log only,
so a Job built by `spot.attach` in a new kernel shows exactly what the original one did."""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator
from typing import TYPE_CHECKING, Any

from spotnb import aio
from spotnb.control.supervise import ensure_controller
from spotnb.core.events import EventReader, EventSink
from spotnb.core.ledger import Breakdown
from spotnb.core.protocol import TERMINAL, Event, JobStatus, as_metric
from spotnb.core.savings import describe_savings
from spotnb.core.state import JobState
from spotnb.core.store import Store
from spotnb.errors import JobFailed, JobStopped, SpotnbError
from spotnb.views.html_safe import NO_MATH

if TYPE_CHECKING:
    from spotnb.control.jobdb import JobDB

__all__ = ["Job", "STATUSES", "TERMINAL"]

log = logging.getLogger("spotnb.job")

#: every status, in the order of a job's life (`lost`: only the job DB can say so)
STATUSES = tuple(s.value for s in JobStatus)
_FOLLOW_INTERVAL = 0.25
_CONTROLLER_CHECK = 15.0  # seconds between looks at the job's controller lease


class Job:
    """A running or finished spot job. Returned by `spot.train` and `spot.attach`."""

    def __init__(
        self, job_id: str, store: Store, db: JobDB | None = None, meta: dict[str, Any] | None = None
    ) -> None:
        self.id = job_id
        self.store = store
        self.db = db
        self.meta = dict(meta or {})
        self.name: str = self.meta.get("name") or job_id
        self._lock = threading.RLock()
        self._events: list[Event] = []
        #: the job as its events say (the one reducer; read it under `lock`)
        self.state = JobState()
        self._finished = threading.Event()
        self._done_callbacks: list[Callable[[], None]] = []
        self._sinks: list[EventSink] = []
        self._result: Any = None
        self._result_loaded = False
        self._stop_hook: Callable[[], None] | None = None
        self.driver: object | None = None  # the in-process controller, if this process drives it
        self._follower: threading.Thread | None = None

    # -- state from events ---------------------------------------------------------------------
    @property
    def lock(self) -> threading.RLock:
        """Held while events are folded into `state`."""
        return self._lock

    def _ingest(self, events: list[Event]) -> None:
        if not events:
            return
        with self._lock:
            self._events.extend(events)
            self.state.feed_events(events)
            if self.state.submitted is not None:
                self.meta.update(
                    {
                        k: v
                        for k, v in self.state.submitted.to_json().items()
                        if k not in ("t", "kind", "incarnation")
                    }
                )
                self.name = self.meta.get("name") or self.id
            sinks = list(self._sinks)
        for sink in sinks:
            try:
                sink.on_events(events)
            except Exception as exc:  # noqa: BLE001 - a broken view must not stop the job
                log.warning(
                    "job %s: a job view failed and was detached: %r", self.id, exc, extra={"job_id": self.id}
                )
                self.remove_sink(sink)
        if self.state.status in TERMINAL:
            self._finish()

    def add_sink(self, sink: EventSink, replay: bool = True) -> None:
        """Send events to `sink` as they arrive (after replaying those seen so far)."""
        with self._lock:
            self._sinks.append(sink)
            past = list(self._events)
        if replay and past:
            sink.on_events(past)

    def remove_sink(self, sink: EventSink) -> None:
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)

    def follow(self) -> None:
        """Tail the store until the job ends (used when another process drives the job)."""
        if self._follower is not None:
            return
        reader = EventReader(self.store, self.id)
        self._ingest(reader.poll())

        def loop() -> None:
            interval = max(_FOLLOW_INTERVAL, self.store.poll_interval)
            checked = time.time()
            while not self._finished.is_set():
                time.sleep(interval)
                if self.db is not None and time.time() - checked > _CONTROLLER_CHECK:
                    checked = time.time()
                    self._revive_controller()
                try:
                    self._ingest(reader.poll())
                except Exception as exc:  # noqa: BLE001 - the follower must outlive any bad read
                    log.warning(
                        "job %s: reading events failed, retrying: %r", self.id, exc, extra={"job_id": self.id}
                    )
                    continue

        if not self._finished.is_set():
            self._follower = threading.Thread(target=loop, name=f"spotnb-follow-{self.id}", daemon=True)
            self._follower.start()

    def _revive_controller(self) -> None:
        """A follower that outlives the job's controller restarts it (the lease in the job DB
        keeps two from driving the job), so `job.result()` never waits on a dead controller."""
        try:
            row = self.db.job(self.id) if self.db is not None else None
            if row is not None:
                ensure_controller(row)
                if row.get("status") == JobStatus.LOST:  # the store is gone: only the DB can say so
                    self._mark_lost(row.get("status_reason") or "its store vanished")
        except Exception as exc:  # noqa: BLE001 - try again at the next check
            log.warning("job %s: could not check its controller: %r", self.id, exc, extra={"job_id": self.id})

    def _mark_lost(self, reason: str) -> None:
        """The store is gone: no event can say so, the job DB row does (see supervise.job_vanished)."""
        with self._lock:
            self.state.status, self.state.status_reason = JobStatus.LOST, reason
        self._finish()

    def _finish(self) -> None:
        """The job has ended: wake `wait()`ers and run the done callbacks once."""
        with self._lock:
            if self._finished.is_set():
                return
            self._finished.set()
            callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - one waiter's bug must not stop the others
                log.warning("job %s: a done callback failed: %r", self.id, exc, extra={"job_id": self.id})

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (from the job's thread) once the job has ended; at once if it has."""
        with self._lock:
            if not self._finished.is_set():
                self._done_callbacks.append(callback)
                return
        callback()

    def remove_done_callback(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._done_callbacks:
                self._done_callbacks.remove(callback)

    # -- awaiting (spotnb.aio) -------------------------------------------------------------------
    def __await__(self) -> Generator[Any, None, Any]:
        """`await job`: the function's return value, as `job.result()` gives it."""
        return aio.result_async(self).__await__()

    async def wait_async(self, timeout: float | None = None) -> bool:
        """`await job.wait_async()`: True once the job ended, False on timeout."""
        return await aio.wait_async(self, timeout)

    def stream(self) -> AsyncIterator[Event]:
        """`async for event in job.stream()`: every event so far, then each new one, ending
        after the one that ends the job."""
        return aio.stream(self)

    # -- public ---------------------------------------------------------------------------------
    @property
    def status(self) -> str:
        """pending, running, preempted, restoring, succeeded, failed, stopped or lost (its
        store or job directory vanished): a `JobStatus`, which compares equal to its string."""
        return self.state.status

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    @property
    def events(self) -> list[Event]:
        """Every event so far, oldest first (a copy). Typed records (`spotnb.core.protocol`) that
        also read like their JSON (`e["kind"]`, `e.get("step")`)."""
        with self._lock:
            return list(self._events)

    @property
    def metrics(self) -> dict[str, list[tuple[int, float]]]:
        """Logged metrics by name: [(step, value), ...] in the order they were logged; steps
        redone after a preemption appear again (see `metrics_frame()` for the incarnation).
        On several instances, replica 0's (`replica_metrics(k)` for another's)."""
        return self.replica_metrics(0)

    def replica_metrics(self, replica: int) -> dict[str, list[tuple[int, float]]]:
        """`metrics` as replica `replica` logged them (a one-instance job has only replica 0)."""
        out: dict[str, list[tuple[int, float]]] = {}
        for e in self.events:
            rows = e.get("rows") if e.kind == "metrics" else None
            for row in rows if isinstance(rows, list) else ():
                step = row.get("step") if isinstance(row, dict) else None
                if not isinstance(step, int) or isinstance(step, bool):
                    continue
                if row.get("replica", 0) != replica:
                    continue
                for key, value in row.items():
                    number = as_metric(value)
                    if number is not None and key not in ("step", "t", "replica"):
                        out.setdefault(key, []).append((step, number))
        return out

    def events_frame(self) -> Any:
        """The events as a pandas DataFrame, one column per JSON field (needs pandas)."""
        import pandas as pd

        return pd.DataFrame([e.to_json() for e in self.events])

    def metrics_frame(self) -> Any:
        """One row per logged step: step, t, incarnation and the metric columns (needs pandas)."""
        import pandas as pd

        rows = [
            {**row, "incarnation": e.incarnation}
            for e in self.events
            if e.kind == "metrics"
            for row in e["rows"]
        ]
        return pd.DataFrame(rows)

    def breakdown(self) -> Breakdown:
        """Seconds of compute / recompute / save / alloc / prep / other, preemptions, spot cost
        and the on-demand cost of the same compute."""
        with self._lock:
            return self.state.breakdown()

    def hourly_rate(self) -> float:
        """$/h the job is billed now: every instance it holds at its current spot price, plus
        its coordinator (0 once it ended)."""
        with self._lock:
            return self.state.hourly_rate()

    def cost(self) -> dict[str, Any]:
        """Spent so far, its on-demand equivalent, the projected total and the savings, said
        as every view says them (`spotnb.core.savings`): `savings` is None while withheld (before a
        minute of training) and for a failed job; `savings_text` is the sentence."""
        with self._lock:
            return self.state.cost()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job ends; False on timeout."""
        return self._finished.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The function's return value once every preemption was survived.

        Raises JobFailed (with the remote traceback) on a user error, JobStopped if stopped,
        TimeoutError if `timeout` passes first."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"job {self.id} still {self.status} after {timeout} s")
        state = self.state
        if state.status == JobStatus.FAILED:
            err = state.error
            raise JobFailed(
                f"job {self.id} failed: {err.message if err else 'see events'}", err.traceback if err else ""
            )
        if state.status == JobStatus.LOST:
            raise JobFailed(f"job {self.id} is lost: {state.status_reason or 'its store vanished'}")
        if state.status == JobStatus.STOPPED:
            raise JobStopped(f"job {self.id} was stopped: {state.status_reason or 'stop requested'}")
        if not self._result_loaded:
            self._result = self._load_result()
            self._result_loaded = True
        return self._result

    def _load_result(self) -> Any:
        """Unpickle result.pkl only once its signature verifies with the job's key (kept on the
        machine that submitted the job): a pickle from anyone else would run their code here."""
        import cloudpickle

        from spotnb.core.signing import BadSignature, key_path, load_key, unseal

        key = load_key(self.id)
        path = self.store.job(self.id, "result.pkl")
        if key is None and self._legacy():
            raise SpotnbError(
                f"job {self.id} was submitted by an older spotnb: its result is not "
                f"signed and is not loaded. If you trust everyone who can write the "
                f"store, load it yourself: cloudpickle.loads(Store(url).read_bytes("
                f"{path!r}))"
            )
        if key is None:
            raise SpotnbError(
                f"job {self.id}: its key is not on this machine ({key_path(self.id)}), so "
                "its result cannot be verified and is not loaded; copy the key file "
                "from the machine that submitted the job"
            )
        blob = self.store.read_bytes(path)
        try:
            payload = unseal(key, self.id, "result.pkl", blob)
        except BadSignature as exc:
            raise SpotnbError(f"job {self.id}: result.pkl is not loaded: {exc}") from None
        return cloudpickle.loads(payload)

    def _legacy(self) -> bool:
        """True for a job of a spotnb before jobs were signed (its spec has no version)."""
        import json

        try:
            doc = json.loads(self.store.read_bytes(self.store.job(self.id, "spec.json")))
            return isinstance(doc, dict) and "spec_version" not in doc
        except (OSError, ValueError):
            return False

    def checkpoint(self, step: int | None = None) -> Any:
        """The tracked state of the job's newest checkpoint that verifies against its signed
        manifest, or of the one saved at `step`: a `spotnb.weights.Checkpoint`, a dict of what
        `ctx.track` tracked by name (`model.load_state_dict(ckpt["model"])`), with `ckpt.step`
        and `ckpt.state` (`ctx.state`), tensors on the CPU. Works while the job runs and after
        it ended; needs the job's key on this machine, as `result()` does. Raises
        CheckpointError naming the step and the fix when none can be read."""
        from spotnb.weights import job_key, read_checkpoint

        return read_checkpoint(self.id, self._store_or_raise(), job_key(self.id), step)

    def export(
        self, folder: str, step: int | None = None, format: str = "safetensors", overwrite: bool = False
    ) -> list[Any]:
        """Write the trained weights of the newest verified checkpoint (or of `step`) into
        `folder`, as files other tools read (`spotnb.weights.export`: `<name>.safetensors` per
        tracked model, or `<name>.pt` with `format="torch"`; a Hugging Face job's
        `checkpoint-<step>/`). Returns the paths written."""
        from spotnb.weights import export_from, job_key

        return export_from(
            self.id,
            self._store_or_raise(),
            job_key(self.id),
            folder,
            step=step,
            format=format,
            overwrite=overwrite,
        )

    def _store_or_raise(self) -> Store:
        if self.store is None:  # a lost job: the job DB says its store vanished
            raise SpotnbError(
                f"job {self.id} is lost ({self.state.status_reason}): its checkpoints went with its store"
            )
        return self.store

    def stop(self, wait: bool = True, timeout: float | None = 60) -> None:
        """Stop the job: terminate its instance; the job ends as "stopped"."""
        if self._stop_hook is not None:
            self._stop_hook()
        else:
            self.store.write_bytes(self.store.job(self.id, "STOP"), b"stop requested\n")
        if wait:
            self._finished.wait(timeout)

    @property
    def traceback(self) -> str | None:
        return self.state.error.traceback if self.state.error else None

    # -- display -----------------------------------------------------------------------------
    def summary(self) -> str:
        b = self.breakdown()
        prog = f"step {b.step}" + (f"/{b.total_steps}" if b.total_steps else "")
        return (
            f"{self.name} [{self.status}] {prog}, {b.preemptions} preemption(s), "
            f"{_spent(b)} vs on-demand ${b.on_demand_cost:.4f}"
        )

    def __repr__(self) -> str:
        return f"<spotnb.Job {self.id} {self.summary()}>"

    def _repr_html_(self) -> str:
        b = self.breakdown()
        sv = describe_savings(b.total_cost, b.on_demand_cost, str(self.status), b.compute, b.lanes)
        rows = "".join(
            f"<tr><td>{c}</td><td>{getattr(b, c):.1f} s</td></tr>"
            for c in ("compute", "recompute", "save", "alloc", "prep", "other")
        )
        return (
            f"<div class='spotnb-job {NO_MATH}'><b>{html.escape(self.name)}</b> "
            f"<code>{html.escape(self.id)}</code> — <b>{html.escape(self.status)}</b><br>"
            f"step {b.step}{'/' + str(b.total_steps) if b.total_steps else ''}, "
            f"{b.preemptions} preemption(s), {html.escape(_spent(b))}: "
            f"{html.escape(sv.text)} ({html.escape(sv.baseline)})"
            f"<table>{rows}<tr><td>total</td><td>{b.total:.1f} s</td></tr></table></div>"
        )

    def _ipython_display_(self) -> None:
        from IPython.display import display

        try:
            from spotnb.views.widget import job_widget
        except ImportError:
            display({"text/html": self._repr_html_(), "text/plain": repr(self)}, raw=True)
            return
        display(job_widget(self))

    def show(self) -> Any:
        """Display the live widget (or the text view outside a notebook kernel)."""
        try:
            from spotnb.views.widget import job_widget
        except ImportError:
            print(repr(self))
            return None
        widget = job_widget(self)
        try:
            from IPython.display import display

            display(widget)
        except ImportError:
            pass
        return widget

    def plot(self) -> Any:
        """Static plotly figures (breakdown, timeline, metrics) for export."""
        from spotnb.views.widget import static_figures

        return static_figures(self)


def _spent(b: Breakdown) -> str:
    """What the job spent, as the job's one-line views say it: the spot instances, plus the
    on-demand coordinator of a job on several instances on a cloud on its own line."""
    if b.coordinator_price is None:
        return f"spot ${b.spot_cost:.4f}"
    return (
        f"spent ${b.total_cost:.4f} (spot ${b.spot_cost:.4f} + "
        f"coordinator ${b.coordinator_cost:.4f} on demand)"
    )
