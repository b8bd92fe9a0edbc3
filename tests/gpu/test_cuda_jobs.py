"""Jobs on the GPU, on the local market (real processes, really killed): a CUDA job resumed
through kills ends with the weights, the GradScaler and the CUDA RNG of a calm run, bit for bit;
a notice on a GPU leaves time for an emergency save, whose cost is reported; a group of one
process per GPU trains over NCCL where there are two GPUs or more."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
import torch

import spotnb as spot
from tests.gpu import gpufns
from tests.support.jobs import assert_same_state

SHIP = ["tests.gpu.gpufns"]
STEPS = 160


def _by(job: spot.Job, kind: str, n: int | None = None) -> list[dict]:
    return [e for e in job.events if e["kind"] == kind and (n is None or e["incarnation"] == n)]


def _run(**config: Any) -> tuple[spot.Job, dict, float]:
    t0 = time.perf_counter()
    job = spot.train(
        functools.partial(gpufns.cuda_mlp, steps=STEPS, hold_at=config.pop("hold_at", None)),
        spot.Config(ship_modules=SHIP, local_alloc_delay=0, **config),
    )
    result = job.result(timeout=300)
    return job, result, time.perf_counter() - t0


@pytest.fixture(scope="module")
def calm(tmp_path_factory: pytest.TempPathFactory) -> tuple[spot.Job, dict, float]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOTNB_HOME", str(tmp_path_factory.mktemp("calm-home")))
    try:
        job, result, wall = _run(save_every=25)
        assert job.breakdown().preemptions == 0
        return job, result, wall
    finally:
        mp.undo()


def test_a_cuda_job_killed_twice_ends_with_the_calm_runs_weights_scaler_and_rng(calm, report) -> None:
    """AdamW (fused), fp16 autocast with a GradScaler whose scale grows every 20 steps, dropout
    drawing from the CUDA generator, deterministic algorithms; SIGKILLed at steps 50 and 120
    (between checkpoints every 25): the resumed run recomputes from the newest checkpoint and
    ends equal to the calm run in every bit, the loss curve included."""
    calm_job, expected, calm_wall = calm
    job, result, wall = _run(save_every=25, local_schedule=[{"step": 50}, {"step": 120}])
    b = job.breakdown()
    assert b.preemptions == 2
    assert len(_by(job, "resumed")) == 2
    assert_same_state(expected, result)
    losses = dict(job.metrics["loss"])
    assert losses == dict(calm_job.metrics["loss"])
    report(
        "cuda job through 2 kills",
        calm_s=round(calm_wall, 1),
        kills_s=round(wall, 1),
        bit_exact=True,
        prep_s=round(b.prep, 1),
        recompute_s=round(b.recompute, 1),
        save_s=round(b.save, 2),
    )


def test_an_emergency_save_on_the_gpu_commits_within_the_notice_and_resumes_exactly(calm, report) -> None:
    """A 10 s notice at step 70 (checkpoints every 1000 steps: none else): the emergency save of
    the GPU's state commits before the kill, the replacement resumes from step 70's state, and
    the run ends equal to the calm one."""
    _, expected, _ = calm
    job, result, _ = _run(
        save_every=1000,
        hold_at=70,
        local_grace=10.0,
        notice_poll=0.1,
        local_schedule=[{"step": 70, "notice": True}],
    )
    (notice,) = _by(job, "notice", 1)
    (save,) = _by(job, "checkpoint", 1)
    assert save["save_kind"] == "emergency" and save["t"] < notice["deadline"]
    (resumed,) = _by(job, "resumed", 2)
    assert resumed["from_step"] == save["step"] >= 70
    assert_same_state(expected, result)
    report(
        "emergency save on the GPU",
        state_mb=round(save["bytes"] / 1e6, 1),
        snapshot_s=round(save["snapshot_s"], 3),
        upload_s=round(save["upload_s"], 3),
        notice_to_commit_s=round(save["t"] - notice["t"], 2),
        grace_s=10.0,
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs or more (NCCL between them)")
def test_one_process_per_gpu_trains_as_one_data_parallel_group_over_nccl() -> None:
    pytest.importorskip("torchft", reason="spotnb[elastic]")
    n = torch.cuda.device_count()
    steps = 40
    job = spot.train(
        functools.partial(gpufns.cuda_group_dp, steps=steps),
        spot.Config(ship_modules=SHIP, procs_per_instance=n, local_alloc_delay=0, save_every=10),
    )
    result = job.result(timeout=300)
    assert result["ranks"] == n and result["weights"] == gpufns.cuda_group_expected(steps)
