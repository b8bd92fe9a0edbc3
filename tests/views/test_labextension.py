"""The JupyterLab extension: built and listed by JupyterLab, loads without errors
(`python -m jupyterlab.browser_check`), and in headless Chromium shows a job that a fixture
started on the local spot market: the Spot jobs panel lists it, a click opens its view with
its status and cost, and the status bar counts it.

Every wait is on a condition (Playwright waits, or polling a condition with a deadline), never
a sleep. The browser tests skip without /usr/bin/chromium unless CI is set (CI installs it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb import _jupyter
from tests.support.browser_lab import CHROMIUM, CHROMIUM_ARGS
from tests.views.test_server_ext import ROOT, request, start_jupyter, stop_process, wait_for

BUILT = ROOT / "spotnb" / "labextension" / "package.json"
SETUP = "bash -c 'source scripts/setup.d/50-labextension.sh'"

needs_build = pytest.mark.skipif(
    not BUILT.exists() and not os.environ.get("CI"),
    reason=f"the JupyterLab extension is not built ({BUILT} missing); run {SETUP}",
)
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason=f"{CHROMIUM} not installed (apt-get install chromium; CI installs it and runs this)",
)


def _labextension_list() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True, timeout=120
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)


@needs_build
def test_the_extension_is_built_and_jupyterlab_lists_it_ok() -> None:
    paths = _jupyter._jupyter_labextension_paths()
    src = Path(_jupyter.__file__).parent / paths[0]["src"]
    meta = json.loads((src / "package.json").read_text())
    assert meta["name"] == paths[0]["dest"] == "spotnb"
    assert (src / meta["jupyterlab"]["_build"]["load"]).exists()
    exported = getattr(spot, "_jupyter_labextension_paths", None)  # once spotnb/__init__ re-exports it
    if exported is not None:
        assert exported() == paths
    listing = _labextension_list()
    assert re.search(r"^\s*spotnb v\S+ enabled\s+OK", listing, re.M), listing


def _debian_chromium_for_playwright(tmp: Path) -> dict[str, str]:
    """`jupyterlab.browser_check` drives the browser from node Playwright, which it installs
    with npm into `<app dir>/browser_test`, then runs `npx playwright install chromium`, which
    downloads Chrome for Testing from Playwright's CDN (unreachable from CI machines without
    outbound access to it). Give that Playwright a browsers directory where its Chromium and
    headless shell are Debian's /usr/bin/chromium (marked installed, so nothing is downloaded)
    and ffmpeg (used only to record videos) is a stub. Returns the env to point it there."""
    from jupyterlab.commands import get_app_dir

    target = Path(get_app_dir()) / "browser_test"
    if not (target / "node_modules").exists():  # exactly what browser_check itself would do
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "init", "-y"], cwd=target, check=True, capture_output=True, timeout=300)
        subprocess.run(
            ["npm", "install", "playwright@^1.9.2"], cwd=target, check=True, capture_output=True, timeout=600
        )
    spec = json.loads((target / "node_modules" / "playwright-core" / "browsers.json").read_text())
    rev = {b["name"]: b["revision"] for b in spec["browsers"]}
    root = tmp / "playwright-browsers"
    layout = [
        (f"chromium-{rev['chromium']}", "chrome-linux64/chrome", CHROMIUM),
        (
            f"chromium_headless_shell-{rev['chromium-headless-shell']}",
            "chrome-headless-shell-linux64/chrome-headless-shell",
            CHROMIUM,
        ),
        (f"ffmpeg-{rev['ffmpeg']}", "ffmpeg-linux", "/bin/false"),
    ]
    for folder, exe, real in layout:
        path = root / folder / exe
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(real)
        for marker in ("INSTALLATION_COMPLETE", "DEPENDENCIES_VALIDATED"):
            (root / folder / marker).touch()
    return {"PLAYWRIGHT_BROWSERS_PATH": str(root)}


@needs_build
@needs_chromium
@pytest.mark.browser
@pytest.mark.slow
def test_jupyterlab_browser_check(tmp_path: Path) -> None:
    """JupyterLab's own smoke test (`python -m jupyterlab.browser_check`): starts the app
    (under base URL /foo/) with every installed extension, spotnb's included, in headless
    Chromium and fails on any console error or logged server error."""
    env = {
        **os.environ,
        "SPOTNB_HOME": str(tmp_path / "home"),
        "JUPYTER_CONFIG_PATH": str(ROOT / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        **_debian_chromium_for_playwright(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-m", "jupyterlab.browser_check", *(["--allow-root"] if os.geteuid() == 0 else [])],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-5000:]
    assert "Browser test complete" in log and "Exiting normally" in log, log[-3000:]
    assert "spotnb.views.server | extension was successfully loaded" in log, log[-3000:]


# -- the panel, the view and the status bar in a real JupyterLab --------------------------------
def long_fit(ctx: Any) -> None:
    """A local job that runs until the test stops it, preempted once early on."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ctx.track(model=model, optimizer=opt)
    for _ in ctx.steps(200_000):
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
        time.sleep(0.01)  # the workload's step time, not a wait in the test


@pytest.fixture
def lab(tmp_path: Path, spotnb_home: Path) -> Iterator[dict[str, Any]]:
    """JupyterLab on 127.0.0.1 (free port, token) with this test's SPOTNB_HOME."""
    work = tmp_path / "lab"
    work.mkdir()
    settings = tmp_path / "lab-settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    proc, url, token, log = start_jupyter(
        "jupyterlab",
        tmp_path,
        spotnb_home,
        work,
        extra_env={
            "JUPYTERLAB_SETTINGS_DIR": str(settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
        },
        extra_args=("--LabApp.expose_app_in_browser=True",),
    )
    try:
        yield {"url": url, "token": token, "tmp": tmp_path, "log": log}
    finally:
        stop_process(proc)


@pytest.fixture
def running_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A job on the local market, in this process, with the same SPOTNB_HOME as the lab;
    returned once it has been preempted once and runs again with metrics logged."""
    monkeypatch.chdir(tmp_path)
    job = spot.train(
        long_fit,
        spot.Config(
            name="lab-demo",
            local_schedule=[{"step": 40, "phase": "step"}],
            save_every=25,
            notice_poll=0.1,
            ship_modules=[__name__],
        ),
    )
    try:
        wait_for(
            lambda: (
                job.status == "running"
                and job.breakdown().preemptions == 1
                and len(job.metrics.get("loss", [])) > 60
            ),
            180,
            f"job {job.id} to be preempted once and run again (status {job.status})",
        )
        yield job
    finally:
        if not job.done:
            job.stop(timeout=60)


@needs_build
@needs_chromium
@pytest.mark.browser
@pytest.mark.slow
def test_panel_lists_the_job_and_its_view_shows_status_and_cost(
    lab: dict[str, Any], running_job: Any
) -> None:
    from playwright.sync_api import expect, sync_playwright

    job = running_job
    status, data = request(f"{lab['url']}/spotnb/api/jobs", lab["token"])
    assert status == 200 and data["jobs"][0]["id"] == job.id, data
    shot = lab["tmp"] / "spotnb-labextension.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        console: list[str] = []
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 950})
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"{lab['url']}/lab?token={lab['token']}&reset")
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=120_000)

            # the status bar counts the running job and shows its burn rate
            running = page.locator(".spotnb-statusbar .spotnb-sb-running")
            expect(running).to_have_text("1", timeout=30_000)
            expect(page.locator(".spotnb-statusbar .spotnb-sb-rate")).to_have_text(
                re.compile(r"^\$\d+\.\d+/h$")
            )

            # open the panel from the left sidebar: the job is listed, running, first
            page.locator(".jp-SideBar.jp-mod-left [data-id='spotnb-jobs-panel']").click()
            row = page.locator(f".spotnb-job-row[data-job-id='{job.id}']")
            expect(row).to_be_visible(timeout=30_000)
            expect(page.locator(".spotnb-job-row").first).to_have_attribute("data-job-id", job.id)
            expect(row.locator(".spotnb-badge")).to_have_text("running")
            expect(row.locator(".spotnb-row-name")).to_have_text("lab-demo")
            expect(row).to_contain_text("local")
            expect(row).to_contain_text("⚡ 1")

            # it refreshes without a reload: the step shown grows
            step_text = row.locator(".spotnb-row-progress span")
            first = int(re.sub(r"\D", "", step_text.inner_text().split("/")[0]))
            page.wait_for_function(
                """([sel, first]) => {
                     const s = document.querySelector(sel);
                     return s && parseInt(s.textContent.replace(/[^0-9\\/]/g, '').split('/')[0]) > first;
                   }""",
                arg=[f".spotnb-job-row[data-job-id='{job.id}'] .spotnb-row-progress span", first],
                timeout=30_000,
            )

            # click into the job: a main-area view with its status, cost and figures
            row.click()
            view = page.locator(f".spotnb-jobview[data-job-id='{job.id}']")
            expect(view).to_be_visible(timeout=30_000)
            expect(view.locator(".spotnb-status")).to_have_attribute("data-status", "running", timeout=30_000)
            expect(view.locator(".spotnb-status")).to_have_text("running")
            expect(view.locator("h1")).to_have_text("lab-demo")
            spot_cost = view.locator(".spotnb-cost-spot .spotnb-card-value")
            expect(spot_cost).to_have_text(re.compile(r"^\$\d+\.\d+$"))
            expect(view.locator(".spotnb-preempt-card .spotnb-card-value")).to_have_text("1")
            expect(view.locator(".spotnb-breakdown")).to_contain_text("compute")
            expect(view.locator(".spotnb-stop")).to_be_enabled()
            # the widget's three figures, drawn by JupyterLab's plotly renderer when installed
            # (jupyterlab-plotly ships with plotly), else as SVG / tables
            for name in ("metrics", "timeline", "breakdown"):
                expect(
                    view.locator(
                        f".spotnb-figure[data-figure='{name}'] .plot-container, "
                        f".spotnb-figure[data-figure='{name}'] .spotnb-figure-static"
                    )
                ).to_have_count(1, timeout=30_000)
            page.wait_for_function(  # the spot cost shown is the job's, and it is not zero
                "sel => { const e = document.querySelector(sel);"
                " return e && parseFloat(e.textContent.slice(1)) > 0; }",
                arg=f".spotnb-jobview[data-job-id='{job.id}'] .spotnb-cost-spot .spotnb-card-value",
                timeout=30_000,
            )
            page.screenshot(path=str(shot))
            print(f"\nscreenshot: {shot}")
            view.evaluate("node => { node.scrollTop = node.scrollHeight; }")
            page.screenshot(path=str(lab["tmp"] / "spotnb-labextension-bottom.png"))

            # Stop from the view: confirm the dialog; the job ends as stopped
            view.locator(".spotnb-stop").click()
            page.locator(".jp-Dialog .jp-mod-accept").click()
            assert job.wait(60), f"job {job.id} still {job.status} after Stop in the view"
            assert job.status == "stopped"
            expect(view.locator(".spotnb-status")).to_have_attribute("data-status", "stopped", timeout=30_000)
            expect(view.locator(".spotnb-stop")).to_be_hidden()
            expect(running).to_have_text("0", timeout=30_000)
            page.screenshot(path=str(lab["tmp"] / "spotnb-labextension-stopped.png"))
        except Exception:
            try:
                page.screenshot(path=str(lab["tmp"] / "failure.png"))
            except Exception:  # noqa: BLE001 - the page may be gone
                pass
            print("browser console:\n" + "\n".join(console[-50:]))
            print("server log:\n" + lab["log"].read_text()[-3000:])
            raise
        finally:
            browser.close()
    errors = [m for m in console if m.startswith(("error", "pageerror")) and "spotnb" in m.lower()]
    assert not errors, errors
