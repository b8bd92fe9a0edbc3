"""The widget and the text view following real jobs on the local spot market (real subprocesses,
real preemptions), through a recording comm: live, from a new Job (as `spot.attach` in a new
kernel), on failure, and the Stop button."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest

import spotnb as spot
from spotnb.job import Job
from tests.support.widget_helpers import RecordingComm

pytestmark = [pytest.mark.slow, pytest.mark.jobs]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, str, dict[str, Any]]]:
    import comm

    log: list[tuple[float, str, dict[str, Any]]] = []
    monkeypatch.setattr(comm, "create_comm", lambda **kw: RecordingComm(time.monotonic, log, **kw))
    return log


def fit(ctx: Any) -> dict[str, float]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx.track(model=model, optimizer=opt)
    for _ in ctx.steps(300):
        x = torch.randn(32, 10)
        y = x.sum(1, keepdim=True)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
        time.sleep(0.01)
    return {"loss": loss.item()}


def crash(ctx: Any) -> None:
    for step in ctx.steps(100):
        ctx.log(loss=1.0 / (step + 1))
        if step == 20:
            raise ValueError("diverged at step 20")


def slow(ctx: Any) -> None:
    for _ in ctx.steps(100_000):
        ctx.log(loss=1.0)
        time.sleep(0.01)


def _finish(view: Any) -> None:
    """The view's flusher ends by itself once the final state is shown."""
    assert view._thread is not None
    view._thread.join(30)
    assert not view._thread.is_alive()


def _trace(view: Any, name: str) -> Any:
    return next(t for t in view.figure.data if t.name == name)


def test_widget_and_text_follow_a_preempted_job_then_replay_it(
    sent: list[Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotnb.views.widget.text import TextView
    from spotnb.views.widget.view import JobView

    monkeypatch.chdir(tmp_path)
    # an emulated upload bandwidth gives the third kill an upload to land in (a local store
    # otherwise renames a checkpoint into place in microseconds)
    job = spot.train(
        fit,
        spot.Config(
            local_schedule=[3, 4, {"step": 120, "phase": "upload"}],
            local_grace=2.5,
            save_every=50,
            notice_poll=0.1,
            local_upload_bps=5e4,
            ship_modules=[__name__],
        ),
    )
    view = JobView(job)
    out = io.StringIO()
    TextView(job, file=out, interval=1.0)
    job.result(timeout=120)
    _finish(view)
    assert "data-status='succeeded'" in view.info.value
    assert len(_trace(view, "loss").x) > 100
    assert len(_trace(view, "preempted").x) == 3 * 3  # three vertical lines
    assert len(_trace(view, "resumed").x) >= 3
    bars = {y for name in ("allocation", "preparation", "compute") for y in _trace(view, name).y}
    assert len(bars) == 4  # one bar per instance
    assert len(_trace(view, "killed").x) == 3
    assert job.breakdown().as_dict() == pytest.approx(view.state.breakdown().as_dict())
    text = out.getvalue()
    assert text.count("PREEMPTED") == 3 and "succeeded" in text.splitlines()[-1]

    # a new Job object on the same store (what `spot.attach` builds in a new kernel)
    again = Job(job.id, job.store)
    again.follow()
    assert again.wait(30)
    replay = JobView(again)
    _finish(replay)
    for name in ("loss", "loss (recomputed)", "preempted", "resumed", "compute"):
        assert list(_trace(replay, name).x) == list(_trace(view, name).x), name
    assert replay.info.value.split("data-spot")[1][:20] == view.info.value.split("data-spot")[1][:20]

    figs = job.plot()
    assert set(figs) == {"metrics", "timeline", "breakdown"}


def test_failed_job_shows_the_remote_traceback(
    sent: list[Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotnb.views.widget.view import JobView

    monkeypatch.chdir(tmp_path)
    job = spot.train(crash, spot.Config(local_schedule=[], notice_poll=0.1, ship_modules=[__name__]))
    view = JobView(job)
    assert job.wait(120)
    _finish(view)
    assert "data-status='failed'" in view.info.value
    assert "diverged at step 20" in view.info.value and "Traceback" in view.info.value


def test_stop_button_stops_a_real_job(
    sent: list[Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotnb.views.widget.view import JobView

    monkeypatch.chdir(tmp_path)
    job = spot.train(slow, spot.Config(local_schedule=[], notice_poll=0.1, ship_modules=[__name__]))
    view = JobView(job)
    running = threading.Event()

    class Probe:
        def on_events(self, events: list[dict[str, Any]]) -> None:
            if any(e["kind"] == "metrics" for e in events):
                running.set()

    job.add_sink(Probe())
    assert running.wait(60)
    view.stop_button.click()
    assert job.wait(60)
    _finish(view)
    assert job.status == "stopped"
    assert "data-status='stopped'" in view.info.value
