"""`ResumableLoader`: a training loader whose position in the epoch can be saved and
restored exactly (framework-free; `spotnb.integrations.lightning` hands it to Lightning, whose
loops save and restore any loader with `state_dict`/`load_state_dict` with their checkpoint).

It records the RNG states (torch, Python, NumPy and the loader's own generators) when each
epoch's iterator is created, which is everything a shuffling sampler and the worker seeds draw
from, and how many batches of the epoch were trained. On resume it recreates the epoch's
iterator from those states and loads the trained batches again rather than skipping their
indices: with `num_workers > 0` each batch goes to a worker in turn and every worker has its
own RNG stream (random crops, masking), so only replaying the same batches through the same
workers leaves each worker's stream where the uninterrupted run had it. A batch already fetched
before the save is fetched again with the RNG state it was fetched with, then the RNG is set to
its state at the save.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["ResumableLoader"]

_KEEP_FETCH_STATES = 8  # RNG states before the last few fetches (a trainer prefetches one)


# -- RNG states, in a form `torch.load(weights_only=True)` accepts ---------------------------
def _rng_get(generators: list[torch.Generator]) -> dict[str, Any]:
    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (
            str(name),
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ),
        "generators": [g.get_state() for g in generators],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _rng_set(state: dict[str, Any], generators: list[torch.Generator]) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    for g, s in zip(generators, state["generators"], strict=False):
        g.set_state(s)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(obj: Any) -> Any:
    """`random.setstate` wants tuples; a checkpoint round trip may give lists."""
    return tuple(_tuples(x) for x in obj) if isinstance(obj, (list, tuple)) else obj


class ResumableLoader:
    """A training loader whose position Lightning saves and restores with its checkpoint
    (it has `state_dict`/`load_state_dict`). Iterates the wrapped loader unchanged; other
    attributes (`sampler`, `dataset`, `batch_size`, ...) are the wrapped loader's, so
    Lightning still calls `sampler.set_epoch`. See the module docstring for how it resumes."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._epoch_rng: dict[str, Any] | None = None  # when this epoch's iterator was created
        self._fetch_rng: dict[int, dict[str, Any]] = {}  # batch index -> RNG before its fetch
        self._yielded = 0
        self._trained = 0  # batches of this epoch trained (SpotCallback counts them)
        self._exhausted = False  # the epoch's iterator ran out
        self._pending: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def _generators(self) -> list[torch.Generator]:
        found: list[torch.Generator] = []
        for obj in (
            self.loader,
            getattr(self.loader, "sampler", None),
            getattr(self.loader, "batch_sampler", None),
        ):
            g = getattr(obj, "generator", None)
            if isinstance(g, torch.Generator) and all(g is not f for f in found):
                found.append(g)
        sampler = getattr(getattr(self.loader, "batch_sampler", None), "sampler", None)
        g = getattr(sampler, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not f for f in found):
            found.append(g)
        return found

    def state_dict(self) -> dict[str, Any]:
        """The epoch's starting RNG states, the batches trained, the RNG before the next
        batch was fetched and now (the save's step boundary)."""
        gens = self._generators()
        return {
            "epoch_rng": self._epoch_rng,
            "trained": self._trained,
            "yielded": self._yielded,
            "fetch_rng": self._fetch_rng.get(self._trained),
            "exhausted": self._exhausted,
            "rng": _rng_get(gens),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending = state if state.get("epoch_rng") is not None else None

    def __iter__(self) -> Iterator[Any]:
        pending, self._pending = self._pending, None
        return self._iterate(pending)

    def _iterate(self, pending: dict[str, Any] | None) -> Iterator[Any]:
        gens = self._generators()
        skip = 0
        resume_rng = None
        if pending is not None and self._epoch_finished(pending):
            # saved after the epoch's last batch: Lightning starts the next epoch, from the
            # RNG states of the save (the generators' included: the epoch's draws are done)
            _rng_set(pending["rng"], gens)
            pending = None
        elif pending is not None:
            _rng_set(pending["epoch_rng"], gens)  # the epoch's iterator as it was made
            skip = pending["trained"]
        self._epoch_rng = _rng_get(gens)
        self._fetch_rng = {}
        self._yielded = self._trained = 0
        self._exhausted = False
        it = iter(self.loader)
        for _ in range(skip):  # load, not sample-skip: workers' RNG streams advance as before
            next(it)
            self._yielded += 1
        self._trained = skip
        if pending is not None:
            if pending["fetch_rng"] is not None:
                # Lightning had fetched the next batch before the save: fetch it again as it
                # was (random transforms in this process), then go on from the save's RNG
                _rng_set(pending["fetch_rng"], [])
                resume_rng = pending["rng"]
            else:
                _rng_set(pending["rng"], [])  # the next batch was fetched after the save
        while True:
            self._fetch_rng[self._yielded] = _rng_get([])
            self._fetch_rng.pop(self._yielded - _KEEP_FETCH_STATES, None)
            try:
                batch = next(it)
            except StopIteration:
                self._exhausted = True
                return
            if resume_rng is not None:
                _rng_set(resume_rng, [])  # back to the step boundary of the save
                resume_rng = None
            self._yielded += 1
            yield batch

    def _epoch_finished(self, pending: dict[str, Any]) -> bool:
        if pending["trained"] < pending["yielded"]:
            return False
        if pending["exhausted"]:
            return True
        try:
            return pending["trained"] >= len(self.loader)
        except TypeError:
            return False
