"""Plotly trace and figure builders, from a `JobState` only (no widgets, no job, no kernel).

Each panel is a list of `(key, trace_dict)`; the key is stable for the life of the job so the
live widget can map it to a trace index and send only changed data. `static_figures` wraps the
same traces into standalone `go.Figure`s for export (`job.plot()`), so the live view and the
exported figures cannot disagree.
"""

from __future__ import annotations

from typing import Any

from spotnb import palette
from spotnb.ledger import Breakdown
from spotnb.state import Incarnation, JobState, describe_kill

__all__ = [
    "metric_traces",
    "timeline_traces",
    "breakdown_traces",
    "static_figures_from_state",
    "PANELS",
    "COLORS",
    "CATEGORY_COLORS",
    "format_bytes",
    "UNIFORM_TEXT",
]

PANELS = ("metrics", "timeline", "breakdown")
COLORS = palette.METRICS
CATEGORY_COLORS = {key: color for key, (color, _label) in palette.CATEGORIES.items()}
PREEMPT_COLOR = palette.MARKS["preempt"]
RESUME_COLOR = palette.MARKS["resume"]
Trace = tuple[str, dict[str, Any]]
#: labels on bars are one size or absent: one that does not fit is hidden, not shrunk to a smudge
UNIFORM_TEXT = {"mode": "hide", "minsize": 10}


def format_bytes(n: float | None) -> str:
    n = float(n or 0)
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _vlines(marks: list[tuple[int, str]]) -> tuple[list[Any], list[Any], list[Any]]:
    """Vertical segments on the [0, 1] marker axis, as one trace (None breaks the line)."""
    xs: list[Any] = []
    ys: list[Any] = []
    text: list[Any] = []
    for step, hover in marks:
        xs += [step, step, None]
        ys += [0.0, 1.0, None]
        text += [hover, hover, None]
    return xs, ys, text


def metric_traces(state: JobState) -> list[Trace]:
    """One line per metric (first-time steps), the same metric's recomputed steps as a dotted,
    marked line, and preemption / resume markers as vertical lines on a hidden [0, 1] axis."""
    out: list[Trace] = []
    for i, name in enumerate(state.metric_names):
        color = COLORS[i % len(COLORS)]
        s = state.first[name]
        x, y = s.xy()
        out.append(
            (
                f"m:{name}",
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": name,
                    "legendgroup": name,
                    "x": x,
                    "y": y,
                    "line": {"color": color, "width": 1.6},
                    "hovertemplate": f"{name} %{{y:.4g}}<br>step %{{x:.0f}}<extra></extra>",
                },
            )
        )
        rx: list[Any] = []
        ry: list[Any] = []
        for _, seg in sorted(state.redo.get(name, {}).items()):
            sx, sy = seg.xy()
            if rx:
                rx.append(None)
                ry.append(None)
            rx += sx
            ry += sy
        out.append(
            (
                f"r:{name}",
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": f"{name} (recomputed)",
                    "legendgroup": name,
                    "x": rx,
                    "y": ry,
                    "visible": True if rx else "legendonly",
                    "line": {"color": palette.MARKS["redo"], "width": 1.4, "dash": "dot"},
                    "marker": {"size": 4, "color": palette.MARKS["redo"], "symbol": "circle-open"},
                    "hovertemplate": f"{name} %{{y:.4g}} (recomputed)<br>step %{{x:.0f}}<extra></extra>",
                },
            )
        )
    px, py, pt = _vlines(state.preempt_marks)
    out.append(
        (
            "preempt",
            {
                "type": "scatter",
                "mode": "lines",
                "name": "preempted",
                "x": px,
                "y": py,
                "yaxis": "y2",
                "text": pt,
                "hovertemplate": "%{text}<extra></extra>",
                "line": {"color": PREEMPT_COLOR, "width": 2, "dash": "dash"},
                "visible": True if px else "legendonly",
            },
        )
    )
    rx2, ry2, rt = _vlines(state.resume_marks)
    out.append(
        (
            "resume",
            {
                "type": "scatter",
                "mode": "lines",
                "name": "resumed",
                "x": rx2,
                "y": ry2,
                "yaxis": "y2",
                "text": rt,
                "hovertemplate": "%{text}<extra></extra>",
                "line": {"color": RESUME_COLOR, "width": 1.5, "dash": "dot"},
                "visible": True if rx2 else "legendonly",
            },
        )
    )
    return out


def _inc_label(inc: Incarnation) -> str:
    bits = [f"#{inc.n}", inc.instance_id or "…"]
    where = ", ".join(b for b in (inc.region, inc.instance_type) if b)
    return f"{' '.join(bits)} ({where})" if where else " ".join(bits)


def _hover_inc(inc: Incarnation, what: str, a: float, b: float) -> str:
    lines = [f"<b>{_inc_label(inc)}</b>", f"{what}: {b - a:.2f} s"]
    if inc.spot_price is not None:
        lines.append(f"spot ${inc.spot_price:.3f}/h")
    if inc.from_step is not None:
        lines.append(f"resumed from step {inc.from_step}")
    if inc.boundary is not None and inc.boundary >= 0 and what.startswith("recompute"):
        lines.append(f"redoing steps ≤ {inc.boundary}")
    if inc.end_how:
        lines.append(f"ended: {inc.end_how}")
    return "<br>".join(lines)


def timeline_traces(state: JobState, now: float | None = None) -> list[Trace]:
    """One horizontal bar per incarnation (per instance slot on a job with several), split into
    alloc / prep / recompute / compute / save (explicit `base`, seconds since submission), with
    notice, kill and checkpoint markers."""
    t0 = state.job_start or 0.0
    now = state.now() if now is None else now
    segs: dict[str, dict[str, list[Any]]] = {
        c: {"y": [], "base": [], "x": [], "text": []}
        for c in ("alloc", "prep", "recompute", "compute", "save")
    }

    # a job on several instances: one lane per instance slot, its incarnations one after another
    lanes = len({inc.slot for inc in state.incs.values()}) > 1

    def lane(inc: Incarnation) -> str:
        # short: the axis labels set the left margin of every panel (the hover has the rest)
        if lanes:
            return f"instance {inc.slot}"
        return f"#{inc.n} {inc.instance_type}" if inc.instance_type else f"#{inc.n}"

    def seg(cat: str, inc: Incarnation, a: float | None, b: float | None, what: str) -> None:
        if a is None or b is None or b <= a:
            return
        d = segs[cat]
        d["y"].append(lane(inc))
        d["base"].append(a - t0)
        d["x"].append(b - a)
        d["text"].append(_hover_inc(inc, what, a, b))

    notice: dict[str, list[Any]] = {"x": [], "y": [], "text": []}
    kill: dict[str, list[Any]] = {"x": [], "y": [], "text": []}
    ckpt: dict[str, list[Any]] = {"x": [], "y": [], "text": []}
    for n in sorted(state.incs):
        inc = state.incs[n]
        end = inc.end if inc.end is not None else now
        seg("alloc", inc, inc.allocating, inc.allocated or end, "allocation")
        seg("prep", inc, inc.allocated, inc.ready or end, "preparation (start, imports, restore)")
        if inc.ready is not None:
            redo = inc.boundary is not None and inc.from_step is not None and inc.boundary >= inc.from_step
            split = (inc.new_work_t or end) if redo else inc.ready
            seg("recompute", inc, inc.ready, min(split, end), "recompute (steps lost to a preemption)")
            seg("compute", inc, max(split, inc.ready), end, "compute")
        for a, b, kind in inc.save_spans:
            seg("save", inc, a, max(b, a + 1e-3), f"save ({kind})")
        label = lane(inc)
        if inc.notice is not None:
            note = inc.notice
            notice["x"].append(note.t - t0)
            notice["y"].append(label)
            notice["text"].append(
                f"notice from {note.source or '?'}: {note.action or 'terminate'}, "
                f"{note.time_left or 0.0:.1f} s left"
            )
        if inc.killed is not None:
            k = inc.killed
            kill["x"].append(k.t - t0)
            kill["y"].append(label)
            kill["text"].append(f"preempted: {describe_kill(k)}<br>lifetime {k.lifetime_s:.1f} s")
    cps = state.checkpoints
    stride = max(1, len(cps) // 400)  # thin the markers of very long runs
    for e in cps[::stride] if stride > 1 else cps:
        found = state.incs.get(e.incarnation)
        if found is None:
            continue
        ckpt["x"].append(e.t - t0)
        ckpt["y"].append(lane(found))
        ckpt["text"].append(
            f"checkpoint #{e.seq} {e.save_kind} at step {e.step}<br>"
            f"{format_bytes(e.nbytes)}, snapshot {e.snapshot_s:.3f} s, upload {e.upload_s:.3f} s"
        )
    out: list[Trace] = []
    names = {key: label for key, (_color, label) in palette.CATEGORIES.items()}
    for cat, d in segs.items():
        out.append(
            (
                f"tl:{cat}",
                {
                    "type": "bar",
                    "orientation": "h",
                    "name": names[cat],
                    "legendgroup": f"cat:{cat}",
                    "y": d["y"],
                    "x": d["x"],
                    "base": d["base"],
                    "hovertext": d["text"],
                    "hovertemplate": "%{hovertext}<extra></extra>",
                    "xaxis": "x",
                    "yaxis": "y",
                    "marker": {"color": CATEGORY_COLORS[cat]},
                    "width": 0.6,
                    "showlegend": False,
                },
            )
        )
    for key, d, name, symbol, color, size in (
        ("tl:ckpt", ckpt, "checkpoint", "diamond", palette.MARKS["checkpoint"], 7),
        ("tl:notice", notice, "notice", "triangle-down", palette.MARKS["notice"], 11),
        ("tl:kill", kill, "kill", "x", PREEMPT_COLOR, 11),
    ):
        out.append(
            (
                key,
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": name,
                    "x": d["x"],
                    "y": d["y"],
                    "text": d["text"],
                    "hovertemplate": "%{text}<extra></extra>",
                    "showlegend": False,
                    "marker": {
                        "symbol": symbol,
                        "color": color,
                        "size": size,
                        "line": {"width": 1, "color": "white"},
                    },
                },
            )
        )
    out.append(("tl:replicas", _replica_lane(state, t0, now) if lanes else _replica_lane(None, t0, now)))
    return out


#: the timeline lane that shows how many replicas trained, over time (jobs on several instances)
REPLICA_LANE = "replicas training"


def _replica_lane(state: JobState | None, t0: float, now: float) -> dict[str, Any]:
    """The number of replicas in the quorum over time, as a labelled step line in its own lane
    above the instances' (empty for a one-instance job, so the widget's traces stay the same)."""
    xs: list[Any] = []
    texts: list[str] = []
    if state is not None:
        for t, count in state.replica_counts:
            xs.append(t - t0)
            texts.append(str(count))
        if xs:
            xs.append(max(xs[-1], now - t0))
            texts.append("")
    return {
        "type": "scatter",
        "mode": "lines+markers+text",
        "name": REPLICA_LANE,
        "x": xs,
        "y": [REPLICA_LANE] * len(xs),
        "text": texts,
        "textposition": "top center",
        "line": {"color": palette.MARKS["checkpoint"], "width": 1, "shape": "hv"},
        "marker": {"size": 5, "color": palette.MARKS["checkpoint"]},
        "hovertemplate": "%{text} replicas from %{x:.1f} s<extra></extra>",
        "showlegend": False,
    }


def breakdown_traces(b: Breakdown) -> list[Trace]:
    """One stacked horizontal bar: where the wall time went, by category (explicit bases so it
    stacks in a figure whose barmode is overlay, which the timeline needs)."""
    out: list[Trace] = []
    base = 0.0
    total = b.total or 0.0
    for cat, (_color, label) in palette.CATEGORIES.items():
        val = float(getattr(b, cat))
        share = val / total if total else 0.0
        out.append(
            (
                f"bd:{cat}",
                {
                    "type": "bar",
                    "orientation": "h",
                    "name": label,
                    "legendgroup": f"cat:{cat}",
                    "y": [0],
                    "x": [val],
                    "base": [base],
                    "hovertemplate": f"{label}: %{{x:.1f}} s ({share:.0%})<extra></extra>",
                    "marker": {"color": CATEGORY_COLORS[cat]},
                    # labelled on the bar where there is room: the layout's `uniformtext` hides
                    # a label that would have to shrink or turn to fit, rather than print it tiny
                    "text": [f"{label} {val:.0f} s ({share:.0%})" if share >= 0.08 else ""],
                    "textposition": "inside",
                    "textangle": 0,
                    "insidetextanchor": "middle",
                    "width": 0.6,
                    "showlegend": False,
                },
            )
        )
        base += val
    return out


def _layout(panel: str, state: JobState) -> dict[str, Any]:
    # the legend sits above the plot, right-aligned: below it, it covers the x-axis title
    common: dict[str, Any] = {
        "template": "plotly_white",
        "margin": {"l": 60, "r": 20, "t": 60, "b": 40},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
        "barmode": "overlay",
        "uniformtext": UNIFORM_TEXT,
    }
    if panel == "metrics":
        return {
            **common,
            "title": {"text": "metrics by step"},
            "height": 380,
            "xaxis": {"title": {"text": "step"}},
            "yaxis": {"title": {"text": ", ".join(state.metric_names) or "value"}},
            "yaxis2": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
        }
    if panel == "timeline":
        return {
            **common,
            "title": {"text": "instances"},
            "height": 140 + 40 * max(1, len(state.incs)),
            "xaxis": {"title": {"text": "seconds since submission"}},
            "yaxis": {"autorange": "reversed"},
        }
    return {
        **common,
        "title": {"text": "where the time went (s)"},
        "height": 220,
        "xaxis": {"title": {"text": "seconds"}},
        "yaxis": {"showticklabels": False, "range": [-0.5, 0.5]},
    }


def static_figures_from_state(state: JobState) -> dict[str, Any]:
    """{"metrics", "timeline", "breakdown"} → plotly `go.Figure` (for export and reports)."""
    import plotly.graph_objects as go

    b = state.breakdown()
    panels = {
        "metrics": metric_traces(state),
        "timeline": timeline_traces(state),
        "breakdown": breakdown_traces(b),
    }
    figs: dict[str, Any] = {}
    for name, traces in panels.items():
        data = []
        for _, tr in traces:
            if name in ("timeline", "breakdown"):
                tr = {**tr, "showlegend": True}
            data.append(tr)
        figs[name] = go.Figure(data=data, layout=_layout(name, state))
    return figs
