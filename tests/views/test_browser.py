"""The quickstart in a real JupyterLab, in headless Chromium, as a user sees it: run all cells,
see the loss curve (it grows while the job runs, or is whole if the page drew the figure
late), a preemption marker, the cost meter and the final status.

Every wait is on a condition in the page (Playwright `wait_for_function`), never a sleep.
CI installs Chromium through scripts/setup.d/40-browser.sh; locally the test is skipped when
/usr/bin/chromium is missing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser_lab import (
    BROWSER_MARKS,
    CHROMIUM,
    CHROMIUM_ARGS,
    MATHJAX_NODES,
    ROOT,
    output_problems,
    readme_python,
    run_lab,
    save_notebook,
    wait_all_ran,
)

pytestmark = BROWSER_MARKS


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """JupyterLab on 127.0.0.1 with a token, serving a temp dir holding the quickstart."""
    with run_lab(tmp_path, ["01-quickstart.ipynb"]) as served:
        yield served


@pytest.fixture
def readme_lab(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The quickstart in a JupyterLab of a virtualenv made only as README says: its first
    command's installs, then JupyterLab (what README tells notebook users to add), no set-up
    script, no constraints, nothing of this checkout on a path. The widget once crashed there
    (plotly's FigureWidget needs anywidget, which only the test set-up installed)."""
    python = readme_python(("jupyterlab",))
    with run_lab(tmp_path, ["01-quickstart.ipynb"], python=str(python), checkout=False) as served:
        yield served


# JS helpers evaluated in the page: read what the user sees from the DOM and plotly's graph div
_LOSS_POINTS = """() => {
  const gd = document.querySelector('.spotnb-job-widget .js-plotly-plot');
  if (!gd || !gd.data) return -1;
  const t = gd.data.find(t => t.name === 'loss');
  return t && t.x ? t.x.length : 0;
}"""
_TRACES = """() => Array.from(document.querySelectorAll('.spotnb-job-widget .js-plotly-plot')).map(
  gd => (gd.data || []).map(t => `${t.name}:${t.x ? t.x.length : '-'}`).join(' '))"""
_LOSS_LAST_STEP = """() => {
  const gd = document.querySelector('.spotnb-job-widget .js-plotly-plot');
  const t = gd && gd.data && gd.data.find(t => t.name === 'loss');
  return t && t.x && t.x.length ? Math.max(...Array.from(t.x)) : -1;
}"""
_TOTAL_STEPS = """() => {
  const p = document.querySelector('.spotnb-job-widget .spotnb-progress');
  return p && p.dataset.total ? Number(p.dataset.total) : Infinity;
}"""
_STATUS = """() => {
  const s = document.querySelector('.spotnb-job-widget .spotnb-status');
  return s ? s.dataset.status : null;
}"""
_PREEMPT_MARKERS = """() => {
  const gd = document.querySelector('.spotnb-job-widget .js-plotly-plot');
  const t = gd && gd.data && gd.data.find(t => t.name === 'preempted');
  return t && t.x ? t.x.filter(x => x !== null && x !== undefined).length / 2 : 0;
}"""


_BARS = """() => {
  const gd = document.querySelector('.spotnb-job-widget .js-plotly-plot');
  const bars = (axis) => gd.data.filter(t => t.type === 'bar' && t.xaxis === axis).map(t => ({
    name: t.name, x: t.x ? Array.from(t.x) : [], y: t.y ? Array.from(t.y) : [],
    base: t.base ? Array.from(t.base) : []}));
  return {timeline: bars('x2'), breakdown: bars('x3')};
}"""


def test_quickstart_widget_in_jupyterlab(readme_lab: dict[str, Any]) -> None:
    """The quickstart as a new user runs it, in the environment README's install makes."""
    from playwright.sync_api import sync_playwright

    lab = readme_lab

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1900})
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            try:
                _drive(page, lab)
            except Exception:
                shot = lab["tmp"] / "failure.png"
                page.screenshot(path=str(shot), full_page=True)
                print(f"failure screenshot: {shot}\nbrowser console (last 30):\n" + "\n".join(console[-30:]))
                print("status:", page.evaluate(_STATUS), "loss points:", page.evaluate(_LOSS_POINTS))
                print("plots and their traces (name:points):", page.evaluate(_TRACES))
                raise
        finally:
            browser.close()


def _drive(page: Any, lab: dict[str, Any]) -> None:
    """Open the notebook, run all cells, check what the user sees, take screenshots."""
    page.goto(f"{lab['url']}/lab/tree/01-quickstart.ipynb?token={lab['token']}")
    # the notebook is open and its kernel is idle
    page.wait_for_function(
        """() => {
        const app = window.jupyterapp; const w = app && app.shell.currentWidget;
        const k = w && w.sessionContext && w.sessionContext.session
                  && w.sessionContext.session.kernel;
        return !!(k && k.status === 'idle' && w.content && w.content.widgets.length > 5);
    }""",
        timeout=60_000,
    )
    # start "run all" without awaiting it (its promise resolves only when all cells ran)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    # the widget renders and its loss plot gets points: while the job runs on most machines;
    # a busy one may draw the figure only after the short job ended, and the user then sees the
    # whole curve at once, so no running status is required here (it once timed out waiting
    # for one)
    page.wait_for_function(f"() => ({_LOSS_POINTS})() > 0", timeout=90_000, polling=100)
    first, first_status = page.evaluate(_LOSS_POINTS), page.evaluate(_STATUS)

    # a preemption marker appears, and the job ends succeeded
    page.wait_for_function(f"() => ({_PREEMPT_MARKERS})() >= 1", timeout=90_000, polling=200)
    page.wait_for_function(f"() => ({_STATUS})() === 'succeeded'", timeout=90_000, polling=200)
    # and its loss curve runs to the last step (the figure's last update follows the status's)
    page.wait_for_function(f"() => ({_LOSS_LAST_STEP})() >= ({_TOTAL_STEPS})() - 1", timeout=30_000)

    cost = page.evaluate("""() => {
        const c = document.querySelector('.spotnb-job-widget .spotnb-cost');
        return {spot: parseFloat(c.dataset.spot), onDemand: parseFloat(c.dataset.onDemand),
                text: c.innerText};
    }""")
    # whether spot came out cheaper depends on how long preparation took on this machine (a
    # 0.1 min job); what must hold is that the sentence says what the numbers say, with its baseline
    assert cost["spot"] > 0 and cost["onDemand"] > 0, cost
    cheaper = cost["spot"] < cost["onDemand"]
    assert ("less than on demand" if cheaper else "more than on demand") in cost["text"], cost
    assert "on demand for the same" in cost["text"], cost
    final = page.evaluate(_LOSS_POINTS)
    assert final >= first > 0

    # every cell ran, and nothing the user sees is a traceback or dollars typeset as maths
    wait_all_ran(page, 120)
    save_notebook(page)
    problems = output_problems(lab["dir"] / "01-quickstart.ipynb")
    assert not problems, problems
    assert page.evaluate(MATHJAX_NODES) == 0, "MathJax typeset part of the notebook (a $…$ pair)"
    assert page.evaluate(_PREEMPT_MARKERS) >= 2

    # the timeline and the breakdown draw every part of the job where it happened: each
    # instance's allocation before its preparation (the first live timeline once drew them the
    # other way round), and every category with seconds in it a bar on the breakdown's row
    drawn = page.evaluate(_BARS)
    for lane in {y for t in drawn["timeline"] for y in t["y"]}:
        spans = {
            t["name"]: min(b for b, y in zip(t["base"], t["y"], strict=True) if y == lane)
            for t in drawn["timeline"]
            if lane in t["y"]
        }
        if "allocation" in spans and "preparation" in spans:
            assert spans["allocation"] < spans["preparation"], (lane, spans)
    missing = [t["name"] for t in drawn["breakdown"] if t["x"] and t["x"][0] > 0 and not t["y"]]
    assert not missing, f"breakdown categories with seconds but no bar: {missing}"

    # the widget's progress line is readable: the extension's stylesheet must not reach into
    # notebook outputs (its 6 px `.spotnb-progress` bar once hid this line as a grey strip)
    progress = page.evaluate("""() => {
        const p = document.querySelector('.spotnb-job-widget .spotnb-progress');
        if (!p) return null;
        const r = p.getBoundingClientRect(); const cs = getComputedStyle(p);
        return {text: p.innerText, height: r.height, visibility: cs.visibility,
                display: cs.display};
    }""")
    assert progress is not None, "the widget has no .spotnb-progress line"
    assert "step" in progress["text"], progress
    assert progress["height"] > 6 and progress["visibility"] == "visible", progress
    assert progress["display"] != "none", progress

    # the figure fills the output area (plotly's widget alone draws 700 px whatever the width)
    measure = """() => {
        const w = document.querySelector('.spotnb-job-widget');
        const out = w && w.closest('.jp-OutputArea-output');
        // the drawn figure (plotly's svg), not its container div: the div stretches to the
        // output while a fixed-width layout draws a narrow figure inside it
        const fig = w && w.querySelector('.js-plotly-plot svg.main-svg');
        return {out: out ? out.getBoundingClientRect().width : 0,
                fig: fig ? fig.getBoundingClientRect().width : 0};
    }"""
    fills = f"() => {{ const m = ({measure})(); return m.out > 0 && m.fig >= 0.9 * m.out; }}"
    page.wait_for_function(fills, timeout=30_000)
    widths = page.evaluate(measure)
    print(f"widget figure width {widths['fig']:.0f} px of output {widths['out']:.0f} px")

    out_dir = Path(os.environ.get("SPOTNB_SCREENSHOTS") or lab["tmp"])
    out_dir.mkdir(parents=True, exist_ok=True)
    widget = page.locator(".spotnb-job-widget").first
    widget.scroll_into_view_if_needed()
    shot = out_dir / "quickstart-widget.png"
    widget.screenshot(path=str(shot))
    page.screenshot(path=str(out_dir / "quickstart-page.png"))
    print(f"screenshot: {shot}  (loss points {first} while {first_status} -> {final}, cost {cost})")

    # and follows the window when it narrows (a live chart, not a 700 px picture)
    page.set_viewport_size({"width": 1000, "height": 1900})
    page.wait_for_function(
        f"() => {{ const m = ({measure})(); return m.out < {widths['out']} && m.fig >= 0.9 * m.out"
        f" && m.fig <= m.out + 1; }}",
        timeout=30_000,
    )
    narrow = page.evaluate(measure)
    print(f"after narrowing the window: figure {narrow['fig']:.0f} px of output {narrow['out']:.0f} px")

    # the Spot jobs panel lists the job with the same savings sentence the widget shows
    page.evaluate("() => window.jupyterapp.commands.execute('spotnb:show-panel')")
    # the panel polls the server: a first draw may predate the job's end (its row then says
    # "running" and withholds the figure, as it should); wait for the row of the ended job
    page.wait_for_function(
        "() => !!document.querySelector('.spotnb-panel .spotnb-job-row[data-status=\"succeeded\"]')",
        timeout=30_000,
    )
    panel = page.locator(".spotnb-panel").first
    panel.screenshot(path=str(out_dir / "panel.png"))
    row_saved = page.evaluate("() => document.querySelector('.spotnb-panel .spotnb-row-saved').innerText")
    print(f"screenshot: {out_dir / 'panel.png'}  (panel savings {row_saved!r})")
    # the panel says the same as the widget (one definition: spotnb.core.savings)
    assert row_saved.strip() and row_saved.strip() in cost["text"], (row_saved, cost)

    # the job view: readable event sentences, no raw key=value records
    page.locator(".spotnb-panel .spotnb-job-row").first.click()
    page.wait_for_function(
        "() => document.querySelectorAll('.spotnb-jobview .spotnb-events tr').length > 2",
        timeout=30_000,
    )
    view = page.locator(".spotnb-jobview").first
    view.screenshot(path=str(out_dir / "jobview.png"))
    events = page.evaluate("() => document.querySelector('.spotnb-jobview .spotnb-events').innerText")
    raw = re.findall(r"\b[a-z_]+=\S+", events)
    assert not raw, f"raw key=value records in the job view's events: {raw[:5]}"
    print(f"screenshot: {out_dir / 'jobview.png'}")

    # a failed job's view puts its error first, once, above the charts, in the first screen
    failed_id = _run_a_failing_job(lab)
    page.evaluate(f"() => window.jupyterapp.commands.execute('spotnb:open-job', {{id: '{failed_id}'}})")
    scope = f".spotnb-jobview[data-job-id='{failed_id}']"
    page.wait_for_function(
        f'() => !!document.querySelector("{scope} .spotnb-failure") && !!document.querySelector('
        f'"{scope} .spotnb-figures .js-plotly-plot, {scope} .spotnb-figures svg")',
        timeout=30_000,
    )
    where = page.evaluate(
        f"""() => {{
        const v = document.querySelector("{scope}");
        const f = v.querySelector('.spotnb-failure'), figs = v.querySelector('.spotnb-figures');
        const box = v.getBoundingClientRect();
        return {{failure: f.getBoundingClientRect().top - box.top,
                 figures: figs.getBoundingClientRect().top - box.top,
                 height: box.height, title: f.querySelector('b').innerText}};
    }}"""
    )
    page.locator(scope).first.screenshot(path=str(out_dir / "jobview-failed.png"))
    print(f"screenshot: {out_dir / 'jobview-failed.png'}  ({where})")
    assert where["failure"] < where["figures"] and where["failure"] < where["height"] / 2, where
    assert where["title"] == "ValueError: bad batch at step 5", where  # once, not "ValueError: ValueError"


def _run_a_failing_job(lab: dict[str, Any]) -> str:
    """A job whose function raises at step 5, run on the local market in the lab's spotnb home
    (a separate process, as another notebook would); returns its id."""
    code = (
        "import spotnb as spot\n"
        "from tests.support import jobfns\n"
        "job = spot.train(jobfns.fails_at,\n"
        "                 spot.Config(ship_modules=['tests.support.jobfns'], name='fails'))\n"
        "try:\n    job.result(timeout=120)\nexcept spot.JobFailed:\n    print(job.id)\n"
    )
    env = {
        **os.environ,
        "SPOTNB_FAST": "1",
        "SPOTNB_HOME": str(lab["tmp"] / "spotnb-home"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]
