"""The controller of a job on several instances (`Config.instances > 1`).

It keeps `instances` slots filled. Each slot runs one incarnation at a time (one instance, one
agent); the replicas train together through torchft (`spotnb.runtime.group.elastic`) and the job's
coordinator (`Provider.coordinator`: torchft's lighthouse), so the controller never stops a
survivor:

- a slot whose instance is preempted (or gets a notice) is refilled at once, in parallel with
  the others; the replacement *joins* (it receives the live state from a peer, never from the
  store) when another slot is live, and restores from the store (a cold start) when none is;
- the job succeeds when a replica returns; it fails when a replica's function raises and no
  retry is left (the others would raise too). A replica whose process dies without an error
  (the OOM killer, a segfault) is a lost replica: replaced and healed from a peer, as after a
  preemption, up to `Config.max_crashes`; when the job must fail, the replicas still training
  checkpoint first (`_survivors_save`), and the error names the incarnation, its exit code
  and its log;
- the policy is told the *group* loss rate (`spotnb.policy.group`), in the incarnation
  document's market, so a job of N instances saves far less often than a job of one;
- with `Config.migrate="best-price"` a replica in a zone dearer than the best one by enough
  (`spotnb.market.migration.best_replica_move`, behind the same `MoveGate`) is moved: its new instance
  is allocated first, as a temporary extra slot that joins the quorum from a peer; once it has
  committed a step the old one is asked (`incarnations/<n>.move`) to leave the quorum at its
  next step boundary, as after a notice, and ends as `moved`. One replica moves at a time, so
  the quorum goes N → N+1 → N and nobody restarts or redoes a step.

Everything else (leases, fencing, events, the job DB, stopping) is the one-instance
`Controller`'s, whose `loop`, `pump` and `market` this class replaces; it shares the
controller's collaborators through their public methods: the `ZonePlanner` (`planner`:
allocation), the `MoveAdvisor` (`moves`: whether and when a replica moves) and
`spotnb.control.outcome` (how an instance ended).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spotnb.control.controller import EXIT_GRACE, Controller, orphan
from spotnb.control.outcome import FAILURES, Ending
from spotnb.core import protocol as ev
from spotnb.core.protocol import TERMINAL, JobStatus, Outcome
from spotnb.market.migration import MOVING_POLICIES, Move
from spotnb.policy.group import group_mttp
from spotnb.providers.base import Instance, InstanceState, InstanceStatus

if TYPE_CHECKING:
    from spotnb.control.jobdb import JobDB
    from spotnb.core.store import Store
    from spotnb.job import Job
    from spotnb.providers.base import Provider
    from spotnb.settings.config import Config

__all__ = ["FleetController", "make_controller", "AFTER_DONE_GRACE"]

#: seconds a replica may go on after the job's first `done` before it is ended as not needed
AFTER_DONE_GRACE = 15.0
#: seconds the surviving replicas of a failing job have to checkpoint before they are ended
SURVIVOR_SAVE_WAIT = 120.0


@dataclass
class _Slot:
    """One of the job's instances: its current incarnation and what the controller knows."""

    index: int
    n: int = 0  # its current incarnation (0: none yet)
    instance: Instance | None = None
    pending: Future | None = None  # an allocation under way
    noticed: bool = False
    ready: bool = False
    heard: bool = False
    last_seen: float = field(default_factory=time.time)
    described: float = 0.0
    reported_end: float | None = None
    done: bool = False
    ready_step: int | None = None  # the group's step when it joined (its `ready`)
    committed: bool = False  # it took part in a committed step since (a `progress` past it)
    # a move (Config.migrate="best-price"): the old slot's `target` is the new instance's slot,
    # whose `replaces` is the old one, until the old one ends; `asked`: told to leave
    target: _Slot | None = None
    replaces: _Slot | None = None
    asked: bool = False
    zone_only: bool = False  # allocated for a move: in the move's zone only, asked once


class FleetController(Controller):
    """Drives a job on several instances; see the module docstring."""

    def loop(self) -> None:
        if self.vanished():
            return
        self.pump()
        if self.job.status in TERMINAL:
            return
        self._close_open_incarnations()
        self.lighthouse = self.provider.coordinator(self.job.id, self.config.min_instances)
        self._next_n = max(self.job.state.incs, default=0) + 1
        self.slots = [_Slot(k) for k in range(self.config.instances)]
        self._succeeded = False
        self._succeeded_at: float | None = None
        self.crashes = 0  # replicas that died without an error (Config.max_crashes)
        self._failure: tuple[int, Ending] | None = None  # the last (incarnation, failure)
        self._looked = time.time()  # the last look at the prices for a move
        self._status(JobStatus.PENDING if self._next_n == 1 else JobStatus.RESTORING)
        for slot in self.slots:
            self._refill(slot)
        poll = self.store.poll_interval
        while True:
            # the coordinator must outlive every instance: if it died, the provider starts it
            # again at the same address (the replicas' quorum requests retry until it answers)
            self.provider.coordinator(self.job.id, self.config.min_instances)
            self.pump()  # each new event goes through `_on_event`
            if self.stop_requested():
                self._end_all(Outcome.STOPPED)
                self.end_stopped()
                return
            for slot in list(self.slots):  # (a slot that ended for good leaves the list)
                verdict = self._tend(slot)
                if verdict is not None:
                    if (
                        verdict == JobStatus.FAILED
                        and self._failure
                        and self._failure[1].reason == Outcome.CRASHED
                    ):
                        # lost replicas ended the job: the others are healthy, so they save first
                        # (after a user error they would raise too: the job ends at once)
                        self._survivors_save()
                    self._end_all(Outcome.NOT_NEEDED if verdict == JobStatus.SUCCEEDED else Outcome.STOPPED)
                    if verdict == JobStatus.STOPPED:
                        self.end_stopped()
                    elif verdict == JobStatus.FAILED:
                        self._fail_job()
                    else:
                        self.set_status(verdict)
                    return
            if self.config.migrate in MOVING_POLICIES and not self._succeeded:
                self._tend_moves()
            if self._succeeded:
                self._dismiss_latecomers()
            if self._succeeded and not any(s.instance or s.pending for s in self.slots):
                self.set_status(JobStatus.SUCCEEDED)
                return
            self._status(self._current_status())
            time.sleep(poll)

    # -- slots ---------------------------------------------------------------------------
    def _refill(self, slot: _Slot) -> None:
        """Start a new incarnation in `slot`, joining live peers when there are any."""
        if self._succeeded:
            return
        n = self._next_n
        self._next_n += 1
        peers = [s for s in self.slots if s is not slot and s.instance is not None and not s.noticed]
        leaving = [s.n for s in self.slots if s is not slot and s.instance is not None and s.noticed]
        ended = [m for m in self.job.state.incs if m < n and m not in leaving]
        extra = {
            "slot": slot.index,
            "lighthouse": self.lighthouse,
            "join": bool(peers),
            # a cold start restores from the store after every instance that may still be
            # saving (a noticed one) has ended; a joiner waits for nobody
            "wait_for": [] if peers else sorted(leaving + ended[-1:]),
        }
        slot.n, slot.instance, slot.noticed, slot.ready, slot.heard = n, None, False, False, False
        slot.reported_end = None
        slot.pending = self.planner.allocate_async(n, f"spotnb-alloc-{self.job.id}-{n}", extra, slot.index)

    def pump(self) -> list[ev.Event]:
        """Read new events, and let each tell its slot what happened: every pump, not only the
        main loop's (`set_status` and `_ended` pump too; an event they read, such as a replica's
        `ready` right behind another's, must not be missed by its slot)."""
        events = super().pump()
        for e in events:
            self._on_event(e)
        return events

    def _on_event(self, e: ev.Event) -> None:
        slot = next((s for s in getattr(self, "slots", ()) if s.n == e.incarnation and s.n), None)
        if slot is None:
            return
        slot.last_seen = max(slot.last_seen, time.time())
        kind = e.kind
        slot.heard = slot.heard or kind not in ("launched", "allocated", "allocating", "alloc_failed")
        if kind == "ready":
            slot.ready = True
            slot.ready_step = getattr(e, "step", None)
        elif kind == "progress" and slot.ready_step is not None and getattr(e, "step", 0) > slot.ready_step:
            slot.committed = True
        elif kind == "notice" and not slot.noticed:
            # the replica finishes its step and leaves; its replacement is asked for now
            slot.noticed = True
            if slot.target is not None:
                return  # it was being moved: the move's new instance is its replacement
            if slot.replaces is not None and not slot.replaces.asked:
                return  # a move's new instance: the replica it was to replace still trains
            spare = _Slot(slot.index)
            self.slots.append(spare)
            self._refill(spare)
        elif kind in ("done", "error", "evacuated") and slot.reported_end is None:
            slot.reported_end = time.time()
            slot.described = 0.0
            if kind == "done":
                self._succeeded = True
                self._succeeded_at = self._succeeded_at or time.time()

    def _tend(self, slot: _Slot) -> JobStatus | None:
        """Advance one slot; a job-ending verdict, or None."""
        if slot.pending is not None:
            if not slot.pending.done():
                return None
            if slot.zone_only:  # a move's new instance, asked in that zone only
                try:
                    instance = slot.pending.result()
                except Exception as exc:  # noqa: BLE001 - the provider failed: stay, say why
                    instance, why = None, repr(exc)
                else:
                    why = "no instance could be allocated there"
                slot.zone_only = False
                if instance is None:
                    slot.pending = None
                    if slot.replaces is not None:  # the replica it was to replace stays
                        self._abandon_move(slot, why)
                    elif not self._succeeded:  # it had taken over a slot left meanwhile: refill
                        self._refill(slot)
                    return None
            instance = slot.pending.result()  # a controller bug here ends the job visibly
            slot.pending = None
            if instance is None:  # stopped, max_wait without capacity, or a quota everywhere
                if self._succeeded:
                    return None
                return JobStatus.FAILED if self.planner.quota_failed else JobStatus.STOPPED
            slot.instance, slot.last_seen = instance, time.time()
            if self._succeeded:  # too late: the job is done
                self.finish_incarnation(slot.n, instance, Ending(Outcome.NOT_NEEDED))
                slot.instance = None
            return None
        if slot.instance is None:
            return None
        outcome = self._ended(slot)
        if outcome is None:
            return None
        self.finish_incarnation(slot.n, slot.instance, outcome)
        slot.instance = None
        if slot.target is not None:  # moved (or lost while moving): its new instance takes over
            slot.target.replaces, slot.target = None, None
            if slot in self.slots:
                self.slots.remove(slot)
            return self._after(slot, outcome, refill=False)
        if slot.replaces is not None:  # a move's new instance ended
            old, slot.replaces = slot.replaces, None
            old.target = None
            if not old.asked and not old.noticed and old.instance is not None:
                # before the old replica was asked to leave: it still trains, the move is off
                self.slots.remove(slot)
                self.moves.abandon(time.time())  # wait a whole payback again
                self.emit(
                    ev.JobWarning(
                        message=f"the move of slot {slot.index}'s replica is abandoned: its new "
                        f"instance ended ({outcome.reason.value}) before it took over"
                    ),
                    old.n,
                )
                return self._after(slot, outcome, refill=False)
        if slot in self.slots and len(self.slots) > self.config.instances and (slot.noticed or slot.asked):
            self.slots.remove(slot)  # its replacement was already asked for (notice or move)
            return None
        return self._after(slot, outcome)

    def _ended(self, slot: _Slot) -> Ending | None:
        """How the slot's instance ended, or None while it runs (as `Controller._watch`)."""
        instance = slot.instance
        assert instance is not None
        now = time.time()
        if now - slot.described >= self.provider.describe_interval:
            slot.described = now
            status = self.provider.describe(instance)
            if status.state in (InstanceState.EXITED, InstanceState.PREEMPTED, InstanceState.TERMINATED):
                self.pump()
                return self.classify(slot.n, instance, status)
        if slot.reported_end is not None and now - slot.reported_end > EXIT_GRACE:
            self.fence()
            self.provider.terminate(instance)
            self.pump()
            return self.classify(slot.n, instance, InstanceStatus(InstanceState.EXITED))
        limit = (
            self.config.heartbeat_timeout
            if slot.heard
            else max(self.config.heartbeat_timeout, self.provider.boot_timeout)
        )
        if now - slot.last_seen > limit:
            self.fence()
            self.provider.terminate(instance)
            return Ending(Outcome.LOST, detail={"why": f"no event for {limit:.0f} s"})
        return None

    def _after(self, slot: _Slot, outcome: Ending, refill: bool = True) -> JobStatus | None:
        """What the job does after one slot's instance ended (`refill`: start another one in
        the slot when the job goes on; not when a move's other instance fills it)."""
        if outcome.reason == Outcome.DONE:
            self._succeeded = True
            self._succeeded_at = self._succeeded_at or time.time()
            slot.done = True
            return None
        if self._succeeded:
            return None
        if outcome.reason == Outcome.CRASHED:
            # the process died without a Python exception (the OOM killer, a segfault, a stray
            # kill): a lost replica, not the function's fault. The survivors train on and a
            # replacement heals from a peer, as after a preemption, within the crash budget
            self.crashes += 1
            self._failure = (slot.n, outcome)
            budget = self.config.max_crashes
            self.emit(
                ev.JobWarning(
                    message=f"incarnation {slot.n} (slot {slot.index}) died without an error, exit "
                    f"code {outcome.code}: crash {self.crashes} of the {budget} the job allows "
                    f"(Config.max_crashes); its log: {outcome.detail.get('log') or 'none'}"
                ),
                slot.n,
            )
            if self.crashes > budget:
                return JobStatus.FAILED
            if refill:
                self._refill(slot)
            return None
        if outcome.reason in FAILURES:
            self._failure = (slot.n, outcome)
            if self.retries >= self.config.max_retries:
                return JobStatus.FAILED
            self.retries += 1
            if refill:
                self._refill(slot)
            return None
        if outcome.reason.is_preemption:
            self.preemptions += 1
            limit = self.config.max_preemptions
            if limit is not None and self.preemptions > limit:
                self.stop_reason = f"max_preemptions={limit} reached"
                return JobStatus.STOPPED
            cost = self.job.breakdown().total_cost  # the coordinator's on-demand spend too
            if self.config.max_cost is not None and cost >= self.config.max_cost:
                self.stop_reason = f"max_cost=${self.config.max_cost} reached (spent ${cost:.4f})"
                return JobStatus.STOPPED
            if refill:
                self._refill(slot)
        return None

    def _survivors_save(self) -> None:
        """The job must end on a failure: the replicas still training first checkpoint the
        step they reached (`incarnations/<n>.save`; replica 0 of the quorum writes it), so a
        resume loses nothing they computed. Waits for that checkpoint, for the survivors to
        end, or SURVIVOR_SAVE_WAIT seconds, whichever comes first."""
        live = [s for s in self.slots if s.instance is not None and s.reported_end is None]
        if not live:
            return
        before = self.job.state.checkpointed
        for slot in live:
            self.store.write_bytes(self.store.job(self.job.id, "incarnations", f"{slot.n:04d}.save"), b"")
        deadline = time.time() + SURVIVOR_SAVE_WAIT
        while time.time() < deadline:
            self.pump()
            if self.job.state.checkpointed != before:
                return
            if all(self._ended(s) is not None for s in live if s.instance is not None):
                return
            time.sleep(self.store.poll_interval)
        self.emit(
            ev.JobWarning(
                message=f"the surviving replicas did not checkpoint within {SURVIVOR_SAVE_WAIT:.0f} s "
                "of the failure: a resume starts from the last checkpoint before it"
            )
        )

    def _fail_job(self) -> None:
        """End the job as failed, saying which instance ended it and how: a crash has no
        error event of its own, so one is written (the instance, its exit code, its log)."""
        if self.planner.quota_failed:  # a slot's instance was refused by a quota in every region
            self.end_for_quota(max((s.n for s in self.slots), default=0))
            return
        n, outcome = self._failure or (0, Ending(Outcome.USER_ERROR))
        if outcome.reason == Outcome.CRASHED and self.job.state.error is None:
            log_path = str(outcome.detail.get("log", ""))
            self.emit(
                ev.Error(
                    message=f"incarnation {n} died without reporting an error (exit code "
                    f"{outcome.code}), crash {self.crashes} where Config.max_crashes allows "
                    f"{self.config.max_crashes}; its log: {log_path or 'none'}",
                    exc_type="InstanceCrashed",
                    traceback=log_path,
                ),
                n,
            )
        self.set_status(JobStatus.FAILED, reason=outcome.reason.value)

    def _dismiss_latecomers(self) -> None:
        """The job is done (a replica returned, so its result is in the store): replicas that
        were not training the last steps (a replacement still allocating or starting) are not
        needed, and must not train the job again from the store on their own. Those in the
        last quorum end by themselves within moments; one still running `AFTER_DONE_GRACE`
        seconds after the first `done` (a replacement that found no peers and trains alone
        from the store) is ended too: nothing it computes is needed."""
        since = time.time() - self._succeeded_at if self._succeeded_at is not None else 0.0
        for slot in self.slots:
            cancel = getattr(slot.pending, "cancel_event", None)
            if cancel is not None:
                cancel.set()
            # a replica that trained the last step is finishing, only slower on a busy machine:
            # it gets ten times the grace before it too is ended (it may hang in a shutdown)
            inc = self.job.state.incs.get(slot.n)
            total = self.job.state.total
            finishing = inc is not None and bool(total) and inc.reached >= int(total or 0) - 1
            late = since > AFTER_DONE_GRACE * (10 if finishing else 1)
            if slot.instance is not None and slot.reported_end is None and (not slot.ready or late):
                self.finish_incarnation(slot.n, slot.instance, Ending(Outcome.NOT_NEEDED))
                slot.instance = None

    def _end_all(self, reason: Outcome) -> None:
        """End every live instance and pending allocation (the job is over)."""
        for slot in list(self.slots):
            if slot.pending is not None:
                cancel = getattr(slot.pending, "cancel_event", None)
                if cancel is not None:
                    cancel.set()  # an allocation waiting for capacity gives up
                try:
                    instance = slot.pending.result(timeout=60)
                except Exception:  # noqa: BLE001
                    instance = None
                slot.pending = None
                if instance is not None:
                    slot.instance = instance
            if slot.instance is not None:
                outcome = self._ended(slot) or Ending(reason)
                self.finish_incarnation(slot.n, slot.instance, outcome)
                slot.instance = None

    # -- moves (Config.migrate="best-price") -----------------------------------------------
    def _tend_moves(self) -> None:
        """Advance the move under way (one at a time), or look at the prices for the next."""
        new = next((s for s in self.slots if s.replaces is not None), None)
        if new is not None:
            old = new.replaces
            assert old is not None
            ready = new.instance is not None and new.committed
            if ready and not (new.noticed or new.reported_end or old.asked or old.noticed):
                self._ask_to_leave(old, new)
        now = time.time()
        due = self.moves.move_at is not None and now >= self.moves.move_at
        if now - self._looked < self.provider.price_interval and not due:
            return
        self._looked = now
        # the gate keeps looking during a move (the next replica's wait goes on), but a move
        # starts only when every slot trains: none moving, starting, leaving or allocating
        found = self.moves.consider_replica(
            (s, s.instance.region if s.instance is not None else None) for s in self.slots if self._trains(s)
        )
        every = len(self.slots) == self.config.instances and all(self._trains(s) for s in self.slots)
        if found is None:
            self.moves.move_at = None
        elif new is None and every and self.moves.due(found[0].n, found[0].instance, found[1], now):
            self._start_move(*found)

    @staticmethod
    def _trains(slot: _Slot) -> bool:
        """Whether the slot's replica trains and nothing is happening to it."""
        return (
            slot.instance is not None
            and slot.ready
            and not slot.noticed
            and slot.reported_end is None
            and slot.target is None
            and slot.replaces is None
        )

    def _start_move(self, old: _Slot, move: Move) -> None:
        """Say so (`moving`, on the old instance's lane) and allocate the new instance in the
        move's zone only, as a temporary extra slot that joins the live group."""
        assert old.instance is not None
        n = self._next_n
        self._next_n += 1
        self.emit(
            ev.Moving(
                from_region=old.instance.region,
                to_region=move.there.zone,
                reason=f"the replica in slot {old.index}: {move.reason()}",
                saving=move.saving,
                move_cost=move.cost,
                slot=old.index,
                to_incarnation=n,
            ),
            old.n,
        )
        new = _Slot(old.index, n=n, replaces=old, zone_only=True)
        old.target = new
        self.slots.append(new)
        extra = {"slot": old.index, "lighthouse": self.lighthouse, "join": True, "wait_for": []}
        new.pending = self.planner.allocate_async(
            n, f"spotnb-alloc-{self.job.id}-{n}", extra, old.index, only=move.there.zone
        )

    def _ask_to_leave(self, old: _Slot, new: _Slot) -> None:
        """The new instance has committed a step with the group: ask the old one to leave the
        quorum at its next step boundary (`incarnations/<n>.move`; the agent's move watcher)."""
        if self.moves.request_move(old.n, new.instance.region if new.instance else None, new.n):
            old.asked = True

    def _abandon_move(self, new: _Slot, why: str) -> None:
        """The move's new instance could not be had: the replica stays where it is, and a move
        waits a whole payback again (the zone's failure also counts against it in the ranking)."""
        old = new.replaces
        new.replaces = None
        self.moves.abandon(time.time())
        if new in self.slots:
            self.slots.remove(new)
        if old is not None:
            old.target = None
            if self._succeeded:  # cancelled: the job is done, nothing to say
                return
            region = old.instance.region if old.instance is not None else None
            self.emit(
                ev.JobWarning(
                    message=f"the move of slot {old.index}'s replica is abandoned ({why}); "
                    f"it stays in {region}"
                ),
                old.n,
            )

    # -- status --------------------------------------------------------------------------
    def _current_status(self) -> JobStatus:
        if any(s.instance is not None and s.ready for s in self.slots):
            return JobStatus.RUNNING
        return (
            JobStatus.RESTORING
            if self.preemptions or self._next_n > len(self.slots) + 1
            else JobStatus.PENDING
        )

    def _status(self, status: JobStatus) -> None:
        if self.job.status != status:
            self.set_status(status)

    # -- the incarnation document ----------------------------------------------------------
    def market(self) -> dict[str, float]:
        """The market as one replica's policy should see it: the job is lost only when every
        instance is down at once, so its MTTP is the group's (`spotnb.policy.group`)."""
        market = super().market()
        market["instance_mttp"] = market["mttp"]
        if self._runs_script():
            # torchrun (`runtime/group/torchrun.py`): any lost instance sends every worker back
            # to the checkpoint, so the group rolls back N times as often as one instance dies
            market["mttp"] = market["mttp"] / self.config.instances
        else:
            market["mttp"] = group_mttp(market["mttp"], self.config.instances, market["restart"])
        return market

    def _runs_script(self) -> bool:
        """Whether the job is a script (`spot.run`), read once from its spec."""
        if not hasattr(self, "_script"):
            try:
                doc = json.loads(self.store.read_bytes(self.store.job(self.job.id, "spec.json")))
                self._script = doc.get("script") is not None
            except (OSError, ValueError):
                self._script = False
        return self._script

    def _close_open_incarnations(self) -> None:
        """After a controller restart: every incarnation the dead controller left open is
        reclaimed and ended (its replica is gone with the old coordinator); the slots then
        start again from the store."""
        events = self.job.events
        ended = {e["incarnation"] for e in events if e["kind"] in ("preempted", "exited")}
        records = {e["incarnation"]: e for e in events if e["kind"] in ("launched", "allocated")}
        for n, record in sorted(records.items()):
            if n in ended:
                continue
            instance = self.provider.reclaim(record.to_json())
            gone = instance or orphan(record, self.provider.name)
            self.finish_incarnation(n, gone, Ending(Outcome.LOST, detail={"why": "its controller died"}))
        self.preemptions = sum(e["kind"] == "preempted" for e in events)


def make_controller(job: Job, config: Config, provider: Provider, store: Store, db: JobDB) -> Controller:
    """The controller for `config`: a fleet for several instances, else the one-instance one."""
    cls = FleetController if config.instances > 1 else Controller
    return cls(job, config, provider, store, db)
