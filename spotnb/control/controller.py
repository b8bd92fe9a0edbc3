"""The controller: launches an instance, watches it through the event log and the provider,
relaunches after each preemption, and ends the job. It runs in a thread of the notebook's
process (or of `spotnb controller`), never on the instance.

It writes its own events (writer "ctl") to the same log the agent writes to, and the Job
learns everything, its own status included, by reading that log back.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from spotnb.control.fencing import LeaseHolder, LeaseLost
from spotnb.control.jobdb import JobDB
from spotnb.control.journal import Journal
from spotnb.control.moves import MoveAdvisor
from spotnb.control.outcome import FAILURES, Ending, classify, ending_of_event, stalled_run
from spotnb.control.planner import ZonePlanner
from spotnb.control.supervise import job_vanished, mark_lost
from spotnb.core import protocol as ev
from spotnb.core.events import EventReader, EventWriter
from spotnb.core.protocol import TERMINAL, Event, JobStatus, Outcome
from spotnb.core.store import Store
from spotnb.job import Job
from spotnb.market.migration import MOVING_POLICIES
from spotnb.policy import resolve_policy
from spotnb.providers.base import Instance, InstanceState, InstanceStatus, Provider

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "EXIT_GRACE",
    "Controller",
    "JobDirectoryDeleted",
    "LeaseLost",
    "orphan",
]

EXIT_GRACE = 30.0  # seconds an instance may linger after its agent reported the end
STOP_CHECK = 1.0  # seconds between looks for a STOP marker in the store
IDENTITY_CHECK = 2.0  # seconds between looks for the job's spec (local; scaled for remote)
STALL_WARN = 3  # instances in a row without a new checkpoint before the feed says so

log = logging.getLogger("spotnb.control.controller")


def _store_refuses(exc: BaseException) -> bool:
    """Whether `exc` is the store refusing a write for good (not a bug in spotnb)."""
    return isinstance(exc, OSError) and (
        isinstance(exc, PermissionError)
        or exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)
    )


def orphan(record: Any, provider: str) -> Instance:
    """An instance known only from its `launched`/`allocated` record (the provider cannot
    reclaim it): enough to terminate it and close its incarnation."""
    return Instance(
        id=record["instance_id"],
        provider=provider,
        region=record.get("region"),
        instance_type=record.get("instance_type", ""),
        launched_at=record.get("launched_at", record["t"]),
        info=dict(record.get("info") or {}),
    )


class JobDirectoryDeleted(Exception):
    """The job's directory vanished from the store while the job ran."""


class Controller:
    """Drives one job: holds its lease, writes the controller's events, and runs its loop
    (`loop`: one instance at a time; `FleetController` runs several). Zones and allocation
    are its `planner`'s (`ZonePlanner`), moves its `moves`' (`MoveAdvisor`), and how an
    incarnation ended is `spotnb.control.outcome.classify`'s."""

    def __init__(self, job: Job, config: Config, provider: Provider, store: Store, db: JobDB) -> None:
        self.job, self.config, self.provider, self.store, self.db = job, config, provider, store, db
        # every record names the job, so a view of it can show what this controller says
        self.log = logging.LoggerAdapter(log, {"job_id": job.id})
        self.reader = EventReader(store, job.id)
        self.writer = EventWriter(store, job.id, 0, "ctl")
        self._stop = threading.Event()
        self.stop_reason = "stop requested"
        self._stop_checked = 0.0
        # the job's spec, if it had one when this controller started: its disappearance while
        # the job runs means the job directory was deleted (the agent's writes would recreate
        # the folder, but not the spec)
        spec = self.store.job(job.id, "spec.json")
        self._spec_path = spec if self.store.exists(spec) else None
        self._identity_checked = time.time()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease = LeaseHolder(db, store, job.id, self.owner, self.log, self._lease_lost)
        self.journal = Journal(job, store, db, self.lease, self.log)
        self._thread = threading.Thread(target=self._main, name=f"spotnb-ctl-{job.id}", daemon=True)
        self.preemptions = 0
        self.retries = 0
        self.policy = resolve_policy(config.checkpoint)
        self.planner = ZonePlanner(self, job, config, provider, store, db, self.policy, self._stop, self.log)
        self.moves = MoveAdvisor(self, job, config, provider, store, self.planner, self.log)
        job._stop_hook = self.request_stop

    # -- plumbing ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_stop(self, reason: str = "stop requested") -> None:
        self.stop_reason = reason
        self._stop.set()

    def emit(self, event: Event, incarnation: int = 0) -> None:
        """Write one event now, fenced by the lease (`Journal.emit`)."""
        self.journal.emit(event, incarnation)

    def fence(self) -> None:
        """Raise LeaseLost unless this controller still holds the job's lease (`LeaseHolder.fence`)."""
        self.lease.fence()

    @property
    def generation(self) -> int:
        """The lease generation this controller holds (0: none yet)."""
        return self.lease.generation

    def _lease_lost(self) -> None:
        """Another controller holds the job now: stop, and write nothing more."""
        self._stop.set()
        dropped = self.journal.discard()
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
            self.journal.index(events)
        return events

    def stop_requested(self) -> bool:
        self.fence()
        now = time.time()
        if not self._stop.is_set() and now - self._stop_checked >= STOP_CHECK:
            self._stop_checked = now
            if self.store.exists(self.store.job(self.job.id, "STOP")):
                self.stop_reason = "stop requested"
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

    def run(self) -> None:
        """Drive the job in this thread until it ends (what `spotnb controller ID` does)."""
        self._main()

    # -- main loop -----------------------------------------------------------------------------
    def _take_lease(self) -> dict[str, Any] | None:
        """Take the job's lease (a new generation); None if a live controller holds it."""
        return self.lease.take()

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
        threading.Thread(
            target=self.lease.keep, args=(lambda: self._thread_alive,), name="spotnb-lease", daemon=True
        ).start()
        try:
            self.loop()
        except LeaseLost:
            self.lease.lose()
            self.log.warning("another controller took job %s over", self.job.id)
            return
        except JobDirectoryDeleted:
            return  # recorded in the job DB; nothing may be written to the store
        except BaseException as exc:  # noqa: BLE001 - a controller bug must end the job visibly
            tb = traceback.format_exc()
            self.log.error("job %s: controller error", self.job.id, exc_info=True)
            if self.lease.lost.is_set():
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
            if not self.lease.lost.is_set():
                self.provider.close()
                self.pump()
                self.lease.release()

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

    def loop(self) -> None:
        """Drive the job to its end, one incarnation at a time (`FleetController` keeps several)."""
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
                if self.stop_requested():
                    if instance is not None:
                        self.finish_incarnation(n, instance, Ending(Outcome.STOPPED))
                    self.end_stopped()
                    return
                if instance is None:
                    if self.vanished():
                        return
                    self.set_status(JobStatus.PENDING if n == 1 else JobStatus.RESTORING)
                    instance = pre.result() if pre is not None else self.planner.allocate(n)
                    pre = None
                    if instance is None:
                        if self.planner.quota_failed:
                            self.end_for_quota(n)
                        else:
                            self.end_stopped()
                        return
                self.planner.place_checkpoint(n, instance)
                outcome, pre = self._watch(n, instance)
                if pre is not None and not self._relaunches(outcome):
                    self._cancel_pre(pre)  # before the end marker lets its agent restore
                    pre = None
                self.finish_incarnation(n, instance, outcome)
            instance = None
            if not self._carry_on(n, outcome, pre):
                return
            outcome = None
            n += 1

    def _relaunches(self, outcome: Ending) -> bool:
        """Whether this outcome leads to another incarnation (limits aside)."""
        if outcome.reason.is_preemption or outcome.reason == Outcome.MOVED:
            return True
        return outcome.reason in FAILURES and self.retries < self.config.max_retries

    def _carry_on(self, n: int, outcome: Ending, pre: Future | None) -> bool:
        """After incarnation `n` ended with `outcome`: end the job, or go on to the next one."""
        if outcome.reason == Outcome.DONE:
            self._cancel_pre(pre)
            self.set_status(JobStatus.SUCCEEDED)
            return False
        if outcome.reason == Outcome.STOPPED:
            self._cancel_pre(pre)
            self.end_stopped()
            return False
        if outcome.reason in (Outcome.MOVED, Outcome.NOT_NEEDED):
            # a move is not a preemption: its replacement already runs in the new zone; nor is
            # a move's new instance that a successor controller ended before it began
            pass
        elif outcome.reason in FAILURES:
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
                self.stop_reason = f"max_preemptions={limit} reached"
                self.end_stopped()
                return False
            if not self._progressing(n, pre):
                return False
        cost = self.job.breakdown().total_cost  # a coordinator's spend counts too
        if self.config.max_cost is not None and cost >= self.config.max_cost:
            self._cancel_pre(pre)
            self.stop_reason = f"max_cost=${self.config.max_cost} reached (spent ${cost:.4f})"
            self.end_stopped()
            return False
        return True

    def _progressing(self, n: int, pre: Future | None) -> bool:
        """Say so when relaunches stop making net progress; end the job at the limit."""
        stalled = stalled_run(self.job.state.incs, n)
        limit = self.config.max_stalled_relaunches
        if limit is not None and stalled >= limit:
            self._cancel_pre(pre)
            self.stop_reason = (
                f"no net progress: the last {stalled} instances ended without committing a "
                f"checkpoint (max_stalled_relaunches={limit}). Their lifetimes were shorter than "
                "start-up plus a save: use a market with longer lifetimes, make start-up or saves "
                "faster, or raise max_stalled_relaunches"
            )
            self.end_stopped()
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

    def vanished(self) -> bool:
        """If the job's store or directory is gone, record the job as lost in the job DB (no
        event can be written) and say so: nothing can be launched or resumed without it."""
        row = {"id": self.job.id, "store": self.store.url}
        why = job_vanished(row)
        if why is None:
            return False
        self.fence()
        reason = mark_lost(row, why)["status_reason"]
        self.job._mark_lost(reason)
        self.log.error("job %s is lost: %s", self.job.id, why)
        return True

    def _recover(self) -> tuple[int, Instance | None, Ending | None] | None:
        """Pick the job up where the log says it is: fresh (incarnation 1), or after a controller
        that died. Every incarnation it left open is reclaimed by the provider (kept, or ended and
        closed with an event); how the last one ended decides what happens next, as it would
        have for the dead controller."""
        if self.vanished():
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
        for n in started:
            if n in ended:
                if not self.store.exists(self.store.job(self.job.id, "incarnations", f"{n:04d}.end")):
                    self.journal.end_marker(n, "closed after a controller restart")
                continue
            record = allocated.get(n) or launched.get(n)
            if record is None:
                continue  # it died while asking for an instance and got none
            instance = self.provider.reclaim(record.to_json())
            if instance is not None and n == last:
                return last, instance, None
            gone = instance or orphan(record, self.provider.name)
            result = self.classify(n, gone, InstanceStatus(InstanceState.TERMINATED))
            if result.reason in (Outcome.LOST, Outcome.STOPPED):
                result = Ending(Outcome.LOST, detail={"why": "its controller died"})
                if self._move_target_unused(n):
                    # the new instance of a move, still waiting for the old one when the
                    # controller died: ended by spotnb before it did any work, not preempted
                    result = Ending(Outcome.NOT_NEEDED, detail={"why": "its controller died"})
            self.finish_incarnation(n, gone, result)
            if n < last and result.reason.is_preemption:
                self.preemptions += 1
            ended[n] = result  # type: ignore[assignment]
        if last not in ended:
            return last, None, None  # it died while allocating: ask again
        end = ended[last]
        return last, None, end if isinstance(end, Ending) else ending_of_event(end)

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

    def end_stopped(self) -> None:
        self.emit(ev.Stopped(reason=self.stop_reason))
        self.set_status(JobStatus.STOPPED, reason=self.stop_reason)

    def end_for_quota(self, n: int) -> None:
        """Every candidate region refused incarnation `n` for the account's quota: the job
        fails, before anything more is billed, with an error that names each quota and how to
        raise it (and, after a checkpoint, how to go on from it once raised)."""
        message = self.planner.quota_message()
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
    def market(self) -> dict[str, float]:
        """What the policy assumes of this market: the job DB's measurements, shrunk toward the
        provider's priors (a configured market, like the local one, knows its own)."""
        name, zone, itype, priors = self.provider.market_key(self.config.region)
        stats = self.db.market(name, zone, itype, **priors)
        return {**stats.as_dict(), "grace": self.provider.notice_settings(self.config.region)["grace"]}

    def _watch(self, n: int, instance: Instance) -> tuple[Ending, Future | None]:
        pre: Future | None = None
        last_seen = time.time()
        heard = False  # the agent has spoken: from then on, silence means a dead instance
        described = 0.0
        reported_end: float | None = None  # the agent said done/error/evacuated at this time
        poll = self.store.poll_interval
        ready = False
        move_to: str | None = None  # a move's zone, while its instance is being allocated
        looked = time.time()  # the last look at the prices for a move
        self.moves.move_at = None  # a billing-aware move planned for the instance before
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
                    if self.policy.allocate_on_notice(self.planner.observation(n)):
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
                    or (self.moves.move_at is not None and now >= self.moves.move_at)
                )
            ):
                looked = now
                move_to = self.moves.consider(n, instance)
                if move_to is not None:
                    pre = self._preallocate(n + 1, only=move_to)
            if move_to is not None and pre is not None and pre.done():
                pre, move_to = self.moves.ask_to_move(n, instance, pre, move_to)
            if now - described >= self.provider.describe_interval:
                described = now
                status = self.provider.describe(instance)
                if status.state in (InstanceState.EXITED, InstanceState.PREEMPTED, InstanceState.TERMINATED):
                    self.pump()  # the agent flushed before it exited
                    return self.classify(n, instance, status), pre
            if reported_end is not None and now - reported_end > EXIT_GRACE:
                # the agent is finished but its instance did not go away: end it ourselves
                self.fence()
                self.provider.terminate(instance)
                self.pump()
                return self.classify(n, instance, InstanceStatus(InstanceState.EXITED)), pre
            if self.stop_requested():
                self.provider.terminate(instance)
                return Ending(Outcome.STOPPED), pre
            limit = (
                self.config.heartbeat_timeout
                if heard
                else max(self.config.heartbeat_timeout, self.provider.boot_timeout)
            )
            if time.time() - last_seen > limit:
                self.fence()
                self.provider.terminate(instance)
                return Ending(Outcome.LOST, detail={"why": f"no event for {limit:.0f} s"}), pre
            time.sleep(poll)

    def _preallocate(self, n: int, only: str | None = None) -> Future:
        """Start allocating the replacement as soon as the notice arrives, or a move's new
        instance in zone `only` (it waits for the old instance's end marker before restoring)."""
        return self.planner.allocate_async(n, f"spotnb-prealloc-{n}", only=only)

    def classify(self, n: int, instance: Instance, status: InstanceStatus) -> Ending:
        """How incarnation `n` on `instance` ended (`spotnb.control.outcome.classify`), from
        the provider's `status` and what the job's log says of it."""
        inc = self.job.state.incs.get(n)
        kinds = inc.kinds if inc is not None else set()
        agent_exit = self._agent_exit_code(n) if status.state == InstanceState.PREEMPTED else None
        left = None
        if "evacuated" in kinds:
            left = next(
                (e for e in reversed(self.job.events) if e.kind == "evacuated" and e.incarnation == n), None
            )
        return classify(
            status,
            kinds,
            agent_exit=agent_exit,
            stopping=self._stop.is_set(),
            log=str(instance.info.get("log", "")),
            evacuated_step=left.step if isinstance(left, ev.Evacuated) else None,
        )

    def _agent_exit_code(self, n: int) -> int | None:
        """The exit code incarnation `n`'s boot script reported for its agent (`bootstrap`
        event, phase agent_exited), or None when it reported none (it was killed first)."""
        for e in reversed(self.job.events):
            if isinstance(e, ev.Bootstrap) and e.incarnation == n and e.phase == "agent_exited":
                return int(e.code) if e.code is not None else 0
        return None

    def finish_incarnation(self, n: int, instance: Instance, outcome: Ending) -> None:
        self.fence()  # a controller that lost the job must not end its instance
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
        self.journal.end_marker(n, outcome.reason)
