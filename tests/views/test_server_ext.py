"""The Jupyter server extension behind the JupyterLab panel (`spotnb.views.server`): the data it
computes from the job DB and event logs, and its routes in a real `jupyter server` that loads
it through the shipped `jupyter-config/` file, with Jupyter's token auth on every route."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.control.jobdb import JobDB
from spotnb.views.server.data import JobViews, list_payload, pid_alive
from tests.support.paths import REPO

ROOT = REPO


# -- training functions shipped to local instances (by value: ship_modules=[__name__]) ----------
def short_fit(ctx: Any) -> float:
    """60 steps; the first incarnation holds at step 30 until the market's kill there ends it
    (on a loaded machine the market may otherwise see the step only after the loop)."""
    loss = 1.0
    for step in ctx.steps(60):
        loss = 1.0 / (1 + step)
        ctx.log(loss=loss)
        time.sleep(0.01)  # the workload's own step time
        deadline = time.monotonic() + 120
        while step == 30 and ctx.incarnation == 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    return loss


def endless(ctx: Any) -> None:
    for step in ctx.steps(1_000_000):
        ctx.log(loss=1.0 / (1 + step))
        time.sleep(0.01)  # the workload's own step time, not a wait in the test


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `cond` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)  # polling interval of a condition, not a race-hiding sleep


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_jupyter(
    app: str,
    tmp: Path,
    home: Path,
    root_dir: Path,
    extra_env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], str, str, Path]:
    """`python -m <app>` (jupyter_server or jupyterlab) on 127.0.0.1, a free port and a token,
    with SPOTNB_HOME=`home` and the repository's jupyter-config/ on the config path (so the
    server extension is enabled by the shipped file even before setup installed it)."""
    port, token = free_port(), os.urandom(12).hex()
    env = {
        **os.environ,
        "SPOTNB_HOME": str(home),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "JUPYTER_CONFIG_PATH": os.pathsep.join(
            filter(None, [str(ROOT / "jupyter-config"), os.environ.get("JUPYTER_CONFIG_PATH")])
        ),
        "JUPYTER_RUNTIME_DIR": str(tmp / "jupyter-runtime"),
        **(extra_env or {}),
    }
    log_path = tmp / f"{app}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the server writes it until teardown
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            app,
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root_dir}",
            *extra_args,
            *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        ],
        cwd=root_dir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{app} exited:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for(up, 90, f"{app} to answer on {url}", interval=0.2)
    except AssertionError:
        stop_process(proc)
        raise AssertionError(f"{app} did not start:\n{log_path.read_text()[-3000:]}") from None
    return proc, url, token, log_path


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def request(url: str, token: str | None = None, method: str = "GET", header: bool = True) -> tuple[int, Any]:
    """(status, JSON body or text). The token goes in the Authorization header (what
    JupyterLab's ServerConnection sends), or in the query string with header=False."""
    headers = {}
    if token and header:
        headers["Authorization"] = f"token {token}"
    elif token:
        url += ("&" if "?" in url else "?") + f"token={token}"
    req = urllib.request.Request(url, method=method, headers=headers, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
            status = r.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


# -- the data, without a server ---------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_list_sorts_running_first_and_totals_burn_rate(tmp_path: Path) -> None:
    db = JobDB(tmp_path / "jobs.db")
    me = os.getpid()
    specs = [
        ("a-done", "succeeded", 1.0, None),
        ("b-run", "running", 2.0, me),
        ("c-pend", "pending", 3.0, me),
        ("d-orphan", "running", 4.0, _dead_pid()),
        ("e-pre", "preempted", 5.0, me),
        ("f-run", "running", 6.0, me),
    ]
    for job_id, status, created, pid in specs:
        db.add_job(job_id, name=None, provider="local", region=None, instance_type="cpu", store="file:///x")
        db.update_job(
            job_id,
            status=status,
            created=created,
            controller_pid=pid,
            spot_cost=0.25,
            on_demand_cost=1.0,
            burn_rate=0.5 if status == "running" else 0.0,
        )
    data = list_payload(db, now=10.0)
    assert [r["id"] for r in data["jobs"]] == ["f-run", "b-run", "e-pre", "c-pend", "d-orphan", "a-done"]
    orphan = next(r for r in data["jobs"] if r["id"] == "d-orphan")
    assert orphan["orphaned"] and not orphan["active"] and orphan["burn_rate"] == 0.0
    assert data["running"] == 2 and data["active"] == 4
    assert data["burn_rate"] == pytest.approx(1.0)
    assert data["jobs"][0]["saved"] == pytest.approx(0.75) and data["jobs"][0]["age"] == pytest.approx(4.0)
    json.dumps(data, allow_nan=False)


def test_pid_alive() -> None:
    assert pid_alive(os.getpid()) is True
    assert pid_alive(_dead_pid()) is False
    assert pid_alive(None) is None


def test_detail_of_a_finished_job_matches_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    job = spot.train(
        short_fit,
        spot.Config(local_schedule=[{"step": 30, "phase": "step"}], notice_poll=0.1, ship_modules=[__name__]),
    )
    job.result(timeout=120)
    views = JobViews()
    d = views.detail(job.id[:12])  # an id prefix works, as in spot.attach
    assert d is not None and d["job"]["id"] == job.id
    assert d["status"] == "succeeded" and d["job"]["status"] == "succeeded"
    assert d["breakdown"] == pytest.approx(job.breakdown().as_dict())
    assert d["breakdown"]["preemptions"] == 1 and len(d["timeline"]) == 2
    steps = set(d["metrics"].get("loss", {}).get("x", []))
    steps.update(x for seg in d["redo"].get("loss", []) for x in seg["x"])
    assert max(steps) == 59  # downsampled bucket means; 60 steps fit without merging
    assert d["events"]["kinds"]["preempted"] == 1
    # the job view describes events in the widget's words (one describer for every view)
    from spotnb.views.widget.text import event_text

    widget_words = {event_text(e) for e in job.state.feed}
    assert d["events"]["recent"] and all(e["text"] in widget_words for e in d["events"]["recent"])
    assert any("preempted" in e["text"].lower() for e in d["events"]["recent"])
    assert set(d["figures"]) == {"metrics", "timeline", "breakdown"}
    json.dumps(d, allow_nan=False)
    again = views.detail(job.id)  # incremental: nothing new, same answer
    assert again is not None and again["breakdown"] == d["breakdown"]
    assert views.detail("no-such-job") is None and views.stop("no-such-job") is None
    assert views.stop(job.id)["stopped"] is False  # type: ignore[index]


# -- the routes, in a real jupyter server -----------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("server")
    home = tmp / "spotnb-home"
    home.mkdir()
    proc, url, token, log = start_jupyter("jupyter_server", tmp, home, tmp)
    try:
        yield {"url": url, "token": token, "home": home, "log": log}
    finally:
        stop_process(proc)


@pytest.fixture
def spotnb_home(server: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Path:
    """Overrides the autouse fixture: this module's jobs go to the server's SPOTNB_HOME."""
    monkeypatch.setenv("SPOTNB_HOME", str(server["home"]))
    return server["home"]


ROUTES = [
    ("GET", "/spotnb/api/jobs"),
    ("GET", "/spotnb/api/jobs/some-job"),
    ("POST", "/spotnb/api/jobs/some-job/stop"),
]


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_needs_the_token(server: dict[str, Any], method: str, path: str) -> None:
    status, _ = request(server["url"] + path, None, method)
    assert status in (401, 403), f"{method} {path} answered {status} without a token"
    status, _ = request(server["url"] + path, "not-the-token", method)
    assert status in (401, 403), f"{method} {path} answered {status} with a wrong token"


def test_jobs_route_with_the_token(server: dict[str, Any]) -> None:
    status, data = request(server["url"] + "/spotnb/api/jobs", server["token"])
    assert status == 200, data
    assert {"jobs", "running", "burn_rate"} <= set(data)
    status, data = request(server["url"] + "/spotnb/api/jobs", server["token"], header=False)
    assert status == 200, data
    status, _ = request(server["url"] + "/spotnb/api/jobs/no-such-job", server["token"])
    assert status == 404
    status, _ = request(server["url"] + "/spotnb/api/jobs/no-such-job/stop", server["token"], "POST")
    assert status == 404


def test_an_ambiguous_id_prefix_is_a_400_listing_the_matches(server: dict[str, Any]) -> None:
    db = JobDB(Path(server["home"]) / "jobs.db")
    for job_id in ("amb-0001", "amb-0002", "x_y", "xzy"):
        db.add_job(
            job_id, name=None, provider="local", region=None, instance_type="cpu", store="file:///nonexistent"
        )
    for method, path in (("GET", "amb-"), ("POST", "amb-/stop")):
        status, data = request(f"{server['url']}/spotnb/api/jobs/{path}", server["token"], method)
        assert status == 400, data
        assert sorted(data["matches"]) == ["amb-0001", "amb-0002"]
        assert "ambiguous" in data["message"]
    status, data = request(f"{server['url']}/spotnb/api/jobs/x_", server["token"])
    assert status == 200 and data["job"]["id"] == "x_y"  # `_` is no wildcard: xzy is no match


def test_a_live_job_through_the_api_then_stop_it(
    server: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = spot.train(
        endless, spot.Config(name="api-live", local_schedule=[], notice_poll=0.1, ship_modules=[__name__])
    )
    try:
        url, token = server["url"], server["token"]

        def listed_running() -> dict[str, Any] | None:
            _, data = request(f"{url}/spotnb/api/jobs", token)
            row = next((r for r in data["jobs"] if r["id"] == job.id), None)
            return data if row and row["status"] == "running" and row["step"] > 0 else None

        data = wait_for(listed_running, 120, "the job to be listed as running with steps")
        assert data["jobs"][0]["id"] == job.id and data["jobs"][0]["name"] == "api-live"
        assert data["running"] == 1 and data["burn_rate"] > 0

        def has_metrics() -> dict[str, Any] | None:
            status, d = request(f"{url}/spotnb/api/jobs/{job.id}", token)
            assert status == 200, d
            return d if d["metrics"].get("loss", {}).get("x") else None

        d = wait_for(has_metrics, 60, "metrics in the job's detail")
        assert d["status"] == "running" and d["name"] == "api-live"
        assert d["cost"]["spot"] >= 0 and d["breakdown"]["total"] > 0

        status, res = request(f"{url}/spotnb/api/jobs/{job.id}/stop", token, "POST")
        assert status == 200 and res["stopped"] is True, res
        assert job.wait(60), f"job still {job.status} after the stop request"
        assert job.status == "stopped"
        wait_for(
            lambda: request(f"{url}/spotnb/api/jobs/{job.id}", token)[1]["status"] == "stopped",
            30,
            "the API to report the job stopped",
        )
    finally:
        if not job.done:
            job.stop(timeout=60)


def failing_fit(ctx: Any) -> float:
    for step in ctx.steps(20):
        ctx.log(loss=1.0)
        if step == 5:
            raise ValueError("learning rate too high")
    return 0.0


def test_a_failed_job_shows_its_error_once_and_no_savings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job view leads with the error; a failed job claims no savings (issue 15)."""
    from spotnb.errors import JobFailed

    monkeypatch.chdir(tmp_path)
    job = spot.train(failing_fit, spot.Config(notice_poll=0.1, ship_modules=[__name__]))
    with pytest.raises(JobFailed):
        job.result(timeout=120)
    views = JobViews()
    d = views.detail(job.id)
    assert d is not None and d["status"] == "failed"
    f = d["failure"]
    assert f["exc_type"] == "ValueError" and "learning rate too high" in f["message"]
    # the view prints exc_type only when the message lacks it: never "ValueError: ValueError: …"
    assert "ValueError: ValueError" not in f["message"]
    assert d["job"]["savings"] is None and d["job"]["savings_tone"] == "none"
    assert "%" not in d["job"]["savings_text"]
    # the panel's row says the same
    row = next(r for r in views.jobs()["jobs"] if r["id"] == job.id)
    assert row["savings"] is None and row["savings_tone"] == "none"
