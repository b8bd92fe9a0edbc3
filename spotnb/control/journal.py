"""What a controller writes of its job: its events, the job DB's index of them, end markers.

Every write goes through the controller's lease (`LeaseHolder.fence`): a controller that lost
the job writes nothing more, and each event carries the lease generation it was written
under, so a late write is recognisable. A store that refuses writes for a while (a full
disk) is ridden out: the events stay pending and the flush is retried with backoff.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING

from spotnb.control.fencing import LeaseHolder
from spotnb.control.jobdb import JobDB
from spotnb.core import protocol as ev
from spotnb.core.events import EventWriter
from spotnb.core.protocol import TERMINAL, Event
from spotnb.core.store import Store

if TYPE_CHECKING:
    from spotnb.job import Job

__all__ = ["FLUSH_BACKOFF", "Journal"]

# a store that refuses writes for a while (full disk): retry a flush this often, events kept
FLUSH_BACKOFF: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
if os.environ.get("SPOTNB_FLUSH_BACKOFF_SCALE"):  # tests: the same ride, shorter
    FLUSH_BACKOFF = tuple(w * float(os.environ["SPOTNB_FLUSH_BACKOFF_SCALE"]) for w in FLUSH_BACKOFF)
INDEX_EVERY = 2.0  # seconds between the job DB's updates of the job's totals (and at its end)


class Journal:
    """The controller's writes for one job; see the module docstring."""

    def __init__(
        self,
        job: Job,
        store: Store,
        db: JobDB,
        lease: LeaseHolder,
        log: logging.LoggerAdapter,
    ) -> None:
        self.job, self.store, self.db, self.lease, self.log = job, store, db, lease, log
        self._writers: dict[int, EventWriter] = {}
        self.high_water = 0  # the highest step any incarnation reported
        self._indexed = 0.0

    def emit(self, event: Event, incarnation: int = 0) -> None:
        """Write one event now, stamped with this controller's lease generation, only while it
        holds the lease (checked before the event is stamped, so a late write is recognisable)."""
        self.lease.fence()
        writer = self._writers.get(incarnation)
        if writer is None:
            writer = self._writers[incarnation] = EventWriter(self.store, self.job.id, incarnation, "ctl")
        writer.emit(event, gen=self.lease.generation)
        self._flush(writer)

    def _flush(self, writer: EventWriter) -> None:
        """Flush, riding out a store that refuses writes for a while (a full disk): the events
        stay pending and the flush is retried with backoff, as long as the lease is held."""
        for wait in (*FLUSH_BACKOFF, None):
            self.lease.fence()
            try:
                writer.flush()
                return
            except OSError as exc:
                if wait is None:
                    raise
                self.log.warning(
                    "job %s: cannot write events (%s); %d kept, retrying in %.1f s",
                    self.job.id,
                    exc,
                    writer.pending,
                    wait,
                )
                time.sleep(wait)

    def discard(self) -> int:
        """Drop every event not written yet (the lease is lost); how many were dropped."""
        return sum(w.discard() for w in list(self._writers.values()))

    def index(self, events: list[Event]) -> None:
        """Keep the job DB current with the events just read: checkpoints and incarnations at
        once, the job's totals every `INDEX_EVERY` seconds and at its end."""
        for e in events:
            if isinstance(e, ev.Checkpoint):
                self.db.record_checkpoint(self.job.id, e.incarnation, e)
            elif isinstance(e, ev.Ready):
                self.db.record_incarnation(self.job.id, e.incarnation, ready=e.t)
            elif isinstance(e, ev.Progress):
                self.high_water = max(self.high_water, e.step)
        final = any(isinstance(e, ev.Status) and e.status in TERMINAL for e in events)
        if not final and time.time() - self._indexed < INDEX_EVERY:
            return
        self._indexed = time.time()
        b = self.job.breakdown()
        self.db.update_job(
            self.job.id,
            step=b.step,
            total_steps=b.total_steps,
            preemptions=b.preemptions,
            # the job's whole spend (a cloud coordinator included): the panel's "spent" and
            # savings read this column, and must agree with the job's own views
            spot_cost=b.total_cost,
            on_demand_cost=b.on_demand_cost,
            heartbeat=time.time(),
            # every instance the job holds (and its coordinator), at its price now
            burn_rate=self.job.hourly_rate() if self.job.status in ("running", "restoring") else 0.0,
        )

    def end_marker(self, n: int, reason: str) -> None:
        """Write incarnation `n`'s end marker (`incarnations/<n>.end`): its successor waits for
        it before restoring, and reads from it the step reached and why it ended."""
        self.lease.fence()
        # `checkpointed`: whether any checkpoint was ever committed, so that a successor that
        # finds none can tell "all were lost" (worth a warning) from "none was made yet"
        checkpointed = self.job.state.checkpointed
        marker = {
            "high_water": self.high_water,
            "checkpointed": checkpointed,
            "reason": reason,
            "t": time.time(),
        }
        self.store.write_bytes(
            self.store.job(self.job.id, "incarnations", f"{n:04d}.end"), json.dumps(marker).encode()
        )
