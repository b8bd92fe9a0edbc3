"""Lightning `Trainer` on spot instances: `fit(ctx, trainer, model, ...)` and `SpotCallback`.

    def train(ctx):
        trainer = lightning.Trainer(max_steps=1000, default_root_dir="out")
        lightning_spot.fit(ctx, trainer, model, datamodule=dm)  # resumes exactly

How it maps onto spotnb: each optimizer step is one spotnb step (`trainer.global_step` is the
spotnb step; with gradient accumulation the batches in between are not steps). At the step
boundary the policy asked for (periodic, insurance) or right after a preemption notice,
`SpotCallback.on_train_batch_end` writes a full Lightning checkpoint with
`trainer.save_checkpoint` into `<default_root_dir>/spotnb/step-<N>.ckpt` (the older one goes)
and hands the folder to `ctx.backup`; after a notice that waits for the upload and the instance
leaves. On restore `fit` passes `ckpt_path=` that file, so Lightning restores what it owns: the
model, optimizers, LR schedulers, precision/AMP scaler, callbacks' and datamodule's state and
its loops' progress (epoch, batch, global step). `on_train_batch_end` is the save point
Lightning's own restart logic supports mid-epoch (its `ModelCheckpoint(every_n_train_steps)`
saves there); a save due at a batch after which the calm run validates or ends the epoch waits
one step, because Lightning restarting from there would skip that validation or epoch end
(validation draws from the global RNG; epoch-interval schedulers step). The Trainer's logged
metrics arrive through a `SpotLogger` (a Lightning `Logger`, so at `log_every_n_steps` with the
values the loggers get) as `ctx.log` metrics.

The data position, which Lightning no longer restores by itself (its fault-tolerant mid-epoch
resume was removed; without a stateful loader it restarts the epoch's data from the start and
warns): `fit` wraps the training loader in a `ResumableLoader`
(`spotnb/integrations/loader.py`). Lightning saves and restores any loader with
`state_dict`/`load_state_dict` with its checkpoint, so the position travels in the same file.
The wrapper records the RNG states (torch, Python, NumPy and the loader's own generators) at the
moment each epoch's iterator is created, which is everything a shuffling sampler and the worker
seeds draw from, and how many batches of the epoch were trained. On resume it recreates the
epoch's iterator from those states and **skips the trained batches by loading them**. Why load
them rather than skip indices in the sampler (as the HF Trainer's `skip_first_batches` does):
with `num_workers > 0`, each batch goes to a worker in turn and every worker has its own RNG
stream (random crops, masking), so only replaying the same batches through the same workers
leaves each worker's stream where the calm run had it; skipping indices would hand later batches
to other workers with other random numbers. The price is reading the skipped batches once (no
forward or backward) per resume. The batch Lightning had already prefetched when it saved is
fetched again with the RNG state it was fetched with (so random transforms in the main process
match too), and then the RNG is set to its state at the save. The user's data order is
Lightning's own; nothing is reseeded. Tested: `tests/integrations/test_lightning.py` (preempted
mid-epoch and again with a notice, final weights `torch.equal` to an uninterrupted run).

SIGTERM stays spotnb's: its agent takes it as a preemption notice (a GCP soft-off), while the
handler `trainer.fit` installs would end the run with `SIGTERMException` at the step's end,
before or instead of the emergency save; `SpotCallback` puts the agent's handler back when
training starts (Lightning's teardown restores it too).

Not exact, and said at launch as a warning event: a training set that is an
`IterableDataset` without `state_dict` (a stream may not replay the same batches from its
start), several training loaders at once, a one-shot iterator (cannot be iterated again), and
more than one device (each process would back up its own checkpoint).
"""

from __future__ import annotations

import glob
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

try:
    import lightning
    from lightning.pytorch import Callback, LightningDataModule
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.plugins.io import TorchCheckpointIO
except ImportError as exc:  # pragma: no cover - exercised with sys.modules patched
    raise ImportError(
        "spotnb.integrations.lightning needs Lightning, which is not installed: "
        "pip install 'spotnb[lightning]'"
    ) from exc

import torch

from spotnb.integrations.loader import ResumableLoader

__all__ = ["ResumableLoader", "SpotCallback", "SpotLogger", "fit"]

_DIR = "spotnb"


class SpotLogger(Logger):
    """Hands the Trainer's logged metrics to `ctx.log` (numbers only; `step`, `t`, ... are
    spotnb's own). Named "" so that `ModelCheckpoint` paths stay what they were."""

    def __init__(self, ctx: Any, root: str) -> None:
        super().__init__()
        self.ctx = ctx
        self._root = root
        self.skip_step: int | None = None  # this step's row was logged before an evacuating save

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str:
        return self._root

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self.skip_step is not None and self.skip_step == self.ctx.step_index:
            self.skip_step = None  # the step's own call; epoch-end metrics of this step follow
            return
        row = _numbers(metrics, self.ctx.RESERVED_METRICS)
        if row:
            self.ctx.log(**row)


def _numbers(metrics: dict[str, Any], reserved: frozenset[str]) -> dict[str, Any]:
    row = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in reserved:
            row[k] = v
    return row


class SpotCallback(Callback):
    """Drives `ctx` from a `lightning.Trainer`: one spotnb step per optimizer step, and the
    policy's and the notice's saves as Lightning checkpoints backed up through `ctx.backup`.
    Use it through `fit(ctx, trainer, model, ...)`, which also resumes and keeps the data
    position; add it yourself only if you pass `ckpt_path` and a `ResumableLoader` too."""

    def __init__(self, ctx: Any, logger: SpotLogger | None = None) -> None:
        self.ctx = ctx
        self.logger = logger
        self.loaders: list[ResumableLoader] = []
        self._seen = 0
        self._deferred = -1  # the step a due save was put off at (at most one step)
        self._sigterm: Any = None  # the SIGTERM handler before fit (spotnb's agent's)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if callable(self._sigterm) and threading.current_thread() is threading.main_thread():
            # spotnb's agent takes SIGTERM (a GCP soft-off, ...) as a preemption notice: an
            # emergency save, then leave. Lightning's own handler, installed by fit, would
            # instead end the run with SIGTERMException at this step's end, before or instead
            # of that save; its teardown puts the agent's handler back anyway
            signal.signal(signal.SIGTERM, self._sigterm)
        ctx = self.ctx
        total: int | None = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        if total is None:
            estimated = trainer.estimated_stepping_batches
            total = int(estimated) if estimated != float("inf") else None
        ctx.external_loop(total)
        self._seen = trainer.global_step
        if ctx.step_index != trainer.global_step:
            ctx.warn(
                f"the Trainer starts at step {trainer.global_step} but spotnb restored step "
                f"{ctx.step_index}: call spotnb.integrations.lightning.fit(ctx, trainer, model, ...) "
                "so that it resumes from the restored checkpoint"
            )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        for loader in self.loaders:  # every batch: a ModelCheckpoint of the user's saves it too
            loader._trained = batch_idx + 1
        if trainer.global_step == self._seen:
            return  # accumulating gradients: not an optimizer step
        self._seen = trainer.global_step
        ctx = self.ctx
        ctx.step_done()  # may ask for a save (policy, notice)
        if not ctx.should_save():
            return
        if self._deferred != trainer.global_step - 1 and _boundary_skipped_on_resume(trainer, batch_idx):
            # the save waits one step (it stays due): resumed from a save here, Lightning
            # would skip what follows this batch in the calm run (the validation due now, or
            # the epoch's end: validation, epoch-interval LR schedulers, on_train_epoch_end)
            self._deferred = trainer.global_step
            return
        if self.logger is not None and _logs_now(trainer):
            # Lightning logs this step after this hook, i.e. after the checkpoint: log it
            # first, so that the row is stored with the checkpoint (a kill or the notice's
            # exit right after it would otherwise leave a hole the resumed run never fills)
            row = _numbers(_step_metrics(trainer), ctx.RESERVED_METRICS)
            if row:
                row.setdefault("epoch", trainer.current_epoch)  # as Lightning adds it
                self.logger.skip_step = ctx.step_index
                ctx.log(**row)
        folder = checkpoint_dir(trainer)
        path = os.path.join(folder, f"step-{trainer.global_step}.ckpt")
        _save_checkpoint(trainer, path)
        for old in glob.glob(os.path.join(folder, "step-*.ckpt")):
            if old != path:
                os.remove(old)
        ctx.backup(folder)  # after a notice: waits for the upload and leaves (Evacuate)


class _LocalTorchIO(TorchCheckpointIO):
    """`TorchCheckpointIO` for a local file, without fsspec: Lightning's own probes whether the
    path is object storage by importing adlfs/s3fs/gcsfs (installed with spotnb's cloud
    extras), which took 1.5 to 6.5 s at the first save of every incarnation here, inside an
    emergency save's grace period."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        tmp = f"{path}.tmp"
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)  # atomic: a kill mid-write leaves the older checkpoint whole


def _save_checkpoint(trainer: Any, path: str) -> None:
    """`trainer.save_checkpoint(path)`, through `_LocalTorchIO` when the strategy uses the
    default `TorchCheckpointIO` (a user's own CheckpointIO is used as it is)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    strategy = trainer.strategy
    io = strategy.checkpoint_io
    if type(io) is TorchCheckpointIO:
        strategy.checkpoint_io = _LocalTorchIO()
    try:
        trainer.save_checkpoint(path)
    finally:
        strategy.checkpoint_io = io


def _boundary_skipped_on_resume(trainer: Any, batch_idx: int) -> bool:
    """After this batch the calm run validates or ends the epoch, which a run resumed from a
    checkpoint saved here would not replay (Lightning's restart skips ahead)."""
    if trainer.max_steps and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
        return False  # the run's last step: nothing follows it
    epoch_loop = trainer.fit_loop.epoch_loop
    if (
        getattr(epoch_loop.batch_progress, "is_last_batch", False)
        or batch_idx + 1 >= trainer.num_training_batches
    ):
        return True
    try:  # Lightning's own decision (side-effect free; a private method, hence the guard)
        return bool(epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher))
    except Exception:  # noqa: BLE001 - another Lightning version: only the epoch's end is known
        return False


def _logs_now(trainer: Any) -> bool:
    """Whether Lightning logs this step (its `should_update_logs`, at `on_train_batch_end`)."""
    n = trainer.log_every_n_steps
    return bool(n) and trainer.global_step % n == 0


def _step_metrics(trainer: Any) -> dict[str, Any]:
    """What the loggers will receive for this step (Lightning's own result collection; the
    public `logged_metrics` also holds older values)."""
    try:
        return dict(trainer._results.metrics(True)["log"])
    except Exception:  # noqa: BLE001 - a Lightning internal; then the row is just missing
        return {}


def checkpoint_dir(trainer: Any) -> str:
    """Where `SpotCallback` writes its checkpoints: `<default_root_dir>/spotnb`."""
    return os.path.join(trainer.default_root_dir, _DIR)


def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _wrap(ctx: Any, callback: SpotCallback, loaders: Any) -> Any:
    """The training loader(s) with their position saved: each loader wrapped once; a loader
    that has its own state (e.g. torchdata's `StatefulDataLoader`) is left to Lightning."""
    leaves = (
        list(loaders.values())
        if isinstance(loaders, dict)
        else list(loaders)
        if isinstance(loaders, (list, tuple))
        else [loaders]
    )
    if len(leaves) > 1:
        ctx.warn(
            f"{len(leaves)} training loaders: after a preemption spotnb restores the position of "
            "one loader only, so resume is not exact"
        )
        return loaders
    loader = leaves[0]
    if isinstance(loader, ResumableLoader):
        callback.loaders = [loader]
        return loaders
    if _is_stateful(loader):
        return loaders
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, torch.utils.data.IterableDataset) and not _is_stateful(dataset):
        ctx.warn(
            "the training set is an IterableDataset without state_dict(): after a preemption "
            "its batches are read again from its start and skipped, which is exact only if it "
            "yields the same batches every time it is iterated (a live stream does not), so "
            "resume may not be exact"
        )
    elif isinstance(loader, Iterator):  # iter() would start a DataLoader's workers
        ctx.warn(
            "the training loader is a one-shot iterator: after a preemption its position cannot "
            "be restored, so resume is not exact; pass a DataLoader"
        )
        return loaders
    wrapped = ResumableLoader(loader)
    callback.loaders = [wrapped]
    if isinstance(loaders, dict):
        return {k: wrapped for k in loaders}
    if isinstance(loaders, (list, tuple)):
        return type(loaders)([wrapped])
    return wrapped


def fit(
    ctx: Any,
    trainer: Any,
    model: Any,
    train_dataloaders: Any = None,
    val_dataloaders: Any = None,
    datamodule: Any = None,
    **fit_kwargs: Any,
) -> None:
    """Run `trainer.fit(model, ...)` under spotnb: adds a `SpotCallback` and a `SpotLogger`
    (once), keeps the training loader's position (from `train_dataloaders`, the datamodule's
    or the model's `train_dataloader()`), restores the newest checkpoint and resumes from it.
    Arguments as `trainer.fit`'s; `ckpt_path` is chosen here (the restored one)."""
    if "ckpt_path" in fit_kwargs:
        raise TypeError("fit(ctx, trainer, model, ...) chooses ckpt_path itself (the restored checkpoint)")
    if isinstance(train_dataloaders, LightningDataModule):  # as trainer.fit accepts it there
        datamodule, train_dataloaders = train_dataloaders, None
    if trainer.world_size > 1:
        ctx.warn(
            f"the Trainer runs on {trainer.world_size} devices: spotnb's Lightning integration "
            "saves and restores one process's checkpoint, so resume is not exact"
        )
    callback = next((cb for cb in trainer.callbacks if isinstance(cb, SpotCallback)), None)
    if callback is None:
        logger = SpotLogger(ctx, trainer.default_root_dir)
        callback = SpotCallback(ctx, logger)
        trainer.callbacks.append(callback)
        trainer.loggers = [*trainer.loggers, logger]
    if threading.current_thread() is threading.main_thread():
        callback._sigterm = signal.getsignal(signal.SIGTERM)
    patched = None
    if train_dataloaders is not None:
        train_dataloaders = _wrap(ctx, callback, train_dataloaders)
    else:
        source = datamodule if datamodule is not None else model
        original = source.train_dataloader

        def train_dataloader() -> Any:
            return _wrap(ctx, callback, original())

        train_dataloader.__wrapped__ = original  # type: ignore[attr-defined]  # Lightning's is_overridden
        source.train_dataloader = train_dataloader  # an instance attribute: the class is untouched
        patched = source
    step = ctx.restore()
    ckpt_path = None
    if step:
        path = os.path.join(checkpoint_dir(trainer), f"step-{step}.ckpt")
        if os.path.isfile(path):
            ckpt_path = path
        else:
            ctx.warn(f"restored step {step} but {path} is missing: the Trainer starts from step 0")
    try:
        trainer.fit(
            model,
            train_dataloaders=train_dataloaders,
            val_dataloaders=val_dataloaders,
            datamodule=datamodule,
            ckpt_path=ckpt_path,
            **fit_kwargs,
        )
    finally:
        if patched is not None:
            del patched.train_dataloader


def version() -> str:
    """The installed Lightning version."""
    return str(lightning.__version__)
