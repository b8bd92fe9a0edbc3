"""The zones' spot prices over time (issue 10's widget part): the controller's `prices`
events drawn over the instance timeline on a $/h axis, in the live widget and in the static
figures (`job.plot()`, the lab's job view), and bad `prices` events that must not break them."""

from __future__ import annotations

from typing import Any

from spotnb.core.state import MAX_PRICE_ZONES, JobState
from spotnb.views.widget.figures import LIVE_PRICE_AXIS, PRICE_KEY, static_figures_from_state, timeline_traces
from tests.support.widget_helpers import EventsJob, FakeClock, events_of


def _with_prices(events: list[dict[str, Any]], *zones: dict[str, Any]) -> list[dict[str, Any]]:
    """The events with `prices` events spread over the job's time."""
    t0, t1 = events[0]["t"], events[-1]["t"]
    out = list(events)
    for i, z in enumerate(zones):
        t = t0 + (t1 - t0) * i / max(1, len(zones))
        out.append({"kind": "prices", "t": t, "incarnation": 0, "zones": z, "source": "test"})
    return sorted(out, key=lambda e: e["t"])


def test_each_zone_is_a_step_line_over_the_timeline_to_the_end_of_the_job() -> None:
    events = _with_prices(
        events_of(steps=100, preempt_at=(60,)), {"a": 0.10, "b": 0.30}, {"a": 0.10, "b": 0.02}
    )
    st = JobState.from_events(events)
    lines = {k: v for k, v in timeline_traces(st) if k.startswith(PRICE_KEY)}
    assert set(lines) == {f"{PRICE_KEY}a", f"{PRICE_KEY}b"}
    b = lines[f"{PRICE_KEY}b"]
    assert b["y"][:2] == [0.30, 0.02] and b["line"]["shape"] == "hv"
    assert b["x"][-1] >= b["x"][1]  # drawn on to the end of the job
    assert b["text"][-1] == "b" and "%{fullData.name}" in b["hovertemplate"]
    fig = static_figures_from_state(st)["timeline"]
    # a band of their own above the lanes (not drawn across them), ticked at the zones' prices
    assert fig.layout.yaxis2.visible is True and fig.layout.yaxis2.overlaying is None
    assert fig.layout.yaxis2.domain[0] > fig.layout.yaxis.domain[1]
    assert list(fig.layout.yaxis2.tickvals) == [0.02, 0.10, 0.30]
    assert list(fig.layout.yaxis2.ticktext) == ["$0.02", "$0.10", "$0.30"]
    assert [t.yaxis for t in fig.data if t.name in ("a", "b")] == ["y2", "y2"]


def test_a_job_without_prices_has_no_price_axis() -> None:
    st = JobState.from_events(events_of(steps=40, preempt_at=()))
    assert not [k for k, _ in timeline_traces(st) if k.startswith(PRICE_KEY)]
    assert static_figures_from_state(st)["timeline"].layout.yaxis2.visible is False


def test_the_live_widget_draws_the_prices_on_its_own_axis(sent: list[Any], clock: FakeClock) -> None:
    from spotnb.views.widget.view import JobView

    events = _with_prices(
        events_of(steps=100, preempt_at=()), {"zone-a": 0.1, "zone-b": 0.3}, {"zone-b": 0.05}
    )
    view = JobView(EventsJob(events), autostart=False, clock=clock)
    assert view.flush(force=True)
    lines = [t for t in view.figure.data if t.name in ("zone-a", "zone-b")]
    assert (
        len(lines) == 2
        and {t.yaxis for t in lines} == {LIVE_PRICE_AXIS}
        and {t.xaxis for t in lines} == {"x2"}
    )
    axis = view.figure.layout[f"yaxis{LIVE_PRICE_AXIS[1:]}"]
    lanes = view.figure.layout.yaxis2
    assert axis.visible is True and axis.overlaying is None and axis.domain[0] > lanes.domain[1]
    assert list(axis.tickvals) == [0.05, 0.1, 0.3]  # the zones' prices, not plotly's round numbers


def test_bad_prices_events_are_skipped_not_drawn() -> None:
    """Not a mapping, non-numbers, infinities, booleans, hundreds of zones: the state keeps
    the finite prices of the first zones and the figures draw."""
    events = _with_prices(
        events_of(steps=40, preempt_at=()),
        {"a": "cheap", "b": float("inf"), "c": True, "d": None, "e": 0.5},
        {f"z{i}": 0.1 for i in range(500)},
        {f"y{i}": 0.1 for i in range(500)},
    )
    events.append({"kind": "prices", "t": events[-1]["t"], "incarnation": 0, "zones": ["a", 1.0]})
    st = JobState.from_events(events)
    assert st.zone_prices["e"][0][1] == 0.5
    assert not {"a", "b", "c", "d"} & set(st.zone_prices)
    assert len(st.zone_prices) == MAX_PRICE_ZONES
    static_figures_from_state(st)  # draws
