"""End-to-end on the local spot market: real agent processes, really SIGKILLed.

Nothing of spotnb is mocked here: the controller launches `python -m spotnb.runtime.agent`
subprocesses, the injector kills their process groups, the store is a real directory.
"""

from __future__ import annotations

import functools

import pytest
import torch

import spotnb as spot
from tests.support import jobfns

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


def _losses(job: spot.Job) -> list[tuple[int, float]]:
    return job.metrics["loss"]


def test_bit_exact_resume_after_kills_during_steps_saves_and_uploads(reference) -> None:
    ref_result, ref_losses = reference
    schedule = [
        {"step": 25, "phase": "save"},
        {"step": 45, "phase": "upload"},
        {"step": 70, "phase": "step"},
        {"step": 105, "phase": "save"},
        {"step": 140, "phase": "upload"},
        {"step": 170, "phase": "step"},
    ]
    config = spot.Config(
        checkpoint="static:20",
        ship_modules=SHIP,
        local_schedule=schedule,
        local_upload_bps=8e6,
        local_alloc_delay=(0.05, 0.1),
    )
    # steps of ~10 ms (the sleep changes no number) let metrics and checkpoints get out between kills
    job = spot.train(functools.partial(jobfns.seeded_mlp, step_delay=0.01), config)
    result = job.result(timeout=300)

    preempted = [e for e in job.events if e["kind"] == "preempted"]
    assert len(preempted) == len(schedule) >= 5
    phases = {e["phase"] for e in preempted}
    assert phases & {"snapshot", "save"}, f"no kill landed during a save: {phases}"
    assert "upload" in phases, f"no kill landed during an upload: {phases}"
    # the model is identical, bit for bit, to the uninterrupted run
    assert result["params"].keys() == ref_result["params"].keys()
    for name, tensor in ref_result["params"].items():
        assert torch.equal(result["params"][name], tensor), name
    assert result["loss"] == ref_result["loss"]
    # every logged loss, including the steps recomputed after a kill, matches step for step
    ref = dict(ref_losses)
    losses = _losses(job)
    assert {s for s, _ in losses} == set(ref)
    assert all(value == ref[step] for step, value in losses)
    assert len(losses) > len(ref_losses)  # some steps really were redone
    assert any(e["from_step"] > 0 for e in job.events if e["kind"] == "resumed")
    b = job.breakdown()
    assert b.preemptions == len(schedule) and b.recompute > 0


def test_partial_uploads_never_become_checkpoints(reference, store_url: str) -> None:
    """A kill during an upload leaves files without a manifest; restore never uses them."""
    from spotnb.core.store import Store

    config = spot.Config(
        checkpoint="static:20",
        ship_modules=SHIP,
        store=store_url,
        local_schedule=[{"step": 130, "phase": "upload"}],
        local_upload_bps=4e6,
    )
    job = spot.train(functools.partial(jobfns.seeded_mlp, step_delay=0.01), config)
    job.result(timeout=180)
    resumed = [e for e in job.events if e["kind"] == "resumed"]
    committed = {e["seq"]: e for e in job.events if e["kind"] == "checkpoint" and e["incarnation"] == 1}
    assert len(resumed) == 1 and resumed[0]["seq"] in committed
    assert resumed[0]["from_step"] == committed[resumed[0]["seq"]]["step"] <= 130
    store = Store(store_url)
    ckpts = store.ls(store.job(job.id, "ckpt"))
    for name in ckpts:  # whatever is left is complete: the partial upload was pruned
        assert store.exists(store.job(job.id, "ckpt", name, "MANIFEST.json"))


def test_low_level_api_backs_up_user_files(tmp_path) -> None:
    path = str(tmp_path / "my_ckpt.txt")
    fn = functools.partial(jobfns.low_level, steps=60, path=path)
    config = spot.Config(
        checkpoint="static:10", ship_modules=SHIP, local_schedule=[{"step": 35, "phase": "step"}]
    )
    job = spot.train(fn, config)
    assert job.result(timeout=120) == sum(range(60))
    resumed = [e for e in job.events if e["kind"] == "resumed"]
    assert resumed and resumed[0]["from_step"] in (30, 40)
