"""Hostile input for the live widget (issue 15): bad rows, odd names, the view options after
the job ended."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

from spotnb.core.state import JobState, Series
from spotnb.views.widget.synthetic import synthetic_events
from tests.support.widget_helpers import EventsJob, FakeClock, events_of


def _trace(view: Any, name: str) -> Any:
    return next(t for t in view.figure.data if t.name == name)


def _metrics(events: list[dict[str, Any]], incarnation: int | None = None) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "metrics" and incarnation in (None, e["incarnation"])]


# -- defects -------------------------------------------------------------------------------------
def test_a_text_t_in_the_rows_of_a_relaunched_instance_does_not_break_the_timeline() -> None:
    """A row whose `t` is a string (a corrupt or foreign log) is read with the event's time
    for the metric; it must not become the instance's `new_work_t`, where the timeline (live
    widget, job.plot(), the lab's job view) compares it with floats and raises."""
    from spotnb.views.widget.figures import static_figures_from_state, timeline_traces

    events = events_of(steps=200, preempt_at=(120,))
    for e in _metrics(events, incarnation=2):
        for row in e["rows"]:
            row["t"] = "soon"
    st = JobState()
    st.feed_events(events)
    assert len(st.first["loss"]) == 200  # the values themselves were read
    bars = dict(timeline_traces(st))
    assert sum(bars["tl:compute"]["x"]) > 0
    static_figures_from_state(st)["timeline"].to_json()


def test_one_row_with_an_unrepresentable_t_loses_only_its_own_time() -> None:
    """`t` of 10**400 (an int beyond float range) in one row: that row falls back to the
    event's time like any other unreadable `t`; the other 49 rows of the flush are kept."""
    events = events_of(steps=200, preempt_at=())
    _metrics(events)[0]["rows"][0]["t"] = 10**400
    st = JobState()
    st.feed_events(events)
    assert st.n_skipped == 0
    assert st.first["loss"].count == 200


def test_one_row_with_a_huge_step_does_not_drop_the_rest_of_its_flush() -> None:
    """A step of 10**400 in one row: that row is unreadable, the others of the flush are not
    (today the whole event is skipped after its first rows were folded in: half a flush)."""
    events = events_of(steps=200, preempt_at=())
    _metrics(events)[0]["rows"][3]["step"] = 10**400
    st = JobState()
    st.feed_events(events)
    assert st.first["loss"].count == 199


def test_two_finite_values_at_one_step_do_not_plot_as_infinity() -> None:
    """Every logged value is finite; the bucket mean of two values near the float maximum
    must be too (the sum overflows to inf today, and plotly draws nothing there)."""
    s = Series()
    s.add(0, 1e308, 1.0)
    s.add(0, 1e308, 2.0)
    _, ys = s.xy()
    assert all(math.isfinite(y) for y in ys) and ys == [pytest.approx(1e308)]


def test_metric_traces_with_full_smoothing_does_not_raise() -> None:
    """`metric_traces` is public (job.plot(), the lab's figures): smoothing 1.0 (a flat line)
    must draw something, not raise ZeroDivisionError in `smooth`."""
    from spotnb.views.widget.figures import metric_traces

    st = JobState()
    st.feed_events(events_of(steps=50, preempt_at=()))
    traces = dict(metric_traces(st, "step", 1.0))
    assert len(traces["s:loss"]["y"]) == 50


def test_the_view_options_still_redraw_after_the_job_ended(sent: list[Any], clock: FakeClock) -> None:
    """A finished run is where one reads curves: moving the smoothing slider or the x-axis
    toggle of a finished job's widget must redraw it (the flusher thread has returned once
    the final state was shown, so nothing draws the change today)."""
    from spotnb.views.widget.view import JobView

    view = JobView(EventsJob(events_of(steps=300, preempt_at=(200,))), interval=0.01, figure_interval=0.01)
    try:
        assert view._thread is not None
        view._thread.join(10)  # the final state is shown, the flusher done
        assert view.stop_button.disabled
        drawn = threading.Event()
        original = view.flush

        def flush(force: bool = False) -> bool:
            out = original(force)
            if len(_trace(view, "loss (smoothed)").y):
                drawn.set()
            return out

        view.flush = flush  # type: ignore[method-assign]
        view.smoothing_control.value = 0.8
        assert drawn.wait(5), "the smoothing slider of a finished job changed nothing"
    finally:
        view.close()


# -- passing: what a user relies on ---------------------------------------------------------
HOSTILE = "<img src=x onerror=alert(1)>'\"&"


def test_a_metric_name_with_html_is_escaped_in_the_info_pane() -> None:
    from spotnb.views.widget.view import render_info_html

    events = events_of(steps=30, preempt_at=())
    for e in _metrics(events):
        for row in e["rows"]:
            row[HOSTILE] = 1.0
    st = JobState()
    st.feed_events(events)
    page = render_info_html(st, "job<script>")
    assert "<img" not in page and "<script>" not in page and "onerror=alert(1)>" not in page


def test_odd_values_are_skipped_and_odd_names_plot(sent: list[Any], clock: FakeClock) -> None:
    """NaN, inf, None and strings are skipped, unicode and very long names each get a panel;
    the view draws it all without raising."""
    from spotnb.views.widget.view import JobView

    odd = ["nan", "inf", None, "x", float("nan"), float("-inf")]
    events = events_of(steps=60, preempt_at=(40,))
    for e in _metrics(events):
        for row in e["rows"]:
            row["ünï 📉"] = float(row["step"])
            row["L" * 2000] = odd[row["step"] % len(odd)] if row["step"] % 2 else 1.0
    view = JobView(EventsJob(events), autostart=False, clock=clock)
    assert view.flush(force=True)
    assert len(_trace(view, "ünï 📉").x) == 60
    assert all(math.isfinite(y) for y in _trace(view, "L" * 2000).y)


def test_a_metric_that_first_appears_late_gets_its_panel(sent: list[Any], clock: FakeClock) -> None:
    from spotnb.views.widget.view import JobView

    events = events_of(steps=100, preempt_at=())
    cut = len(events) // 2
    job = EventsJob(events[:cut])
    view = JobView(job, autostart=False, clock=clock)
    view.flush(force=True)
    late = [e for e in events[cut:] if e["kind"] == "metrics"]
    for e in late:
        for row in e["rows"]:
            row["late"] = 0.5
    view.on_events(events[cut:])
    assert view.flush(force=True)
    trace = _trace(view, "late")
    assert len(trace.x) > 0 and view.figure.layout[f"yaxis{trace.yaxis[1:]}"].title.text == "late"


def test_toggling_before_the_first_step_then_drawing(sent: list[Any], clock: FakeClock) -> None:
    """Options toggled many times while waiting for the first step, then steps arrive: the
    lines are drawn with the last choice (time axis, smoothing 0.99, even for one point)."""
    from spotnb.views.widget.view import JobView

    events = events_of(steps=40, preempt_at=(), rows_per_flush=5)
    first = next(i for i, e in enumerate(events) if e["kind"] == "metrics")
    view = JobView(EventsJob(events[:first]), autostart=False, clock=clock)
    for i in range(30):
        view.x_axis_control.value = ("time", "step")[i % 2]
        view.smoothing_control.value = (i % 100) / 100
        clock.now += 0.3
        view.flush()
    view.x_axis_control.value = "time"
    view.smoothing_control.value = 0.99
    one = dict(events[first])
    one["rows"] = one["rows"][:1]
    view.on_events([one])
    rest = dict(events[first])
    rest["rows"] = rest["rows"][1:]
    view.flush(force=True)
    assert len(_trace(view, "loss").x) == 1 and math.isfinite(_trace(view, "loss").x[0])
    view.on_events([rest, *events[first + 1 :]])
    assert view.flush(force=True)
    raw, smoothed = _trace(view, "loss"), _trace(view, "loss (smoothed)")
    assert len(smoothed.y) == len(raw.y) == 40 and all(math.isfinite(y) for y in smoothed.y)
    assert max(raw.x) < 100  # seconds since submission, not steps or epoch seconds


def test_fifty_metrics_and_replica_rows_of_a_multi_instance_job(sent: list[Any], clock: FakeClock) -> None:
    """Replica rows: only replica 0 draws; fifty metrics fill four panels, the last shared."""
    from spotnb.views.widget.view import JobView

    events = events_of(steps=40, preempt_at=())
    for e in _metrics(events):
        rows = []
        for row in e["rows"]:
            wide = {**row, **{f"m{i}": float(i) for i in range(50)}}
            rows += [{**wide, "replica": 0}, {**wide, "replica": 1, "loss": 99.0}]
        e["rows"] = rows
    view = JobView(EventsJob(events), autostart=False, clock=clock)
    assert view.flush(force=True)
    assert 99.0 not in list(_trace(view, "loss").y) and len(_trace(view, "loss").y) == 40
    titled = [view.figure.layout[f"yaxis{k}"] for k in ("", "4", "5", "6")]
    assert all(a.visible for a in titled) and "more" in titled[-1].title.text


def test_a_job_with_preemptions_and_no_metrics_waits_and_marks_nothing(
    sent: list[Any], clock: FakeClock
) -> None:
    from spotnb.views.widget.figures import WAITING
    from spotnb.views.widget.view import JobView

    events = [e for e in events_of(steps=200, preempt_at=(50, 120)) if e["kind"] != "metrics"]
    view = JobView(EventsJob(events), autostart=False, clock=clock)
    assert view.flush(force=True)
    assert view.state.preemptions == 2
    assert any(a.name == WAITING for a in view.figure.layout.annotations)


def test_events_from_another_thread_while_the_flusher_runs(sent: list[Any]) -> None:
    """A real flusher thread and a real producer thread: the final state arrives, whole."""
    from spotnb.views.widget.view import JobView

    batches = list(synthetic_events(steps=2000, preempt_at=(700,), rows_per_flush=20))
    job = EventsJob([])
    view = JobView(job, interval=0.001, figure_interval=0.001, max_rate=1e9)
    try:
        producer = threading.Thread(target=lambda: [view.on_events(b) for b in batches])
        producer.start()
        producer.join(10)
        assert view._thread is not None
        view._thread.join(10)
        assert not view._thread.is_alive()
        assert "data-status='succeeded'" in view.info.value
        xs = list(_trace(view, "loss").x)
        assert len(xs) <= view.state.max_points and xs[-1] > 1990 and xs == sorted(xs)
    finally:
        view.close()


def test_closing_the_widget_closes_every_widget_in_it(sent: list[Any], clock: FakeClock) -> None:
    """Each widget of the box holds a comm in the kernel and a model in the front end: closing
    the box (or re-running the cell) must release them all, not only the outer box."""
    import ipywidgets as widgets

    from spotnb.views.widget.view import JobView

    view = JobView(EventsJob(events_of(steps=30, preempt_at=())), autostart=False, clock=clock)
    view.flush(force=True)
    inner = [view.figure, view.info, view.stop_button, view.x_axis_control, view.smoothing_control]
    assert all(w.comm is not None for w in inner)
    view.box.close()
    assert all(w.comm is None for w in inner)
    assert all(w.layout.comm is None for w in inner if isinstance(w.layout, widgets.Widget))


def test_a_metric_name_like_a_hover_template_is_shown_as_written() -> None:
    """A name containing plotly's template syntax (`%{y}`) is the metric's name, not a field:
    the hover names the trace by its name rather than pasting the name into the template."""
    from spotnb.views.widget.figures import metric_traces

    events = events_of(steps=20, preempt_at=())
    for e in _metrics(events):
        for row in e["rows"]:
            row["acc %{y} %{x:.0f}"] = 0.5
    st = JobState()
    st.feed_events(events)
    for key, spec in metric_traces(st, "step", 0.5):
        if key.endswith("acc %{y} %{x:.0f}"):
            assert spec["name"].startswith("acc %{y} %{x:.0f}")
            assert "acc %{y}" not in spec["hovertemplate"]


def test_a_long_metric_name_is_cut_in_its_axis_title(sent: list[Any], clock: FakeClock) -> None:
    from spotnb.views.widget.figures import TITLE_CHARS
    from spotnb.views.widget.view import JobView

    long = "validation/" + "very_long_metric_name_" * 10
    events = events_of(steps=20, preempt_at=())
    for e in _metrics(events):
        for row in e["rows"]:
            row[long] = 1.0
    view = JobView(EventsJob(events), autostart=False, clock=clock)
    assert view.flush(force=True)
    trace = _trace(view, long)
    title = view.figure.layout[f"yaxis{trace.yaxis[1:]}"].title.text
    assert title.startswith("validation/very_long") and len(title) == TITLE_CHARS


def test_rows_without_a_job_start_plot_from_zero_on_the_time_axis() -> None:
    """A state folded from metrics alone (a log that begins mid-job): the wall-time axis
    starts at the first logged time, not at 1.8e9 epoch seconds."""
    from spotnb.views.widget.figures import metric_traces

    st = JobState()
    st.feed_events(_metrics(events_of(steps=50, preempt_at=())))
    assert st.job_start is None
    xs = dict(metric_traces(st, "time"))["m:loss"]["x"]
    assert xs[0] == 0 and 0 < xs[-1] < 1000
