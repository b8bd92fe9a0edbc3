"""Billing that tells the truth (issue 10): the ledger bills what the market bills — minimum
charges, increments, a price that changes while an instance runs — and counts both instances
of a replica move while they overlap. Each expected figure is computed here from the spans."""

from __future__ import annotations

import math
from typing import Any

import pytest

import spotnb as spot
from spotnb.core import protocol as ev
from spotnb.core.billing import CLOUD_BILLING, CONTINUOUS, Billing, charge, parse_billing
from spotnb.core.ledger import CATEGORIES, Span, compute_breakdown
from spotnb.core.protocol import Progress
from spotnb.core.state import JobState
from spotnb.market.migration import move_start
from spotnb.market.preempt import Never, Schedule
from spotnb.sim.zones import POLICIES, SimZone, simulate_zones

T0 = 1_700_000_000.0
AWS = CLOUD_BILLING["aws"]


def _span(n: int, alloc: float, end: float, spot_price: float, **kw: Any) -> Span:
    return Span(n, alloc - 1.0, alloc, alloc + 2.0, end, False, None, spot_price, 1.0, **kw)


def test_a_spot_instance_preempted_after_20_s_on_aws_is_billed_its_60_s_minimum() -> None:
    span = _span(1, T0, T0 + 20.0, 0.9, billing=AWS)
    b = compute_breakdown([span], T0 - 1.0, T0 + 20.0)
    assert b.spot_cost == pytest.approx(60.0 * 0.9 / 3600)
    # past the minimum, per second: 61.2 s is billed 62 s, not 61.2 s nor 120 s
    b = compute_breakdown([_span(1, T0, T0 + 61.2, 0.9, billing=AWS)], T0 - 1.0, T0 + 61.2)
    assert b.spot_cost == pytest.approx(math.ceil(61.2) * 0.9 / 3600)


@pytest.mark.parametrize("ran", [1.0, 1799.0, 3600.0, 3600.5, 7300.0])
def test_hourly_increments_bill_every_started_hour(ran: float) -> None:
    hourly = parse_billing("test", "1h")
    span = _span(1, T0, T0 + ran, 2.0, billing=hourly)
    b = compute_breakdown([span], T0 - 1.0, T0 + ran)
    hours = max(1, math.ceil(ran / 3600 - 1e-9))
    assert b.spot_cost == pytest.approx(hours * 2.0)


def test_increments_with_a_minimum_and_azure_s_free_partial_minute() -> None:
    billing = parse_billing("test", {"increment": "30s", "minimum": "1m"})
    for ran, expect in ((10.0, 60.0), (61.0, 90.0), (90.0, 90.0), (91.0, 120.0)):
        assert billing.billed(ran) == pytest.approx(expect)
        assert charge(T0, T0 + ran, 3.6, billing) == pytest.approx(expect * 3.6 / 3600)
    azure = CLOUD_BILLING["azure"]  # whole minutes: 6 min 45 s is billed 6 min
    assert azure.billed(6 * 60 + 45) == pytest.approx(360.0)
    assert azure.period_end(6 * 60 + 45) == pytest.approx(420.0)


def test_a_price_that_changes_while_an_instance_runs_is_billed_piecewise() -> None:
    """Allocated at $0.30/h; the zone's price drops to $0.02/h 15 s later and rises to $0.50/h
    at 40 s; the instance ends at 50 s in a 20 s-increment zone, so 60 s are billed: 15 s at
    0.30, 25 s at 0.02 and the last 20 s (10 of them after it ended) at 0.50."""
    steps = ((T0 - 100.0, 0.30), (T0 + 15.0, 0.02), (T0 + 40.0, 0.50))
    billing = Billing(20.0, 20.0)
    b = compute_breakdown([_span(1, T0, T0 + 50.0, 0.30, billing=billing, prices=steps)], T0 - 1, T0 + 50)
    expect = (15.0 * 0.30 + 25.0 * 0.02 + (billing.billed(50.0) - 40.0) * 0.50) / 3600
    assert b.spot_cost == pytest.approx(expect)
    # one price known (no steps): that price over the billed time
    b = compute_breakdown([_span(1, T0, T0 + 50.0, 0.30, billing=billing)], T0 - 1, T0 + 50)
    assert b.spot_cost == pytest.approx(billing.billed(50.0) * 0.30 / 3600)


def test_the_state_bills_the_prices_the_controller_saw_after_the_allocation() -> None:
    """A cloud instance: no schedule recorded, but the controller's `prices` looks saw its
    zone's price change while it ran; the ledger bills from each look on (a look before its
    allocation is not its price: the allocation asked a fresher one)."""
    events = [
        ev.Submitted(t=T0 - 5, name="j", provider="aws", instance_type="g4dn.xlarge", config={}),
        ev.Prices(t=T0 - 2, zones={"us-east-1a": 0.40, "us-east-1b": 0.9}),
        ev.Allocating(t=T0 - 1, incarnation=1, region="us-east-1a", attempt=1),
        ev.Allocated(
            t=T0,
            incarnation=1,
            instance_id="i-1",
            region="us-east-1a",
            instance_type="g4dn.xlarge",
            alloc_s=1.0,
            spot_price=0.30,
            on_demand_price=1.0,
            info={"billing": AWS.as_info()},
        ),
        ev.Prices(t=T0 + 100, zones={"us-east-1a": 0.10, "us-east-1b": 0.9}),
        ev.Exited(t=T0 + 130.5, incarnation=1, reason=ev.Outcome.DONE),
        ev.Status(t=T0 + 131, status=ev.JobStatus.SUCCEEDED),
    ]
    b = JobState.from_events(events).breakdown()
    assert b.spot_cost == pytest.approx((100 * 0.30 + (AWS.billed(130.5) - 100) * 0.10) / 3600)
    # a Config price is the user's: the zone's looks do not change it
    fixed = [
        dataclass_replace(e, info={**e.info, "price_fixed": True}) if isinstance(e, ev.Allocated) else e
        for e in events
    ]
    b = JobState.from_events(fixed).breakdown()
    assert b.spot_cost == pytest.approx(AWS.billed(130.5) * 0.30 / 3600)


def dataclass_replace(e: Any, **kw: Any) -> Any:
    import dataclasses

    return dataclasses.replace(e, **kw)


def test_a_replica_move_s_overlap_is_counted_on_two_lanes() -> None:
    """Two replicas (slots 0 and 1); slot 1's replica (incarnation 2) moves to incarnation 3,
    asked at 100 s, allocated at 101 s, training from 105 s; incarnation 2 leaves at 110 s.
    Both are billed in the overlap, and the instance-seconds now count both too: the total is
    2 lanes × the wall time plus the overlap lane, and each instance's alloc/prep/running time
    is its own, whatever the other does meanwhile."""
    end = T0 + 200.0
    p = Progress(step=10, compute_s=0.0)
    spans = [
        Span(1, T0, T0 + 1, T0 + 3, end, False, p, 0.5, 1.0, slot=0),
        Span(2, T0, T0 + 1, T0 + 3, T0 + 110, False, p, 0.5, 1.0, slot=1),
        Span(3, T0 + 100, T0 + 101, T0 + 105, end, False, p, 0.1, 1.0, slot=1, replaces=2),
    ]
    b = compute_breakdown(spans, T0, end)
    wall = end - T0
    overlap = (T0 + 110) - (T0 + 100)  # incarnation 3 asked → incarnation 2 gone
    assert b.total == pytest.approx(2 * wall + overlap)
    assert sum(getattr(b, c) for c in CATEGORIES) == pytest.approx(b.total)
    # each instance's whole life (asked → end) is in the instance-seconds, side by side
    assert b.total == pytest.approx(sum((s.end or end) - (s.asked or 0) for s in spans))
    assert b.alloc == pytest.approx(sum((s.allocated or 0) - (s.asked or 0) for s in spans))
    assert b.prep == pytest.approx(sum((s.ready or 0) - (s.allocated or 0) for s in spans))
    assert b.spot_cost == pytest.approx(sum(charge(s.allocated or 0, s.end or end, s.spot) for s in spans))
    # without the move's link (the old reading), the new instance's alloc and prep vanished
    # under the old one's running
    old = compute_breakdown([*spans[:2], dataclass_replace(spans[2], replaces=None)], T0, end)
    assert old.total == pytest.approx(2 * wall)
    assert b.alloc - old.alloc == pytest.approx(1.0) and b.prep - old.prep == pytest.approx(4.0)


def test_the_state_links_a_replica_move_s_new_instance_to_the_old_one() -> None:
    events: list[Any] = [
        ev.Submitted(t=T0, name="j", provider="local", instance_type="g4dn.xlarge", config={}),
    ]
    for n, slot, asked in ((1, 0, T0), (2, 1, T0), (3, 1, T0 + 100)):
        events += [
            ev.Allocating(t=asked, incarnation=n, region="zone-a", attempt=1, slot=slot),
            ev.Allocated(
                t=asked + 1,
                incarnation=n,
                instance_id=f"i-{n}",
                region="zone-a",
                instance_type="g4dn.xlarge",
                alloc_s=1.0,
                spot_price=0.5,
                on_demand_price=1.0,
            ),
            ev.Ready(t=asked + 5, incarnation=n, prep_s=4.0, step=0),
        ]
    events += [
        ev.Moving(
            t=T0 + 99,
            incarnation=2,
            from_region="zone-a",
            to_region="zone-b",
            reason="",
            saving=0.1,
            move_cost=0.01,
            slot=1,
            to_incarnation=3,
        ),
        ev.Exited(t=T0 + 110, incarnation=2, reason=ev.Outcome.MOVED),
        ev.Exited(t=T0 + 200, incarnation=1, reason=ev.Outcome.DONE),
        ev.Exited(t=T0 + 200, incarnation=3, reason=ev.Outcome.DONE),
        ev.Status(t=T0 + 200, status=ev.JobStatus.SUCCEEDED),
    ]
    st = JobState.from_events(sorted(events, key=lambda e: e.t))
    assert st.incs[3].replaces == 2
    assert st.breakdown().total == pytest.approx(2 * 200.0 + 10.0)


@pytest.mark.parametrize(
    ("billing", "words"),
    [
        ({"increment": "-5s"}, "increment must be 0 or more"),
        (-30, "increment must be 0 or more"),
        ({"increment": "30s", "minimum": -1}, "minimum must be 0 or more"),
        ({"increment": "30s", "every": "1h"}, "the keys are increment and minimum; got ['every']"),
        ({"minimum": "1m"}, "give an increment"),
        ("hourly", "increment 'hourly' is not a duration"),
        ("2d", "more than a day"),
        (True, "give a duration"),
    ],
)
def test_bad_billing_is_refused_naming_the_zone_and_the_field(billing: Any, words: str) -> None:
    with pytest.raises(ValueError) as err:
        spot.Config(local_regions={"zone-a": {"price": 0.1, "billing": billing}, "zone-b": {"price": 0.2}})
    text = str(err.value)
    assert "local_regions" in text and "zone 'zone-a'" in text and "billing" in text and words in text


def test_a_zone_s_billing_survives_the_spec_s_json_round_trip() -> None:
    import json

    cfg = spot.Config(
        local_regions={"zone-a": {"price": 0.1, "billing": {"increment": "20s", "minimum": "20s"}}}
    )
    again = spot.Config(local_regions=json.loads(json.dumps(cfg.local_regions)))
    assert again.local_zone_billing("zone-a") == Billing(20.0, 20.0)
    assert again.local_zone_billing("zone-b").increment_s == 0.0  # not given: continuously


# -- migrate="billing-aware": when to start a move ------------------------------------------------
def test_a_move_on_a_per_second_market_starts_at_once_past_the_minimum() -> None:
    assert move_start(AWS, T0, T0 + 300.0, lead_s=5.0, work_s=3600.0) == T0 + 300.0
    # within AWS's first minute the minute is paid anyway: the old one leaves just before it
    start = move_start(AWS, T0, T0 + 20.0, lead_s=5.0, work_s=3600.0)
    assert start is not None and start > T0 + 20.0 and start + 5.0 < T0 + 60.0


@pytest.mark.parametrize("elapsed", [10.0, 1800.0, 3590.0, 3700.0])
def test_an_hourly_move_is_timed_so_the_old_instance_leaves_just_before_its_hour_ends(elapsed: float) -> None:
    hourly = parse_billing("test", "1h")
    lead = 240.0
    start = move_start(hourly, T0, T0 + elapsed, lead_s=lead, work_s=10 * 3600.0)
    assert start is not None and start >= T0 + elapsed
    leave = start + lead - T0
    paid = hourly.period_end(leave)
    # it leaves in the last quarter of an hour it paid for, never past its end
    assert paid - 0.25 * 3600 <= leave < paid
    # the hour the look was in, unless the lead no longer fits in it
    assert paid == hourly.period_end(elapsed) or elapsed + lead > hourly.period_end(elapsed) - 900


def test_no_move_when_the_work_ends_within_the_paid_time() -> None:
    hourly = parse_billing("test", "1h")
    assert move_start(hourly, T0, T0 + 600.0, lead_s=60.0, work_s=1200.0) is None
    assert move_start(hourly, T0, T0 + 600.0, lead_s=60.0, work_s=7200.0) is not None


def test_billing_aware_saves_over_best_price_where_billing_is_hourly_and_equals_it_per_second() -> None:
    """Zone a at $1/h, b at $2/h dropping to $0.2/h 10 minutes in; no preemptions. best-price
    moves soon after the drop and pays the rest of a's first hour for nothing; billing-aware
    leaves a just before that hour ends. Per second, the two are the same run."""
    hourly = parse_billing("test", "1h")
    work = 5 * 3600.0

    def zones(billing: Billing) -> list[SimZone]:
        return [
            SimZone("a", [(0, 1.0)], Never(), restart=120.0, billing=billing),
            SimZone("b", [(0, 2.0), (600.0, 0.2)], Never(), restart=120.0, billing=billing),
        ]

    best = simulate_zones(zones(hourly), "best-price", work, delta=30.0, check_s=60.0)
    aware = simulate_zones(zones(hourly), "billing-aware", work, delta=30.0, check_s=60.0)
    assert best.moves == aware.moves == 1
    assert aware.cost < best.cost
    # continuous billing: the same decisions, the same bill
    best = simulate_zones(zones(CONTINUOUS), "best-price", work, delta=30.0, check_s=60.0)
    aware = simulate_zones(zones(CONTINUOUS), "billing-aware", work, delta=30.0, check_s=60.0)
    assert (aware.cost, aware.wall, aware.moves) == (best.cost, best.wall, best.moves)


def test_billing_aware_is_a_migrate_value_with_best_price_s_checks() -> None:
    with pytest.raises(ValueError, match="migrate='billing-aware' moves a running job"):
        spot.Config(migrate="billing-aware")
    cfg = spot.Config(
        migrate="billing-aware",
        regions="cheapest",
        local_regions={"zone-a": {"price": 0.1, "billing": "1h"}, "zone-b": {"price": 0.05}},
    )
    assert cfg.migrate == "billing-aware"


def test_a_price_that_flaps_around_the_boundary_costs_billing_aware_little_and_best_price_much() -> None:
    """Attack: b is cheaper for 20 minutes of every 40. Per hour, best-price takes every gap
    (15 moves, each paying the rest of an hour it leaves: 2.5 × staying's bill). billing-aware
    waits for the end of the paid hour and drops the move when the gap closes at a look before
    it; only the gaps that straddle an hour's end are taken (3 moves). Measured: +7.5 % over
    staying (the move back out of b when it turns dear again pays a started hour) — the limit
    of any policy that trusts the prices of the moment; billed continuously it is best-price."""
    hourly = parse_billing("test", "1h")
    flaps = [(0.0, 2.0)] + [(k * 1200.0, 0.2 if k % 2 else 2.0) for k in range(1, 40)]
    work = 5 * 3600.0

    def zones(billing: Billing) -> list[SimZone]:
        return [
            SimZone("a", [(0, 1.0)], Never(), restart=120.0, billing=billing),
            SimZone("b", flaps, Never(), restart=120.0, billing=billing),
        ]

    runs = {p: simulate_zones(zones(hourly), p, work, delta=30.0, check_s=60.0) for p in POLICIES[1:4]}
    stay, best, aware = runs["on-interrupt"], runs["best-price"], runs["billing-aware"]
    assert aware.moves < best.moves / 4 and aware.cost < best.cost / 2
    assert aware.cost <= 1.1 * stay.cost
    flat = {p: simulate_zones(zones(CONTINUOUS), p, work, delta=30.0, check_s=60.0) for p in POLICIES[2:4]}
    assert flat["billing-aware"] == dataclass_replace(flat["best-price"], policy="billing-aware")


def test_a_preemption_while_a_billing_aware_move_waits_is_a_relaunch_in_the_best_zone() -> None:
    """Attack: a bills by the hour, b turns cheaper at 10 min, so the move waits for the end
    of a's hour; a is preempted at 30 min meanwhile. The job relaunches in b at once (nothing
    to time: on-interrupt's relaunch) and the waiting move is gone: no move, one preemption,
    the same run as on-interrupt's."""
    hourly = parse_billing("test", "1h")

    def zones() -> list[SimZone]:
        return [
            SimZone("a", [(0, 1.0)], Schedule([1800.0]), restart=120.0, billing=hourly),
            SimZone("b", [(0, 2.0), (600.0, 0.2)], Never(), restart=120.0, billing=hourly),
        ]

    aware = simulate_zones(zones(), "billing-aware", 5 * 3600.0, delta=30.0, check_s=60.0)
    plain = simulate_zones(zones(), "on-interrupt", 5 * 3600.0, delta=30.0, check_s=60.0)
    assert (aware.moves, aware.preemptions) == (0, 1)
    assert (aware.cost, aware.wall) == pytest.approx((plain.cost, plain.wall))


def test_a_replica_move_is_timed_to_its_old_instance_s_increment_too() -> None:
    """`MoveAdvisor.due`, the fleet's gate for a replica move, on a stand-in advisor
    (the decision is arithmetic on the job's state; the fleet's real moves run in
    tests/control/test_fleet_moves.py): billing-aware waits for the end of the old instance's hour
    and says when; best-price goes at once."""
    from types import SimpleNamespace

    from spotnb.control.moves import MoveAdvisor
    from spotnb.market.placement import ZoneEstimate

    hourly = parse_billing("test", "1h")
    now = T0 + 600.0
    st = SimpleNamespace(incs={4: SimpleNamespace(allocated=T0)}, step_time=1.0, total=100_000, step=1000)
    there = ZoneEstimate("zone-b", 0.02, 10800.0, 120.0, 1.0, 1.0, 0.02)

    def stand_in(migrate: str) -> Any:
        return SimpleNamespace(
            move_at=None,
            config=SimpleNamespace(migrate=migrate),
            job=SimpleNamespace(state=st),
            store=SimpleNamespace(local=True),
            provider=SimpleNamespace(billing=lambda zone: hourly),
        )

    old = SimpleNamespace(n=4, instance=SimpleNamespace(region="zone-a"))
    move = SimpleNamespace(there=there)
    fleet = stand_in("billing-aware")
    assert MoveAdvisor.due(fleet, old.n, old.instance, move, now) is False
    assert fleet.move_at is not None and now < fleet.move_at < T0 + 3600.0
    leave = fleet.move_at + there.restart + 1.0  # its lead: the start there, a step, the poll
    assert T0 + 3600.0 - 900.0 <= leave < T0 + 3600.0
    assert MoveAdvisor.due(fleet, old.n, old.instance, move, fleet.move_at) is True
    assert MoveAdvisor.due(stand_in("best-price"), old.n, old.instance, move, now) is True


def test_a_copy_placed_before_the_controller_died_stays_in_the_bill_when_its_successor_places_again() -> None:
    """Attack: the controller copied the checkpoint to zone-b (its `checkpoint_placed` says so,
    $0.04 spent) and was SIGKILLed before writing `incarnations/0002.ckpt.json`; its successor
    places incarnation 2 again and finds the copy there ("in_place", $0). The copy's bytes
    were moved and paid: the bill keeps them. A restore read across is spent once, by the
    instance, so a later placement of the same incarnation replaces it."""
    base: list[Any] = [
        ev.Submitted(t=T0 - 5, name="j", provider="local", instance_type="g4dn.xlarge", config={}),
    ]

    def placed(t: float, action: str, cost: float, per_gb: float = 0.0) -> Any:
        return ev.CheckpointPlaced(
            t=t,
            incarnation=2,
            zone="zone-b",
            action=action,
            source="h",
            target="b",
            cost=cost,
            save_per_gb=per_gb,
        )

    copied_then_in_place = [*base, placed(T0, "copy", 0.04), placed(T0 + 5, "in_place", 0.0)]
    assert JobState.from_events(copied_then_in_place).transfer_cost == pytest.approx(0.04)
    across_twice = [*base, placed(T0, "read_across", 0.04, 0.02), placed(T0 + 5, "read_across", 0.04, 0.02)]
    assert JobState.from_events(across_twice).transfer_cost == pytest.approx(0.04)
    # a successor that had to copy again (the first copy was damaged since): both copies paid
    copy_after_copy = [*base, placed(T0, "copy", 0.04), placed(T0 + 5, "copy", 0.04)]
    assert JobState.from_events(copy_after_copy).transfer_cost == pytest.approx(0.08)


def test_an_instance_launched_but_never_recorded_as_allocated_is_still_billed() -> None:
    """Attack: the controller is SIGKILLed between `launched` and `allocated` (on a cloud the
    wait for the VM can take minutes). The instance ran: its successor reclaimed it (a cloud's)
    or killed it (the local market's orphan) and closed it. It was billed $0 — no allocation
    in the log. It is billed from its launch to its end at its zone's price; a launch that
    failed (`alloc_failed` after it: never ran) and one still waiting are not billed."""
    base: list[Any] = [
        ev.Submitted(t=T0 - 5, name="j", provider="aws", instance_type="g4dn.xlarge", config={}),
        ev.Prices(t=T0 - 2, zones={"us-east-1a": 0.40}),
        ev.Allocating(t=T0 - 1, incarnation=1, region="us-east-1a", attempt=1),
    ]

    def launched(t: float) -> Any:
        return ev.Launched(
            t=t,
            incarnation=1,
            instance_id="i-1",
            region="us-east-1a",
            instance_type="g4dn.xlarge",
            launched_at=t,
        )

    closed = ev.Exited(t=T0 + 600, incarnation=1, reason=ev.Outcome.LOST)
    ran = JobState.from_events([*base, launched(T0), closed])
    assert ran.breakdown(now=T0 + 600).spot_cost == pytest.approx(600 * 0.40 / 3600)
    failed = [
        *base,
        launched(T0),
        ev.AllocFailed(t=T0 + 30, incarnation=1, region="us-east-1a", reason="x", retry_in=0.0),
    ]
    assert JobState.from_events([*failed, closed]).breakdown(now=T0 + 600).spot_cost == 0.0
    waiting = JobState.from_events([*base, launched(T0)])
    assert waiting.breakdown(now=T0 + 60).spot_cost == 0.0
