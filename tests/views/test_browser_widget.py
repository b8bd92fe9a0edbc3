"""The live widget's figure in a real JupyterLab and headless Chromium, when plotly's module
is slow to load.

Why: the quickstart's browser test once ended with the job succeeded and an empty loss plot.
Plotly's `FigureWidget` is an anywidget whose front-end module (plotly.js, ~5 MB) must load
within anywidget's model timeout (2 s, anywidget 0.11); on a busy machine it may not, and the
front-end model then drops every message the kernel sends it: the figure stays as first drawn,
without a single metric.

The tests hold plotly's module back (its first line awaits a promise the test resolves) until
anywidget's 2 s model timeout has expired in the page, as on a machine too busy to compile
5 MB of JavaScript in time, and check that the user still sees every point of the loss curve.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser_lab import CHROMIUM, CHROMIUM_ARGS
from tests.views.test_browser import _TRACES, lab  # noqa: F401 - lab: fixture

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"the browser tests drive headless Chromium at {CHROMIUM}; scripts/setup.sh installs it",
    ),
]

#: the number of points of the synthetic job's loss line (its first-time steps)
STEPS = 300

#: In the page, before JupyterLab loads: (1) anywidget's model timeouts (`AbortSignal.timeout`
#: of 2000 ms) count in `window.__modelTimeouts` when they expire; (2) a JavaScript module of
#: more than 1 MB made from a Blob (plotly's widget bundle: anywidget and spotnb both import
#: modules from Blob URLs) first awaits `window.__slowModule`, a promise the test resolves once
#: a model timeout has expired.
_SLOW_MODULES = """
(() => {
  window.__modelTimeouts = 0;
  const timeout = AbortSignal.timeout.bind(AbortSignal);
  AbortSignal.timeout = (ms) => {
    const signal = timeout(ms);
    if (ms === 2000) signal.addEventListener('abort', () => { window.__modelTimeouts += 1; });
    return signal;
  };
  let release;
  window.__slowModule = new Promise((resolve) => { release = resolve; });
  window.__releaseModules = () => release();
  const NativeBlob = window.Blob;
  window.Blob = class extends NativeBlob {
    constructor(parts, options) {
      const big = options && options.type === 'text/javascript' && parts && parts.length === 1
        && typeof parts[0] === 'string' && parts[0].length > 1e6;
      super(big ? ['await window.__slowModule;\\n', parts[0]] : parts, options);
    }
  };
})();
"""

#: the points of each widget's loss line (-1: its plot is not drawn yet)
_LOSSES = """() => Array.from(document.querySelectorAll('.spotnb-job-widget')).map(w => {
  const gd = w.querySelector('.js-plotly-plot');
  if (!gd || !gd.data) return -1;
  const t = gd.data.find(t => t.name === 'loss');
  return t && t.x ? t.x.length : 0;
})"""


def _notebook(path: Path, source: str) -> None:
    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.write_text(
        json.dumps({"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5})
    )


def _report_failure(page: Any, server: dict[str, Any], console: list[str]) -> None:
    """What a failed browser test leaves to look at: a screenshot, the console, the plots."""
    shot = server["tmp"] / "failure.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"failure screenshot: {shot}\nbrowser console (last 30):\n" + "\n".join(console[-30:]))
    print("plots and their traces (name:points):", page.evaluate(_TRACES))


def _open_and_run(page: Any, server: dict[str, Any], name: str) -> None:
    """Open notebook `name`, wait for its idle kernel, start running all its cells."""
    page.goto(f"{server['url']}/lab/tree/{name}?token={server['token']}")
    page.wait_for_function(
        """() => {
        const app = window.jupyterapp; const w = app && app.shell.currentWidget;
        const k = w && w.sessionContext && w.sessionContext.session
                  && w.sessionContext.session.kernel;
        return !!(k && k.status === 'idle' && w.content && w.content.widgets.length > 0);
    }""",
        timeout=60_000,
    )
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


def test_widget_of_an_ended_job_shows_its_loss_curve_when_plotly_loads_late(
    lab: dict[str, Any],  # noqa: F811 - the fixture imported above
) -> None:
    """A widget displayed for a job that has already ended sends all its data at once, right
    after the figure's model opens, while plotly's module is still loading: the user must see
    the whole loss curve, in each of two such widgets (the page loads plotly once for both)."""
    from playwright.sync_api import sync_playwright

    _notebook(
        lab["dir"] / "ended.ipynb",
        "from IPython.display import display\n"
        "from tests.support.widget_helpers import EventsJob, events_of\n"
        "from spotnb.views.widget.view import JobView\n"
        f"views = [JobView(EventsJob(events_of(steps={STEPS}, preempt_at=(150,)))) for _ in range(2)]\n"
        "for view in views:\n"
        "    display(view.box)",
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1200})
            page.add_init_script(_SLOW_MODULES)
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"page error: {e}"))
            try:
                _open_and_run(page, lab, "ended.ipynb")
                # plotly's module completes only after anywidget's model timeout expired
                page.wait_for_function("() => window.__modelTimeouts > 0", timeout=60_000, polling=100)
                page.evaluate("() => window.__releaseModules()")
                whole = f"n => n.length === 2 && n.every(p => p >= {STEPS})"
                page.wait_for_function(f"() => ({whole})(({_LOSSES})())", timeout=60_000, polling=200)
            except Exception:
                _report_failure(page, lab, console)
                raise
        finally:
            browser.close()


def test_widget_shows_its_loss_curve_again_after_the_page_is_reloaded(
    lab: dict[str, Any],  # noqa: F811 - the fixture imported above
) -> None:
    """A user reloads the page (or opens the notebook in a second tab) while the kernel runs:
    JupyterLab asks the kernel for each widget's state and draws it anew; the figure must show
    the curve drawn so far, not the empty figure the widget began with."""
    from playwright.sync_api import sync_playwright

    _notebook(
        lab["dir"] / "reload.ipynb",
        "from tests.support.widget_helpers import EventsJob, events_of\n"
        "from spotnb.views.widget.view import JobView\n"
        f"view = JobView(EventsJob(events_of(steps={STEPS}, preempt_at=(150,))))\n"
        "view.box",
    )
    whole = f"() => ((n) => n.length === 1 && n[0] >= {STEPS})(({_LOSSES})())"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1200})
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"page error: {e}"))
            try:
                _open_and_run(page, lab, "reload.ipynb")
                page.wait_for_function(whole, timeout=60_000, polling=200)
                # saved with its output (the widget's view), then the page reloaded
                page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
                page.wait_for_function(
                    "() => { const w = window.jupyterapp.shell.currentWidget;"
                    " return !!(w && w.context && !w.context.model.dirty); }",
                    timeout=30_000,
                )
                page.reload()
                page.wait_for_function(whole, timeout=60_000, polling=200)
            except Exception:
                _report_failure(page, lab, console)
                raise
        finally:
            browser.close()


#: the live figure's breakdown bar (axes x3/y3): each category's name, seconds and bar position
_BREAKDOWN = """() => Array.from(document.querySelectorAll('.spotnb-job-widget .js-plotly-plot')).map(
  gd => (gd.data || []).filter(t => t.xaxis === 'x3').map(
    t => ({name: t.name, x: t.x ? Array.from(t.x) : null, y: t.y ? Array.from(t.y) : null})))"""


def test_the_live_breakdown_bar_draws_every_category_the_job_spent_time_on(
    lab: dict[str, Any],  # noqa: F811 - the fixture imported above
) -> None:
    """The widget draws the job's breakdown as it grows (several updates, as while a job
    runs): every category with seconds in it is a bar on the breakdown row. Allocation,
    preparation and "other" once lost their row (y) and were not drawn at all: plotly marks
    the traces a batched update leaves alone as "_undefined_", which its ipywidgets
    serializers turned into undefined but anywidget does not, so plotly's model wrote the
    string into the data the figure is first drawn from."""
    from playwright.sync_api import sync_playwright

    _notebook(
        lab["dir"] / "growing.ipynb",
        "import threading\n"
        "from IPython.display import display\n"
        "from tests.support.widget_helpers import EventsJob, events_of\n"
        "from spotnb.views.widget.view import JobView\n"
        f"events = events_of(steps={STEPS}, preempt_at=(150,))\n"
        "job = EventsJob([])\n"
        "view = JobView(job, interval=0.05, figure_interval=0.05)\n"
        "display(view.box)\n"
        "def feed():\n"
        "    for k in range(0, len(events), 20):\n"
        "        view.on_events(events[k:k + 20])\n"
        "        view._closed.wait(0.2)\n"
        "threading.Thread(target=feed, daemon=True).start()",
    )
    want = {"compute", "recompute", "allocation", "preparation"}
    drawn = f"""() => {{
      const bars = ({_BREAKDOWN})();
      if (bars.length !== 1) return false;
      const spent = bars[0].filter(t => t.x && t.x[0] > 0).map(t => t.name);
      return {sorted(want)!r}.every(n => spent.includes(n));
    }}"""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            # plotly's module arrives after the first updates, as on a busy machine: the figure
            # is first drawn from the state those updates left
            page.add_init_script(_SLOW_MODULES)
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            try:
                _open_and_run(page, lab, "growing.ipynb")
                page.wait_for_function("() => window.__modelTimeouts > 0", timeout=60_000, polling=100)
                page.evaluate("() => window.__releaseModules()")
                page.wait_for_function(drawn, timeout=90_000, polling=200)
                bars = page.evaluate(_BREAKDOWN)[0]
                missing = [t["name"] for t in bars if t["x"] and t["x"][0] > 0 and not t["y"]]
                assert not missing, f"categories with seconds but no bar: {missing} ({bars})"
            except Exception:
                _report_failure(page, lab, console)
                raise
        finally:
            browser.close()
