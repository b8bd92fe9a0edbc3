"""`spot.resume` / `spotnb resume`: a failed or stopped job continues from its latest verified
checkpoint, keeping its id and history, after the user fixed the bug (real agents, local market)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import spotnb as spot
from spotnb.errors import ConfigError, SpotnbError
from tests.support import jobfns

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns", __name__]  # this module by value: its helpers run on the instance


class _FailsAt:
    """The user's bug: the data pipeline raises at one step (everything else is `ctx`)."""

    def __init__(self, ctx: Any, at: int) -> None:
        self._ctx, self._at = ctx, at

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def steps(self, n: int) -> Any:
        for step in self._ctx.steps(n):
            if step == self._at:
                raise ValueError(f"bad batch at step {step}")
            yield step


def buggy_mlp(ctx: Any, at: int = 130) -> Any:
    return jobfns.seeded_mlp(_FailsAt(ctx, at), step_delay=0.005)


def test_a_failed_job_resumed_with_a_fixed_fn_ends_bit_exact(reference) -> None:
    ref_result, ref_losses = reference
    job = spot.train(buggy_mlp, spot.Config(checkpoint="static:20", ship_modules=SHIP))
    with pytest.raises(spot.JobFailed, match="bad batch at step 130"):
        job.result(timeout=180)
    saved = [e["step"] for e in job.events if e["kind"] == "checkpoint"]
    assert saved and max(saved) <= 130

    resumed_job = spot.resume(job.id, fn=functools.partial(jobfns.seeded_mlp, step_delay=0.005))
    assert resumed_job.id == job.id
    result = resumed_job.result(timeout=180)
    assert resumed_job.status == "succeeded"
    events = resumed_job.events
    kinds = [e["kind"] for e in events]
    assert kinds.count("submitted") == 1 and kinds.count("job_resumed") == 1  # one job, one history
    mark = next(e for e in events if e["kind"] == "job_resumed")
    assert mark["from_status"] == "failed" and mark["new_fn"] is True
    restored = [e for e in events if e["kind"] == "resumed" and e["t"] > mark["t"]]
    assert [e["from_step"] for e in restored] == [max(saved)]  # the failed run's last checkpoint
    # bit-exact against the calm run: parameters, final loss, and every logged loss step by step
    for name, tensor in ref_result["params"].items():
        assert torch.equal(result["params"][name], tensor), name
    assert result["loss"] == ref_result["loss"]
    ref = dict(ref_losses)
    losses = resumed_job.metrics["loss"]
    assert {s for s, _ in losses} == set(ref)
    assert all(value == ref[step] for step, value in losses)
    b = resumed_job.breakdown()
    parts = sum(getattr(b, k) for k in ("compute", "recompute", "save", "alloc", "prep", "other"))
    assert parts == pytest.approx(b.total, rel=1e-6, abs=1e-6)
    assert b.incarnations == 2 and b.step == 200


def test_resume_refuses_a_provider_change_and_a_running_job_and_keeps_config_changes() -> None:
    job = spot.train(jobfns.fails_at, spot.Config(ship_modules=SHIP))
    with pytest.raises(spot.JobFailed):
        job.result(timeout=120)
    with pytest.raises(ConfigError, match=r"Config.provider: .*cannot move to 'aws'"):
        spot.resume(job.id, provider="aws", aws_image_id="ami-123", store="s3://b/p")
    assert not [e for e in job.events if e["kind"] == "job_resumed"]  # nothing was written

    from spotnb.cli import main

    assert main(["resume", job.id[:12], "--set", "max_retries=1"]) == 0  # the same bug, twice more
    again = spot.attach(job.id)
    with pytest.raises(spot.JobFailed, match="bad batch at step 5"):
        again.result(timeout=180)
    mark = next(e for e in again.events if e["kind"] == "job_resumed")
    assert mark["changed"] == ["max_retries"] and mark["new_fn"] is False
    after = [e for e in again.events if e["kind"] == "allocated" and e["t"] > mark["t"]]
    assert len(after) == 2  # a fresh allowance of retries after the resume


def test_a_running_job_cannot_be_resumed_and_a_stopped_one_finishes() -> None:
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=300, step_time=0.01),
        spot.Config(ship_modules=SHIP, checkpoint="static:50"),
    )
    deadline = __import__("time").monotonic() + 120
    while job.status != "running" and __import__("time").monotonic() < deadline:
        job.wait(0.05)
    with pytest.raises(SpotnbError, match="only a failed or stopped job can be resumed; stop it first"):
        spot.resume(job.id)
    job.stop(timeout=120)
    assert job.status == "stopped"
    resumed = spot.resume(job.id)
    assert resumed.result(timeout=180) == 300
    mark = next(e for e in resumed.events if e["kind"] == "job_resumed")
    assert mark["from_status"] == "stopped"
    assert [e for e in resumed.events if e["kind"] == "allocated" and e["t"] > mark["t"]]


def tracks(ctx: Any, names: tuple[str, ...], fail_at: int | None = None, new: tuple[str, ...] = ()) -> Any:
    """A linear model per name (`new`: tracked with ctx.track_new); fails at `fail_at`."""
    torch.manual_seed(0)
    models = {n: torch.nn.Linear(4, 1) for n in names}
    ctx.track(**{n: m for n, m in models.items() if n not in new})
    if new:
        ctx.track_new(**{n: m for n, m in models.items() if n in new})
    for step in ctx.steps(60):
        if step == fail_at:
            raise ValueError(f"bad batch at step {step}")
        with torch.no_grad():
            for m in models.values():
                m.weight.add_(1.0)
    return {n: float(m.weight.detach().sum()) for n, m in models.items()}


def test_a_resume_whose_function_tracks_other_names_refuses_to_start_and_says_which() -> None:
    """The job saved `model`; the 'fixed' function tracks `net` and `other` instead. Restoring
    would train them from zeros under a job that says it resumed at step 30: the resumed run
    fails at once, naming the names on both sides and the fix. `ctx.track_new` says "start
    these fresh" on purpose: then it resumes, and only they start from zero."""
    job = spot.train(
        functools.partial(tracks, names=("model",), fail_at=35), spot.Config(ship_modules=SHIP, save_every=10)
    )
    with pytest.raises(spot.JobFailed, match="bad batch at step 35"):
        job.result(timeout=120)
    renamed = spot.resume(job.id, functools.partial(tracks, names=("net", "other")))
    refusal = r"holds \['model'\] but this function tracks \['net', 'other'\]"
    with pytest.raises(spot.JobFailed, match=refusal):
        renamed.result(timeout=120)
    assert "ctx.track_new" in renamed.state.error.message
    assert not [e for e in renamed.events if e["kind"] == "resumed"]
    added = spot.resume(job.id, functools.partial(tracks, names=("model", "ema"), new=("ema",)))
    result = added.result(timeout=120)
    resumed = [e for e in added.events if e["kind"] == "resumed"][-1]
    assert resumed["from_step"] == 30
    fresh = _fresh_weight_sums(2)
    assert result["model"] == pytest.approx(60 * 4 + fresh[0])  # every step applied once
    assert result["ema"] == pytest.approx(30 * 4 + fresh[1])  # from step 30 on, from fresh weights


def _fresh_weight_sums(n: int) -> list[float]:
    torch.manual_seed(0)
    return [float(torch.nn.Linear(4, 1).weight.detach().sum()) for _ in range(n)]


def test_two_concurrent_resumes_of_one_job_let_one_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `spot.resume` calls at once (two cells, two shells): one resumes the job, the other
    is refused before it writes anything; one `job_resumed` event. Both are held after their
    checks (the job is failed for both) until both got there: the race, every time."""
    import threading

    from spotnb import api

    job = spot.train(jobfns.fails_at, spot.Config(ship_modules=SHIP))
    with pytest.raises(spot.JobFailed):
        job.result(timeout=120)
    checked = threading.Barrier(2)
    real_check = api.check_inputs

    def check_then_meet(config: Any) -> None:
        real_check(config)
        checked.wait(60)

    monkeypatch.setattr(api, "check_inputs", check_then_meet)
    go = threading.Barrier(2)
    outcomes: list[Any] = []

    def resume() -> None:
        go.wait()
        try:
            outcomes.append(spot.resume(job.id))
        except SpotnbError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=resume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    jobs = [o for o in outcomes if isinstance(o, spot.Job)]
    refused = [o for o in outcomes if isinstance(o, SpotnbError)]
    assert len(jobs) == 1 and len(refused) == 1, outcomes
    assert "is being resumed" in str(refused[0])
    with pytest.raises(spot.JobFailed):
        jobs[0].result(timeout=120)
    assert len([e for e in jobs[0].events if e["kind"] == "job_resumed"]) == 1


def test_attach_after_a_resume_from_a_shell_follows_the_job_again() -> None:
    """The notebook ran the job and saw it stop; `spotnb resume ID` in a shell continued it. The
    notebook's `spot.attach(ID)` must not hand back the finished Job it still holds: it shows
    the resume and waits for the result."""
    import subprocess
    import sys

    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=200, step_time=0.01),
        spot.Config(ship_modules=SHIP, checkpoint="static:50"),
    )
    deadline = __import__("time").monotonic() + 120
    while job.status != "running" and __import__("time").monotonic() < deadline:
        job.wait(0.05)
    job.stop(timeout=120)
    assert job.status == "stopped"
    shell = subprocess.run(
        [sys.executable, "-m", "spotnb.cli", "resume", job.id], capture_output=True, text=True, timeout=120
    )
    assert shell.returncode == 0, shell.stderr
    again = spot.attach(job.id)
    assert again.result(timeout=180) == 200
    assert [e for e in again.events if e["kind"] == "job_resumed"]
