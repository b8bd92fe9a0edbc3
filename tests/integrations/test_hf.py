"""The Hugging Face Trainer integration on the real local spot market."""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path

import pytest
import torch

import spotnb as spot

pytest.importorskip("transformers")

from tests.integrations import hfjobs  # noqa: E402

SHIP = ["tests.integrations.hfjobs"]


def _kinds(job: spot.Job, kind: str) -> list:
    return [e for e in job.events if e["kind"] == kind]


def test_trainer_resumes_exactly_after_two_preemptions(tmp_path: Path) -> None:
    # local instances run in the submitter's working directory: each job its own output_dir
    calm_fn = functools.partial(hfjobs.tiny_gpt2, out=str(tmp_path / "calm"), step_delay=0.05)
    fn = functools.partial(hfjobs.tiny_gpt2, out=str(tmp_path / "spot"), step_delay=0.05)
    calm = spot.train(calm_fn, spot.Config(checkpoint="static:5", ship_modules=SHIP))
    config = spot.Config(
        checkpoint="static:5",
        ship_modules=SHIP,
        local_grace=3.0,
        notice_poll=0.1,
        local_schedule=[{"step": 12}, {"step": 27, "notice": True}],
    )
    spotted = spot.train(fn, config)
    ref, got = calm.result(timeout=120), spotted.result(timeout=120)
    assert calm.breakdown().preemptions == 0
    assert spotted.breakdown().preemptions == 2
    resumed = _kinds(spotted, "resumed")
    assert len(resumed) == 2 and resumed[0]["from_step"] == 10, resumed
    saves = [e["save_kind"] for e in _kinds(spotted, "checkpoint")]
    assert "emergency" in saves, saves  # the notice's save happened at a Trainer step boundary
    assert resumed[1]["save_kind"] == "emergency"
    assert ref["weights"].keys() == got["weights"].keys()
    for name, w in ref["weights"].items():
        assert torch.equal(w, got["weights"][name]), name
    # the Trainer's logs (on_log) are the job's metrics
    for job in (calm, spotted):
        losses = job.metrics["loss"]
        assert [s for s, _ in losses][-1] == 40 and len(losses) >= 8, losses
        assert "learning_rate" in job.metrics and "grad_norm" in job.metrics
    assert dict(spotted.metrics["loss"])[40] == dict(calm.metrics["loss"])[40]
    assert not [e for e in _kinds(spotted, "warning")], _kinds(spotted, "warning")


def test_missing_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    monkeypatch.delitem(sys.modules, "spotnb.integrations.hf", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'spotnb\[hf\]'"):
        importlib.import_module("spotnb.integrations.hf")
    assert "transformers" not in spot.__dict__


def test_import_spotnb_does_not_import_transformers() -> None:
    import subprocess

    code = "import sys, spotnb; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_inexact_resume_is_a_warning_at_launch() -> None:
    from transformers import TrainingArguments

    from spotnb.integrations import hf

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield {}

    class Ctx:
        def __init__(self) -> None:
            self.events: list = []

        def warn(self, message: str) -> None:
            self.events.append(message)

    class FakeTrainer:
        train_dataset = Stream()
        args = TrainingArguments(output_dir="unused", ignore_data_skip=True, report_to="none", use_cpu=True)

    ctx = Ctx()
    hf._warn_inexact(ctx, FakeTrainer())
    messages = ctx.events
    assert len(messages) == 2 and "IterableDataset" in messages[0] and "ignore_data_skip" in messages[1]
