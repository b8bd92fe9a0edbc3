"""The event log: JSON lines in the store, the one record every view is computed from.

An event is a dict with `t` (unix seconds), `kind`, `incarnation` and kind-specific fields:

    submitted     name, provider, instance_type, config (no secrets)
    allocating    region, attempt                   controller asks the provider for an instance
    alloc_failed  region, reason, retry_in
    allocated     instance_id, region, instance_type, alloc_s, spot_price, on_demand_price
    ready         prep_s (process start → first step, restore included), step
    resumed       from_step, seq, save_kind, restore_s
    metrics       rows: [{step, t, <name>: value, ...}, ...]   (one event per flush, not per step)
    progress      step, total (or null), steps_done, compute_s, recompute_s, save_s, step_time
    checkpoint    seq, save_kind, step, snapshot_s, upload_s, bytes, stall_s
    checkpoint_failed  seq, kind, step, error
    notice        deadline (unix s), source (aws|azure|gcp), action, emergency (bool)
    evacuated     step (the agent saved and left cleanly after a notice)
    preempted     instance_id, lifetime_s, phase, step (as the market saw it at the kill)
    exited        code, reason
    heartbeat     step
    error         traceback, exc_type, message
    done          result (store path), step
    status        status (pending | running | preempted | restoring | succeeded | failed | stopped)
    stopped       reason
    files         count, written, workdir          the agent laid out Config.files
    job_resumed   from_status, new_fn, changed, config   spot.resume continued a failed/stopped job
    controller_restarted  owner, gen, previous_expiry   a new controller took the job over
    warning       message (e.g. no net progress: `stalled` instances in a row without a save)

Every event a controller writes carries `gen`, its lease generation: a reader drops those of
an older generation stamped after a newer one's `previous_expiry` (see EventReader._fenced).
A job whose store vanished is `lost`; only the job DB can say so (no event can be written).

Writers buffer and flush; readers tail. Nothing here imports the runtime or the notebook side.
"""
from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from typing import Any, Iterable, Protocol

from spotnb.store import Store

__all__ = ["EventWriter", "EventReader", "EventSink", "Event", "SEGMENT_BYTES", "as_metric", "json_safe"]

log = logging.getLogger("spotnb.events")

Event = dict[str, Any]
SEGMENT_BYTES = 512 * 1024  # a writer rewrites at most this much per flush


class EventSink(Protocol):
    """Anything that wants events as they arrive (widget, text view, job DB)."""

    def on_events(self, events: list[Event]) -> None: ...


def _dumps(event: Event) -> bytes:
    """One JSON line. A NaN or an infinity anywhere would make a line JavaScript's JSON.parse
    rejects (the lab panel reads these): the agent already turns metric values into null, and
    anything else non-finite becomes null here rather than a write that fails forever."""
    try:
        text = json.dumps(event, separators=(",", ":"), default=str, allow_nan=False)
    except ValueError:
        text = json.dumps(json_safe(event), separators=(",", ":"), default=str, allow_nan=False)
    return (text + "\n").encode()


def json_safe(obj: Any) -> Any:
    """`obj` with NaN and infinities as null (the browser's JSON.parse rejects them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def as_metric(value: Any) -> float | None:
    """A logged value as a finite float, or None when it is no number a chart can draw (a
    string, null, NaN, an infinity, an integer beyond float range). Readers use it so that
    no value in any log, however odd or from whichever writer, can stop them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):  # bool included
        try:
            return float(value)
        except OverflowError:
            return None
    return None


class EventWriter:
    """Buffers events of one writer of one incarnation and flushes them as bounded segments.

    Thread-safe: the training thread emits, a background thread flushes.
    """

    def __init__(self, store: Store, job_id: str, incarnation: int, writer: str) -> None:
        self.store, self.job_id, self.incarnation, self.writer = store, job_id, incarnation, writer
        self._lock = threading.RLock()
        self._pending: list[Event] = []
        self._segment = 0
        self._content = bytearray()
        self._io_lock = threading.Lock()
        self.last_flush = 0.0
        # resume numbering after an earlier writer of the same name (e.g. a restarted controller)
        # (only names of finished segments: a temp file of a write that died is no segment)
        segment = re.compile(rf"{incarnation:04d}-{re.escape(writer)}-(\d+)\.jsonl")
        existing = [int(m.group(1)) for n in store.ls(store.job(job_id, "events"))
                    if (m := segment.fullmatch(n))]
        if existing:
            self._segment = max(existing) + 1

    def emit(self, kind: str, **fields: Any) -> Event:
        event: Event = {"t": fields.pop("t", None) or time.time(), "kind": kind,
                        "incarnation": self.incarnation, **fields}
        with self._lock:
            self._pending.append(event)
        return event

    @property
    def pending(self) -> int:
        return len(self._pending)

    def discard(self) -> int:
        """Drop what is buffered (a controller that lost its lease must not write it later).
        Returns how many events were dropped."""
        with self._lock:
            dropped, self._pending = len(self._pending), []
        return dropped

    def flush(self) -> None:
        """Write what is buffered. Never loses an event: on failure they stay pending."""
        with self._io_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch:
                return
            data = b"".join(_dumps(e) for e in batch)
            content = self._content + data
            path = self.store.job(self.job_id, "events",
                                  f"{self.incarnation:04d}-{self.writer}-{self._segment:05d}.jsonl")
            try:
                self.store.write_bytes(path, bytes(content))
            except BaseException:
                with self._lock:
                    self._pending[:0] = batch
                raise
            self._content = content
            if len(self._content) >= SEGMENT_BYTES:
                self._segment += 1
                self._content = bytearray()
            self.last_flush = time.time()


class EventReader:
    """Tails every event file of a job; `poll()` returns events not seen before, oldest first."""

    def __init__(self, store: Store, job_id: str) -> None:
        self.store, self.job_id = store, job_id
        self._offsets: dict[str, int] = {}
        self.skipped: dict[str, int] = {}   # unusable lines per file (see _parse)
        self._fences: dict[int, float] = {}  # lease generation -> its predecessor's expiry

    def poll(self) -> list[Event]:
        folder = self.store.job(self.job_id, "events")
        self.store.invalidate()
        out: list[Event] = []
        for name in self.store.ls(folder):
            if not name.endswith(".jsonl"):
                continue
            path = f"{folder}/{name}"
            offset = self._offsets.get(name, 0)
            try:
                size = self.store.size(path)
            except FileNotFoundError:
                continue
            if size <= offset:
                continue
            data = self.store.read_bytes(path, start=offset)
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                if line.strip():
                    event = self._parse(name, line)
                    if event is not None:
                        out.append(event)
            self._offsets[name] = offset + end
        out.sort(key=_time_of)
        return self._fenced(out)

    def _fenced(self, events: list[Event]) -> list[Event]:
        """Drop controller events (they carry `gen`, their lease generation) stamped after a
        newer generation's predecessor lost its lease: a controller that was paused past its
        lease may write once more before it notices; what it says then is not the job's state.
        The newer controller announces itself (`controller_restarted` with `gen` and
        `previous_expiry`) before anything else, so the fence is known before the stale writes."""
        out = []
        for e in events:
            gen = e.get("gen")
            if e.get("kind") == "controller_restarted" and isinstance(gen, int):
                t = as_metric(e.get("previous_expiry"))
                self._fences[gen] = t if t is not None else e["t"]
            if isinstance(gen, int) and any(g > gen and e["t"] > t for g, t in self._fences.items()):
                continue
            out.append(e)
        return out

    def _parse(self, name: str, line: bytes) -> Event | None:
        """One event, or None for a line no reader can use (corrupt, truncated by a crash, not
        an object, no kind): skipped with one log line per file, never an exception that would
        stop a follower and leave `job.result()` waiting forever."""
        try:
            event = json.loads(line)
        except ValueError as exc:
            problem = f"not JSON ({exc})"
        else:
            if isinstance(event, dict) and isinstance(event.get("kind"), str):
                t = as_metric(event.get("t"))
                event["t"] = t if t is not None else 0.0
                if not isinstance(event.get("incarnation", 0), int):
                    event["incarnation"] = 0
                return event
            problem = "not an event object"
        if name not in self.skipped:
            log.warning("job %s: skipped a line of events/%s that is %s", self.job_id, name, problem)
        self.skipped[name] = self.skipped.get(name, 0) + 1
        return None


def _time_of(event: Event) -> float:
    return event["t"]  # made a finite float by _parse


def read_all(store: Store, job_id: str) -> list[Event]:
    """Every event of a job, oldest first."""
    return EventReader(store, job_id).poll()


def dispatch(sinks: Iterable[EventSink], events: list[Event]) -> None:
    for sink in list(sinks):
        sink.on_events(events)
