"""The event log: JSON lines in the store, the one record every view is computed from.

What the events are is `spotnb.core.protocol` (one typed record per kind); this module writes and
reads them. Each writer (the agent of one incarnation, the controller, the notebook) appends
to its own segment files `events/<incarnation>-<writer>-<n>.jsonl`, whose first line is a
`segment` header with the protocol version.

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
from collections.abc import Iterable
from typing import Any, Protocol

from spotnb.core.protocol import PROTOCOL_VERSION, ControllerRestarted, Event, Segment, as_metric, from_json
from spotnb.core.store import Store

__all__ = [
    "EventWriter",
    "EventReader",
    "EventSink",
    "Event",
    "SEGMENT_BYTES",
    "as_metric",
    "json_safe",
    "read_all",
    "dispatch",
]

log = logging.getLogger("spotnb.core.events")

SEGMENT_BYTES = 512 * 1024  # a writer rewrites at most this much per flush


class EventSink(Protocol):
    """Anything that wants events as they arrive (widget, text view, job DB)."""

    def on_events(self, events: list[Event]) -> None: ...


def _dumps(event: dict[str, Any]) -> bytes:
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
        existing = [
            int(m.group(1)) for n in store.ls(store.job(job_id, "events")) if (m := segment.fullmatch(n))
        ]
        if existing:
            self._segment = max(existing) + 1

    def emit(self, event: Event, gen: int | None = None) -> Event:
        """Buffer `event`, stamped with the time (unless it carries one), this writer's
        incarnation and, for a controller, its lease generation."""
        event = event.stamped(t=time.time(), incarnation=self.incarnation, gen=gen)
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

    def _header(self) -> bytes:
        """The first line of a segment: the protocol version its events are written in."""
        header = Segment(protocol=PROTOCOL_VERSION, writer=self.writer).stamped(
            t=time.time(), incarnation=self.incarnation
        )
        return _dumps(header.to_json())

    def flush(self) -> None:
        """Write what is buffered. Never loses an event: on failure they stay pending."""
        with self._io_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch:
                return
            data = b"".join(_dumps(e.to_json()) for e in batch)
            content = bytearray(self._content or self._header()) + data
            path = self.store.job(
                self.job_id, "events", f"{self.incarnation:04d}-{self.writer}-{self._segment:05d}.jsonl"
            )
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
        self.skipped: dict[str, int] = {}  # unusable lines per file (see _parse)
        self._fences: dict[int, float] = {}  # lease generation -> its predecessor's expiry
        self.protocols: dict[str, int] = {}  # segment file -> protocol version of its writer

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
            gen = e.gen
            if isinstance(e, ControllerRestarted) and gen is not None:
                t = e.previous_expiry
                self._fences[gen] = t if t is not None else e.t
            if gen is not None and any(g > gen and e.t > t for g, t in self._fences.items()):
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
                typed = from_json(event)
                if isinstance(typed, Segment):
                    self._segment(name, typed)
                    return None
                return typed
            problem = "not an event object"
        if name not in self.skipped:
            log.warning(
                "job %s: skipped a line of events/%s that is %s",
                self.job_id,
                name,
                problem,
                extra={"job_id": self.job_id},
            )
        self.skipped[name] = self.skipped.get(name, 0) + 1
        return None

    def _segment(self, name: str, header: Segment) -> None:
        self.protocols[name] = header.protocol
        if header.protocol > PROTOCOL_VERSION:
            log.warning(
                "job %s: events/%s was written by a newer spotnb (protocol %d; this one "
                "reads %d): kinds and fields it does not know are kept and shown as they are",
                self.job_id,
                name,
                header.protocol,
                PROTOCOL_VERSION,
                extra={"job_id": self.job_id},
            )


def _time_of(event: Event) -> float:
    return event.t  # a finite float (protocol.from_json)


def read_all(store: Store, job_id: str) -> list[Event]:
    """Every event of a job, oldest first."""
    return EventReader(store, job_id).poll()


def dispatch(sinks: Iterable[EventSink], events: list[Event]) -> None:
    for sink in list(sinks):
        sink.on_events(events)
