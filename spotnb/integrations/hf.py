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

`trainer.train().training_loss` (and the `train_loss` of its metrics and last log) is the
mean loss of every step, as an uninterrupted run's — though a resumed `train()` call trains only
the steps after its checkpoint. The Trainer averages the losses it summed in *this* call
(`_total_loss_scalar / (global_step − the step it started from)`: a resume starts the sum at 0),
so each save also writes the running sum into `checkpoint-<step>/spotnb_loss.json` — the sum
drained at the logging steps, the on-device remainder since the last one, the last logging
step, and the step the first incarnation started from — and the resumed call starts from those
(`on_train_begin`) and divides by all the steps: the same float additions in the same order as
the calm run, so the figure is equal to the last bit (tested, killed twice and with gradient
accumulation). The speed figures (`train_runtime`, `train_samples_per_second`,
`train_steps_per_second`) remain the last incarnation's: `job.breakdown()` has the whole run's.

Not exact, and said at launch as a warning event: an `IterableDataset` (the Trainer cannot
skip into it without re-reading it, and a stream has no position to restore), and
`ignore_data_skip=True` (the user asked the Trainer not to skip).
"""

from __future__ import annotations

import json
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
#: the Trainer's running loss sum at a save, beside its checkpoint-<step>/ files
_LOSS_FILE = "spotnb_loss.json"


class SpotCallback(TrainerCallback):
    """Drives `ctx` from a `transformers.Trainer`: one spotnb step per optimizer step, the
    policy's and the notice's saves as Trainer checkpoints backed up through `ctx.backup`,
    and the Trainer's logs as `ctx.log` metrics. Use it through `train(ctx, trainer)`, which
    also resumes; add it yourself only if you call `trainer.train` with the resume path."""

    def __init__(self, ctx: Any, trainer: Any = None) -> None:
        self.ctx = ctx
        self._output_dir: str | None = None
        # set by `train`: the Trainer whose loss sum is saved and restored, and the checkpoint
        # folder this call resumes from (None: from the start)
        self._trainer = trainer
        self._resume: str | None = None
        self._first_step: int | None = None  # the step the first incarnation's train() started at
        self.training_loss: float | None = None  # the whole run's, once this call ended resumed

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._output_dir = args.output_dir
        self.training_loss = None
        ctx = self.ctx
        self._restore_loss(state)
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
        self._save_loss(args, state)
        self.ctx.backup(self._output_dir or args.output_dir)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        if logs and "train_loss" in logs:  # the end of train(): the whole run's mean
            self._whole_run_loss(state, logs)
        # numbers only (the Trainer also logs strings); names ctx fills in itself are left out
        row = {
            k: v
            for k, v in (logs or {}).items()
            if isinstance(v, (int, float)) and k not in self.ctx.RESERVED_METRICS
        }
        if row:
            self.ctx.log(**row)
        return control

    # -- the running loss sum, saved and restored with the checkpoint (see the module's doc) --
    def _loss_fields(self) -> tuple[Any, ...] | None:
        """The Trainer's loss accumulators (transformers 5.x's private names), or None when this
        Trainer has none of them (another version: `training_loss` is then its own)."""
        t = self._trainer
        names = ("_total_loss_scalar", "_tr_loss", "_globalstep_last_logged", "_initial_global_step")
        if t is None or not all(hasattr(t, n) for n in names):
            return None
        return tuple(getattr(t, n) for n in names)

    def _save_loss(self, args: Any, state: Any) -> None:
        fields = self._loss_fields()
        folder = os.path.join(self._output_dir or args.output_dir, f"{_PREFIX}-{state.global_step}")
        if fields is None or not os.path.isdir(folder):
            return
        total, pending, last_logged, initial = fields
        first = initial if self._first_step is None else self._first_step
        record = {
            "step": int(state.global_step),
            "total": float(total),  # drained at the logging steps (a Python float: exact in JSON)
            "pending": float(pending.item()) if hasattr(pending, "item") else float(pending),
            "last_logged": int(last_logged),
            "first_step": int(first),
        }
        tmp = os.path.join(folder, _LOSS_FILE + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, os.path.join(folder, _LOSS_FILE))

    def _restore_loss(self, state: Any) -> None:
        """Called at on_train_begin, right after the Trainer set its accumulators to zero."""
        self._first_step = None
        fields = self._loss_fields()
        if fields is None:
            return
        if self._resume is None:
            self._first_step = int(fields[3])
            return
        path = os.path.join(self._resume, _LOSS_FILE)
        try:
            with open(path) as fh:
                record = json.load(fh)
            ok = int(record["step"]) == int(state.global_step)
            total, pending = float(record["total"]), float(record["pending"])
            last_logged, first = int(record["last_logged"]), int(record["first_step"])
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            self.ctx.warn(
                f"{path} is missing or is not step {state.global_step}'s: the Trainer's "
                "training_loss will average only the steps trained after this resume"
            )
            return
        t = self._trainer
        t._total_loss_scalar = total
        t._tr_loss.fill_(pending)  # float32 → float → float32: the same value
        t._globalstep_last_logged = last_logged
        self._first_step = first

    def _whole_run_loss(self, state: Any, logs: dict[str, Any]) -> None:
        fields = self._loss_fields()
        if fields is None or self._first_step is None or self._first_step == fields[3]:
            return  # not resumed (the Trainer's figure is the whole run's), or nothing restored
        # the Trainer's own formula (_finalize_training) over every step since the first start;
        # its sum already holds the last remainder
        loss = fields[0] / max(state.global_step - self._first_step, 0.001)
        logs["train_loss"] = loss  # the TrainOutput's metrics are this dict
        history = getattr(state, "log_history", None)
        if history and "train_loss" in history[-1]:
            history[-1]["train_loss"] = loss
        self.training_loss = loss


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
    callbacks = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, SpotCallback)]
    if not callbacks:
        callbacks = [SpotCallback(ctx)]
        trainer.add_callback(callbacks[0])
    _warn_inexact(ctx, trainer)
    step = ctx.restore()
    resume = None
    if step:
        path = os.path.join(trainer.args.output_dir, f"{_PREFIX}-{step}")
        if os.path.isdir(path):
            resume = path
        else:
            ctx.warn(f"restored step {step} but {path} is missing: the Trainer starts from step 0")
    callback = callbacks[0]
    callback._trainer, callback._resume = trainer, resume  # its loss sum is saved and restored
    trainer._spotnb_driving = True  # a Trainer.train patched by spotnb.integrations.autohf
    try:
        out = trainer.train(resume_from_checkpoint=resume, **train_kwargs)
    finally:
        trainer._spotnb_driving = False
        callback._resume = None  # a later plain trainer.train() starts from 0: nothing to restore
    if callback.training_loss is not None and hasattr(out, "_replace"):
        out = out._replace(training_loss=callback.training_loss)  # the whole run's mean
    return out


def version() -> str:
    """The installed transformers version."""
    return str(transformers.__version__)
