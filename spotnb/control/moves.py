"""The move advisor: when a running job, or one replica of a fleet, moves to a cheaper zone
(`Config.migrate` = "best-price" or "billing-aware").

Both controllers hold one `MoveAdvisor`. It looks at the candidate zones' prices, ranks them
with the job's `ZonePlanner`, weighs a move (`spotnb.market.migration`: `best_move` for one
instance, `best_replica_move` for a replica) behind a `MoveGate` (a move must stay worth
making for its payback time), times it to the end of a billing increment with
"billing-aware" (`move_start`), says so (`moving`) and asks the old instance to leave
(`incarnations/<n>.move`, read by the agent every `move_poll(store)` seconds).

The controllers keep the mechanics of their own loop (the one-instance controller allocates
the new instance, then asks; the fleet allocates it as an extra slot that joins the group);
the advisor keeps the decision and its state (`gate`, `move_at`: a billing-aware move's
planned start).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from spotnb.core import protocol as ev
from spotnb.core.store import Store
from spotnb.market.migration import Move, MoveGate, best_move, best_replica_move, move_start
from spotnb.market.transfer import checkpoint_bytes, transfer_to
from spotnb.providers.base import Instance, Provider

if TYPE_CHECKING:
    from spotnb.control.planner import PlannerHost, ZonePlanner
    from spotnb.job import Job
    from spotnb.settings.config import Config

__all__ = ["MOVE_POLL", "MOVE_POLL_REMOTE", "MoveAdvisor", "move_poll"]

# how often an instance looks for the controller's request to move (Config.migrate="best-price")
MOVE_POLL = 0.2
MOVE_POLL_REMOTE = 5.0

K = TypeVar("K")


def move_poll(store: Store) -> float:
    """Seconds between an instance's looks for a request to move (or, in a fleet, to save)."""
    return MOVE_POLL if store.local else MOVE_POLL_REMOTE


class MoveAdvisor:
    """Whether, where and when the job (or one of its replicas) moves; see the module docstring."""

    def __init__(
        self,
        host: PlannerHost,
        job: Job,
        config: Config,
        provider: Provider,
        store: Store,
        planner: ZonePlanner,
        log: logging.LoggerAdapter,
    ) -> None:
        self.host, self.job, self.config, self.provider = host, job, config, provider
        self.store, self.planner, self.log = store, planner, log
        self.gate = MoveGate()  # a move must stay worth making for its payback time
        self.move_at: float | None = None  # migrate="billing-aware": a move's planned start

    def prices(self, n: int = 0) -> dict[str, Any] | None:
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
        self.planner.note_prices(prices, n)
        return prices

    def abandon(self, now: float) -> None:
        """A move could not be made: the next one waits a whole payback again."""
        self.gate.admit(None, now)

    def request_move(self, n: int, to: str | None, incarnation: int) -> bool:
        """Ask incarnation `n` to save and leave for `to` (`incarnations/<n>.move`, its
        successor `incarnation`); False when the store refused it (ask again next poll)."""
        self.host.fence()  # a controller that lost the job must not move its instance
        try:
            self.store.write_bytes(
                self.store.job(self.job.id, "incarnations", f"{n:04d}.move"),
                json.dumps({"to": to, "incarnation": incarnation, "t": time.time()}).encode(),
            )
        except OSError as exc:  # the store refused it (full, briefly down): ask again next poll
            # (a store that refuses everything for good ends the job through the event writes)
            self.log.warning(
                "job %s: could not ask incarnation %d to move (%r); asking again", self.job.id, n, exc
            )
            return False
        return True

    # -- one instance --------------------------------------------------------------------------
    def consider(self, n: int, instance: Instance) -> str | None:
        """The zone to move incarnation `n` to now (`spotnb.market.migration`), announced; None:
        stay. Without a known remaining work (no total, no step time yet) there is no saving
        to weigh, so the job stays."""
        st = self.job.state
        if not (st.total and st.step_time) or not instance.region:
            return None
        inc = st.incs.get(n)
        if inc is not None and inc.notice is not None:  # it is leaving anyway: a relaunch, not a move
            self.move_at = None
            return None
        prices = self.prices(n)
        if prices is None or instance.region not in prices or len(prices) < 2:
            return None
        ranked = self.planner.rank({zone: p.spot for zone, p in prices.items()})
        saves = st.checkpoints[-10:]
        save_s = sum(c.snapshot_s + c.upload_s for c in saves) / len(saves) if saves else None
        timed = self.config.migrate == "billing-aware"
        now = time.time()
        move = self.gate.admit(best_move(ranked, instance.region, save_s), now, keep=timed)
        planned, self.move_at = self.move_at, None
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
                self.move_at = start
                return None
            self.gate.reset()  # started: the next move waits its own payback, as best-price's
        self.host.emit(
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
        market = self.planner.market_now or self.host.market()
        alloc = sum(allocs) / len(allocs) if allocs else market["restart"]
        step = st.step_time or 0.0
        lead = alloc + move_poll(self.store) + step + (save_s or 0.0) + 2 * self.store.poll_interval
        work = max(0, int(st.total or 0) - int(st.step)) * step
        return move_start(self.provider.billing(instance.region), inc.allocated, now, lead, work)

    def ask_to_move(
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
            self.host.emit(
                ev.JobWarning(
                    message=f"the move to {zone} is abandoned ({why}); the job stays in {instance.region}"
                ),
                n,
            )
            return None, None
        inc = self.job.state.incs.get(n)
        if inc is not None and "notice" in inc.kinds:
            return pre, None  # a notice came first: the new instance is its replacement
        if not self.request_move(n, zone, n + 1):
            return pre, zone
        return pre, None

    # -- one replica of several ----------------------------------------------------------------
    def consider_replica(self, live: Iterable[tuple[K, str | None]]) -> tuple[K, Move] | None:
        """The replica worth moving now and its move (`best_replica_move` through the gate),
        once the remaining work is known: of the replicas that train (`live`: each one's key
        and zone), the one whose move saves the most."""
        st = self.job.state
        live = list(live)
        if not (st.total and st.step_time) or not live:
            return None
        prices = self.prices()
        if prices is None or len(prices) < 2:
            return None
        ranked = self.planner.rank({zone: p.spot for zone, p in prices.items()})
        # the old replica is billed until it sees the request and ends its step
        leave_s = float(st.step_time) + move_poll(self.store) + self.store.poll_interval
        nbytes, _ = checkpoint_bytes(st)
        best: tuple[K, Move] | None = None
        for key, here in live:
            if here not in prices:
                continue
            peer = transfer_to(
                self.provider.zone_location(here), self.provider.zone_location(ranked[0].zone), nbytes, True
            )
            move = best_replica_move(ranked, here, leave_s, peer.gb * peer.per_gb, peer.seconds)
            if move is not None and (best is None or move.saving > best[1].saving):
                best = (key, move)
        admitted = self.gate.admit(best[1] if best else None, time.time(), keep=True)
        return (best[0], admitted) if best is not None and admitted is not None else None

    def due(self, n: int, instance: Instance | None, move: Move, now: float) -> bool:
        """Whether the move of incarnation `n`'s replica (on `instance`) may start now: at once,
        except with migrate="billing-aware", which starts it so that the old instance leaves
        just before the end of its billing increment (`migration.move_start`; its lead: the new
        instance's start and heal and the old one's leave), and not at all when the group's
        work ends within the paid time."""
        self.move_at = None
        if self.config.migrate != "billing-aware" or instance is None:
            return True
        st = self.job.state
        inc = st.incs.get(n)
        if inc is None or inc.allocated is None:
            return True
        step = st.step_time or 0.0
        lead = move.there.restart + step + move_poll(self.store)
        work = max(0, int(st.total or 0) - int(st.step)) * step
        start = move_start(self.provider.billing(instance.region), inc.allocated, now, lead, work)
        if start is not None and start <= now:
            return True
        self.move_at = start
        return False
