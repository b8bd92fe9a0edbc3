"""Attacks on moving a running job (`Config.migrate="best-price"`, issue 10): prices that flap,
a store that refuses the move's writes, a move whose save fails. Real processes on the local
market where a process matters; the decision logic alone where only it is under attack."""

from __future__ import annotations

import functools
from typing import Any

from spotnb.migration import MoveGate, best_move
from spotnb.placement import rank_zones


def _ranked(prices: dict[str, float], work_s: float) -> Any:
    markets = {zone: (float("inf"), 60.0) for zone in prices}  # calm zones, a minute to start
    return rank_zones(prices, markets, work_s=work_s, save_s=5.0)


def _looks(prices_at: Any, seconds: int, work_s: float = 3600.0) -> list[tuple[int, str, str]]:
    """The controller's looks, one a second, on prices `prices_at(t)`; the job follows each
    admitted move. Returns (t, from, to) of the moves made."""
    gate, here, moves = MoveGate(), "zone-a", []
    for t in range(seconds):
        move = gate.admit(best_move(_ranked(prices_at(t), work_s), here, 5.0), float(t))
        if move is not None:
            moves.append((t, here, move.there.zone))
            here = move.there.zone
    return moves


def test_prices_that_flap_every_second_do_not_make_the_job_move_back_and_forth() -> None:
    """Attack: zone-a and zone-b swap $0.10/h and $0.30/h every second. Each look alone says
    "move" (an hour of work left, a third of the price), and before the gate the job moved at
    every chance: 13 moves in 2 minutes on the local market, its spot bill 2.7 × on-demand.
    A move pays back its save and start only if the gap lasts ~40 s here: none is made."""

    def flapping(t: int) -> dict[str, float]:
        low, high = 0.10, 0.30
        return {"zone-a": low, "zone-b": high} if t % 2 == 0 else {"zone-a": high, "zone-b": low}

    assert _looks(flapping, 600) == []
    # a gap that lasts is taken, once it has lasted the move's payback (not at the first look)
    move = best_move(_ranked({"zone-a": 0.30, "zone-b": 0.10}, 3600), "zone-a", 5.0)
    assert move is not None and 1.0 < move.payback_s < 600
    moves = _looks(lambda t: {"zone-a": 0.30, "zone-b": 0.10}, 600)
    assert len(moves) == 1 and moves[0][1:] == ("zone-a", "zone-b")
    assert move.payback_s <= moves[0][0] <= move.payback_s + 1
    # prices that flip slower than a move's payback are followed, each move paying for itself
    slow = _looks(lambda t: {"zone-a": 0.30, "zone-b": 0.10} if (t // 300) % 2 == 0 else {"zone-a": 0.10, "zone-b": 0.30}, 1200)
    assert [m[1:] for m in slow] == [("zone-a", "zone-b"), ("zone-b", "zone-a"), ("zone-a", "zone-b"), ("zone-b", "zone-a")]
