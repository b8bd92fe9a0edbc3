"""When a running job should move to another zone (`Config.migrate="best-price"`).

DeepSpotCloud's *best price* heuristic, on the expected costs of `spotnb.market.placement`: with W
seconds of work left, staying costs what the work costs here (`rank_zones`' estimate without
the first start: the job already runs here); moving costs what the work costs there, plus the
move itself — the save before leaving (δ at this zone's price: training pauses for it) and the
new instance's start (its restart time at the new price, in the new zone's estimate) — plus
moving the checkpoint there (`ZoneEstimate.restore_cost`: its bytes × the egress $/GB from
the store's region, `spotnb.market.transfer`; the store stays where it is and the new zone reads it,
and the estimates of both zones already count the saves written back across). The job moves
when

    saving = stay − (there + δ·p_here)  >  MIN_GAIN · stay

i.e. when the expected saving over the remaining work exceeds the cost of the move by a margin
(prices wobble; a move for 1 % is noise and a chain of such moves costs more than it saves).

That weighs the prices of one moment as if they held for the rest of the work. Prices that
flap between zones (every second on an adversarial local market, every few minutes on a cloud)
would have the job move back and forth, paying a save and a start each time while every move's
saving lasts only until the next flip (measured: 13 moves in 2 minutes, the spot bill 2.7 ×
the on-demand one). So `MoveGate` admits a move only once it has been worth making at every look
for its payback time — the time the saving takes to pay for the move (`Move.payback_s`): a gap
that has lasted that long is taken to last as long again, and a gap shorter than a move's
payback could not have paid for it anyway.

The payback alone still chases prices that flip slower than it but faster than a move is worth:
two replicas, zone prices swapping $0.02/$0.30 every 6 s, a payback of ~1 s: 8 moves in 46 s,
back and forth. So the gate also keeps the history of its looks — which zone it paid to be in,
and from when (the move's target, or the zone the job is in when no move is worth making): a
*spell* of a zone lasts from one flip to the next, counted in looked-at seconds (an interval
between looks longer than `GAP_LOOKS` usual ones, plus the lead of a move admitted at its
start, counts as that much: what happened in a gap, prices unknown, is not taken as a spell
going on). Once both zones of a move
have `FLAP_SPELLS` spells in the last `FLAP_WINDOW_S` (a zone that flipped once is judged by
the payback alone), their usual (median) lengths, weighed by the saving a move to each made
(`Move.rate`, $/s), say what a move is worth per cycle of the two: staying here loses the
target's spells (its length × its saving); moving there for good loses the other zone's;
chasing loses, at each flip, the wait (a payback and a look), the move's time (`Move.lead_s`:
the job is still in the dear zone) and the move itself (another payback). The move is made if
staying here loses more than the better of the other two by `FLAP_MARGIN` (the costs a move
does not price: the hand-over's pause, the wall time, a start that fails). Otherwise only once
the target's current spell has outlasted `FLAP_OUTLAST` × its usual one (the pattern broke: a
zone that became cheaper for good is moved to, that much later). The
wait says why (`MoveGate.waiting`, logged once a spell: "waiting: zone-b flipped 10 times in
the last 60 s ...; it must stay cheaper for 12 s (so far 5 s)") and the admitted move's reason
says what it outlasted. Measured: `python benchmarks/bench_migration.py --flapping`
(`benchmarks/MIGRATION.md`).

A job on several instances (`Config.instances > 1`) moves one replica at a time
(`best_replica_move`): the new instance joins the live group and receives the state from a
peer, so nothing is saved to the store and nobody pauses; the old replica trains on until the
new one has committed a step, then leaves the quorum. Its terms, with W the group's remaining
wall time, R the new instance's start there (allocation, preparation, the state's transfer
from the peer) and L the old one's last step and goodbye: staying bills W here; moving bills
R + L here (the old replica still trains while the new one starts) and W there (the new one
from its allocation to the end), plus the state's bytes from the peer's zone. So

    saving = (p_here − p_there)·W − p_here·(R + L) − bytes·$/GB

and `Move.cost` is what the overlap spends beyond staying: the new instance billed idle while it
starts (p_there·R), the old one's leave (p_here·L) and the bytes. The same gate and payback
apply.

Billing boundaries (DeepSpotCloud's third heuristic, `Config.migrate="billing-aware"`): a
market that bills in increments (`spotnb.core.billing`: an hour, 30 s, Azure's whole minutes)
charges the rest of a started increment whether the instance stays or not. So a move that
pays is started (`move_start`) so that the old instance leaves just before the end of the
increment it is in: the allocation of the new instance starts its lead time earlier (its
allocation and the old one's leave: the request, a step, the save, measured), plus a margin
against a late leave (crossing the boundary would buy a whole increment). The decision is
best-price's (the same `best_move` behind the same gate, kept while the wait lasts: a look
that no longer finds the move drops it), and a job whose remaining work ends within the paid
increment does not move at all (staying costs nothing more). On a per-second market after its
minimum (AWS, GCP) the start is now: it behaves exactly like best-price. A preemption has
nothing to time: the relaunch goes to the best zone at once, as with on-interrupt.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from dataclasses import dataclass, replace

from spotnb.core.billing import Billing
from spotnb.market.placement import NOMINAL_SAVE, ZoneEstimate

__all__ = [
    "FLAP_MARGIN",
    "FLAP_OUTLAST",
    "FLAP_SPELLS",
    "FLAP_WINDOW_S",
    "MIN_GAIN",
    "MOVING_POLICIES",
    "Move",
    "MoveGate",
    "best_move",
    "best_replica_move",
    "move_start",
]

log = logging.getLogger("spotnb.market.migration")

#: the `Config.migrate` values that move a running job
MOVING_POLICIES = ("best-price", "billing-aware")

#: the share of staying's expected cost a move must save, after paying for itself
MIN_GAIN = 0.05

#: how far back (s) the gate judges a zone's flips, and how many of its last spells it keeps
FLAP_WINDOW_S = 3600.0
FLAP_MEMORY = 8
#: spells of each zone (in the window) before their lengths are judged; fewer: the payback alone
FLAP_SPELLS = 1
#: a flapping target's usual spell must beat what chasing it loses, or the other zone's usual
#: spell (moving there for good), by this factor: the costs a move does not price (the pause
#: while it hands over, the wall time, a start that fails) and spells measured to a look
FLAP_MARGIN = 1.1
#: ... or its current spell must outlast its usual one this many times (the flapping stopped)
FLAP_OUTLAST = 2.0
#: an interval between looks counts as at most this many usual intervals (a gap is unknown)
GAP_LOOKS = 3.0


@dataclass(frozen=True)
class Move:
    """A move worth making: from `here` to `there`, saving `saving` $ net of `cost` $."""

    here: ZoneEstimate
    there: ZoneEstimate
    stay: float  # $ the remaining work is expected to cost here
    cost: float  # $ of the move: the save here, the start there and moving the checkpoint
    saving: float  # $ expected to be saved by moving, the move paid
    payback_s: float = 0.0  # seconds the saving, at its rate, takes to pay for the move
    replica: bool = False  # one replica of several: it joins from a peer, nothing is saved
    lead_s: float = 0.0  # seconds from the move's start to the job running there
    rate: float = 0.0  # $/s the move saves while the gap lasts (what pays it back)
    note: str = ""  # what the gate weighed beyond the payback (flapping prices), for the feed

    def reason(self) -> str:
        """The two zones' terms in words, for the event feed."""
        note = f"; {self.note}" if self.note else ""
        if self.replica:
            return (
                f"{self.there.zone} at ${self.there.spot:.3f}/h against ${self.here.spot:.3f}/h here: "
                f"this replica's remaining work is expected to cost ${self.stay:.4f} here and "
                f"${self.stay - self.saving:.4f} moved, of which the move itself ${self.cost:.4f} "
                "(the new instance's start and its join from a peer, the old one's last step"
                + (", the state's transfer" if self.there.restore_cost else "")
                + "; nothing is saved)"
                + note
            )
        return (
            f"{self.there.zone} at ${self.there.spot:.3f}/h against ${self.here.spot:.3f}/h here: "
            f"the remaining work is expected to cost ${self.stay:.4f} here and "
            f"${self.stay - self.saving - self.cost:.4f} there, and the move ${self.cost:.4f} "
            "(a save here, a start there"
            + (f", the checkpoint moved ${self.there.restore_cost:.4f}" if self.there.restore_cost else "")
            + ")"
            + note
        )


def _known(ranked: list[ZoneEstimate]) -> list[ZoneEstimate]:
    """The zones whose expected cost is a number (a price that is NaN or infinite is unknown:
    such a zone is neither a move's target nor a reason to stay)."""
    return [z for z in ranked if math.isfinite(z.cost)]


def best_move(ranked: list[ZoneEstimate], here: str | None, save_s: float | None) -> Move | None:
    """The move to make now, if any. `ranked`: `rank_zones` over the candidate zones with the
    job's remaining work; `here`: the zone the job runs in; `save_s`: the time of one save
    (snapshot + upload; None: not measured yet). A zone whose price is not a number is left
    out; one here is no move (nothing to weigh)."""
    ranked = _known(ranked)
    current = next((z for z in ranked if z.zone == here), None)
    if current is None or not ranked or ranked[0].zone == here:
        return None
    there = ranked[0]
    delta = save_s if save_s is not None and save_s >= 0 else NOMINAL_SAVE
    # no new start nor restore to pay here
    stay = current.cost - current.spot * current.restart / 3600.0 - current.restore_cost
    start_there = there.spot * there.restart / 3600.0 + there.restore_cost
    work_there = there.cost - start_there
    cost = current.spot * delta / 3600.0 + start_there
    saving = stay - work_there - cost
    if not saving > MIN_GAIN * stay:  # NaN-safe
        return None
    # the gross saving accrues over the work's wall time here: its rate pays the move back
    wall_here = max(1.0, current.hours * 3600.0 - current.restart)
    rate = (stay - work_there) / wall_here
    return Move(current, there, stay, cost, saving, cost / rate, lead_s=there.restart + delta, rate=rate)


def best_replica_move(
    ranked: list[ZoneEstimate],
    here: str | None,
    leave_s: float,
    peer_bytes_cost: float = 0.0,
    peer_s: float = 0.0,
) -> Move | None:
    """The move to make now for one replica of a job on several instances, if any (see the
    module's docstring for the terms). `ranked`: `rank_zones` with the group's remaining wall
    time as the work; `here`: the replica's zone; `leave_s`: seconds the old replica is billed
    after the new one committed its first step (it finishes its step and leaves);
    `peer_bytes_cost` / `peer_s`: the state's copy from a peer's zone to the new one ($, s),
    which replaces the store restore that `ranked` priced."""
    ranked = _known(ranked)
    current = next((z for z in ranked if z.zone == here), None)
    if current is None or not ranked or ranked[0].zone == here:
        return None
    there = ranked[0]
    store_s = there.transfer.seconds if there.transfer.restore_first else 0.0
    start_s = max(0.0, there.restart - store_s) + max(0.0, peer_s)  # allocation, prep, the heal
    stay = current.cost - current.spot * current.restart / 3600.0 - current.restore_cost
    work_there = there.cost - there.spot * there.restart / 3600.0 - there.restore_cost
    # the group's work during the new instance's start is still done here, at this price
    overlap_here = current.spot * (start_s + max(0.0, leave_s)) / 3600.0
    moving = work_there + overlap_here + peer_bytes_cost
    saving = stay - moving
    if not saving > MIN_GAIN * stay:  # NaN-safe
        return None
    cost = there.spot * start_s / 3600.0 + current.spot * max(0.0, leave_s) / 3600.0 + peer_bytes_cost
    wall_here = max(1.0, current.hours * 3600.0 - current.restart)
    rate = (stay - work_there) / wall_here
    estimate = replace(there, restore_cost=peer_bytes_cost)
    lead = start_s + max(0.0, leave_s)
    return Move(current, estimate, stay, cost, saving, cost / rate, replica=True, lead_s=lead, rate=rate)


class MoveGate:
    """Hysteresis for `best_move`: a move is made only when every look for its payback time
    (`Move.payback_s`) found it worth making, to the same zone from the same zone; a look that
    finds no move, or another one, starts the wait over. And, once the zones' prices flap, only
    when their spells say that moving pays (see the module's docstring); `waiting` says why a
    move that paid back still waits. `hysteresis=False`: the payback rule alone (the rule before
    the history; `benchmarks/bench_migration.py --flapping` compares them)."""

    def __init__(self, hysteresis: bool = True) -> None:
        self.hysteresis = hysteresis
        self._wanted: tuple[str, str, float] | None = None  # (here, there, since)
        self._home: str | None = None  # the zone the job is in, as far as the looks tell
        self._spell: list | None = None  # [zone it pays to be in, since, looked-at seconds]
        self._spells: dict[str, deque[tuple[float, float]]] = {}  # zone → (ended, seconds)
        self._rates: dict[str, deque[tuple[float, float]]] = {}  # zone → (t, $/s a move there saves)
        self._flips: deque[float] = deque()  # when the zone it pays to be in changed
        self._last: float | None = None  # the last look
        self._gaps: deque[float] = deque(maxlen=16)  # the intervals between looks
        self._moving = 0.0  # the lead of the move admitted at the last look: no look meanwhile
        self._said: tuple[str, float] | None = None  # the spell whose wait was logged
        #: why the move this look found still waits beyond its payback (None: it does not)
        self.waiting: str | None = None

    def admit(self, move: Move | None, now: float, keep: bool = False) -> Move | None:
        """`move`: this look's `best_move`; returns it once it has held for its payback (and,
        on flapping prices, once the spells say it pays).
        `keep`: the wait is not started over once a move is admitted, for the replicas of a
        job on several instances, which move one at a time between the same two zones: the gap
        that held for the first one's payback admits the next at the next look that still
        finds it (a look that does not, or the next move's longer payback, still waits)."""
        self._look(move, now)
        self.waiting = None
        if move is None:
            self._wanted = None
            return None
        key = (move.here.zone, move.there.zone)
        if self._wanted is None or self._wanted[:2] != key:
            self._wanted = (*key, now)
        if now - self._wanted[2] < move.payback_s:
            return None
        held = self._flapping(move, now)
        if held is not None:
            wait, _ = held
            self.waiting = wait
            spell = (move.there.zone, self._spell[1]) if self._spell else None
            if wait:
                if spell != self._said:  # once a spell
                    self._said = spell
                    log.info("%s", wait)
                return None
            move = replace(move, note=held[1])
        if not keep:
            self._wanted = None
        self._home = move.there.zone
        self._moving = max(0.0, move.lead_s)
        return move

    def reset(self) -> None:
        """Start the wait over: a move admitted with `keep` (a billing-aware one, waiting for
        its increment's end) was started, so the next one waits its own payback."""
        self._wanted = None

    # -- the history of the looks ---------------------------------------------------------
    def _look(self, move: Move | None, now: float) -> None:
        """One look: which zone it pays to be in now (the move's target, else the job's zone),
        its spell's looked-at time, and a flip if that zone changed."""
        best = move.there.zone if move is not None else self._home
        if move is not None:
            self._home = move.here.zone
            rates = self._rates.setdefault(move.there.zone, deque(maxlen=4 * FLAP_MEMORY))
            rates.append((now, move.rate))
        counted = 0.0
        if self._last is not None:
            dt = max(0.0, now - self._last)
            counted = dt
            if len(self._gaps) >= 3:  # a move just admitted explains its own time without looks
                counted = min(dt, GAP_LOOKS * statistics.median(self._gaps) + self._moving)
            self._gaps.append(dt)
        self._moving = 0.0
        self._last = max(now, self._last) if self._last is not None else now
        if self._spell is not None:
            self._spell[2] += counted
        if best is None:
            return
        if self._spell is None:
            self._spell = [best, now, 0.0]
            return
        if best != self._spell[0]:
            zone, _, seconds = self._spell
            self._spells.setdefault(zone, deque(maxlen=FLAP_MEMORY)).append((now, seconds))
            self._flips.append(now)
            self._spell = [best, now, 0.0]
        while self._flips and self._flips[0] < now - FLAP_WINDOW_S:
            self._flips.popleft()

    def _usual(self, zone: str, now: float) -> float | None:
        """The median length of `zone`'s spells in the window; None: too few to judge."""
        spells = [s for end, s in self._spells.get(zone, ()) if end >= now - FLAP_WINDOW_S]
        return statistics.median(spells) if len(spells) >= FLAP_SPELLS else None

    def _gap(self, zone: str, now: float) -> float | None:
        """The median $/s that moves to `zone` saved while it was the cheaper one (None: no
        move to it seen in the window: the job sat there through its spells)."""
        rates = [r for t, r in self._rates.get(zone, ()) if t >= now - FLAP_WINDOW_S and r > 0]
        return statistics.median(rates) if rates else None

    def _flapping(self, move: Move, now: float) -> tuple[str, str] | None:
        """None: the spells have nothing to say (too few, or the look is not in the target's
        spell). Else (wait, note): `wait` says why the move waits (empty: it is made), `note`
        what the admitted move outlasted."""
        if not self.hysteresis or self._spell is None or self._spell[0] != move.there.zone:
            return None
        there, here = move.there.zone, move.here.zone
        usual, other = self._usual(there, now), self._usual(here, now)
        if usual is None or other is None:
            return None
        # $ lost per cycle of the two zones' spells: staying here loses the target's spells'
        # gap; staying there the other's; chasing, at each spell's start, the wait (a payback
        # and the look that sees it), the move's time and the move itself (another payback)
        gap_there = self._gap(there, now) or move.rate or 1.0  # unknown: the spells' lengths alone
        gap_here = self._gap(here, now) or gap_there
        look = statistics.median(self._gaps) if self._gaps else 0.0
        per_move = 2.0 * move.payback_s + look + max(0.0, move.lead_s)
        stay_here, stay_there = usual * gap_there, other * gap_here
        chase = per_move * (gap_there + gap_here)
        if stay_here > FLAP_MARGIN * min(stay_there, chase):
            return None  # its spells are long (or deep) enough to pay for chasing, or staying there
        need = FLAP_OUTLAST * usual
        seconds = self._spell[2]
        flips = len(self._flips)
        span = now - self._flips[0] if self._flips else 0.0
        history = (
            f"{there} flipped {flips} times in the last {span:.0f} s (cheaper ~{usual:.0f} s at a "
            f"time, {here} ~{other:.0f} s)"
        )
        if seconds >= need:
            return "", f"{history}; it has stayed cheaper {seconds:.0f} s, over {need:.0f} s"
        return (
            f"waiting: {history}: neither chasing it (a move takes {move.lead_s:.1f} s and pays "
            f"back in {move.payback_s:.1f} s) nor staying there pays; it must stay cheaper for "
            f"{need:.0f} s (so far {seconds:.0f} s)",
            "",
        )


def move_start(
    billing: Billing, allocated: float, now: float, lead_s: float, work_s: float | None = None
) -> float | None:
    """When to start a move (wall time; `now` or earlier: at once) so that the instance
    allocated at `allocated` leaves just before the end of an increment it paid for. `lead_s`:
    seconds from the start of the move to the old instance's end (the new instance's
    allocation, the old one's leave). `work_s`: the remaining work's wall time; None when the
    work ends within the time already paid (then moving saves nothing: the job stays).

    Per-second billing past its minimum starts at once (best-price's timing). The target is
    the end of the current increment less a margin (`lead_s`, at least 1 s, at most a quarter
    of the increment); a look a little past the start still starts at once if half the margin
    is left; an end too close to reach is skipped for the next."""
    elapsed = max(0.0, now - allocated)
    paid = billing.period_end(elapsed)
    if work_s is not None and elapsed + max(0.0, work_s) <= paid:
        return None
    inc = billing.increment_s
    if inc <= 1.0 and elapsed >= billing.minimum_s:
        return now
    margin = min(0.25 * inc, max(1.0, lead_s)) if inc > 0 else 0.0
    start = allocated + paid - margin - lead_s
    if start >= now:
        return start
    if now + lead_s <= allocated + paid - margin / 2:
        return now  # a look a little late: it still leaves within the increment, half the margin kept
    if inc <= 1.0 or inc <= margin + lead_s:
        return now  # the minimum is too near, or increments too short to time: at once
    while start < now:  # too late for this increment's end: the next one's
        paid += inc
        start = allocated + paid - margin - lead_s
    if work_s is not None and elapsed + max(0.0, work_s) <= paid:
        return None  # done before that increment ends: it is paid whether the job moves or not
    return start
