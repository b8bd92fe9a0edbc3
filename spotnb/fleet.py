"""The controller of a job on several instances (`Config.instances > 1`).

It keeps `instances` slots filled. Each slot runs one incarnation at a time (one instance, one
agent); the replicas train together through torchft (`spotnb.runtime.elastic`) and the job's
coordinator (`Provider.coordinator`: torchft's lighthouse), so the controller never stops a
survivor:

- a slot whose instance is preempted (or gets a notice) is refilled at once, in parallel with
  the others; the replacement *joins* (it receives the live state from a peer, never from the
  store) when another slot is live, and restores from the store (a cold start) when none is;
- the job succeeds when a replica returns; it fails when a replica's function raises and no
  retry is left (the others would raise too);
- the policy is told the *group* loss rate (`spotnb.policy.group`), in the incarnation
  document's market, so a job of N instances saves far less often than a job of one.

Everything else (leases, fencing, events, the job DB, stopping, classifying how an instance
ended) is the one-instance `Controller`'s.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from spotnb import protocol as ev
from spotnb.controller import _FAILURES, EXIT_GRACE, Controller, _Outcome
from spotnb.policy.group import group_mttp
from spotnb.protocol import TERMINAL, JobStatus, Outcome
from spotnb.providers.base import Instance, InstanceState, InstanceStatus

__all__ = ["FleetController", "make_controller", "AFTER_DONE_GRACE"]

#: seconds a replica may go on after the job's first `done` before it is ended as not needed
AFTER_DONE_GRACE = 15.0


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


class FleetController(Controller):
    """Drives a job on several instances; see the module docstring."""

    def _run(self) -> None:
        if self._vanished():
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
        self._status(JobStatus.PENDING if self._next_n == 1 else JobStatus.RESTORING)
        for slot in self.slots:
            self._refill(slot)
        poll = self.store.poll_interval
        while True:
            # the coordinator must outlive every instance: if it died, the provider starts it
            # again at the same address (the replicas' quorum requests retry until it answers)
            self.provider.coordinator(self.job.id, self.config.min_instances)
            for e in self.pump():
                self._on_event(e)
            if self._stop_requested():
                self._end_all(Outcome.STOPPED)
                self._end_stopped()
                return
            for slot in self.slots:
                verdict = self._tend(slot)
                if verdict is not None:
                    self._end_all(Outcome.NOT_NEEDED if verdict == JobStatus.SUCCEEDED else Outcome.STOPPED)
                    if verdict == JobStatus.STOPPED:
                        self._end_stopped()
                    else:
                        self.set_status(
                            verdict, reason=None if verdict == JobStatus.SUCCEEDED else "user_error"
                        )
                    return
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
        slot.pending = self._allocate_async(n, slot.index, extra)

    def _allocate_async(self, n: int, slot: int, extra: dict[str, Any]) -> Future:
        fut: Future = Future()
        fut.cancel_event = cancel = threading.Event()  # type: ignore[attr-defined]

        def run() -> None:
            try:
                fut.set_result(self._allocate(n, cancel, extra=extra, slot=slot))
            except BaseException as exc:  # noqa: BLE001 - seen by the main loop
                fut.set_exception(exc)

        threading.Thread(target=run, name=f"spotnb-alloc-{self.job.id}-{n}", daemon=True).start()
        return fut

    def _on_event(self, e: ev.Event) -> None:
        slot = next((s for s in self.slots if s.n == e.incarnation and s.n), None)
        if slot is None:
            return
        slot.last_seen = max(slot.last_seen, time.time())
        kind = e.kind
        slot.heard = slot.heard or kind not in ("launched", "allocated", "allocating", "alloc_failed")
        if kind == "ready":
            slot.ready = True
        elif kind == "notice" and not slot.noticed:
            # the replica finishes its step and leaves; its replacement is asked for now
            slot.noticed = True
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
            instance = slot.pending.result()  # a controller bug here ends the job visibly
            slot.pending = None
            if instance is None:  # stopped, or max_wait without capacity
                return JobStatus.STOPPED if not self._succeeded else None
            slot.instance, slot.last_seen = instance, time.time()
            if self._succeeded:  # too late: the job is done
                self._finish_incarnation(slot.n, instance, _Outcome(Outcome.NOT_NEEDED))
                slot.instance = None
            return None
        if slot.instance is None:
            return None
        outcome = self._ended(slot)
        if outcome is None:
            return None
        self._finish_incarnation(slot.n, slot.instance, outcome)
        slot.instance = None
        if slot in self.slots and len(self.slots) > self.config.instances and slot.noticed:
            self.slots.remove(slot)  # its replacement was already asked for on the notice
            return None
        return self._after(slot, outcome)

    def _ended(self, slot: _Slot) -> _Outcome | None:
        """How the slot's instance ended, or None while it runs (as `Controller._watch`)."""
        instance = slot.instance
        assert instance is not None
        now = time.time()
        if now - slot.described >= self.provider.describe_interval:
            slot.described = now
            status = self.provider.describe(instance)
            if status.state in (InstanceState.EXITED, InstanceState.PREEMPTED, InstanceState.TERMINATED):
                self.pump()
                return self._classify(slot.n, instance, status)
        if slot.reported_end is not None and now - slot.reported_end > EXIT_GRACE:
            self._fence()
            self.provider.terminate(instance)
            self.pump()
            return self._classify(slot.n, instance, InstanceStatus(InstanceState.EXITED))
        limit = (
            self.config.heartbeat_timeout
            if slot.heard
            else max(self.config.heartbeat_timeout, self.provider.boot_timeout)
        )
        if now - slot.last_seen > limit:
            self._fence()
            self.provider.terminate(instance)
            return _Outcome(Outcome.LOST, detail={"why": f"no event for {limit:.0f} s"})
        return None

    def _after(self, slot: _Slot, outcome: _Outcome) -> JobStatus | None:
        """What the job does after one slot's instance ended."""
        if outcome.reason == Outcome.DONE:
            self._succeeded = True
            self._succeeded_at = self._succeeded_at or time.time()
            slot.done = True
            return None
        if self._succeeded:
            return None
        if outcome.reason in _FAILURES:
            if self.retries >= self.config.max_retries:
                return JobStatus.FAILED
            self.retries += 1
            self._refill(slot)
            return None
        if outcome.reason.is_preemption:
            self.preemptions += 1
            limit = self.config.max_preemptions
            if limit is not None and self.preemptions > limit:
                self._stop_reason = f"max_preemptions={limit} reached"
                return JobStatus.STOPPED
            cost = self.job.breakdown().total_cost  # the coordinator's on-demand spend too
            if self.config.max_cost is not None and cost >= self.config.max_cost:
                self._stop_reason = f"max_cost=${self.config.max_cost} reached (spent ${cost:.4f})"
                return JobStatus.STOPPED
            self._refill(slot)
        return None

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
                self._finish_incarnation(slot.n, slot.instance, _Outcome(Outcome.NOT_NEEDED))
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
                outcome = self._ended(slot) or _Outcome(reason)
                self._finish_incarnation(slot.n, slot.instance, outcome)
                slot.instance = None

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
    def _market(self) -> dict[str, float]:
        """The market as one replica's policy should see it: the job is lost only when every
        instance is down at once, so its MTTP is the group's (`spotnb.policy.group`)."""
        market = super()._market()
        market["instance_mttp"] = market["mttp"]
        if self._runs_script():
            # torchrun (`runtime/torchrun_group.py`): any lost instance sends every worker back
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
            orphan = instance or self._orphan(record)
            self._finish_incarnation(n, orphan, _Outcome(Outcome.LOST, detail={"why": "its controller died"}))
        self.preemptions = sum(e["kind"] == "preempted" for e in events)


def make_controller(job: Any, config: Any, provider: Any, store: Any, db: Any) -> Controller:
    """The controller for `config`: a fleet for several instances, else the one-instance one."""
    cls = FleetController if config.instances > 1 else Controller
    return cls(job, config, provider, store, db)
