"""Plotly trace and figure builders, from a `JobState` only (no widgets, no job, no kernel).

Each panel is a list of `(key, trace_dict)`; the key is stable for the life of the job so the
live widget can map it to a trace index and send only changed data. `static_figures` wraps the
same traces into standalone `go.Figure`s for export (`job.plot()`), so the live view and the
exported figures cannot disagree.
"""

from __future__ import annotations

from typing import Any

from spotnb.core.ledger import Breakdown
from spotnb.core.state import Incarnation, JobState, describe_kill
from spotnb.views import palette

__all__ = [
    "metric_traces",
    "metric_axes",
    "metric_panels",
    "smooth",
    "layout_key",
    "MAX_PANELS",
    "VALUE_AXES",
    "MARK_AXES",
    "X_AXES",
    "live_layout",
    "LIVE_TITLES",
    "WAITING",
    "waiting_for_first_step",
    "timeline_traces",
    "timeline_lanes",
    "timeline_axis",
    "live_titles",
    "integer_ticks",
    "split_timeline",
    "price_ticks",
    "MARK_OFFSETS",
    "price_traces",
    "price_axis",
    "PRICE_KEY",
    "PRICE_AXIS",
    "LIVE_PRICE_AXIS",
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


#: one panel per metric, stacked on a shared x-axis (TensorBoard's and W&B's one chart per
#: metric: a cross-entropy above 1 must not flatten an accuracy); past MAX_PANELS metrics the
#: last panel holds the rest, with a legend
MAX_PANELS = 4
#: the shared last panel has a legend up to this many metrics, and only hover beyond
MAX_LEGEND = 6
#: the y-axes of the metric panels (top to bottom) and the hidden [0, 1] axes the preemption /
#: resume marks are drawn on, one per panel; `y2`/`y3` are the live figure's timeline/breakdown
VALUE_AXES = ("y", "y4", "y5", "y6")
MARK_AXES = ("y7", "y8", "y9", "y10")
#: the right-hand $/h axis of the zone prices drawn over the timeline: in the timeline's own
#: figure (`job.plot()`, the lab's job view) and in the live widget's one figure
PRICE_AXIS, LIVE_PRICE_AXIS = "y2", "y11"
#: key prefix of the zone price lines among the timeline's traces
PRICE_KEY = "tl:price:"
_PRICE_DASH = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
#: the metrics' x-axis: the step, or the wall time since submission (the timeline's axis)
X_AXES = {"step": "step", "time": "seconds since submission"}


def _span(lo: float, hi: float) -> list[float]:
    """A layout domain, clamped to [0, 1] (sums of fractions stray by 1e-17, which plotly refuses)."""
    return [round(min(1.0, max(0.0, lo)), 6), round(min(1.0, max(0.0, hi)), 6)]


def layout_key(ref: str) -> str:
    """A trace's axis reference ("y4") → its layout key ("yaxis4")."""
    return f"{ref[0]}axis{ref[1:]}"


def metric_panels(state: JobState) -> list[list[str]]:
    """The metrics of each panel, top to bottom (one empty panel before the first metric)."""
    names = state.metric_names
    if len(names) <= MAX_PANELS:
        return [[n] for n in names] or [[]]
    return [[n] for n in names[: MAX_PANELS - 1]] + [names[MAX_PANELS - 1 :]]


def smooth(ys: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased so the first points
    are not pulled towards zero. `weight` 0 returns the values, 0.99 a very flat line."""
    weight = min(max(weight, 0.0), 1.0)
    out: list[float] = []
    last = 0.0
    for n, v in enumerate(ys, 1):
        if weight == 1.0:  # the limit of the debiased average: the mean so far
            last += (v - last) / n
            out.append(last)
            continue
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight**n))
    return out


def _vlines(marks: list[tuple[float, str]]) -> tuple[list[Any], list[Any], list[Any]]:
    """Vertical segments on the [0, 1] marker axis, as one trace (None breaks the line)."""
    xs: list[Any] = []
    ys: list[Any] = []
    text: list[Any] = []
    for x, hover in marks:
        xs += [x, x, None]
        ys += [0.0, 1.0, None]
        text += [hover, hover, None]
    return xs, ys, text


def metric_traces(state: JobState, x_axis: str = "step", smoothing: float = 0.0) -> list[Trace]:
    """Per metric: its line (first-time steps), a smoothed line when `smoothing` > 0 (the raw
    one then fades, as in TensorBoard), the recomputed steps as a dotted, marked line; per
    panel: preemption / resume marks as vertical lines on a hidden [0, 1] axis.

    `x_axis` "step" or "time" (seconds since submission, so the metrics line up with the
    instance timeline)."""
    t0 = state.job_start
    if t0 is None:  # rows of a log that began mid-job: its first logged time is 0
        t0 = min((s.times()[0] for s in state.first.values() if len(s)), default=0.0)
    by_time = x_axis == "time"

    def xs(s: Any) -> tuple[list[float], list[float]]:
        x, y = s.xy()
        return ([t - t0 for t in s.times()] if by_time else x), y

    x_hover = "%{x:.1f} s" if by_time else "step %{x:.0f}"
    panels = metric_panels(state)
    out: list[Trace] = []
    for i, name in enumerate(state.metric_names):
        panel = min(i, MAX_PANELS - 1)
        # the last panel of many: a legend tells its lines apart (hover alone past a handful,
        # or the legend would bury the figure)
        shared = 1 < len(panels[panel]) <= MAX_LEGEND
        axes = {"xaxis": "x", "yaxis": VALUE_AXES[panel]}
        color = COLORS[i % len(COLORS)]
        x, y = xs(state.first[name])
        smoothed = smoothing > 0 and len(y) > 1
        out.append(
            (
                f"m:{name}",
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": name,
                    "legendgroup": name,
                    "showlegend": shared,
                    **axes,
                    "x": x,
                    "y": y,
                    "opacity": 0.3 if smoothed else 1.0,
                    "line": {"color": color, "width": 1.6},
                    "hovertemplate": f"%{{fullData.name}} %{{y:.4g}}<br>{x_hover}<extra></extra>",
                },
            )
        )
        out.append(
            (
                f"s:{name}",
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": f"{name} (smoothed)",
                    "legendgroup": name,
                    "showlegend": False,
                    **axes,
                    "x": x if smoothed else [],
                    "y": smooth(y, smoothing) if smoothed else [],
                    "line": {"color": color, "width": 2},
                    "hovertemplate": f"%{{fullData.name}} %{{y:.4g}}<br>{x_hover}<extra></extra>",
                },
            )
        )
        rx: list[Any] = []
        ry: list[Any] = []
        for _, seg in sorted(state.redo.get(name, {}).items()):
            sx, sy = xs(seg)
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
                    "legendgroup": "redo",
                    "showlegend": False,  # one legend entry for all metrics: below
                    **axes,
                    "x": rx,
                    "y": ry,
                    "visible": True if rx else "legendonly",
                    "line": {"color": palette.MARKS["redo"], "width": 1.4, "dash": "dot"},
                    "marker": {"size": 4, "color": palette.MARKS["redo"], "symbol": "circle-open"},
                    "hovertemplate": f"%{{fullData.name}} %{{y:.4g}}<br>{x_hover}<extra></extra>",
                },
            )
        )

    out.append(
        (
            "redo",  # the legend entry of every metric's recomputed steps (no data of its own)
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": "recomputed steps",
                "legendgroup": "redo",
                "xaxis": "x",
                "yaxis": "y",
                "x": [None],  # one empty point: plotly leaves a trace without data out of the legend
                "y": [None],
                "hoverinfo": "skip",
                "line": {"color": palette.MARKS["redo"], "width": 1.4, "dash": "dot"},
                "marker": {"size": 4, "color": palette.MARKS["redo"], "symbol": "circle-open"},
                "visible": True if any(state.redo.values()) else "legendonly",
            },
        )
    )

    def at(marks: list[tuple[int, str, float]]) -> list[tuple[float, str]]:
        return [((t - t0) if by_time else step, hover) for step, hover, t in marks]

    px, py, pt = _vlines(at(state.preempt_marks))
    rx2, ry2, rt = _vlines(at(state.resume_marks))
    for panel in range(len(panels)):
        suffix = f":{panel}" if panel else ""
        for key, name, (mx, my, mt), line in (
            ("preempt", "preempted", (px, py, pt), {"color": PREEMPT_COLOR, "width": 2, "dash": "dash"}),
            ("resume", "resumed", (rx2, ry2, rt), {"color": RESUME_COLOR, "width": 1.5, "dash": "dot"}),
        ):
            out.append(
                (
                    key + suffix,
                    {
                        "type": "scatter",
                        "mode": "lines",
                        "name": name,
                        "legendgroup": key,
                        "showlegend": panel == 0,
                        "xaxis": "x",
                        "yaxis": MARK_AXES[panel],
                        "x": mx,
                        "y": my,
                        "text": mt,
                        "hovertemplate": "%{text}<extra></extra>",
                        "line": line,
                        "visible": True if mx else "legendonly",
                    },
                )
            )
    return out


#: a metric's name in an axis title is cut to this many characters (the hover has it whole)
TITLE_CHARS = 40


def _panel_title(names: list[str]) -> str:
    """A panel's y-axis title: its metrics, the first three of many."""
    cut = [n if len(n) <= TITLE_CHARS else n[: TITLE_CHARS - 1] + "…" for n in names[:3]]
    if len(names) <= 3:
        return ", ".join(cut)
    return f"{', '.join(cut)} +{len(names) - 3} more"


#: a panel of whole numbers spanning at most this much is ticked at every integer
INTEGER_SPAN = 6


def integer_ticks(state: JobState) -> list[int | None]:
    """Per metric panel: 1 where its one metric counts something (whole numbers over a small
    span: replicas, instances, an epoch), so its ticks read 2, 3 and not 2, 2.5, 3; else None."""
    out: list[int | None] = []
    for names in metric_panels(state):
        series = state.first.get(names[0]) if len(names) == 1 else None
        if series is None or not len(series) or not series.integral:
            out.append(None)
            continue
        _, ys = series.xy()
        out.append(1 if max(ys) - min(ys) <= INTEGER_SPAN else None)
    return out


def metric_axes(state: JobState, domain: tuple[float, float], x_axis: str, gap: float) -> dict[str, Any]:
    """Layout of the metric panels stacked in `domain` (paper fraction), `gap` apart: each
    panel's y-axis titled with its metric, its hidden marker axis, and the shared x-axis drawn
    under the bottom panel."""
    panels = metric_panels(state)
    n = len(panels)
    lo, hi = domain
    h = (hi - lo - gap * (n - 1)) / n
    steps = integer_ticks(state)
    layout: dict[str, Any] = {}
    for k in range(MAX_PANELS):
        # every panel's axes exist from the first draw (the live figure then only changes
        # them): an unused one is hidden over the first panel, where it draws nothing
        top = hi - min(k, n) * (h + gap) if k < n else hi
        layout[layout_key(VALUE_AXES[k])] = {
            "domain": _span(max(lo, top - h), top),
            "anchor": "x",
            "visible": k < n,
            "title": {"text": _panel_title(panels[k]) if k < n else "", "standoff": 4},
            "dtick": steps[k] if k < n else None,
            "tickformat": "d" if k < n and steps[k] else None,
        }
        layout[layout_key(MARK_AXES[k])] = {
            "overlaying": VALUE_AXES[k],
            "range": [0, 1],
            "visible": False,
            "fixedrange": True,
        }
    layout["xaxis"] = {"anchor": VALUE_AXES[n - 1], "domain": [0, 1], "title": {"text": X_AXES[x_axis]}}
    return layout


def _short(text: str, limit: int = 16) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


#: where a lane's marks sit, as offsets from the lane's centre (the lanes are 1 apart, the bars
#: 0.6 wide, the axis reversed: negative is above): a notice above the bar, a kill on it, a
#: checkpoint on its lower edge, so a notice, an emergency save and the kill a moment later
#: are three marks, not one
MARK_OFFSETS = {"notice": -0.42, "move": -0.42, "kill": 0.0, "ckpt": 0.3}


def _slots(state: JobState) -> dict[int, list[int]]:
    """Each instance slot (replica) of a job on several instances, with the instances (#n)
    that filled it in turn; {} for a job on one instance at a time."""
    slots: dict[int, list[int]] = {}
    for n in sorted(state.incs):
        slots.setdefault(state.incs[n].slot, []).append(n)
    return slots if len(slots) > 1 else {}


def timeline_lanes(state: JobState) -> tuple[dict[int, int], list[str]]:
    """(incarnation → lane index, lane labels top to bottom). One lane per instance, named
    "#n" (the n-th launched, as the feed and the hovers name it) with its instance type, or
    its zone once the job moved; a job on several instances has one lane per replica, naming
    the instances that served it in turn ("replica 1 · #2 #4"), and a last lane with the
    number of replicas training."""
    slots = _slots(state)
    if slots:
        order = sorted(slots)
        index = {n: order.index(slot) for slot, ns in slots.items() for n in ns}
        labels = [f"replica {slot} · " + " ".join(f"#{n}" for n in slots[slot]) for slot in order]
        return index, [*labels, REPLICA_LANE]
    moved = len({inc.region for inc in state.incs.values() if inc.region}) > 1
    index, labels = {}, []
    for n in sorted(state.incs):
        inc = state.incs[n]
        # short: the axis labels set the left margin of every panel (the hover has the rest)
        what = inc.region if moved else inc.instance_type
        index[n] = len(labels)
        labels.append(f"#{inc.n} {_short(what)}" if what else f"#{inc.n}")
    return index, labels


def timeline_axis(state: JobState) -> dict[str, Any]:
    """The lanes' axis: one tick per lane, named (the lanes are numbers, so marks can sit
    above and below a bar), top to bottom."""
    _, labels = timeline_lanes(state)
    count = max(1, len(labels))
    return {
        "tickmode": "array",
        "tickvals": list(range(len(labels))),
        "ticktext": labels,
        "range": [count - 0.45, -0.55],  # reversed: the first lane on top, room for its notice
        "autorange": False,
        "showgrid": False,
        "zeroline": False,
    }


def timeline_traces(state: JobState, now: float | None = None) -> list[Trace]:
    """One horizontal bar per incarnation (per instance slot on a job with several), split into
    alloc / prep / recompute / compute / save (explicit `base`, seconds since submission), with
    notice, move, kill and checkpoint markers placed apart around their lane."""
    t0 = state.job_start or 0.0
    now = state.now() if now is None else now
    segs: dict[str, dict[str, list[Any]]] = {
        c: {"y": [], "base": [], "x": [], "text": []}
        for c in ("alloc", "prep", "recompute", "compute", "save")
    }
    lane_of, labels = timeline_lanes(state)
    several = bool(_slots(state))

    def seg(cat: str, inc: Incarnation, a: float | None, b: float | None, what: str) -> None:
        if a is None or b is None or b <= a:
            return
        d = segs[cat]
        d["y"].append(lane_of[inc.n])
        d["base"].append(a - t0)
        d["x"].append(b - a)
        d["text"].append(_hover_inc(inc, what, a, b))

    marks: dict[str, dict[str, list[Any]]] = {
        k: {"x": [], "y": [], "text": []} for k in ("ckpt", "notice", "move", "kill")
    }

    def mark(kind: str, t: float, inc: Incarnation, text: str) -> None:
        marks[kind]["x"].append(t - t0)
        marks[kind]["y"].append(lane_of[inc.n] + MARK_OFFSETS[kind])
        marks[kind]["text"].append(text)

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
        if inc.notice is not None:
            note = inc.notice
            mark(
                "notice",
                note.t,
                inc,
                f"#{n} notice from {note.source or '?'}: {note.action or 'terminate'}, "
                f"{note.time_left or 0.0:.1f} s left",
            )
        if inc.moving is not None:  # asked to leave by the controller, for a cheaper zone
            mv = inc.moving
            mark(
                "move",
                mv.t,
                inc,
                f"#{n} moves to {mv.to_region}: expected saving ${mv.saving:.4f} after the "
                f"move's ${mv.move_cost:.4f}",
            )
        if inc.killed is not None:
            k = inc.killed
            mark("kill", k.t, inc, f"#{n} preempted: {describe_kill(k)}<br>lifetime {k.lifetime_s:.1f} s")
    cps = state.checkpoints
    stride = max(1, len(cps) // 400)  # thin the markers of very long runs
    for e in cps[::stride] if stride > 1 else cps:
        found = state.incs.get(e.incarnation)
        if found is None:
            continue
        mark(
            "ckpt",
            e.t,
            found,
            f"{e.save_kind} checkpoint (save {e.seq}) by #{e.incarnation} at step {e.step}<br>"
            f"{format_bytes(e.nbytes)}, snapshot {e.snapshot_s:.3f} s, upload {e.upload_s:.3f} s",
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
    # in the legend when drawn (plotly leaves a trace without points out of it): what the
    # glyphs mean is said once, where they are
    for key, name, symbol, color, size in (
        ("ckpt", "checkpoint", "diamond", palette.MARKS["checkpoint"], 7),
        ("notice", "notice", "triangle-down", palette.MARKS["notice"], 11),
        ("move", "moved zone", "triangle-right", palette.MARKS["move"], 12),
        ("kill", "killed", "x", PREEMPT_COLOR, 11),
    ):
        d = marks[key]
        out.append(
            (
                f"tl:{key}",
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": name,
                    "legendgroup": f"mark:{key}",
                    "x": d["x"],
                    "y": d["y"],
                    "text": d["text"],
                    "hovertemplate": "%{text}<extra></extra>",
                    "showlegend": True,
                    "marker": {
                        "symbol": symbol,
                        "color": color,
                        "size": size,
                        "line": {"width": 1, "color": "white"},
                    },
                },
            )
        )
    replicas = _replica_lane(state if several else None, t0, now, len(labels) - 1)
    out.append(("tl:replicas", replicas))
    out.extend(price_traces(state, t0, now))
    return out


#: the share of the timeline row the lanes keep when the zone prices get a band above them
LANES_SHARE, PRICE_BAND_FROM = 0.6, 0.7


def _money_tick(p: float) -> str:
    return f"${p:.2f}" if round(p, 2) == p else f"${p:.3f}"


#: up to this many distinct zone prices are each a tick of the price band
PRICE_TICKS = 8


def price_ticks(state: JobState) -> tuple[float, ...] | None:
    """The distinct prices the zones had, to tick the band at (None: none, or too many to
    tick each: a price walk gets plotly's own ticks)."""
    prices = sorted({p for points in state.zone_prices.values() for _, p in points})
    return tuple(prices) if 0 < len(prices) <= PRICE_TICKS else None


def price_axis(state: JobState) -> dict[str, Any]:
    """The $/h axis of the zone prices: a band of its own above the lanes (lines drawn over the
    lanes crossed them), ticked at the prices the zones had, hidden without prices. The
    caller places it (`domain`, `anchor`)."""
    ticks = price_ticks(state)
    axis: dict[str, Any] = {
        "showgrid": True,
        "zeroline": False,
        "visible": bool(state.zone_prices),
        "title": {"text": "zone $/h", "standoff": 2},
        "fixedrange": True,
    }
    if ticks:
        axis.update(
            tickmode="array",
            tickvals=list(ticks),
            ticktext=[_money_tick(p) for p in ticks],
            range=[0, max(ticks) * 1.35],  # room above the top line for the zones' names
            autorange=False,
        )
    else:
        axis.update(tickmode="auto", tickformat="$.3~f", rangemode="tozero", autorange=True)
    return axis


def split_timeline(lo: float, hi: float, prices: bool) -> tuple[list[float], list[float]]:
    """The lanes' domain and the price band's, in a timeline row spanning [lo, hi]."""
    if not prices:
        return _span(lo, hi), _span(lo, hi)
    h = hi - lo
    return _span(lo, lo + h * LANES_SHARE), _span(lo + h * PRICE_BAND_FROM, hi)


def price_traces(state: JobState, t0: float, now: float) -> list[Trace]:
    """Each candidate zone's spot price over time (the controller's `prices` events), a step
    line over the timeline labelled at its end with the zone: where the job ran is on the
    lanes, what the other zones cost meanwhile is here."""
    out: list[Trace] = []
    for i, (zone, points) in enumerate(sorted(state.zone_prices.items())):
        xs = [t - t0 for t, _ in points]
        ys = [p for _, p in points]
        end = (state.ended_at if state.ended_at is not None else now) - t0
        if xs and end > xs[-1]:
            xs.append(end)
            ys.append(ys[-1])
        label = _short(zone)
        out.append(
            (
                f"{PRICE_KEY}{zone}",
                {
                    "type": "scatter",
                    "mode": "lines+text",
                    "name": _short(zone, 40),
                    "x": xs,
                    "y": ys,
                    "text": [""] * (len(xs) - 1) + [label] if xs else [],
                    "textposition": "top left",  # above its line's end, inside the plot
                    "textfont": {"size": 10, "color": "#616161"},
                    "line": {"shape": "hv", "width": 1.5, "color": "#757575", "dash": _PRICE_DASH[i % 6]},
                    # the zone's name is data, never template: %{fullData.name}, not an f-string
                    "hovertemplate": "%{fullData.name}: %{y:$.4f}/h<extra></extra>",
                    "xaxis": "x",
                    "yaxis": PRICE_AXIS,
                    "showlegend": False,
                    "cliponaxis": False,
                },
            )
        )
    return out


#: the timeline lane that shows how many replicas trained, over time (jobs on several instances)
REPLICA_LANE = "replicas training"


def _replica_lane(state: JobState | None, t0: float, now: float, lane: int = 0) -> dict[str, Any]:
    """The number of replicas in the quorum over time, as a labelled step line in its own lane
    (`lane`, below the replicas') (empty for a one-instance job, so the widget's traces stay the
    same)."""
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
        "y": [lane] * len(xs),
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
                    "hovertemplate": f"{label}: %{{x:.1f}} {b.unit} ({share:.0%})<extra></extra>",
                    "marker": {"color": CATEGORY_COLORS[cat]},
                    # labelled on the bar where there is room: the layout's `uniformtext` hides
                    # a label that would have to shrink or turn to fit, rather than print it tiny
                    "text": [f"{label} {val:.0f} {b.unit} ({share:.0%})" if share >= 0.08 else ""],
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


#: the live figure's rows, in pixels: metric panels (one, or each of several), instance
#: timeline, breakdown; the gaps between rows hold the rows' titles
_ONE_PANEL_PX, _PANEL_PX, _PANEL_GAP_PX = 260, 150, 22
_TIMELINE_PX, _BREAKDOWN_PX, _ROW_GAP_PX = 150, 90, 62
_MARGIN = {"l": 70, "r": 20, "t": 92, "b": 30}
WAITING = "spotnb-waiting"
#: the live figure's row titles (annotations named so they can be found and updated)
LIVE_TITLES = {
    "metrics": "metrics by {x}",
    "timeline": "instances (seconds since submission)",
    "breakdown": "where the time went (s)",
}


def live_titles(state: JobState) -> dict[str, str]:
    """The live figure's row titles: a job on several instances says its lanes are replicas
    and its seconds instance-seconds (a 3-minute job on three instances spends 9)."""
    slots = len(_slots(state))
    if slots < 2:
        return dict(LIVE_TITLES)
    return {
        **LIVE_TITLES,
        "timeline": "replicas and the instances #n that served them (seconds since submission)",
        "breakdown": f"where the time went (instance-seconds, {slots} instances side by side)",
    }


def live_layout(state: JobState, x_axis: str = "step") -> dict[str, Any]:
    """The live widget's one figure: the metric panels on top, then the instance timeline
    (axes x2/y2), then the breakdown bar (x3/y3). Rows are sized in pixels, so a new metric
    panel makes the figure taller instead of squeezing the others."""
    n = len(metric_panels(state))
    metrics_px = _ONE_PANEL_PX if n == 1 else (_PANEL_PX if n == 2 else 130) * n + _PANEL_GAP_PX * (n - 1)
    prices = bool(state.zone_prices)
    lanes = len(timeline_lanes(state)[1])
    # the lanes keep ~30 px each; the zone prices get a band above them
    timeline_px = max(_TIMELINE_PX, 30 * lanes + 30)
    if prices:
        timeline_px = int(timeline_px / LANES_SHARE)
    rows_px = [metrics_px, timeline_px, _BREAKDOWN_PX]
    plot_px = sum(rows_px) + 2 * _ROW_GAP_PX
    height = plot_px + _MARGIN["t"] + _MARGIN["b"]
    domains: list[tuple[float, float]] = []
    top = 1.0
    for px in rows_px:
        domains.append((top - px / plot_px, top))
        top -= (px + _ROW_GAP_PX) / plot_px
    lanes_domain, band_domain = split_timeline(*domains[1], prices)
    layout: dict[str, Any] = {
        "template": "plotly_white",
        "height": height,
        "barmode": "overlay",
        "uniformtext": UNIFORM_TEXT,
        "margin": _MARGIN,
        "legend": {"orientation": "h", "x": 0.0, "y": 1.0, "yanchor": "bottom"},
        "uirevision": "spotnb",
        **metric_axes(state, domains[0], x_axis, gap=_PANEL_GAP_PX / plot_px),
        "xaxis2": {"anchor": "y2", "domain": [0, 1]},
        "yaxis2": {"anchor": "x2", "domain": lanes_domain, **timeline_axis(state)},
        layout_key(LIVE_PRICE_AXIS): {**price_axis(state), "domain": band_domain, "anchor": "x2"},
        "xaxis3": {"anchor": "y3", "domain": [0, 1]},
        "yaxis3": {
            "anchor": "x3",
            "domain": _span(*domains[2]),
            "showticklabels": False,
            "fixedrange": True,
            "range": [-0.5, 0.5],
        },
    }
    layout["xaxis"]["title"] = {"text": ""}  # the row title names the x-axis
    titles = live_titles(state)
    layout["annotations"] = [
        {
            "name": f"title:{row}",
            "text": titles[row].format(x=X_AXES[x_axis] if x_axis != "step" else "step"),
            "xref": "paper",
            "yref": "paper",
            "x": 0.5,
            "y": domains[i][1],
            "yanchor": "bottom",
            "yshift": 4 if i else 44,  # the legend (two rows when narrow) sits between it and its title
            "showarrow": False,
            "font": {"size": 16},
        }
        for i, row in enumerate(LIVE_TITLES)
    ]
    if waiting_for_first_step(state):  # say so, instead of an empty panel with ticks at 0.2/0.4
        layout["yaxis"]["showticklabels"] = False
        layout["annotations"].append(
            {
                "name": WAITING,
                "text": "waiting for the first step",
                "xref": "x domain",
                "yref": "y domain",
                "x": 0.5,
                "y": 0.5,
                "showarrow": False,
                "font": {"color": "#757575", "size": 14},
            }
        )
    else:
        layout["yaxis"]["showticklabels"] = True
    return layout


def waiting_for_first_step(state: JobState) -> bool:
    """No metric point yet: the metrics panel has nothing to draw."""
    return not any(len(s) for s in state.first.values())


def _layout(panel: str, state: JobState) -> dict[str, Any]:
    # the title on top, then the legend, then the plot: a legend beside the title covers it
    # when the view is narrow and the legend wraps (the job view), one below the plot covers
    # the x-axis title. The timeline's and breakdown's legends take two rows in a narrow view.
    top = 70 if panel == "metrics" else 105
    common: dict[str, Any] = {
        "template": "plotly_white",
        "margin": {"l": 60, "r": 20, "t": top, "b": 40},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0, "xanchor": "left"},
        "barmode": "overlay",
        "uniformtext": UNIFORM_TEXT,
    }
    title = {"yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 10}, "x": 0.02}
    if panel == "metrics":
        n = len(metric_panels(state))
        layout = {
            **common,
            "title": {**title, "text": "metrics"},
            "height": 380 if n == 1 else 120 + 150 * n,
            **metric_axes(state, (0.0, 1.0), "step", gap=0.08 if n > 1 else 0.0),
        }
        if waiting_for_first_step(state):  # say so, rather than draw empty axes from -1 to 6
            layout["xaxis"]["visible"] = layout["yaxis"]["visible"] = False
            layout["annotations"] = [
                {
                    "text": "no metrics logged yet" if not state.done else "no metrics were logged",
                    "xref": "paper",
                    "yref": "paper",
                    "x": 0.5,
                    "y": 0.5,
                    "showarrow": False,
                    "font": {"color": "#757575", "size": 14},
                }
            ]
        return layout
    if panel == "timeline":
        prices = bool(state.zone_prices)
        lanes_domain, band_domain = split_timeline(0.0, 1.0, prices)
        lanes = len(timeline_lanes(state)[1])
        several = len(_slots(state)) > 1
        return {
            **common,
            "title": {**title, "text": "replicas and their instances #n" if several else "instances"},
            "height": 185 + 40 * max(1, lanes) + (120 if prices else 0),
            "xaxis": {"title": {"text": "seconds since submission"}},
            "yaxis": {"domain": lanes_domain, **timeline_axis(state)},
            layout_key(PRICE_AXIS): {**price_axis(state), "domain": band_domain, "anchor": "x"},
        }
    slots = len(_slots(state))
    return {
        **common,
        "title": {
            **title,
            "text": f"where the time went (instance-seconds, {slots} instances side by side)"
            if slots > 1
            else "where the time went (s)",
        },
        "height": 265,
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
