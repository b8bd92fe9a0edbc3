"""Fixtures of the core tests."""

from __future__ import annotations

import pytest

import spotnb as spot
from tests.core import jobfns
from tests.core.helpers import Recorder

SHIP = ["tests.core.jobfns"]


def _losses(job: spot.Job) -> list[tuple[int, float]]:
    return job.metrics["loss"]


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[tuple[int, float]]]:
    """The uninterrupted run, on the same market with no preemption."""
    home = tmp_path_factory.mktemp("ref-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOTNB_HOME", str(home))
    try:
        job = spot.train(jobfns.seeded_mlp, spot.Config(checkpoint="static:20", ship_modules=SHIP))
        result = job.result(timeout=180)
        assert job.breakdown().preemptions == 0
        return result, _losses(job)
    finally:
        mp.undo()


@pytest.fixture
def ckpt(store_url: str):
    """A real checkpointer on a real directory store, with its events recorded."""
    from spotnb.core.store import Store
    from spotnb.runtime.checkpoint.checkpointer import Checkpointer

    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec, keep_last=2)
    yield c, rec
    c.close()
