"""`spot.resume` / `spotnb resume`: a failed or stopped job continues from its latest verified
checkpoint, keeping its id and history, after the user fixed the bug (real agents, local market)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import spotnb as spot
from spotnb.errors import ConfigError, SpotnbError
from tests.core import jobfns

SHIP = ["tests.core.jobfns", __name__]  # this module by value: its helpers run on the instance


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
