"""The Hugging Face Trainer integration on the real local spot market."""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path

import pytest
import torch

import spotnb as spot

pytestmark = pytest.mark.jobs

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
    # trainer.train().training_loss averages every step's loss, as the calm run's, though the
    # last incarnation trained only steps 27..40 (its running sum is restored with the checkpoint)
    assert got["loss"] == ref["loss"], (got["loss"], ref["loss"])
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


# -- training_loss after resumes, in this process (the Trainer under a stand-in ctx) ----------
class _Killed(Exception):
    """The instance dies right after its checkpoint was backed up."""


class _Ctx:
    """What `hf.train` and `SpotCallback` use of the runtime's context: a restored step, a
    save at the steps in `saves`, and a kill after the backup at step `kill`."""

    RESERVED_METRICS = frozenset({"step", "t"})

    def __init__(self, restored: int | None = None, saves: tuple[int, ...] = (), kill: int | None = None):
        self.step_index = self.resumed_from = restored or 0
        self.saves, self.kill = saves, kill
        self.warnings: list[str] = []
        self.logs: list[dict] = []

    def restore(self) -> int | None:
        return self.resumed_from or None

    def external_loop(self, total: int | None = None) -> None:
        pass

    def step_done(self) -> None:
        self.step_index += 1

    def should_save(self) -> bool:
        return self.step_index in self.saves

    def backup(self, *paths: str, wait: bool | None = None) -> None:
        if self.step_index == self.kill:
            raise _Killed(self.step_index)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def log(self, **row: float) -> None:
        self.logs.append(row)


def _killed_and_resumed(out: Path, kills: tuple[int, ...], **kw: object) -> tuple[dict, _Ctx]:
    """hfjobs.tiny_gpt2 killed after a save at each step of `kills`, resumed from it each time."""
    restored = None
    for k in kills:
        with pytest.raises(_Killed):
            hfjobs.tiny_gpt2(_Ctx(restored, saves=(k,), kill=k), out=str(out), **kw)  # type: ignore[arg-type]
        restored = k
    ctx = _Ctx(restored)
    return hfjobs.tiny_gpt2(ctx, out=str(out), **kw), ctx  # type: ignore[arg-type]


@pytest.mark.parametrize("accum", [1, 2])
def test_training_loss_after_two_resumes_is_the_calm_runs_to_the_last_bit(tmp_path: Path, accum: int) -> None:
    """Killed after saves at steps 7 and 13 (neither a logging step: the Trainer holds part of
    the loss sum on the device then), the third incarnation returns the calm run's
    `training_loss`, `train_loss` metric and log, bit for bit; with gradient accumulation too."""
    threads = torch.get_num_threads()
    try:
        calm_ctx = _Ctx()
        calm = hfjobs.tiny_gpt2(calm_ctx, out=str(tmp_path / "calm"), steps=20, accum=accum)  # type: ignore[arg-type]
        got, ctx = _killed_and_resumed(tmp_path / "spot", (7, 13), steps=20, accum=accum)
    finally:
        torch.set_num_threads(threads)
    assert got["resumed_from"] == 13 and not ctx.warnings, ctx.warnings
    for name, w in calm["weights"].items():
        assert torch.equal(w, got["weights"][name]), name
    assert got["loss"] == calm["loss"]  # before: the mean of steps 14..20's losses over 7 steps
    final = [row["train_loss"] for row in ctx.logs if "train_loss" in row]
    assert final == [row["train_loss"] for row in calm_ctx.logs if "train_loss" in row] == [calm["loss"]]
    # the first log after the resume (step 15) averages steps 11..15, as the calm run's did
    losses = [r["loss"] for r in ctx.logs if "loss" in r]
    assert losses == [r["loss"] for r in calm_ctx.logs if "loss" in r][-2:]


def test_a_checkpoint_without_the_loss_sum_resumes_and_says_training_loss_is_partial(tmp_path: Path) -> None:
    """A checkpoint written before spotnb kept the loss sum (or damaged): the run resumes
    exactly all the same, and a warning says what `training_loss` covers."""
    from spotnb.integrations import hf

    threads = torch.get_num_threads()
    try:
        with pytest.raises(_Killed):
            hfjobs.tiny_gpt2(_Ctx(None, saves=(6,), kill=6), out=str(tmp_path), steps=10)  # type: ignore[arg-type]
        (tmp_path / "checkpoint-6" / hf._LOSS_FILE).write_text("{not json")
        ctx = _Ctx(6)
        got = hfjobs.tiny_gpt2(ctx, out=str(tmp_path), steps=10)  # type: ignore[arg-type]
    finally:
        torch.set_num_threads(threads)
    assert got["resumed_from"] == 6 and got["loss"] > 0
    assert len(ctx.warnings) == 1 and "only the steps trained after this resume" in ctx.warnings[0]
