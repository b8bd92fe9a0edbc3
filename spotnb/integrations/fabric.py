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

from collections.abc import Iterator
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
    then resumes at the next batch. An empty loader is an error, not an endless loop."""
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
