"""The controller: launches an instance, watches it through the event log and the provider,
relaunches after each preemption, and ends the job. It runs in a thread of the notebook's
process (or of `spotnb controller`), never on the instance.

It writes its own events (writer "ctl") to the same log the agent writes to, and the Job
learns everything, its own status included, by reading that log back.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import random
import socket
import sqlite3
import threading
import time
import traceback
import uuid
from concurrent.futures import Future
from typing import Any

from spotnb.control.jobdb import JobDB
from spotnb.control.lease import StoreLease, site_of
from spotnb.control.supervise import job_vanished, mark_lost
from spotnb.core import protocol as ev
from spotnb.core.events import EventReader, EventWriter
from spotnb.core.protocol import TERMINAL, Event, JobStatus, Outcome
from spotnb.core.store import Store
from spotnb.errors import CapacityError, QuotaError
from spotnb.job import Job
from spotnb.market.migration import MOVING_POLICIES, MoveGate, best_move, move_start
from spotnb.market.placement import Transfer, ZoneEstimate, rank_zones
from spotnb.market.regional import CKPT_DOC, Regional, expected_saves
from spotnb.market.transfer import checkpoint_bytes, store_cloud, transfer_to
from spotnb.policy import Observation, resolve_policy
from spotnb.providers.base import Instance, InstanceState, InstanceStatus, LaunchSpec, Provider

__all__ = ["Controller"]


def _backoff(attempt: int) -> float:
    """Seconds to wait before the next round of launches after `attempt` refusals: BACKOFF's
    step for it (exponential, capped at 30 s), drawn at 50-100 % so that controllers refused
    together (an Azure allocation failure, a zone's stockout) do not ask again in lock step."""
    return BACKOFF[min(attempt, len(BACKOFF) - 1)] * random.uniform(0.5, 1.0)


def _said(reason: str, limit: int = 160) -> str:
    """A refusal's first line, short enough to list one per region."""
    line = reason.strip().splitlines()[0] if reason.strip() else "no reason given"
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _version() -> str:
    from spotnb import __version__

    return __version__


EXIT_GRACE = 30.0  # seconds an instance may linger after its agent reported the end
STOP_CHECK = 1.0  # seconds between looks for a STOP marker in the store
# a controller silent this long is presumed dead and may be replaced (env: for tests and ops)
LEASE_TTL = float(os.environ.get("SPOTNB_LEASE_TTL", "10"))
# seconds between rounds of refused launches (no capacity, an allocation that failed after the
# request, Azure throttling): exponential, capped, each drawn at 50-100 % (jitter, `_backoff`)
BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# a store that refuses writes for a while (full disk): retry a flush this often, events kept
FLUSH_BACKOFF: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
if os.environ.get("SPOTNB_FLUSH_BACKOFF_SCALE"):  # tests: the same ride, shorter
    FLUSH_BACKOFF = tuple(w * float(os.environ["SPOTNB_FLUSH_BACKOFF_SCALE"]) for w in FLUSH_BACKOFF)
IDENTITY_CHECK = 2.0  # seconds between looks for the job's spec (local; scaled for remote)
STALL_WARN = 3  # instances in a row without a new checkpoint before the feed says so
# how often an instance looks for the controller's request to move (Config.migrate="best-price")
MOVE_POLL = 0.2
MOVE_POLL_REMOTE = 5.0

log = logging.getLogger("spotnb.control.controller")

_FAILURES = (Outcome.USER_ERROR, Outcome.CRASHED)


def _outcome(value: object, default: Outcome) -> Outcome:
    """An Outcome from a logged value (a newer writer's unknown reason counts as `default`)."""
    return value if isinstance(value, Outcome) else default


def _store_refuses(exc: BaseException) -> bool:
    """Whether `exc` is the store refusing a write for good (not a bug in spotnb)."""
    return isinstance(exc, OSError) and (
        isinstance(exc, PermissionError)
        or exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)
    )


class JobDirectoryDeleted(Exception):
    """The job's directory vanished from the store while the job ran."""


class LeaseLost(Exception):
    """Another controller took over the job: this one must stop driving it at once."""


class _Outcome:
    """How an incarnation ended (`reason`), its exit code and what the provider knows."""

    def __init__(
        self, reason: Outcome, code: int | None = None, detail: dict[str, Any] | None = None
    ) -> None:
        self.reason, self.code, self.detail = reason, code, detail or {}


class Controller:
    def __init__(self, job: Job, config: Any, provider: Provider, store: Store, db: JobDB) -> None:
        self.job, self.config, self.provider, self.store, self.db = job, config, provider, store, db
        # every record names the job, so a view of it can show what this controller says
        self.log = logging.LoggerAdapter(log, {"job_id": job.id})
        self.reader = EventReader(store, job.id)
        self.writer = EventWriter(store, job.id, 0, "ctl")
        self._stop = threading.Event()
        self._stop_reason = "stop requested"
        # the quotas that refused every candidate region (`_allocate`): the job fails with them
        self._quota_failed: list[QuotaError] | None = None
        self._stop_checked = 0.0
        # the job's spec, if it had one when this controller started: its disappearance while
        # the job runs means the job directory was deleted (the agent's writes would recreate
        # the folder, but not the spec)
        spec = self.store.job(job.id, "spec.json")
        self._spec_path = spec if self.store.exists(spec) else None
        self._identity_checked = time.time()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        # the DB lease fences this machine's controllers; this record, other machines'
        self._store_lease = StoreLease(store, job.id, site_of(db.path), self.owner)
        self._lease_lost = threading.Event()
        self.generation = 0  # lease generation this controller holds (0: none yet)
        self._lease_until = 0.0  # when the lease last renewed runs out
        self._thread = threading.Thread(target=self._main, name=f"spotnb-ctl-{job.id}", daemon=True)
        self._writers: dict[int, EventWriter] = {}
        self.preemptions = 0
        self._move_gate = MoveGate()  # a move must stay worth making for its payback time
        self._move_at: float | None = None  # migrate="billing-aware": a move's planned start
        self.retries = 0
        self._high_water = 0
        self._indexed = 0.0
        self.policy = resolve_policy(config.checkpoint)
        self._market_now: dict[str, float] = {}
        self._prices_said: dict[str, float] = {}  # the zone prices last written (`prices` event)
        self._store_location: tuple[str | None, str | None] | None = None  # (cloud, region)
        self._regional: Regional | None = None  # Config.regional_stores
        job._stop_hook = self.request_stop

    # -- plumbing ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self, reason: str = "stop requested") -> None:
        self._stop_reason = reason
        self._stop.set()

    def emit(self, event: Event, incarnation: int = 0) -> None:
        """Write one event now, stamped with this controller's lease generation, only while it
        holds the lease (checked before the event is stamped, so a late write is recognisable)."""
        self._fence()
        writer = self._writers.get(incarnation)
        if writer is None:
            writer = self._writers[incarnation] = EventWriter(self.store, self.job.id, incarnation, "ctl")
        writer.emit(event, gen=self.generation)
        self._flush(writer)

    def _flush(self, writer: EventWriter) -> None:
        """Flush, riding out a store that refuses writes for a while (a full disk): the events
        stay pending and the flush is retried with backoff, as long as the lease is held."""
        for wait in (*FLUSH_BACKOFF, None):
            self._fence()
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

    def _fence(self) -> None:
        """Raise LeaseLost unless this controller still holds its lease generation. When the
        renewing thread is late (a paused or starved process), ask the job DB now rather than
        trust a lease that may have run out while this process was not running."""
        if not self._lease_lost.is_set() and time.time() > self._lease_until - LEASE_TTL / 2:
            try:
                until = self.db.renew_lease(self.job.id, self.owner, self.generation, LEASE_TTL)
            except sqlite3.OperationalError:
                until = self._lease_until if time.time() < self._lease_until else None
            if until is None:
                self._lose_lease()
            else:
                self._lease_until = max(self._lease_until, until)
        if self._lease_lost.is_set():
            raise LeaseLost()

    def _lose_lease(self) -> None:
        """Another controller holds the job now: stop, and write nothing more."""
        self._lease_lost.set()
        self._stop.set()
        dropped = sum(w.discard() for w in list(self._writers.values()))
        if dropped:
            self.log.warning("job %s: lease lost; %d unwritten event(s) dropped", self.job.id, dropped)

    def set_status(self, status: JobStatus, reason: str | None = None) -> None:
        if self.job.status != status or reason is not None:
            self.emit(ev.Status(status=status, reason=reason))
            self.db.update_job(self.job.id, status=status.value)
        self.pump()
        if status not in TERMINAL:
            self.job.state.status = status  # seen at once; the log read back confirms it

    def pump(self) -> list[Event]:
        """Read new events, hand them to the Job, keep the job DB current."""
        events = self.reader.poll()
        if events:
            self.job._ingest(events)
            self._index(events)
        return events

    def _index(self, events: list[Event]) -> None:
        for e in events:
            if isinstance(e, ev.Checkpoint):
                self.db.record_checkpoint(self.job.id, e.incarnation, e)
            elif isinstance(e, ev.Ready):
                self.db.record_incarnation(self.job.id, e.incarnation, ready=e.t)
            elif isinstance(e, ev.Progress):
                self._high_water = max(self._high_water, e.step)
        final = any(isinstance(e, ev.Status) and e.status in TERMINAL for e in events)
        if not final and time.time() - self._indexed < 2.0:
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

    def _stop_requested(self) -> bool:
        self._fence()
        now = time.time()
        if not self._stop.is_set() and now - self._stop_checked >= STOP_CHECK:
            self._stop_checked = now
            if self.store.exists(self.store.job(self.job.id, "STOP")):
                self._stop_reason = "stop requested"
                self._stop.set()
        if (
            self._spec_path
            and now - self._identity_checked >= IDENTITY_CHECK * self.store.poll_interval / 0.1
        ):
            self._identity_checked = now
            if not self.store.exists(self._spec_path):
                self._directory_deleted()
        return self._stop.is_set()

    def _directory_deleted(self) -> None:
        """The job directory was deleted under the running job: end it as lost (job DB only;
        a write now would recreate a directory nobody can attach to) and stop at once; the
        instance is ended on the way out (`provider.close()`)."""
        reason = (
            f"its job directory {self.store.job(self.job.id)} was deleted while it ran "
            "(spec.json is gone), so it could not go on; the instance was ended. Submit it "
            "again"
        )
        self.db.update_job(self.job.id, status=JobStatus.LOST.value, status_reason=reason, burn_rate=0.0)
        self.job._mark_lost(reason)
        self.log.error("job %s is lost: %s", self.job.id, reason)
        raise JobDirectoryDeleted(reason)

    def _keep_lease(self) -> None:
        """Renew the lease in the job DB; if another controller holds it, stop driving.

        A busy DB (another process writing) must not kill this thread: it used to, the lease
        then ran out under a healthy controller and a second one was started beside it. Each
        attempt waits at most a quarter TTL for the DB lock and is retried soon after."""
        while not self._lease_lost.is_set() and self._thread_alive:
            try:
                until = self.db.renew_lease(self.job.id, self.owner, self.generation, LEASE_TTL)
            except sqlite3.OperationalError as exc:
                self.log.warning("job %s: lease renewal failed (%s); retrying", self.job.id, exc)
                time.sleep(min(1.0, LEASE_TTL / 8))
                continue
            if until is None:
                self._lose_lease()
                return
            self._lease_until = max(self._lease_until, until)
            if not self._renew_store_lease():
                self._lose_lease()
                return
            time.sleep(LEASE_TTL / 4)

    def _renew_store_lease(self) -> bool:
        """Renew this machine's record in the store; False when another machine's live record
        is there (it took the job over after ours lapsed: stop driving). A store that cannot be
        read or written right now is not a reason to stop (the next renewal tries again)."""
        try:
            other = self._store_lease.holder()
            if other is not None:
                self.log.warning("job %s: %s drives it now (store lease)", self.job.id, other.get("site"))
                return False
            self._store_lease.write()
        except Exception as exc:  # noqa: BLE001 - transient store trouble
            self.log.warning("job %s: store lease renewal failed (%r); retrying", self.job.id, exc)
        return True

    def run(self) -> None:
        """Drive the job in this thread until it ends (what `spotnb controller ID` does)."""
        self._main()

    # -- main loop -----------------------------------------------------------------------------
    def _take_lease(self) -> dict[str, Any] | None:
        """Take the job's lease (a new generation); None if a live controller holds it. Every
        write after this is fenced by that generation (see `_fence`)."""
        other = self._store_lease.holder()
        if other is not None:  # another machine drives the job (its record is live)
            self.log.warning("job %s is driven from %s", self.job.id, other.get("site"))
            return None
        taken = time.time()
        lease = self.db.take_lease(self.job.id, self.owner, os.getpid(), LEASE_TTL)
        if lease is not None:
            self.generation, self._lease_until = lease["generation"], taken + LEASE_TTL
            try:
                self._store_lease.write()
            except Exception as exc:  # noqa: BLE001 - the first event write will say what is wrong
                self.log.warning("job %s: could not record the store lease (%r)", self.job.id, exc)
        return lease

    def _main(self) -> None:
        lease = self._take_lease()
        if lease is None:
            self.log.warning("job %s already has a live controller", self.job.id)
            return
        self._thread_alive = True
        if lease["previous_expiry"] is not None:
            # first, so readers know the fence before any late write of the predecessor
            self.emit(ev.ControllerRestarted(owner=self.owner, previous_expiry=lease["previous_expiry"]))
        for folder in ((), ("events",), ("incarnations",)):  # temp files of writes that died
            self.store.clean_temp(self.store.job(self.job.id, *folder))
        threading.Thread(target=self._keep_lease, name="spotnb-lease", daemon=True).start()
        try:
            self._run()
        except LeaseLost:
            self._lose_lease()
            self.log.warning("another controller took job %s over", self.job.id)
            return
        except JobDirectoryDeleted:
            return  # recorded in the job DB; nothing may be written to the store
        except BaseException as exc:  # noqa: BLE001 - a controller bug must end the job visibly
            tb = traceback.format_exc()
            self.log.error("job %s: controller error", self.job.id, exc_info=True)
            if self._lease_lost.is_set():
                return  # not ours to end any more
            if _store_refuses(exc):
                self._store_refused(exc)  # no event can say so: the job DB must
                return
            self.emit(
                ev.Error(message=f"controller error: {exc!r}", exc_type=type(exc).__name__, traceback=tb)
            )
            try:
                self.set_status(JobStatus.FAILED, reason="controller error")
            except LeaseLost:
                pass
        finally:
            self._thread_alive = False
            if not self._lease_lost.is_set():
                self.provider.close()
                self.pump()
                self.db.release_lease(self.job.id, self.owner)

    def _store_refused(self, exc: BaseException) -> None:
        """The store refused every write for the whole backoff (read-only, permissions, full):
        nothing more can be recorded there, so the job ends here (the instance is ended by
        `provider.close()` on the way out) and the job DB, which `Job`, the CLI, the panel and
        `jobs()` read, says what happened and what to do; `jobs()` then starts no controller
        for it again."""
        reason = (
            f"its store refuses writes ({type(exc).__name__}: {exc}), so nothing more could "
            "be recorded: the controller ended its instance and stopped. Make the store "
            "writable again (free space, remount read-write, fix permissions), then submit "
            "the job again"
        )
        self.log.error("job %s: %s", self.job.id, reason)
        self.db.update_job(self.job.id, status=JobStatus.LOST.value, status_reason=reason, burn_rate=0.0)
        self.job._mark_lost(reason)

    def _run(self) -> None:
        if self.config.controller == "cloud" and self.provider.name != "local":
            # this controller runs on the job's coordinator: found by its tags, so its cost is
            # billed in the ledger and `close` ends it with the job (the machine ends with it)
            self.provider.coordinator(self.job.id, self.config.min_instances)
        recovered = self._recover()
        if recovered is None:
            return
        n, instance, outcome = recovered
        pre: Future | None = None
        while True:
            if outcome is None:
                if self._stop_requested():
                    if instance is not None:
                        self._finish_incarnation(n, instance, _Outcome(Outcome.STOPPED))
                    self._end_stopped()
                    return
                if instance is None:
                    if self._vanished():
                        return
                    self.set_status(JobStatus.PENDING if n == 1 else JobStatus.RESTORING)
                    instance = pre.result() if pre is not None else self._allocate(n)
                    pre = None
                    if instance is None:
                        if self._quota_failed:
                            self._end_for_quota(n)
                        else:
                            self._end_stopped()
                        return
                self._place_checkpoint(n, instance)
                outcome, pre = self._watch(n, instance)
                if pre is not None and not self._relaunches(outcome):
                    self._cancel_pre(pre)  # before the end marker lets its agent restore
                    pre = None
                self._finish_incarnation(n, instance, outcome)
            instance = None
            if not self._carry_on(n, outcome, pre):
                return
            outcome = None
            n += 1

    def _relaunches(self, outcome: _Outcome) -> bool:
        """Whether this outcome leads to another incarnation (limits aside)."""
        if outcome.reason.is_preemption or outcome.reason == Outcome.MOVED:
            return True
        return outcome.reason in _FAILURES and self.retries < self.config.max_retries

    def _carry_on(self, n: int, outcome: _Outcome, pre: Future | None) -> bool:
        """After incarnation `n` ended with `outcome`: end the job, or go on to the next one."""
        if outcome.reason == Outcome.DONE:
            self._cancel_pre(pre)
            self.set_status(JobStatus.SUCCEEDED)
            return False
        if outcome.reason == Outcome.STOPPED:
            self._cancel_pre(pre)
            self._end_stopped()
            return False
        if outcome.reason in (Outcome.MOVED, Outcome.NOT_NEEDED):
            # a move is not a preemption: its replacement already runs in the new zone; nor is
            # a move's new instance that a successor controller ended before it began
            pass
        elif outcome.reason in _FAILURES:
            if self.retries >= self.config.max_retries:
                self._cancel_pre(pre)
                if outcome.reason == Outcome.CRASHED and self.job.state.error is None:
                    self.emit(
                        ev.Error(
                            message=f"the instance process died (exit code "
                            f"{outcome.code}) without reporting an error; see its log",
                            exc_type="InstanceCrashed",
                            traceback=str(outcome.detail.get("log", "")),
                        ),
                        n,
                    )
                self.set_status(JobStatus.FAILED, reason=outcome.reason.value)
                return False
            self.retries += 1
        else:  # preempted, evacuated or lost
            self.preemptions += 1
            limit = self.config.max_preemptions
            if limit is not None and self.preemptions > limit:
                self._cancel_pre(pre)
                self._stop_reason = f"max_preemptions={limit} reached"
                self._end_stopped()
                return False
            if not self._progressing(n, pre):
                return False
        cost = self.job.breakdown().total_cost  # a coordinator's spend counts too
        if self.config.max_cost is not None and cost >= self.config.max_cost:
            self._cancel_pre(pre)
            self._stop_reason = f"max_cost=${self.config.max_cost} reached (spent ${cost:.4f})"
            self._end_stopped()
            return False
        return True

    def _stalled(self, n: int) -> int:
        """How many instances in a row, up to incarnation `n`, ended without committing a
        checkpoint: each relaunch of those starts over from the same step."""
        incs = self.job.state.incs
        saved = {m for m, inc in incs.items() if "checkpoint" in inc.kinds}
        ran = sorted(m for m, inc in incs.items() if "allocated" in inc.kinds and m <= n)
        count = 0
        for m in reversed(ran):
            if m in saved:
                break
            count += 1
        return count

    def _progressing(self, n: int, pre: Future | None) -> bool:
        """Say so when relaunches stop making net progress; end the job at the limit."""
        stalled = self._stalled(n)
        limit = self.config.max_stalled_relaunches
        if limit is not None and stalled >= limit:
            self._cancel_pre(pre)
            self._stop_reason = (
                f"no net progress: the last {stalled} instances ended without committing a "
                f"checkpoint (max_stalled_relaunches={limit}). Their lifetimes were shorter than "
                "start-up plus a save: use a market with longer lifetimes, make start-up or saves "
                "faster, or raise max_stalled_relaunches"
            )
            self._end_stopped()
            return False
        if stalled >= STALL_WARN:
            self.emit(
                ev.JobWarning(
                    message=(
                        f"no net progress: {stalled} instances in a row ended without committing a "
                        f"checkpoint; the job stops after {limit}"
                        if limit is not None
                        else f"no net progress: {stalled} instances in a row ended without committing "
                        "a checkpoint"
                    ),
                    stalled=stalled,
                ),
                n,
            )
        return True

    def _vanished(self) -> bool:
        """If the job's store or directory is gone, record the job as lost in the job DB (no
        event can be written) and say so: nothing can be launched or resumed without it."""
        row = {"id": self.job.id, "store": self.store.url}
        why = job_vanished(row)
        if why is None:
            return False
        self._fence()
        reason = mark_lost(row, why)["status_reason"]
        self.job._mark_lost(reason)
        self.log.error("job %s is lost: %s", self.job.id, why)
        return True

    def _recover(self) -> tuple[int, Instance | None, _Outcome | None] | None:
        """Pick the job up where the log says it is: fresh (incarnation 1), or after a controller
        that died. Every incarnation it left open is reclaimed by the provider (kept, or ended and
        closed with an event); how the last one ended decides what happens next, as it would
        have for the dead controller."""
        if self._vanished():
            return None
        self.pump()
        if self.job.status in TERMINAL:
            return None
        events = self.job.events
        started = sorted({e["incarnation"] for e in events if e["kind"] == "allocating"})
        if not started:
            return 1, None, None
        last = started[-1]
        allocated = {e["incarnation"]: e for e in events if e["kind"] == "allocated"}
        launched = {e["incarnation"]: e for e in events if e["kind"] == "launched"}
        ended = {e["incarnation"]: e for e in events if e["kind"] in ("preempted", "exited")}
        resumed_at = max((e["t"] for e in events if e["kind"] == "job_resumed"), default=None)
        if (
            resumed_at is not None
            and all(n in ended for n in started)
            and resumed_at > max(e["t"] for e in ended.values())
        ):
            # spot.resume after the job ended: a new incarnation restores from the latest
            # checkpoint, with a fresh allowance of retries
            self.preemptions = sum(e["kind"] == "preempted" for e in events)
            if allocated:
                self.provider.resume_state(
                    launched=len(allocated), first_launch=min(e["t"] for e in allocated.values())
                )
            return last + 1, None, None
        # the last incarnation's end is counted when it is decided on below
        self.preemptions = sum(e["kind"] == "preempted" and e["incarnation"] < last for e in events)
        self.retries = sum(
            e["kind"] == "exited" and e["incarnation"] < last and e.get("reason") in ("user_error", "crashed")
            for e in events
        )
        if allocated:
            self.provider.resume_state(
                launched=len(allocated), first_launch=min(e["t"] for e in allocated.values())
            )
        outcome: _Outcome | None = None
        for n in started:
            if n in ended:
                if not self.store.exists(self.store.job(self.job.id, "incarnations", f"{n:04d}.end")):
                    self._write_end_marker(n, "closed after a controller restart")
                continue
            record = allocated.get(n) or launched.get(n)
            if record is None:
                continue  # it died while asking for an instance and got none
            instance = self.provider.reclaim(record.to_json())
            if instance is not None and n == last:
                return last, instance, None
            orphan = instance or self._orphan(record)
            result = self._classify(n, orphan, InstanceStatus(InstanceState.TERMINATED))
            if result.reason in (Outcome.LOST, Outcome.STOPPED):
                result = _Outcome(Outcome.LOST, detail={"why": "its controller died"})
                if self._move_target_unused(n):
                    # the new instance of a move, still waiting for the old one when the
                    # controller died: ended by spotnb before it did any work, not preempted
                    result = _Outcome(Outcome.NOT_NEEDED, detail={"why": "its controller died"})
            self._finish_incarnation(n, orphan, result)
            if n < last and result.reason.is_preemption:
                self.preemptions += 1
            ended[n] = result  # type: ignore[assignment]
        if last not in ended:
            return last, None, None  # it died while allocating: ask again
        end = ended[last]
        if isinstance(end, _Outcome):
            outcome = end
        elif isinstance(end, ev.Preempted):
            outcome = _Outcome(_outcome(end.how, Outcome.PREEMPTED))
        else:
            outcome = _Outcome(_outcome(end.get("reason"), Outcome.CRASHED), end.get("code"))
        return last, None, outcome

    def _move_target_unused(self, n: int) -> bool:
        """Whether incarnation `n` is a move's new instance (`Config.migrate`) that never
        started the job (no `ready`): the incarnation before it was being moved, no notice."""
        incs = self.job.state.incs
        before, inc = incs.get(n - 1), incs.get(n)
        return (
            before is not None
            and "moving" in before.kinds
            and "notice" not in before.kinds
            and (inc is None or "ready" not in inc.kinds)
        )

    def _write_end_marker(self, n: int, reason: str) -> None:
        self._fence()
        # `checkpointed`: whether any checkpoint was ever committed, so that a successor that
        # finds none can tell "all were lost" (worth a warning) from "none was made yet"
        checkpointed = self.job.state.checkpointed
        marker = {
            "high_water": self._high_water,
            "checkpointed": checkpointed,
            "reason": reason,
            "t": time.time(),
        }
        self.store.write_bytes(
            self.store.job(self.job.id, "incarnations", f"{n:04d}.end"), json.dumps(marker).encode()
        )

    def _end_stopped(self) -> None:
        self.emit(ev.Stopped(reason=self._stop_reason))
        self.set_status(JobStatus.STOPPED, reason=self._stop_reason)

    def _end_for_quota(self, n: int) -> None:
        """Every candidate region refused incarnation `n` for the account's quota: the job
        fails, before anything more is billed, with an error that names each quota and how to
        raise it (and, after a checkpoint, how to go on from it once raised)."""
        quotas = self._quota_failed or []
        texts: list[str] = []
        for q in quotas:
            if str(q) not in texts:
                texts.append(str(q))
        message = (
            texts[0]
            if len(texts) == 1
            else "every candidate region refused the instance for a quota: " + " | ".join(texts)
        )
        saved = self.job.state.checkpoints
        if saved:
            message += (
                f". The job's checkpoint of step {saved[-1].step} is kept: once the quota is "
                f"raised, spot.resume({self.job.id!r}) goes on from it"
            )
        self.emit(ev.Error(message=message, exc_type="QuotaError"), n)
        self.set_status(JobStatus.FAILED, reason="quota")

    def _cancel_pre(self, pre: Future | None) -> None:
        if pre is None:
            return
        cancel = getattr(pre, "cancel_event", None)
        if cancel is not None:
            cancel.set()  # a preallocation still retrying for capacity gives up
        instance = pre.result()
        if instance is not None:
            self.provider.terminate(instance)
            self.emit(
                ev.Exited(reason=Outcome.NOT_NEEDED, instance_id=instance.id),
                instance.info.get("incarnation", 0),
            )

    # -- one incarnation ------------------------------------------------------------------------
    def _allocate(
        self,
        n: int,
        cancel: threading.Event | None = None,
        extra: dict[str, Any] | None = None,
        slot: int = 0,
        only: str | None = None,
    ) -> Instance | None:
        """Ask for incarnation `n`'s instance until one runs (None: stopped or max_wait).
        `extra` goes into its incarnation document (a fleet's slot, coordinator, join).
        `only`: a move's zone, asked once (None when it has no capacity: the job stays)."""
        market = self._market_now = self._market()
        inc_doc = {
            "incarnation": n,
            "market": market,
            "notice": self.provider.notice_settings(),
            **(extra or {}),
        }
        if self.config.migrate in MOVING_POLICIES or self.config.instances > 1:
            # the agent looks for a request to move, or (several instances) to save now
            inc_doc["move_poll"] = MOVE_POLL if self.store.local else MOVE_POLL_REMOTE
        if getattr(self.config, "regional_stores", None):  # it waits for `_place_checkpoint`
            inc_doc["ckpt_doc"] = True
        inc_path = self.store.job(self.job.id, "incarnations", f"{n:04d}.json")
        self.store.write_bytes(inc_path, json.dumps(inc_doc).encode())
        regions: list[str | None] = [only] if only else self._regions(n)
        spec_base = dict(
            job_id=self.job.id,
            incarnation=n,
            store_url=self.store.url,
            instance_type=self.config.instance_type_name(),
            command=[
                "python",
                "-m",
                "spotnb.runtime.agent",
                "--store",
                self.store.url,
                "--job",
                self.job.id,
                "--incarnation",
                str(n),
            ],
            requirements=list(self.config.requirements),
            spotnb_version=_version(),
            slot=slot,
        )
        attempt = 0
        requested = time.time()
        tried: list[str] = []
        said: dict[str, str] = {}  # what each region tried last said
        quotas: list[QuotaError] = []  # the quotas that took regions out of `regions`
        self.db.record_incarnation(
            self.job.id,
            n,
            requested=requested,
            provider=self.provider.name,
            instance_type=self.config.instance_type_name(),
        )
        while not self._stop_requested() and not (cancel is not None and cancel.is_set()):
            waited = time.time() - requested
            if self.config.max_wait is not None and attempt and waited >= self.config.max_wait:
                answers = "; ".join(f"{r} ({said[r]})" if r in said else r for r in tried)
                self._stop_reason = (
                    f"max_wait={self.config.max_wait:g}s reached: no spot capacity for "
                    f"{self.config.instance_type_name()} in {waited:.0f} s and {attempt} attempt(s), "
                    f"regions tried: {answers}. Add regions (Config.regions), choose "
                    "another instance_type, or raise max_wait"
                )
                return None
            if not regions:  # a quota refused every candidate: no retry can help
                self._quota_failed = quotas
                return None
            region = regions[attempt % len(regions)]
            if (region or self.provider.name) not in tried:
                tried.append(region or self.provider.name)
            notice = self.provider.notice_settings(region)
            if notice != inc_doc["notice"]:  # provider='any': this zone's cloud's notices
                inc_doc["notice"] = notice
                inc_doc["market"] = {**market, "grace": notice["grace"]}
                self.store.write_bytes(inc_path, json.dumps(inc_doc).encode())
            self.emit(ev.Allocating(region=region, attempt=attempt + 1, slot=slot), n)
            label = region or self.provider.name
            try:
                instance = self.provider.launch(LaunchSpec(region=region, **spec_base))
            except QuotaError as exc:
                # the account's quota, not a shortage: this region (or, with a project-wide
                # quota, every region of its cloud) is asked no more for this incarnation
                said[label] = _said(str(exc))
                self.emit(ev.AllocFailed(region=region, reason=str(exc), retry_in=0.0), n)
                if only:
                    return None
                quotas.append(exc)
                regions = [r for r in regions if not exc.covers(r)]
                attempt += 1
                continue
            except CapacityError as exc:
                said[label] = _said(str(exc))
                if only:
                    self.emit(ev.AllocFailed(region=region, reason=str(exc), retry_in=0.0), n)
                    return None
                wait = _backoff(attempt) if (attempt + 1) % len(regions) == 0 else 0.0
                self.emit(ev.AllocFailed(region=region, reason=str(exc), retry_in=wait), n)
                attempt += 1
                if self.config.max_wait is not None:  # never sleep past the limit
                    wait = max(0.0, min(wait, requested + self.config.max_wait - time.time()))
                if self._stop.wait(wait) or (cancel is not None and cancel.is_set()):
                    break
                continue
            # recorded before waiting, so a controller that dies now can still find it
            self.emit(
                ev.Launched(
                    instance_id=instance.id,
                    region=instance.region,
                    instance_type=instance.instance_type,
                    launched_at=instance.launched_at,
                    info=instance.info,
                ),
                n,
            )
            status = self.provider.wait_allocated(instance, timeout=900, stop=self._stop)
            if status.state != InstanceState.RUNNING:
                # it failed after the request (Azure's asynchronous AllocationFailed, a quota):
                # deleted, then asked again only after a backoff, never in a tight
                # create/delete loop against the cloud's API
                refusal = self.provider.allocation_refusal(instance)
                reason = str(refusal) if refusal is not None else f"instance {status.state.value}"
                said[label] = _said(reason)
                self.provider.terminate(instance)
                if only or self._stop.is_set():
                    self.emit(ev.AllocFailed(region=region, reason=reason, retry_in=0.0), n)
                    if only:
                        return None
                    continue
                if isinstance(refusal, QuotaError):
                    self.emit(ev.AllocFailed(region=region, reason=reason, retry_in=0.0), n)
                    quotas.append(refusal)
                    regions = [r for r in regions if not refusal.covers(r)]
                    attempt += 1
                    continue
                wait = _backoff(attempt) if (attempt + 1) % len(regions) == 0 else 0.0
                self.emit(ev.AllocFailed(region=region, reason=reason, retry_in=wait), n)
                attempt += 1
                if self.config.max_wait is not None:
                    wait = max(0.0, min(wait, requested + self.config.max_wait - time.time()))
                if self._stop.wait(wait) or (cancel is not None and cancel.is_set()):
                    break
                continue
            price = self.provider.prices(self.config.instance_type_name(), [region] if region else None)
            p = price.get(instance.region or "") or next(iter(price.values()), None)
            spot = self.config.price_spot if self.config.price_spot is not None else (p.spot if p else 0.0)
            od = (
                self.config.price_on_demand
                if self.config.price_on_demand is not None
                else (p.on_demand if p else 0.0)
            )
            instance.info["incarnation"] = n
            # how its market bills it, for the ledger (`spotnb.core.billing`); a Config price is fixed
            instance.info["billing"] = self.provider.billing(instance.region).as_info()
            if self.config.price_spot is not None:
                instance.info["price_fixed"] = True
            now = time.time()
            self.emit(
                ev.Allocated(
                    instance_id=instance.id,
                    region=instance.region,
                    instance_type=instance.instance_type,
                    alloc_s=now - requested,
                    launched_at=instance.launched_at,
                    info=instance.info,
                    spot_price=spot,
                    on_demand_price=od,
                    price_source=p.source if p else "config",
                ),
                n,
            )
            # under the zone's own cloud and type (provider='any'): its market's history
            cloud, zone, itype, _ = self.provider.market_key(instance.region)
            self.db.record_incarnation(
                self.job.id,
                n,
                instance_id=instance.id,
                region=zone,
                allocated=now,
                provider=cloud,
                instance_type=itype,
            )
            return instance
        return None

    def _regional_stores(self) -> Regional | None:
        """The job's stores when it has regional ones (`Config.regional_stores`), else None."""
        if self._regional is None and getattr(self.config, "regional_stores", None):
            self._regional = Regional(self.config, self.provider, self.store, self.job.id)
        return self._regional

    def _place_checkpoint(self, n: int, instance: Instance) -> None:
        """Where incarnation `n` restores from and writes (`spotnb.market.regional`: copy the newest
        checkpoint into its zone's store, or read across, by cost), once: its agent waits for
        the document, which a successor controller writes if this one died before (mid-copy)."""
        if not getattr(self.config, "regional_stores", None):
            return
        path = self.store.job(self.job.id, "incarnations", CKPT_DOC.format(n=n))
        if self.store.exists(path):
            return
        regional = self._regional_stores()
        assert regional is not None
        self.pump()
        st, zone = self.job.state, instance.region

        def saves_after(step: int) -> float:
            name, key, itype, priors = self.provider.market_key(zone)
            stats = self.db.market(name, key, itype, **priors)
            obs = self._observation(max(1, n - 1))
            obs = obs.with_(
                mttp=stats.mttp, restart_time=stats.restart, step_time=st.step_time or obs.step_time
            )
            return expected_saves(self.policy, obs, step, st.total, stats.mttp)

        written = max((c.nbytes or 0 for c in st.checkpoints[-10:]), default=0)
        bps = self.config.local_upload_bps if self.provider.name == "local" else None
        doc, fields, warnings = regional.place(zone, saves_after, written, bps)
        for message in warnings:
            self.emit(ev.JobWarning(message=message), n)
        self.emit(ev.CheckpointPlaced(**fields), n)
        self._fence()
        self.store.write_bytes(path, json.dumps(doc).encode())

    def _observation(self, n: int) -> Observation:
        """What the controller knows of incarnation `n`, in the policy's terms."""
        inc = self.job.state.incs.get(n)
        progress = inc.progress if inc is not None else None
        saves = self.job.state.checkpoints

        def mean_sd(key: str) -> tuple[float, float]:
            xs = [float(getattr(e, key)) for e in saves[-10:]]
            if not xs:
                return 0.0, 0.0
            m = sum(xs) / len(xs)
            return m, (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5

        (snap, snap_sd), (up, up_sd) = mean_sd("snapshot_s"), mean_sd("upload_s")
        market = self._market_now or self._market()
        return Observation(
            step=progress.step if progress else 0,
            step_time=(progress.step_time or 0.0) if progress else 0.0,
            snapshot_time=snap,
            upload_time=up,
            mttp=market["mttp"],
            restart_time=market["restart"],
            grace=market["grace"],
            save_every=self.config.save_every,
            total_steps=progress.total if progress else None,
            snapshot_sd=snap_sd,
            upload_sd=up_sd,
            state_bytes=saves[-1].nbytes if saves else 0,
            now=time.time(),
        )

    def _market(self) -> dict[str, float]:
        """What the policy assumes of this market: the job DB's measurements, shrunk toward the
        provider's priors (a configured market, like the local one, knows its own)."""
        name, zone, itype, priors = self.provider.market_key(self.config.region)
        stats = self.db.market(name, zone, itype, **priors)
        return {**stats.as_dict(), "grace": self.provider.notice_settings(self.config.region)["grace"]}

    def _regions(self, n: int = 0) -> list[str | None]:
        regions = self.config.candidate_regions()
        if regions == "cheapest":
            prices = self.provider.prices(self.config.instance_type_name(), None)
            if not prices:
                return [None]
            self._note_prices(prices, n, always=True)
            ranked = self._placement({r: p.spot for r, p in prices.items()})
            log.debug(
                "job %s: zones by expected cost: %s",
                self.job.id,
                "; ".join(f"{z.zone}: {z.describe()}" for z in ranked),
            )
            order: list[str | None] = [z.zone for z in ranked]
        else:
            order = list(regions) or [None]
            if len(set(regions)) > 1:  # the widget draws every multi-zone job's prices
                self._follow_prices(list(regions), n)
        if self.config.migrate == "never":  # back where it ran, the others only as a fallback
            last = max(
                (inc for inc in self.job.state.incs.values() if inc.region and inc.allocated),
                key=lambda inc: inc.n,
                default=None,
            )
            if last is not None and last.region in order:
                order.remove(last.region)
                order.insert(0, last.region)
        return order

    def _placement(self, prices: dict[str, float]) -> list[ZoneEstimate]:
        """The zones by the expected cost of the job's remaining work there (`spotnb.market.placement`):
        each zone's market from the job DB, this job's recent trouble there as a penalty."""
        markets = {}
        for zone in prices:
            name, key, itype, priors = self.provider.market_key(zone)
            stats = self.db.market(name, key, itype, **priors)
            markets[zone] = (stats.mttp, stats.restart)
        st = self.job.state
        work = None
        if st.total and st.step_time:
            work = max(0, int(st.total) - max(0, int(st.step))) * st.step_time
        trouble: dict[str, list[float]] = {}
        for inc in st.incs.values():
            if inc.preempted and inc.region and inc.end is not None:
                trouble.setdefault(inc.region, []).append(inc.end)
        for zone, t in st.alloc_failures:  # folded by the state: no scan of every event
            trouble.setdefault(zone, []).append(t)
        transfer, clouds = self._transfers(prices)
        return rank_zones(
            prices, markets, work_s=work, trouble=trouble, now=time.time(), transfer=transfer, clouds=clouds
        )

    def _transfers(self, zones: Any) -> tuple[dict[str, Transfer], dict[str, str]]:
        """Moving the checkpoint to each zone (`spotnb.market.transfer`): the latest checkpoint's
        bytes (an estimate before the first save) between the store and the zone; and each
        zone's cloud. The store's place is asked once per controller."""
        if self._store_location is None:
            try:
                self._store_location = self.provider.store_location()
            except Exception as exc:  # noqa: BLE001 - unknown: priced as another region
                self.log.debug("job %s: the store's region is unknown: %r", self.job.id, exc)
                self._store_location = (store_cloud(self.store.url), None)
        nbytes, saved = checkpoint_bytes(self.job.state)
        transfer, clouds = {}, {}
        regional = self._regional_stores()
        for zone in zones:
            where = self.provider.zone_location(zone)
            if regional is not None:  # copied into the zone's region, or read from where it is
                transfer[zone] = regional.transfer(zone, self.job.state.checkpoint_store, nbytes, saved)
            else:
                transfer[zone] = transfer_to(self._store_location, where, nbytes, saved)
            clouds[zone] = where[0] or self.provider.name
        return transfer, clouds

    def _watch(self, n: int, instance: Instance) -> tuple[_Outcome, Future | None]:
        pre: Future | None = None
        last_seen = time.time()
        heard = False  # the agent has spoken: from then on, silence means a dead instance
        described = 0.0
        reported_end: float | None = None  # the agent said done/error/evacuated at this time
        poll = self.store.poll_interval
        ready = False
        move_to: str | None = None  # a move's zone, while its instance is being allocated
        looked = time.time()  # the last look at the prices for a move
        self._move_at = None  # a billing-aware move planned for the instance before
        while True:
            for e in self.pump():
                if e.incarnation != n:
                    continue
                last_seen = max(last_seen, time.time())
                kind = e.kind
                heard = heard or kind not in ("launched", "allocated", "allocating", "alloc_failed")
                if kind == "ready":
                    ready = True
                    self.set_status(JobStatus.RUNNING)
                elif kind == "notice" and pre is None:
                    self.set_status(JobStatus.PREEMPTED)
                    if self.policy.allocate_on_notice(self._observation(n)):
                        pre = self._preallocate(n + 1)
                elif kind in ("done", "error", "evacuated") and reported_end is None:
                    reported_end = time.time()
                    described = 0.0  # look now: the instance should be on its way out
            now = time.time()
            if (
                self.config.migrate in MOVING_POLICIES
                and ready
                and pre is None
                and reported_end is None
                and (
                    now - looked >= self.provider.price_interval
                    or (self._move_at is not None and now >= self._move_at)
                )
            ):
                looked = now
                move_to = self._consider_move(n, instance)
                if move_to is not None:
                    pre = self._preallocate(n + 1, only=move_to)
            if move_to is not None and pre is not None and pre.done():
                pre, move_to = self._ask_to_move(n, instance, pre, move_to)
            if now - described >= self.provider.describe_interval:
                described = now
                status = self.provider.describe(instance)
                if status.state in (InstanceState.EXITED, InstanceState.PREEMPTED, InstanceState.TERMINATED):
                    self.pump()  # the agent flushed before it exited
                    return self._classify(n, instance, status), pre
            if reported_end is not None and now - reported_end > EXIT_GRACE:
                # the agent is finished but its instance did not go away: end it ourselves
                self._fence()
                self.provider.terminate(instance)
                self.pump()
                return self._classify(n, instance, InstanceStatus(InstanceState.EXITED)), pre
            if self._stop_requested():
                self.provider.terminate(instance)
                return _Outcome(Outcome.STOPPED), pre
            limit = (
                self.config.heartbeat_timeout
                if heard
                else max(self.config.heartbeat_timeout, self.provider.boot_timeout)
            )
            if time.time() - last_seen > limit:
                self._fence()
                self.provider.terminate(instance)
                return _Outcome(Outcome.LOST, detail={"why": f"no event for {limit:.0f} s"}), pre
            time.sleep(poll)

    def _move_prices(self, n: int = 0) -> dict[str, Any] | None:
        """The candidate zones' prices now, for a move (noted for the widget, on incarnation
        `n`'s lane); None when they cannot be had (a price API down is no reason to stop)."""
        regions = self.config.candidate_regions()
        try:
            prices = self.provider.prices(
                self.config.instance_type_name(), None if regions == "cheapest" else list(regions)
            )
        except Exception as exc:  # noqa: BLE001 - a price API down is no reason to stop training
            self.log.debug("job %s: no prices for a move: %r", self.job.id, exc)
            return None
        self._note_prices(prices, n)
        return prices

    def _consider_move(self, n: int, instance: Instance) -> str | None:
        """The zone to move incarnation `n` to now (`spotnb.market.migration`), announced; None:
        stay. Without a known remaining work (no total, no step time yet) there is no saving
        to weigh, so the job stays."""
        st = self.job.state
        if not (st.total and st.step_time) or not instance.region:
            return None
        inc = st.incs.get(n)
        if inc is not None and inc.notice is not None:  # it is leaving anyway: a relaunch, not a move
            self._move_at = None
            return None
        prices = self._move_prices(n)
        if prices is None or instance.region not in prices or len(prices) < 2:
            return None
        ranked = self._placement({zone: p.spot for zone, p in prices.items()})
        saves = st.checkpoints[-10:]
        save_s = sum(c.snapshot_s + c.upload_s for c in saves) / len(saves) if saves else None
        timed = self.config.migrate == "billing-aware"
        now = time.time()
        move = self._move_gate.admit(best_move(ranked, instance.region, save_s), now, keep=timed)
        planned, self._move_at = self._move_at, None
        if move is None:
            return None
        if timed:
            start = self._billing_start(n, instance, now, save_s)
            if start is None or start > now:  # nothing to save, or wait for the increment's end
                if start is None or planned is None or abs(start - planned) > 0.5:
                    self.log.debug(
                        "job %s: the move to %s %s",
                        self.job.id,
                        move.there.zone,
                        "saves nothing: the remaining work ends within the billed time"
                        if start is None
                        else f"starts in {start - now:.1f} s (the end of a billing increment)",
                    )
                self._move_at = start
                return None
            self._move_gate.reset()  # started: the next move waits its own payback, as best-price's
        self.emit(
            ev.Moving(
                from_region=instance.region,
                to_region=move.there.zone,
                reason=move.reason()
                + ("; timed to leave at the end of a billing increment" if timed else ""),
                saving=move.saving,
                move_cost=move.cost,
            ),
            n,
        )
        return move.there.zone

    def _billing_start(self, n: int, instance: Instance, now: float, save_s: float | None) -> float | None:
        """When to start a billing-aware move of incarnation `n` (`migration.move_start`): its
        lead is the job's measured allocation time plus the old instance's leave (the request's
        poll, a step, a save, the controller noticing); None: its remaining work ends within
        the time its zone already billed."""
        st = self.job.state
        inc = st.incs.get(n)
        if inc is None or inc.allocated is None:
            return now
        allocs = [i.alloc_s for i in st.incs.values() if i.alloc_s is not None and i.alloc_s >= 0]
        alloc = sum(allocs) / len(allocs) if allocs else (self._market_now or self._market())["restart"]
        step = st.step_time or 0.0
        poll = MOVE_POLL if self.store.local else MOVE_POLL_REMOTE
        lead = alloc + poll + step + (save_s or 0.0) + 2 * self.store.poll_interval
        work = max(0, int(st.total or 0) - int(st.step)) * step
        return move_start(self.provider.billing(instance.region), inc.allocated, now, lead, work)

    def _follow_prices(self, regions: list[str], n: int) -> None:
        """The listed zones' prices at an allocation of a job that does not rank them (a list
        of regions is tried in order): written for the widget's price lines. A price API that
        is down or answers garbage costs the job nothing but the lines."""
        try:
            prices = self.provider.prices(self.config.instance_type_name(), regions)
        except Exception as exc:  # noqa: BLE001 - prices are shown, not needed, here
            self.log.debug("job %s: no prices of %s to show: %r", self.job.id, regions, exc)
            return
        self._note_prices(prices, n, always=True)  # a lost lease must still stop the controller

    def _note_prices(self, prices: dict[str, Any], n: int = 0, always: bool = False) -> None:
        """Write the zones' spot prices: at each allocation (`always`), and at each look for a
        move when they changed since the last written (the widget draws them over time; an
        unchanged look writes nothing). A price that is not a finite number is left out."""
        now = {}
        for zone, p in prices.items():
            try:
                spot = float(p.spot)
            except (TypeError, ValueError, AttributeError):
                continue
            if math.isfinite(spot) and spot >= 0:
                now[str(zone)] = round(spot, 6)
        if not now or (now == self._prices_said and not always):
            return
        self._prices_said = now
        sources = sorted({str(p.source) for p in prices.values()})
        self.emit(ev.Prices(zones=now, source="; ".join(sources)[:300]), n)

    def _ask_to_move(
        self, n: int, instance: Instance, pre: Future, zone: str
    ) -> tuple[Future | None, str | None]:
        """The move's new instance was asked for: if it runs, ask incarnation `n` to save and
        leave (it then restores there); if the zone had no capacity, the job stays."""
        try:
            new = pre.result()
        except Exception as exc:  # noqa: BLE001 - the provider failed: stay, say why
            new, why = None, repr(exc)
        else:
            why = "no instance could be allocated there"
        if new is None:
            self.emit(
                ev.JobWarning(
                    message=f"the move to {zone} is abandoned ({why}); the job stays in {instance.region}"
                ),
                n,
            )
            return None, None
        inc = self.job.state.incs.get(n)
        if inc is not None and "notice" in inc.kinds:
            return pre, None  # a notice came first: the new instance is its replacement
        self._fence()  # a controller that lost the job must not move its instance
        try:
            self.store.write_bytes(
                self.store.job(self.job.id, "incarnations", f"{n:04d}.move"),
                json.dumps({"to": zone, "incarnation": n + 1, "t": time.time()}).encode(),
            )
        except OSError as exc:  # the store refused it (full, briefly down): ask again next poll
            # (a store that refuses everything for good ends the job through the event writes)
            self.log.warning(
                "job %s: could not ask incarnation %d to move (%r); asking again", self.job.id, n, exc
            )
            return pre, zone
        return pre, None

    def _preallocate(self, n: int, only: str | None = None) -> Future:
        """Start allocating the replacement as soon as the notice arrives, or a move's new
        instance in zone `only` (it waits for the old instance's end marker before restoring)."""
        fut: Future = Future()
        fut.cancel_event = cancel = threading.Event()  # type: ignore[attr-defined]

        def run() -> None:
            try:
                fut.set_result(self._allocate(n, cancel, only=only))
            except BaseException as exc:  # noqa: BLE001
                fut.set_exception(exc)

        threading.Thread(target=run, name=f"spotnb-prealloc-{n}", daemon=True).start()
        return fut

    def _orphan(self, record: Any) -> Instance:
        """An instance known only from its `launched`/`allocated` record (the provider cannot
        reclaim it): enough to terminate it and close its incarnation."""
        return Instance(
            id=record["instance_id"],
            provider=self.provider.name,
            region=record.get("region"),
            instance_type=record.get("instance_type", ""),
            launched_at=record.get("launched_at", record["t"]),
            info=dict(record.get("info") or {}),
        )

    def _classify(self, n: int, instance: Instance, status: Any) -> _Outcome:
        inc = self.job.state.incs.get(n)
        kinds = inc.kinds if inc is not None else set()
        if status.state == InstanceState.PREEMPTED:
            from spotnb.runtime.agent import EXIT_EVACUATED

            exited = self._agent_exit_code(n)
            if exited is not None and exited != EXIT_EVACUATED and exited < 128:
                # its boot script said the agent exited by itself, then the VM ended itself (an
                # Azure VM deallocates itself: a Stopped one is still billed), which its cloud
                # cannot tell from an eviction: how the agent ended decides, as for an exit. (An
                # agent that left after a notice, or that a signal ended, was evicted.)
                status = InstanceStatus(InstanceState.EXITED, exited, status.detail)
        # saved and left because it was asked to move (a notice first makes it a preemption)
        if "done" not in kinds and {"moving", "evacuated"} <= kinds and "notice" not in kinds:
            return _Outcome(Outcome.MOVED, status.exit_code)
        from spotnb.runtime.agent import EXIT_GAVE_UP

        if status.exit_code == EXIT_GAVE_UP and not kinds & {"ready", "done", "error"}:
            # a replacement (a move's new instance, above all: a move waits for a step
            # boundary, or a failed move save for the next planned one) that gave up waiting
            # for the instance before it: it ran none of the job; the next one restores
            return _Outcome(Outcome.NOT_NEEDED, status.exit_code, {"why": "it gave up waiting"})
        if status.state == InstanceState.PREEMPTED:
            if "done" in kinds:
                return _Outcome(Outcome.DONE, status.exit_code)
            if "evacuated" in kinds:
                return _Outcome(Outcome.EVACUATED, status.exit_code, self._left_at(n, status.detail))
            return _Outcome(Outcome.PREEMPTED, status.exit_code, status.detail)
        if "done" in kinds:
            return _Outcome(Outcome.DONE, status.exit_code)
        if "evacuated" in kinds:
            return _Outcome(Outcome.EVACUATED, status.exit_code, self._left_at(n, {}))
        if "error" in kinds:
            return _Outcome(Outcome.USER_ERROR, status.exit_code)
        from spotnb.runtime.group.local import EXIT_GROUP_LOST

        if status.exit_code == EXIT_GROUP_LOST:  # a process of its replica group died: the
            # instance is lost to the job as a whole (Config.procs_per_instance), not failed
            return _Outcome(Outcome.LOST, status.exit_code, {"why": "a process of its group died"})
        if status.state == InstanceState.TERMINATED:
            return _Outcome(Outcome.STOPPED if self._stop.is_set() else Outcome.LOST, status.exit_code)
        return _Outcome(Outcome.CRASHED, status.exit_code, {"log": str(instance.info.get("log", ""))})

    def _agent_exit_code(self, n: int) -> int | None:
        """The exit code incarnation `n`'s boot script reported for its agent (`bootstrap`
        event, phase agent_exited), or None when it reported none (it was killed first)."""
        for e in reversed(self.job.events):
            if isinstance(e, ev.Bootstrap) and e.incarnation == n and e.phase == "agent_exited":
                return int(e.code) if e.code is not None else 0
        return None

    def _left_at(self, n: int, detail: dict[str, Any]) -> dict[str, Any]:
        """What the `preempted` event of an instance that left by itself after a notice says:
        the market's own kill record where it has one (`detail`), else the step of the
        instance's `evacuated` and that it was noticed. Without them the event read "step
        None" (drawn at step 0) whenever the instance left before the market's kill, which is
        how a notice usually ends (on a cloud, always: it records no step)."""
        out = dict(detail)
        if out.get("step") is None:
            left = next(
                (e for e in reversed(self.job.events) if e.kind == "evacuated" and e.incarnation == n), None
            )
            if isinstance(left, ev.Evacuated):
                out["step"] = left.step
        if out.get("noticed") is None:
            inc = self.job.state.incs.get(n)
            out["noticed"] = inc is not None and "notice" in inc.kinds
        return out

    def _finish_incarnation(self, n: int, instance: Instance, outcome: _Outcome) -> None:
        self._fence()  # a controller that lost the job must not end its instance
        self.provider.terminate(instance)
        end_t = outcome.detail.get("at", time.time())
        lifetime = end_t - instance.launched_at
        if outcome.reason.is_preemption:
            self.emit(
                ev.Preempted(
                    instance_id=instance.id,
                    lifetime_s=lifetime,
                    t=end_t,
                    how=outcome.reason,
                    phase=outcome.detail.get("phase"),
                    step=outcome.detail.get("step"),
                    noticed=outcome.detail.get("noticed"),
                ),
                n,
            )
            reason = "preempted"
        else:
            self.emit(
                ev.Exited(
                    instance_id=instance.id,
                    lifetime_s=lifetime,
                    t=end_t,
                    reason=outcome.reason,
                    code=outcome.code,
                ),
                n,
            )
            reason = outcome.reason.value
        self.db.record_incarnation(self.job.id, n, ended=end_t, end_reason=reason)
        self.pump()
        self._write_end_marker(n, outcome.reason)
