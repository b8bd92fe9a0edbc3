"""What the widget and the job's views say tells the truth about the job: where each preemption
was, what the job costs per hour now, which seconds are instance-seconds, where a recompute is,
the newest events in view, and dollars that stay dollars (no MathJax)."""

from __future__ import annotations

import re
from typing import Any

from spotnb.core.state import JobState
from spotnb.views.html_safe import NO_MATH
from spotnb.views.widget.synthetic import synthetic_events
from spotnb.views.widget.text import progress_line
from spotnb.views.widget.view import render_info_html
from tests.support.widget_helpers import events_of

T0 = 1.7e9


def ev(kind: str, t: float, n: int = 0, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "t": T0 + t, "incarnation": n, **fields}


def three_instances(noticed_evacuates: bool = True) -> list[dict[str, Any]]:
    """A job on three instances (slots 0, 1, 2 = incarnations 1, 2, 3) whose replicas log
    their own rows (only replica 0's are the job's series); #3 gets a notice at step 142,
    saves, leaves, and its `preempted` event carries no step (as the fleet writes it)."""
    out = [ev("submitted", 0, name="three", provider="local", instance_type="g4dn.xlarge", config={})]
    for n in (1, 2, 3):
        out += [
            ev("allocating", 0.1, n, region="local", slot=n - 1, attempt=1),
            ev(
                "allocated",
                1.0,
                n,
                instance_id=f"i-{n}",
                region="local",
                instance_type="g4dn.xlarge",
                spot_price=0.158,
                on_demand_price=0.526,
                alloc_s=0.9,
            ),
            ev("ready", 2.0, n, step=0, prep_s=1.0),
        ]
    out.append(ev("status", 2.0, status="running"))
    for step in range(0, 143):
        for n in (1, 2, 3):
            out.append(
                ev("metrics", 2.0 + step * 0.05, n, rows=[{"step": step, "loss": 1.0, "replica": n - 1}])
            )
    out += [
        ev("notice", 9.0, 3, deadline=T0 + 20, source="local", time_left=10.0),
        ev("evacuating", 9.1, 3, step=142),
        ev("evacuated", 9.2, 3, step=142),
        ev(
            "preempted",
            9.3,
            3,
            instance_id="i-3",
            lifetime_s=8.3,
            how="evacuated" if noticed_evacuates else None,
        ),
    ]
    return out


def test_a_replica_preempted_without_a_step_is_drawn_at_the_step_it_reached() -> None:
    state = JobState.from_events(three_instances())
    step, hover, _ = state.preempt_marks[-1]
    assert 140 <= step <= 142, (step, hover)  # not at step 0
    assert "#3" in hover


def test_the_hourly_rate_is_every_instance_held_now() -> None:
    events = three_instances()
    state = JobState.from_events(events[: events.index(next(e for e in events if e["kind"] == "notice"))])
    assert state.hourly_rate() == 3 * 0.158
    cost = state.cost()
    assert cost["instances_now"] == 3 and abs(cost["hourly"] - 0.474) < 1e-9
    html = render_info_html(state, "job")
    assert "now $0.474/h for 3 instances" in html and "per instance" in html
    state.feed_events(events[len(events) - 1 :])  # #3 preempted: two left
    assert abs(state.hourly_rate() - 2 * 0.158) < 1e-9
    state.feed_events([ev("status", 30.0, status="succeeded")])
    assert state.hourly_rate() == 0.0


def test_the_hourly_rate_follows_each_zones_price_schedule() -> None:
    events = [
        ev("submitted", 0, name="z", provider="local", instance_type="g4dn.xlarge", config={}),
        ev("allocating", 0.1, 1, region="zone-b", slot=0, attempt=1),
        ev(
            "allocated",
            1.0,
            1,
            instance_id="i-1",
            region="zone-b",
            instance_type="g4dn.xlarge",
            spot_price=0.30,
            on_demand_price=0.526,
            info={"price_schedule": [[T0 + 5, 0.02]]},
        ),
        ev("status", 1.0, status="running"),
    ]
    state = JobState.from_events(events)
    assert state.hourly_rate(now=T0 + 2) == 0.30
    assert state.hourly_rate(now=T0 + 6) == 0.02


def test_seconds_of_a_job_on_several_instances_are_said_to_be_instance_seconds() -> None:
    state = JobState.from_events(three_instances())
    b = state.breakdown()
    assert b.lanes == 3 and b.unit == "instance-s"
    table = b.table()
    assert "instance-s" in table and "3 instances side by side" in table and "instance-min" in table
    assert "instance-min of training on 3 instances" in state.cost()["savings_baseline"]
    one = JobState.from_events(events_of(steps=300, preempt_at=(150,))).breakdown()
    assert one.lanes == 1 and "instance-" not in one.table()


def _replay_until(predicate: Any) -> JobState:
    state = JobState()
    for batch in synthetic_events(steps=1000, preempt_at=(450,), save_every=100, rows_per_flush=10):
        state.feed_events(batch)
        if predicate(state):
            return state
    raise AssertionError("the stream never reached the state looked for")


def test_progress_moves_through_a_recompute_and_says_so() -> None:
    """After a kill at step 450 the replacement resumes from 400 and redoes 400→450: the
    progress line says so, with its own progress, and keeps a pace (tqdm keeps moving)."""
    state = _replay_until(lambda s: s.recomputing() is not None and s.front_step() >= 420)
    first, current, end = state.recomputing() or (0, 0, 0)
    assert first == 400 and 420 <= current < end and 445 <= end <= 451
    html = render_info_html(state, "job")
    shown = re.search(r"data-step='(\d+)'", html)
    assert shown and int(shown.group(1)) == current  # the step it is at, not the high-water mark
    assert f"recomputing {first}→{end}" in html
    assert "recomputing" in progress_line(state)
    rate, _eta = state.pace()
    assert rate is not None and rate > 0
    later = _replay_until(lambda s: s.front_step() > 500)
    assert later.recomputing() is None and "recomputing" not in render_info_html(later, "job")


def test_the_newest_event_is_in_view_in_the_feed() -> None:
    state = JobState.from_events(events_of(steps=300, preempt_at=(150,)))
    html = render_info_html(state, "job")
    feed = html[html.index("class='spotnb-feed'") :]
    assert "flex-direction:column-reverse" in feed.split(">", 1)[0]  # starts scrolled to its end
    lines = re.findall(r"spotnb-feed-line'><code>\s*([\d.]+)s", feed)
    assert lines == sorted(lines, key=float) and len(lines) > 3  # oldest first, newest last


def test_every_html_spotnb_shows_is_shielded_from_mathjax() -> None:
    from spotnb.views.plan_view import Plan

    state = JobState.from_events(events_of(steps=300, preempt_at=(150,)))
    info = render_info_html(state, "job")
    plan = Plan({"provider": "local", "requests": [], "bootstrap": "echo $0.10/h"})._repr_html_()
    for page in (info, plan):
        root = re.match(r"<div class='([^']*)'", page)
        assert root and set(NO_MATH.split()) <= set(root.group(1).split()), page[:120]


def test_a_progress_report_with_an_impossible_step_is_skipped_not_fatal_to_the_view() -> None:
    """Found by fuzzing the folds: one `progress` event claiming step 10**400 (a corrupt log, a
    foreign writer) made every refresh of the info pane raise OverflowError, so the widget
    stopped updating for good. It is skipped like a metric row with such a step."""
    events = events_of(steps=300, preempt_at=(150,))
    next(e for e in events if e["kind"] == "progress")["step"] = 10**400
    state = JobState.from_events(events)
    assert state.n_skipped >= 1 and state.step == 300
    assert "step 300/300" in render_info_html(state, "job") and "300/300" in progress_line(state)
