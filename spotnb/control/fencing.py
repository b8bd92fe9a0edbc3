"""One controller's hold on a job: the lease that says it alone drives the job, and the fence
every write of it goes through.

Two records make the lease. The job DB's (`JobDB.take_lease`) fences this machine's
controllers: each holder takes a new *generation*, renews it every quarter TTL, and stamps it
on every event it writes, so a late write of a predecessor is recognisable. The store's
(`spotnb.control.lease.StoreLease`) fences other machines' controllers (two machines share a
store, not a job DB). A `Controller` holds one `LeaseHolder`; its `fence()` is what each of
the controller's writes asks first, and `keep()` is the renewing thread's body.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from spotnb.control.jobdb import JobDB
from spotnb.control.lease import StoreLease, site_of
from spotnb.core.store import Store

__all__ = ["LEASE_TTL", "LeaseHolder", "LeaseLost"]

# a controller silent this long is presumed dead and may be replaced (env: for tests and ops)
LEASE_TTL = float(os.environ.get("SPOTNB_LEASE_TTL", "10"))


class LeaseLost(Exception):
    """Another controller took over the job: this one must stop driving it at once."""


class LeaseHolder:
    """The job's lease as one controller (`owner`) holds it; see the module docstring.
    `on_lost` runs once the lease is found lost (the controller stops and drops what it has
    not written)."""

    def __init__(
        self,
        db: JobDB,
        store: Store,
        job_id: str,
        owner: str,
        log: logging.LoggerAdapter,
        on_lost: Callable[[], None],
    ) -> None:
        self.db, self.job_id, self.owner, self.log = db, job_id, owner, log
        # the DB lease fences this machine's controllers; this record, other machines'
        self.store_lease = StoreLease(store, job_id, site_of(db.path), owner)
        self.lost = threading.Event()
        self.generation = 0  # lease generation this controller holds (0: none yet)
        self.until = 0.0  # when the lease last renewed runs out
        self._on_lost = on_lost

    def take(self) -> dict[str, Any] | None:
        """Take the job's lease (a new generation); None if a live controller holds it. Every
        write after this is fenced by that generation (see `fence`)."""
        other = self.store_lease.holder()
        if other is not None:  # another machine drives the job (its record is live)
            self.log.warning("job %s is driven from %s", self.job_id, other.get("site"))
            return None
        taken = time.time()
        lease = self.db.take_lease(self.job_id, self.owner, os.getpid(), LEASE_TTL)
        if lease is not None:
            self.generation, self.until = lease["generation"], taken + LEASE_TTL
            try:
                self.store_lease.write()
            except Exception as exc:  # noqa: BLE001 - the first event write will say what is wrong
                self.log.warning("job %s: could not record the store lease (%r)", self.job_id, exc)
        return lease

    def fence(self) -> None:
        """Raise LeaseLost unless this controller still holds its lease generation. When the
        renewing thread is late (a paused or starved process), ask the job DB now rather than
        trust a lease that may have run out while this process was not running."""
        if not self.lost.is_set() and time.time() > self.until - LEASE_TTL / 2:
            try:
                until = self.db.renew_lease(self.job_id, self.owner, self.generation, LEASE_TTL)
            except sqlite3.OperationalError:
                until = self.until if time.time() < self.until else None
            if until is None:
                self.lose()
            else:
                self.until = max(self.until, until)
        if self.lost.is_set():
            raise LeaseLost()

    def lose(self) -> None:
        """Another controller holds the job now: say so to the controller (`on_lost`)."""
        self.lost.set()
        self._on_lost()

    def keep(self, alive: Callable[[], bool]) -> None:
        """Renew the lease in the job DB while `alive()`; if another controller holds it, lose it.

        A busy DB (another process writing) must not kill this thread: it used to, the lease
        then ran out under a healthy controller and a second one was started beside it. Each
        attempt waits at most a quarter TTL for the DB lock and is retried soon after."""
        while not self.lost.is_set() and alive():
            try:
                until = self.db.renew_lease(self.job_id, self.owner, self.generation, LEASE_TTL)
            except sqlite3.OperationalError as exc:
                self.log.warning("job %s: lease renewal failed (%s); retrying", self.job_id, exc)
                time.sleep(min(1.0, LEASE_TTL / 8))
                continue
            if until is None:
                self.lose()
                return
            self.until = max(self.until, until)
            if not self._renew_store_lease():
                self.lose()
                return
            time.sleep(LEASE_TTL / 4)

    def _renew_store_lease(self) -> bool:
        """Renew this machine's record in the store; False when another machine's live record
        is there (it took the job over after ours lapsed: stop driving). A store that cannot be
        read or written right now is not a reason to stop (the next renewal tries again)."""
        try:
            other = self.store_lease.holder()
            if other is not None:
                self.log.warning("job %s: %s drives it now (store lease)", self.job_id, other.get("site"))
                return False
            self.store_lease.write()
        except Exception as exc:  # noqa: BLE001 - transient store trouble
            self.log.warning("job %s: store lease renewal failed (%r); retrying", self.job_id, exc)
        return True

    def release(self) -> None:
        """Give the lease up (the job's controller ended; a successor may take it at once)."""
        self.db.release_lease(self.job_id, self.owner)
