"""Hugging Face `Trainer` on spot instances: `SpotCallback` and `train(ctx, trainer)`.

    def fit(ctx):
        trainer = Trainer(model=..., args=TrainingArguments(output_dir="out", max_steps=1000), ...)
        return hf.train(ctx, trainer)  # resumes exactly after every preemption

How resume is made exact: **the Trainer's own checkpoint folder, backed up with
`ctx.backup`, and `trainer.train(resume_from_checkpoint=...)`** — not `ctx.track` of the
model and optimizer. The Trainer builds its optimizer and scheduler inside `train()`, and its
resume path is the only one that also restores what `ctx.track` cannot reach without
reimplementing the Trainer: `trainer_state.json` (global step, epoch, the loss accumulators,
the callbacks' state), the RNG states of every device as the Trainer saved them, the
gradient scaler, and the data position (it skips the batches of the current epoch already
seen, with the sampler seeded per epoch as in the calm run). So the resumed run replays the
calm run's arithmetic bit for bit (tested: `tests/integrations/test_hf.py`).

How it maps onto spotnb: each Trainer optimizer step is one spotnb step (the Trainer's
`global_step` is the spotnb step). When the policy wants a save (periodic, insurance) or a
notice came and an emergency save fits, `on_step_end` sets `control.should_save`; the Trainer
writes `checkpoint-<step>/` and `on_save` hands the whole `output_dir` to `ctx.backup`
(files already uploaded are not uploaded again). After a notice that backup waits for the
upload and the instance leaves. On restore the folder is put back exactly as it was, and
`train` resumes from `checkpoint-<restored step>`. `on_log` streams the Trainer's logs
(loss, learning_rate, grad_norm, ...) as `ctx.log` metrics.

Not exact, and said at launch as a warning event: an `IterableDataset` (the Trainer cannot
skip into it without re-reading it, and a stream has no position to restore), and
`ignore_data_skip=True` (the user asked the Trainer not to skip).
"""

from __future__ import annotations

import os
from typing import Any

try:
    import transformers
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised with sys.modules patched
    raise ImportError(
        "spotnb.integrations.hf needs Hugging Face transformers, which is not installed: "
        "pip install 'spotnb[hf]'"
    ) from exc

__all__ = ["SpotCallback", "train"]

_PREFIX = "checkpoint"


class SpotCallback(TrainerCallback):
    """Drives `ctx` from a `transformers.Trainer`: one spotnb step per optimizer step, the
    policy's and the notice's saves as Trainer checkpoints backed up through `ctx.backup`,
    and the Trainer's logs as `ctx.log` metrics. Use it through `train(ctx, trainer)`, which
    also resumes; add it yourself only if you call `trainer.train` with the resume path."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self._output_dir: str | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._output_dir = args.output_dir
        ctx = self.ctx
        ctx.external_loop(state.max_steps if state.max_steps and state.max_steps > 0 else None)
        if ctx.step_index != state.global_step:
            ctx.warn(
                f"the Trainer starts at step {state.global_step} but spotnb restored step "
                f"{ctx.step_index}: call spotnb.integrations.hf.train(ctx, trainer) so that it "
                "resumes from the restored checkpoint"
            )
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        ctx = self.ctx
        ctx.step_done()  # may ask for a save (policy, notice): the Trainer writes it next
        if ctx.should_save():
            control.should_save = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # the Trainer just wrote checkpoint-<global_step> (its own schedule or ours): back the
        # folder up; after a notice this waits for the upload and leaves (Evacuate)
        self.ctx.backup(self._output_dir or args.output_dir)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        # numbers only (the Trainer also logs strings); names ctx fills in itself are left out
        row = {
            k: v
            for k, v in (logs or {}).items()
            if isinstance(v, (int, float)) and k not in self.ctx.RESERVED_METRICS
        }
        if row:
            self.ctx.log(**row)
        return control


def _warn_inexact(ctx: Any, trainer: Any) -> None:
    import torch.utils.data

    dataset = getattr(trainer, "train_dataset", None)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        ctx.warn(
            "the Trainer's train_dataset is an IterableDataset: after a preemption the "
            "Trainer cannot restore its position exactly (it has no state to restore), so "
            "resumed steps may see other batches than an uninterrupted run"
        )
    if getattr(trainer.args, "ignore_data_skip", False):
        ctx.warn(
            "TrainingArguments(ignore_data_skip=True): after a preemption the Trainer "
            "restarts the epoch's data from its beginning, so resume is not exact"
        )


def train(ctx: Any, trainer: Any, **train_kwargs: Any) -> Any:
    """Run `trainer.train()` under spotnb: adds a `SpotCallback` (once), restores the newest
    checkpoint (the Trainer's `output_dir` as it was) and resumes from its
    `checkpoint-<step>` folder. Returns what `trainer.train` returns (a `TrainOutput`)."""
    if "resume_from_checkpoint" in train_kwargs:
        raise TypeError("train(ctx, trainer) chooses resume_from_checkpoint itself (the restored one)")
    if not any(isinstance(cb, SpotCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(SpotCallback(ctx))
    _warn_inexact(ctx, trainer)
    step = ctx.restore()
    resume = None
    if step:
        path = os.path.join(trainer.args.output_dir, f"{_PREFIX}-{step}")
        if os.path.isdir(path):
            resume = path
        else:
            ctx.warn(f"restored step {step} but {path} is missing: the Trainer starts from step 0")
    trainer._spotnb_driving = True  # a Trainer.train patched by spotnb.integrations.autohf
    try:
        return trainer.train(resume_from_checkpoint=resume, **train_kwargs)
    finally:
        trainer._spotnb_driving = False


def version() -> str:
    """The installed transformers version."""
    return str(transformers.__version__)
