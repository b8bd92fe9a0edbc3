"""The job widget without a browser: state folding, figures, the text view, and the ipywidgets
composite driven through a recording comm (every message the front end would get is kept)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from spotnb.core.state import JobState, Series
from spotnb.views.widget.synthetic import synthetic_events
from tests.support.widget_helpers import EventsJob, FakeClock, events_of


# -- state ---------------------------------------------------------------------------------
def test_series_keeps_at_most_max_points_and_the_mean() -> None:
    s = Series(max_points=100)
    for step in range(100_000):
        s.add(step, float(step))
    xs, ys = s.xy()
    assert len(xs) <= 100 and s.count == 100_000
    assert xs == pytest.approx(ys)  # mean of step == mean of value here
    assert xs[0] < xs[-1] and xs[-1] > 99_000


def test_series_skips_non_finite_values() -> None:
    s = Series()
    s.add(0, float("nan"))
    s.add(1, 1.0)
    assert s.xy() == ([1.0], [1.0])


def test_recomputed_steps_are_kept_apart_from_first_time_steps() -> None:
    st = JobState()
    st.feed_events(events_of(steps=1000, preempt_at=(450, 820), save_every=100))
    first_x, _ = st.first["loss"].xy()
    assert first_x == sorted(first_x) and len(first_x) == len(set(first_x))  # each step once
    redo = {n: s.xy()[0] for n, s in st.redo["loss"].items()}
    assert redo[2] == [float(x) for x in range(400, 450)]  # from the checkpoint to the kill
    assert redo[3] == [float(x) for x in range(800, 820)]
    assert [m[0] for m in st.preempt_marks] == [449, 819]
    assert [m[0] for m in st.resume_marks] == [400, 800]
    assert st.status == "succeeded"


def test_state_breakdown_does_not_depend_on_how_events_arrive() -> None:
    """The live view folds events as they trickle in; `job.breakdown()` of a finished job sees
    them all at once: both must report the same figures (one reducer since issue 12)."""
    events = events_of(steps=2000, preempt_at=(450, 1230), rows_per_flush=20)
    whole = JobState.from_events(events)
    trickled = JobState()
    for i in range(0, len(events), 7):
        trickled.feed_events(events[i : i + 7])
    assert whole.breakdown().as_dict() == pytest.approx(trickled.breakdown().as_dict())
    assert whole.breakdown().preemptions == 2 and whole.breakdown().compute > 0


def test_million_step_job_stays_small() -> None:
    st = JobState()
    for batch in synthetic_events(
        steps=1_000_000, preempt_at=(305_000,), save_every=10_000, rows_per_flush=5000
    ):
        st.feed_events(batch)
    assert st.first["loss"].count + sum(s.count for s in st.redo["loss"].values()) == 1_005_000
    assert len(st.first["loss"]) <= st.max_points


def test_cost_projection_and_savings() -> None:
    events = events_of(steps=1000, preempt_at=())
    half = [e for e in events if e["t"] <= events[0]["t"] + 1.5 + 500 * 0.01]
    st = JobState()
    st.feed_events(half)
    c = st.cost(st.breakdown(now=half[-1]["t"]))
    assert 0 < c["spot"] < c["projected"]  # still running: more to come
    st.feed_events(events[len(half) :])
    done = st.cost()
    assert done["projected"] == done["spot"] and 0 < done["spot"] < done["on_demand"]
    assert 0 < done["savings"] < 1


# -- figures -------------------------------------------------------------------------------
def test_static_figures_have_the_three_panels() -> None:
    from spotnb.views.widget import static_figures

    figs = static_figures(EventsJob(events_of(steps=600, preempt_at=(450,))))
    assert set(figs) == {"metrics", "timeline", "breakdown"}
    names = {t.name for t in figs["metrics"].data}
    assert {"loss", "loss (recomputed)", "recomputed steps", "preempted", "resumed"} <= names
    tl = {t.name: t for t in figs["timeline"].data}
    assert len(tl["compute"].y) == 2 and len(tl["recompute"].y) == 1 and len(tl["killed"].x) == 1
    bd = {t.name: t.x[0] for t in figs["breakdown"].data}
    assert bd["recompute"] > 0 and bd["compute"] > bd["recompute"]
    figs["timeline"].to_json()  # serialisable for export


# -- the widget through a recording comm ---------------------------------------------------
def _trace(view: Any, name: str) -> Any:
    return next(t for t in view.figure.data if t.name == name)


def test_view_shows_metrics_markers_cost_and_status(sent: list[Any], clock: FakeClock) -> None:
    from spotnb.views.widget.view import JobView

    job = EventsJob(events_of(steps=600, preempt_at=(450,)))
    view = JobView(job, autostart=False, clock=clock)
    assert view.flush(force=True) is True  # finished job: final state shown
    assert len(_trace(view, "loss").x) == 600 and len(_trace(view, "loss (recomputed)").x) == 50
    assert list(_trace(view, "preempted").x) == [449, 449, None]
    assert "data-status='succeeded'" in view.info.value
    assert "data-spot='0.000" in view.info.value and "less than on demand" in view.info.value
    assert view.stop_button.disabled
    updates = [d for _, _, d in sent if d and d.get("method") == "update"]
    assert any("_py2js_update" in d["state"] for d in updates)
    assert any("_py2js_addTraces" in d["state"] for d in updates)


def test_view_sends_at_most_ten_messages_a_second_at_5000_steps_a_second(
    sent: list[Any], clock: FakeClock
) -> None:
    """5,000 steps/s for 20 simulated seconds, flush attempted every 10 ms (far more often than
    the real flusher runs): every one-second window holds ≤ 10 front-end messages, and the
    final state still arrives."""
    from spotnb.views.widget.view import JobView

    view = JobView(None, autostart=False, clock=clock)
    opened = len(sent)
    batches = list(
        synthetic_events(
            steps=100_000, preempt_at=(40_000,), step_time=0.0002, rows_per_flush=50, save_every=5000
        )
    )
    t_first = batches[0][0]["t"]
    finished = False
    for batch in batches:
        clock.now = 1000.0 + batch[-1]["t"] - t_first
        view.on_events(batch)
        finished = view.flush()
    for _ in range(100):  # drain: the budget frees up with time
        if finished:
            break
        clock.now += 0.1
        finished = view.flush()
    assert finished
    stamps = [t for t, _, _ in sent[opened:]]
    span = stamps[-1] - stamps[0]
    assert span > 15
    worst = max(sum(1 for s in stamps if a <= s < a + 1.0) for a in stamps)
    assert worst <= 10, worst
    assert len(_trace(view, "loss").x) <= view.state.max_points
    assert "data-status='succeeded'" in view.info.value


def test_feed_collapses_periodic_checkpoints_and_keeps_preemptions() -> None:
    from spotnb.views.widget.view import render_info_html

    st = JobState()
    st.feed_events(events_of(steps=3000, preempt_at=(450,), save_every=50))
    page = render_info_html(st, "job-1")
    assert "✖ PREEMPTED" in page and "relaunched" in page and "(×" in page


def test_failed_job_shows_the_remote_traceback(sent: list[Any], clock: FakeClock) -> None:
    from spotnb.views.widget.view import JobView

    view = JobView(EventsJob(events_of(steps=600, preempt_at=(), fail_at=300)), autostart=False, clock=clock)
    assert view.flush(force=True)
    assert "data-status='failed'" in view.info.value
    assert "spotnb-traceback" in view.info.value and "RuntimeError: boom" in view.info.value


def test_stop_button_stops_the_job(sent: list[Any], clock: FakeClock) -> None:
    from spotnb.views.widget.view import JobView

    events = events_of(steps=600, preempt_at=())
    job = EventsJob(events[:5])
    view = JobView(job, autostart=False, clock=clock)
    view.flush(force=True)
    assert not view.stop_button.disabled
    job.stop = lambda wait=True: setattr(job, "stopped", True)  # type: ignore[method-assign]
    view.stop_button.click()
    assert view.stop_button.disabled
    for thread in __import__("threading").enumerate():
        if thread.name == "spotnb-stop":
            thread.join(5)
    assert job.stopped


# -- text view ----------------------------------------------------------------------------
def test_text_view_prints_the_story() -> None:
    from spotnb.views.widget.text import TextView

    out = io.StringIO()
    job = EventsJob([])
    view = TextView(job, file=out, interval=0.0)
    for batch in synthetic_events(steps=600, preempt_at=(450,)):
        view.on_events(batch)
    text = out.getvalue()
    assert "allocated local-0001" in text and "PREEMPTED" in text and "relaunched" in text
    assert "[####" in text and "loss" in text
    last = text.strip().splitlines()[-1]
    assert "succeeded" in last and "600/600" in last and "less than on demand" in last


def test_job_widget_falls_back_to_text_outside_a_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    from spotnb.views.widget import TextView, in_kernel, job_widget

    assert not in_kernel()
    view = job_widget(EventsJob(events_of(steps=300, preempt_at=())))
    assert isinstance(view, TextView)
    assert "succeeded" in capsys.readouterr().out
    assert repr(view) == "job-1 summary"


def test_import_spotnb_stays_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, spotnb; spotnb.Job; "
        "print(any(m.split('.')[0] in ('plotly', 'ipywidgets') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_failed_job_says_its_error_first_and_once() -> None:
    from spotnb.views.widget.view import render_info_html

    st = JobState()
    st.feed_events(events_of(steps=100, preempt_at=(), fail_at=40))
    html = render_info_html(st, "job-1")
    assert "RuntimeError: RuntimeError" not in html
    assert html.count("<b>RuntimeError: boom</b>") == 1
    assert html.index("RuntimeError: boom") < html.index("spotnb-feed")  # above the feed
    assert st.cost()["savings"] is None and "no savings figure" in html  # a failed job saved nothing


def test_the_metrics_panel_says_it_waits_then_draws_and_the_bar_is_labelled(
    sent: list[Any], clock: FakeClock
) -> None:
    from spotnb.views.widget.figures import WAITING
    from spotnb.views.widget.view import JobView

    events = events_of(steps=300, preempt_at=())
    before = [e for e in events if e["kind"] not in ("metrics", "progress")]
    job = EventsJob(before[:3])
    view = JobView(job, autostart=False, clock=clock)
    waiting = next(a for a in view.figure.layout.annotations if a.name == WAITING)
    assert waiting.visible is not False and not view.figure.layout.yaxis.showticklabels
    view = JobView(EventsJob(events), autostart=False, clock=clock)
    view.flush(force=True)
    assert not [a for a in view.figure.layout.annotations if a.name == WAITING and a.visible is not False]
    assert view.figure.layout.yaxis.showticklabels
    labels = [t.text[0] for t in view.figure.data if t.type == "bar" and t.text and t.text[0]]
    assert any(label.startswith("compute") and "%" in label for label in labels)


def _two_metric_events() -> list[dict[str, Any]]:
    """A job that logs a cross-entropy above 1 and an accuracy in [0, 1], preempted once."""
    events = events_of(steps=300, preempt_at=(200,))
    for e in events:
        for row in e.get("rows") or ():
            row["accuracy"] = min(1.0, row["step"] / 300)
            row["loss"] = 2.5 - row["step"] / 300
    return events


def test_each_metric_has_its_own_panel_and_axis(sent: list[Any], clock: FakeClock) -> None:
    """A cross-entropy above 1 must not flatten an accuracy: one y-axis per metric, stacked
    on the shared step axis, named after its metric, in the live widget and the static figure."""
    from spotnb.views.widget import static_figures
    from spotnb.views.widget.view import JobView

    view = JobView(EventsJob(_two_metric_events()), autostart=False, clock=clock)
    view.flush(force=True)
    fig = view.figure
    loss, acc = _trace(view, "loss"), _trace(view, "accuracy")
    assert loss.yaxis != acc.yaxis and loss.xaxis == acc.xaxis == "x"
    layout = fig.layout
    loss_axis, acc_axis = (layout[f"yaxis{t.yaxis[1:]}"] for t in (loss, acc))
    assert loss_axis.title.text == "loss" and acc_axis.title.text == "accuracy"
    assert acc_axis.domain[1] < loss_axis.domain[0]  # stacked, not overlaid: loss on top, accuracy below
    assert layout.xaxis.anchor == acc.yaxis  # the step ticks under the bottom panel
    # every panel (loss, lr, accuracy) gets the preemption mark, on its own hidden axis
    marks = [t for t in fig.data if t.legendgroup == "preempt"]
    assert len(marks) == len(view.state.metric_names) == 3 and all(len(t.x) == 3 for t in marks)
    assert sum(bool(t.showlegend) for t in marks) == 1  # one legend entry
    static = static_figures(EventsJob(_two_metric_events()))["metrics"]
    assert {t.yaxis for t in static.data if t.name in ("loss", "accuracy")} == {loss.yaxis, acc.yaxis}


def test_metrics_past_the_fourth_share_the_last_panel_with_a_legend() -> None:
    from spotnb.views.widget.figures import MAX_PANELS, metric_panels, metric_traces

    st = JobState()
    st.metric_names = [f"m{i}" for i in range(6)]
    assert metric_panels(st) == [["m0"], ["m1"], ["m2"], ["m3", "m4", "m5"]] and MAX_PANELS == 4
    st = JobState()
    st.feed_events(events_of(steps=50, preempt_at=()))
    shown = {spec["name"]: spec["showlegend"] for key, spec in metric_traces(st) if key.startswith("m:")}
    assert shown == {"loss": False, "lr": False}  # alone in its panel: the axis title names it
    many = JobState()
    many.feed_events(events_of(steps=20, preempt_at=()))
    for row in (r for e in events_of(steps=20, preempt_at=()) for r in e.get("rows") or ()):
        many.feed_events(
            [
                {
                    "kind": "metrics",
                    "t": row["t"],
                    "incarnation": 1,
                    "rows": [{**row, **{f"m{i}": i for i in range(50)}}],
                }
            ]
        )
    traces = dict(metric_traces(many))
    assert not any(traces[f"m:m{i}"]["showlegend"] for i in range(50))  # 49 entries would bury it
    from spotnb.views.widget.figures import metric_axes

    title = metric_axes(many, (0.0, 1.0), "step", 0.05)["yaxis6"]["title"]["text"]
    assert title.endswith("+46 more") and len(title) < 40


def test_the_user_can_smooth_the_lines_and_plot_them_by_wall_time(sent: list[Any], clock: FakeClock) -> None:
    """TensorBoard's two view options, above the figure: smoothing (the raw line fades behind
    a debiased moving average) and a wall-time x-axis (the timeline's seconds since submission)."""
    from spotnb.views.widget.figures import smooth
    from spotnb.views.widget.view import JobView

    assert smooth([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])  # debiased: no pull to 0
    noisy = [float(i % 2) for i in range(200)]
    assert max(smooth(noisy, 0.9)[50:]) - min(smooth(noisy, 0.9)[50:]) < 0.2
    view = JobView(EventsJob(_two_metric_events()), autostart=False, clock=clock)
    view.flush(force=True)
    steps = list(_trace(view, "loss").x)
    assert not list(_trace(view, "loss (smoothed)").x)
    view.smoothing_control.value = 0.8
    view.x_axis_control.value = "time"
    clock.now += 5
    view.flush(force=True)
    raw, smoothed = _trace(view, "loss"), _trace(view, "loss (smoothed)")
    assert raw.opacity < 1 and list(smoothed.x) == list(raw.x) and len(smoothed.y) == len(raw.y)
    assert list(smoothed.y) != list(raw.y)
    t0 = view.state.job_start
    times = list(raw.x)
    assert times != steps and all(0 <= t <= view.state.now() - t0 for t in times)
    assert times == sorted(times)
    kill_t = view.state.preempt_marks[0][2] - t0
    assert list(_trace(view, "preempted").x)[:2] == [kill_t, kill_t]
    assert view.figure.layout.xaxis.title.text == "" and any(
        "seconds since submission" in (a.text or "") for a in view.figure.layout.annotations
    )
    view.x_axis_control.value = "step"
    clock.now += 5
    view.flush(force=True)
    assert list(_trace(view, "loss").x) == steps


def test_preparation_is_one_number_in_the_feed_and_the_timeline() -> None:
    from spotnb.views.widget.figures import timeline_traces
    from spotnb.views.widget.text import event_text

    events = events_of(steps=200, preempt_at=())
    for e in events:
        if e["kind"] == "ready":
            e["prep_s"] = 0.25  # the agent counts from its process start, after the boot
    st = JobState()
    st.feed_events(events)
    inc = st.incs[1]
    ready = next(e for e in st.feed if e.kind == "ready")
    prep = inc.ready - inc.allocated
    assert prep > 0.5 and ready.prep_s == pytest.approx(prep)
    assert f"after {prep:.1f} s prep" in event_text(ready)
    bars = dict(timeline_traces(st))["tl:prep"]
    assert sum(bars["x"]) == pytest.approx(prep)  # the timeline draws the same preparation


def test_the_figure_module_wraps_plotlys_render_or_leaves_an_unknown_bundle_alone() -> None:
    """The widget's figure module is a small loader (ready at once, so anywidget's 2 s model
    timeout cannot drop the plot's messages) that loads plotly's own module, wrapped with a
    refitting `render` (the browser tests check the widths and the replayed messages); a plotly
    release with another export line gets its module back unchanged rather than a broken one."""
    from spotnb.views.widget.responsive import ResponsiveFigureWidget, _plotly_esm, wrap_render

    stock = _plotly_esm()
    wrapped = ResponsiveFigureWidget._esm
    assert wrapped != stock and "ResizeObserver(" in wrapped and "_responsiveChartHandler()" in wrapped
    # exactly one default export remains, and plotly's named exports are kept
    assert wrapped.count("export default") == 1 and "as FigureView" in wrapped
    assert ResponsiveFigureWidget()._config["responsive"] is True
    changed = stock.replace(" as FigureView,", " as PlotView,")
    assert wrap_render(changed) == changed


def test_a_metrics_figure_without_metrics_says_so_instead_of_empty_axes() -> None:
    from spotnb.views.widget.figures import static_figures_from_state

    st = JobState()
    st.feed_events(events_of(steps=300, preempt_at=())[:3])  # launched, no step logged yet
    fig = static_figures_from_state(st)["metrics"]
    assert [a.text for a in fig.layout.annotations] == ["no metrics logged yet"]
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False


def test_the_widgets_text_repr_never_walks_the_live_figure(
    sent: list[Any], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`job` as a cell's last line displays the widget, and ipywidgets makes its text/plain
    part with `repr(box)`, which reprs every child. A plotly figure's repr deep-copies its whole
    dict while the job's feed thread updates that dict: the cell failed with "RuntimeError:
    dictionary changed size during iteration" (tutorial 08, once in a rehearsal). The repr must
    not read the figure at all, so no update can race it."""
    from plotly.basedatatypes import BaseFigure

    from spotnb.views.widget.view import JobView

    job = EventsJob(events_of(steps=600, preempt_at=(450,)))
    view = JobView(job, autostart=False, clock=clock)
    view.flush(force=True)

    def walked(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("repr walked the live figure")

    monkeypatch.setattr(BaseFigure, "to_plotly_json", walked)
    monkeypatch.setattr(BaseFigure, "to_dict", walked)
    text = repr(view.box)
    assert "JobWidget" in text and "figure" in text
    assert view.box._repr_mimebundle_()["text/plain"]
