"""Lightning Fabric on spot: `for step, batch in fabric_batches(ctx, loader, steps): ...`.

Fabric leaves the training loop to you, so spotnb's own `ctx.steps` drives it and the model
and optimizers Fabric returns are tracked as they are (`ctx.track(model=model, optimizer=opt)`:
a Fabric-wrapped module's and optimizer's `state_dict` are the wrapped ones'). What a hand-written
loop lacks for an exact resume is the data position: where in which epoch the loader was, with
the RNG states the epoch's shuffle and random transforms drew from. `fabric_batches` wraps the
loader in a `ResumableLoader` (the one the Lightning integration uses), counts the epochs and
marks each batch trained once the caller's step body ran, and tracks both, so a resume
mid-epoch continues with the very batches, and random draws, the uninterrupted run had.

Exact with one process. Several devices (a `DistributedSampler`): Fabric's loader numbers its
epochs from its own iterator count, which a resume starts again; `fabric_batches` sets the
sampler's epoch from its saved count instead, but the per-rank loaders are not checked here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from spotnb.integrations.loader import ResumableLoader

__all__ = ["fabric_batches"]


class _Epochs:
    """The epoch counter, as a tracked object."""

    def __init__(self) -> None:
        self.epoch = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])


def _set_epoch(loader: Any, epoch: int) -> None:
    for obj in (
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        set_epoch = getattr(obj, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def fabric_batches(ctx: Any, loader: Any, steps: int) -> Iterator[tuple[int, Any]]:
    """`(step, batch)` for each step from the restored one up to `steps`, epoch after epoch of
    `loader` (a DataLoader, or what `fabric.setup_dataloaders` returned). Call it where you
    would call `ctx.steps(steps)`, after `ctx.track(...)` of your model and optimizers: it
    tracks the loader's position and the epoch itself (as `spotnb_loader`, `spotnb_epoch`).

    A batch counts as trained once your loop body for it ran: a save at the step boundary
    then resumes at the next batch. An empty loader is an error, not an endless loop.

    Bad arguments are refused here, at the call, before anything is tracked: `steps` not a
    positive int, a `loader` that is not iterable or is a one-shot iterator (it could not give
    a second epoch, nor replay its batches on a resume), a `ctx` that is not the job's."""
    _check(ctx, loader, steps)
    return _batches(ctx, loader, steps)


def _check(ctx: Any, loader: Any, steps: Any) -> None:
    """`fabric_batches`'s arguments, each refused with the fix."""
    if not (callable(getattr(ctx, "track", None)) and callable(getattr(ctx, "steps", None))):
        raise TypeError(
            f"fabric_batches: ctx must be the job's context (the argument your train function "
            f"receives), got {type(ctx).__name__}"
        )
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"fabric_batches: steps must be an int (the number of steps to train), got {steps!r}")
    if steps <= 0:
        raise ValueError(
            f"fabric_batches: steps must be at least 1 (the number of steps to train), got {steps}"
        )
    inner = loader.loader if isinstance(loader, ResumableLoader) else loader
    # not iter(inner): a DataLoader's iterator starts its workers and draws its base seed from
    # the RNG, which would shift every random draw of the run
    if isinstance(inner, Iterator):
        raise TypeError(
            f"fabric_batches: loader is an iterator ({type(inner).__name__}), which gives one "
            "epoch and cannot replay its batches on a resume; pass the DataLoader itself "
            "(or another re-iterable loader), not iter(loader) or a generator"
        )
    if not isinstance(inner, Iterable):
        raise TypeError(
            f"fabric_batches: loader is not iterable ({type(inner).__name__}); pass a DataLoader "
            "(or what fabric.setup_dataloaders returned)"
        )


def _batches(ctx: Any, loader: Any, steps: int) -> Iterator[tuple[int, Any]]:
    resumable = loader if isinstance(loader, ResumableLoader) else ResumableLoader(loader)
    epochs = _Epochs()
    ctx.track(spotnb_loader=resumable, spotnb_epoch=epochs)
    batches: Iterator[Any] | None = None
    for step in ctx.steps(steps):
        fresh = 0
        while True:
            if batches is None:
                _set_epoch(resumable, epochs.epoch)
                batches = iter(resumable)
            try:
                batch = next(batches)
                break
            except StopIteration:
                batches = None
                epochs.epoch += 1
                fresh += 1
                if fresh > 1:
                    raise ValueError(
                        "fabric_batches: the loader yields no batch (an empty dataset?)"
                    ) from None
        yield step, batch
        resumable._trained += 1  # the caller's step ran: a save at this boundary is after it
