"""A Trainer whose plain `trainer.train()` is called inside a spotnb job runs under spotnb by
itself (`spotnb.integrations.autohf`): saves, notices and exact resume, said in the feed."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import spotnb as spot

pytestmark = pytest.mark.jobs

pytest.importorskip("transformers")

from tests.integrations import hfjobs  # noqa: E402

SHIP = ["tests.integrations.hfjobs"]


def test_a_plain_trainer_train_is_preempted_and_resumes_exactly(tmp_path: Path) -> None:
    """The function calls `trainer.train()`, not `hf.train(ctx, trainer)`; killed at step 12
    without notice, it resumes from spotnb's step-10 checkpoint and ends with the weights of
    an uninterrupted run (which itself used `hf.train`)."""
    calm = spot.train(
        functools.partial(hfjobs.tiny_gpt2, out=str(tmp_path / "calm"), steps=20),
        spot.Config(checkpoint="static:5", ship_modules=SHIP),
    )
    job = spot.train(
        functools.partial(
            hfjobs.tiny_gpt2, out=str(tmp_path / "plain"), steps=20, step_delay=0.05, plain=True
        ),
        spot.Config(checkpoint="static:5", ship_modules=SHIP, local_schedule=[{"step": 12}]),
    )
    ref, got = calm.result(timeout=120), job.result(timeout=120)
    assert job.breakdown().preemptions == 1
    (resumed,) = [e for e in job.events if e["kind"] == "resumed"]
    assert resumed["from_step"] == 10
    for name, w in ref["weights"].items():
        assert torch.equal(w, got["weights"][name]), name
    assert got["loss"] == ref["loss"]  # trainer.train().training_loss: the whole run's mean
    said = [e["message"] for e in job.events if e["kind"] == "warning"]
    assert any("runs under spotnb" in m for m in said), said


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)


def test_the_hook_patches_the_trainer_once_when_it_is_imported_and_imports_nothing_itself() -> None:
    done = _run(
        """
        import sys
        from spotnb.integrations import autohf

        class Ctx:
            warned = []
            def warn(self, message):
                self.warned.append(message)

        autohf.install(Ctx())
        assert "transformers" not in sys.modules, "the hook imported transformers"
        from transformers import Trainer
        assert getattr(Trainer.train, "_spotnb_patched", False), "not patched"
        autohf.install(Ctx())  # twice: still one wrapper
        assert not getattr(Trainer.train.__wrapped__, "_spotnb_patched", False)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
