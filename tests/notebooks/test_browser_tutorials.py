"""Tutorials 04 (several instances) and 05 (zones and migration) run cell by cell, twice in a
row from the same folder (a fresh kernel each time), in the JupyterLab of the Binder environment
(tests/support/binder_env.py builds it as repo2docker does), in headless Chromium, and are checked for
what a user reads there: every preemption drawn at its step, the status bar's $/h the sum over
the live instances, instance-seconds said so, the lanes named as the feed names instances, the
zone prices' axis ticked at the zones' prices, the move in the legend, a dry run that is text
(no MathJax), nothing cut short, nothing left next to the notebook. (tests/notebooks/test_notebooks.py runs
the other tutorials twice in the same environment with nbclient.)

Screenshots land in $SPOTNB_SCREENSHOTS (else /tmp) for a person to look at. Every wait is on
a condition in the page, never a sleep.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.binder_env import binder_python
from tests.support.browser_lab import (
    BROWSER_MARKS,
    CHROMIUM,
    CHROMIUM_ARGS,
    MATHJAX_NODES,
    open_notebook,
    output_problems,
    run_all,
    run_lab,
    save_notebook,
    wait_all_ran,
)

pytestmark = BROWSER_MARKS

#: the first job widget's figure: its traces and layout, as plotly drew them
_FIGURE = """() => {
  const gd = document.querySelector('.spotnb-job-widget .js-plotly-plot');
  if (!gd || !gd.data || !gd.layout) return null;
  return {
    traces: gd.data.map(t => ({name: t.name, x: t.x ? Array.from(t.x) : [],
                               y: t.y ? Array.from(t.y) : [], xaxis: t.xaxis, yaxis: t.yaxis})),
    layout: JSON.parse(JSON.stringify(gd.layout)),
    legend: Array.from(gd.querySelectorAll('.legendtext')).map(e => e.textContent),
    titles: Array.from(gd.querySelectorAll('.annotation-text')).map(e => e.textContent),
    ticks: Array.from(gd.querySelectorAll('.yaxislayer-above text')).map(e => e.textContent),
  };
}"""
_STATUS = """() => {
  const s = document.querySelector('.spotnb-job-widget .spotnb-status');
  return s ? s.dataset.status : null;
}"""
_STATUSBAR = "() => { const s = document.querySelector('.spotnb-statusbar'); return s ? s.innerText : ''; }"


def _shots() -> Path:
    out = Path(os.environ.get("SPOTNB_SCREENSHOTS") or "/tmp")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def browser_page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 2400})
            page.console = []  # type: ignore[attr-defined]
            page.on("console", lambda m: page.console.append(f"{m.type}: {m.text}"))  # type: ignore[attr-defined]
            yield page
        finally:
            browser.close()


def _report(page: Any, lab: dict[str, Any], name: str) -> None:
    shot = lab["tmp"] / f"{name}-failure.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"failure screenshot: {shot}\nconsole (last 20):\n" + "\n".join(page.console[-20:]))


#: the tutorial's job widgets are gone (the outputs were cleared for the second run)
_NO_WIDGET = "() => document.querySelectorAll('.spotnb-job-widget').length === 0"


def _again(page: Any, lab: dict[str, Any], name: str) -> None:
    """The tutorial's second run from the same folder: its outputs cleared, a new kernel, every
    cell run again; it must pass too and leave nothing next to the notebook either."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    page.wait_for_function(_NO_WIDGET, timeout=30_000)
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
    page.wait_for_function(
        """() => { const w = window.jupyterapp.shell.currentWidget;
          const k = w.sessionContext.session && w.sessionContext.session.kernel;
          return !!k && k.status === 'idle' && w.content.widgets.every(
              c => c.model.type !== 'code' || c.model.executionCount === null
                   || c.model.outputs.length === 0); }""",
        timeout=60_000,
    )
    run_all(page)


def _ran_cleanly(page: Any, lab: dict[str, Any], name: str, run: int) -> None:
    wait_all_ran(page, 300)
    save_notebook(page)
    problems = output_problems(lab["dir"] / name)
    assert not problems, f"run {run}: {problems}"
    left = sorted(p.name for p in lab["dir"].iterdir() if p.name not in (name, ".ipynb_checkpoints"))
    assert not left, f"run {run} left next to the notebook: {left}"


@pytest.fixture(scope="module")
def binder() -> Path:
    return binder_python()


def _job_id(lab: dict[str, Any], name: str) -> str:
    """The id of the lab's latest job named `name` (its job DB)."""
    from spotnb.control.jobdb import JobDB

    os.environ["SPOTNB_HOME"] = str(lab["tmp"] / "spotnb-home")
    return str(max((r for r in JobDB().jobs() if r.get("name") == name), key=lambda r: r["created"])["id"])


def _job_events(lab: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The events of the lab's job named `name`, read from its store as `spot.attach` does."""
    import spotnb as spot

    job = spot.attach(_job_id(lab, name))  # the latest run's
    job.result(timeout=60)
    return list(job.events)


def test_many_instances_tutorial_draws_what_happened(tmp_path: Path, browser_page: Any, binder: Path) -> None:
    page, name = browser_page, "04-many-instances.ipynb"
    with run_lab(tmp_path, [name], python=str(binder), checkout=False) as lab:
        try:
            open_notebook(page, lab, name, min_cells=5)
            run_all(page)
            page.wait_for_function(f"() => ({_STATUS})() === 'succeeded'", timeout=300_000, polling=500)
            _ran_cleanly(page, lab, name, 1)
            _again(page, lab, name)
            # while the job holds more than one instance, the status bar's $/h is all of them
            # (it once showed the last one allocated: "$0.16/h" for three)
            page.wait_for_function(
                f"""() => {{ const m = ({_STATUSBAR})().match(/\\$([0-9.]+)\\/h/);
                    return !!m && parseFloat(m[1]) >= 0.3; }}""",
                timeout=120_000,
                polling=200,
            )
            page.wait_for_function(f"() => ({_STATUS})() === 'succeeded'", timeout=300_000, polling=500)
            _ran_cleanly(page, lab, name, 2)
            page.locator(".spotnb-job-widget").first.screenshot(path=str(_shots() / "04-widget.png"))
            fig = page.evaluate(_FIGURE)

            # every preemption is drawn at the step it happened, none at step 0
            events = _job_events(lab, "three-instances")
            kills = sorted(e["step"] for e in events if e["kind"] == "preempted")
            assert len(kills) == 2 and all(isinstance(s, int) and s > 0 for s in kills), kills
            marks = next(t for t in fig["traces"] if t["name"] == "preempted")
            drawn = sorted({x for x in marks["x"] if x is not None})
            assert len(drawn) == 2 and all(abs(d - k) <= 2 for d, k in zip(drawn, kills, strict=True)), (
                drawn,
                kills,
            )

            # one naming: the lanes are replicas naming their instances #n, as the feed does
            lanes = fig["layout"]["yaxis2"]["ticktext"]
            assert [lane.split(" · ")[0] for lane in lanes[:3]] == ["replica 0", "replica 1", "replica 2"], (
                lanes
            )
            instances = {int(n) for lane in lanes[:3] for n in lane.split("#")[1:]}
            assert instances == {e["incarnation"] for e in events if e["kind"] == "allocated"}
            feed = page.evaluate("() => document.querySelector('.spotnb-job-widget .spotnb-feed').innerText")
            assert "#2" in feed or "#4" in feed or "#5" in feed, feed

            # instance-seconds are said to be so, in the figure and the savings line
            assert any("instance-seconds" in t for t in fig["titles"]), fig["titles"]
            cost = page.evaluate("() => document.querySelector('.spotnb-job-widget .spotnb-cost').innerText")
            assert "instance-min" in cost and "per instance" in cost, cost

            # a count is ticked at whole numbers (the replicas panel read 2, 2.5, 3)
            assert "2.5" not in fig["ticks"], fig["ticks"]

            # the feed's newest event is in view, not below its fold
            visible = page.evaluate(
                """() => { const f = document.querySelector('.spotnb-job-widget .spotnb-feed');
                  const lines = f.querySelectorAll('.spotnb-feed-line');
                  const last = lines[lines.length - 1].getBoundingClientRect();
                  const box = f.getBoundingClientRect();
                  return last.bottom <= box.bottom + 1 && last.top >= box.top - 1; }"""
            )
            assert visible, "the newest feed line is scrolled out of view"

            # once every job ended, the status bar says nothing runs
            page.wait_for_function(
                f"() => ({_STATUSBAR})().startsWith('Spot: 0 running')", timeout=30_000, polling=500
            )

            # the lab's job view says its prices are each instance's
            job_id = _job_id(lab, "three-instances")
            page.evaluate(f"() => window.jupyterapp.commands.execute('spotnb:open-job', {{id: '{job_id}'}})")
            card = f".spotnb-jobview[data-job-id='{job_id}'] .spotnb-cost-spot .spotnb-card-sub"
            page.wait_for_function(f'() => !!document.querySelector("{card}")', timeout=30_000)
            sub = page.evaluate(f'() => document.querySelector("{card}").innerText')
            assert "per instance" in sub, sub
        except Exception:
            _report(page, lab, "04")
            raise


def test_zones_tutorial_shows_prices_moves_and_a_readable_dry_run(
    tmp_path: Path, browser_page: Any, binder: Path
) -> None:
    page, name = browser_page, "05-zones-and-migration.ipynb"
    with run_lab(tmp_path, [name], python=str(binder), checkout=False) as lab:
        try:
            open_notebook(page, lab, name, min_cells=5)
            for run in (1, 2):
                if run == 2:
                    _again(page, lab, name)
                else:
                    run_all(page)
                page.wait_for_function(f"() => ({_STATUS})() === 'succeeded'", timeout=300_000, polling=500)
                _ran_cleanly(page, lab, name, run)
            widget = page.locator(".spotnb-job-widget").first
            widget.screenshot(path=str(_shots() / "05-widget.png"))
            # the dry run's dollar amounts stay text ("$0.100/h × 1.04 h" was typeset as maths)
            assert page.evaluate(MATHJAX_NODES) == 0

            fig = page.evaluate(_FIGURE)
            events = _job_events(lab, "moving-mlp")
            assert [e["kind"] for e in events if e["kind"] == "moving"] == ["moving"]
            # the price band is ticked at the zones' prices, and drawn apart from the lanes
            band = fig["layout"]["yaxis11"]
            assert sorted(band["tickvals"]) == [0.02, 0.2, 0.3], band.get("tickvals")
            assert {"$0.02", "$0.20", "$0.30"} <= set(fig["ticks"]), fig["ticks"]
            assert band["domain"][0] > fig["layout"]["yaxis2"]["domain"][1]
            # the move has its own mark, and the legend says what it is
            move = next(t for t in fig["traces"] if t["name"] == "moved zone")
            assert len(move["x"]) == 1
            assert "moved zone" in fig["legend"], fig["legend"]
            # the lanes name the zones, and no zone label runs off the figure
            lanes = fig["layout"]["yaxis2"]["ticktext"]
            assert lanes == ["#1 zone-a", "#2 zone-b"], lanes
            clipped = page.evaluate(
                """() => { const gd = document.querySelector('.spotnb-job-widget .js-plotly-plot');
                  const box = gd.getBoundingClientRect();
                  return Array.from(gd.querySelectorAll('.textpoint text')).filter(t => {
                    const r = t.getBoundingClientRect();
                    return r.width > 0 && (r.right > box.right + 1 || r.left < box.left - 1);
                  }).map(t => t.textContent); }"""
            )
            assert not clipped, f"labels cut at the figure's edge: {clipped}"
            # the finished job's button says "done" whole
            button = page.evaluate(
                """() => { const b = document.querySelector('.spotnb-job-widget button');
                  return {text: b.innerText, fits: b.scrollWidth <= b.clientWidth + 1}; }"""
            )
            assert "done" in button["text"] and button["fits"], button
        except Exception:
            _report(page, lab, "05")
            raise
