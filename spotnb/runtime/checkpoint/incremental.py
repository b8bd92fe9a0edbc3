"""Incremental checkpoints: tensors unchanged since the last committed save are referenced.

A fine-tune's frozen part (a LoRA base model, frozen embeddings, a frozen backbone) is most of
its state and never changes, yet a full checkpoint rewrites it at every save. Here such a
tensor is stored once, by content, as `<ckpt>/blobs/<sha256>` (the folder `ctx.backup`'s files
already share), and every later checkpoint lists the same blob instead of writing it again.

Only tensors that no optimizer trains are candidates (`frozen_tensors`: parameters of tracked
modules with `requires_grad=False` that are in no tracked optimizer's param groups), and only
above `BLOB_MIN` bytes (small ones cost more as files than inline). Buffers are not: the forward
pass itself updates them (running statistics, MoCo-style queues, caches), in every style
including partial writes through `.data` that neither the version counter nor the probe sees.
A candidate is *referenced* without being copied or hashed again when it is the same tensor as
at the last committed save: same storage address, shape, strides and dtype, and the same
version counter (`Tensor._version`, which every in-place op bumps, `load_state_dict` and the
`torch.nn.init` functions included), and the same `PROBE` elements, evenly spaced (a few
hundred bytes read, however large the tensor). Writes that bypass the counter (through `.data`,
a numpy view, a raw kernel) are what rules trainable parameters and optimizer state out:
old-style optimizers write `p.data`. The probe catches such a write to a frozen tensor when it
touches the whole of it (an EMA teacher updated through `.data`), not one that changes a few
elements only. To keep the storage address from being reused by another tensor of the same
shape (both at version 0), the record holds a reference to the tensor until the next commit.

Anything else is written as before; a candidate that changed is copied, then hashed once in
the writer thread as its blob is written. Restore verifies a referenced blob like any file,
and pruning deletes a blob only when no remaining checkpoint lists it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BlobRef", "Seen", "Incremental", "frozen_tensors", "map_tensors", "fill_blobs", "BLOB_MIN"]

#: tensors smaller than this stay inline in `state.pt` (one file per 1 KB bias is all overhead)
BLOB_MIN = 64 * 1024
#: how a tensor blob is named in a manifest's `files` (the file itself is `blobs/<sha256>`)
PREFIX = "tensors/"

Path = tuple[Any, ...]
#: elements of a candidate compared at every save besides its version counter
PROBE = 64


@dataclass(frozen=True)
class BlobRef:
    """A tensor stored by content: its C-order bytes are `blobs/<sha256>`."""

    sha256: str
    nbytes: int
    dtype: str  # "float32", as in torch.float32
    shape: tuple[int, ...]

    @property
    def name(self) -> str:
        return PREFIX + self.sha256


@dataclass(frozen=True)
class Seen:
    """A candidate tensor as it was snapshotted (and, once committed, which blob holds it)."""

    tensor: torch.Tensor  # held: its storage cannot be freed and its address reused meanwhile
    version: int
    probe: torch.Tensor  # `PROBE` elements as they were at the snapshot
    sha256: str = ""

    def same(self, t: torch.Tensor) -> bool:
        s = self.tensor
        return (
            t.data_ptr() == s.data_ptr()
            and t.dtype == s.dtype
            and t.shape == s.shape
            and t.stride() == s.stride()
            and t.device == s.device
            and _version(t) == self.version
            and torch.equal(_probe(t), self.probe)
        )

    def ref(self) -> BlobRef:
        t = self.tensor
        return BlobRef(self.sha256, t.element_size() * t.nelement(), _dtype(t), tuple(t.shape))


def _version(t: torch.Tensor) -> int | None:
    try:
        return int(t._version)
    except RuntimeError:  # inference tensors have no version counter: never referenced
        return None


def _probe(t: torch.Tensor) -> torch.Tensor:
    """`PROBE` evenly spaced elements of a contiguous tensor (a copy: a later write must not
    reach it), as raw bytes so that NaNs compare equal."""
    flat = t.detach().view(-1)
    idx = torch.linspace(0, flat.numel() - 1, min(PROBE, flat.numel()), device=flat.device).long()
    return flat[idx].view(torch.uint8).cpu()


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def frozen_tensors(objects: Iterable[Any]) -> set[int]:
    """Storage addresses of the tensors of tracked modules that nothing trains: parameters
    with `requires_grad=False` in no tracked optimizer's param groups. Every other tensor
    (trainable parameters, buffers, optimizer state, `ctx.state`) is always written."""
    objects = list(objects)
    trained: set[int] = set()
    for obj in objects:  # an optimizer, or a wrapper that exposes its param groups
        for group in getattr(obj, "param_groups", None) or []:
            trained |= {p.data_ptr() for p in group.get("params", []) if isinstance(p, torch.Tensor)}
    frozen: set[int] = set()
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                if p.requires_grad:
                    trained.add(p.data_ptr())
                else:
                    frozen.add(p.data_ptr())
    return frozen - trained - {0}


def map_tensors(obj: Any, fn: Callable[[Path, Any], Any], path: Path = ()) -> Any:
    """`obj` rebuilt with every leaf `fn(path, leaf)` (containers: dicts, lists, tuples)."""
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn, path + (k,)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [map_tensors(v, fn, path + (i,)) for i, v in enumerate(obj)]
        return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
    return fn(path, obj)


class Incremental:
    """What the last committed save stored by content, and the split of the next state."""

    def __init__(self, blob_min: int = BLOB_MIN) -> None:
        self.blob_min = blob_min
        #: path -> the candidate as committed (with its blob); replaced at every commit
        self.committed: dict[Path, Seen] = {}
        #: path -> (blob, probe) of the tensors the last restore read from blobs (for `adopt`)
        self.restored: dict[Path, tuple[BlobRef, torch.Tensor]] = {}

    def split(self, state: Any, frozen: set[int]) -> tuple[Any, dict[Path, Seen], dict[Path, Seen]]:
        """(the state with every unchanged candidate replaced by its `BlobRef`, those
        referenced, the candidates that changed: to copy and write as new blobs)."""
        referenced: dict[Path, Seen] = {}
        fresh: dict[Path, Seen] = {}
        committed = self.committed  # one commit's record (the writer thread replaces it whole)

        def leaf(path: Path, t: Any) -> Any:
            if not self._candidate(t, frozen):
                return t
            seen = committed.get(path)
            if seen is not None and seen.same(t):
                referenced[path] = seen
                return seen.ref()
            version = _version(t)
            if version is not None:
                fresh[path] = Seen(t.detach(), version, _probe(t))
            return t

        return map_tensors(state, leaf), referenced, fresh

    def _candidate(self, t: Any, frozen: set[int]) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and t.layout == torch.strided
            and t.element_size() * t.nelement() >= self.blob_min
            and t.data_ptr() in frozen
            and t.is_contiguous()
        )

    def adopt(self, state: Any, frozen: set[int]) -> int:
        """After a restore has loaded its state into the live tensors: each candidate that was
        read from a blob, and still has that blob's dtype, shape and probe, is recorded as if
        this process had committed it, so the first save of a new incarnation references the
        frozen part instead of copying and hashing it again. The bytes adopted."""
        restored, self.restored = self.restored, {}
        committed = dict(self.committed)
        adopted = 0

        def leaf(path: Path, t: Any) -> Any:
            nonlocal adopted
            found = restored.get(path)
            if found is None or path in committed or not self._candidate(t, frozen):
                return t
            ref, probe = found
            version = _version(t)
            if (
                version is not None
                and (_dtype(t), tuple(t.shape)) == (ref.dtype, ref.shape)
                and torch.equal(_probe(t), probe)
            ):
                committed[path] = Seen(t.detach(), version, probe, ref.sha256)
                adopted += ref.nbytes
            return t

        map_tensors(state, leaf)
        self.committed = committed
        return adopted

    def commit(self, referenced: dict[Path, Seen], written: dict[Path, Seen]) -> None:
        """A save committed: what it referenced or wrote is what the next one may reference."""
        self.committed = {**referenced, **written}

    def forget(self) -> None:
        """Reference nothing until the next commit (a referenced blob went missing)."""
        self.committed = {}


def fill_blobs(
    skeleton: Any, paths: dict[str, str], read: dict[Path, tuple[BlobRef, torch.Tensor]] | None = None
) -> Any:
    """The state with every `BlobRef` read back from its verified local copy (`paths`: manifest
    name -> file); `read` gets each one's (ref, probe) by path. A blob of the wrong size for
    its dtype and shape is damage: ValueError."""
    import os

    def leaf(path: Path, obj: Any) -> Any:
        if not isinstance(obj, BlobRef):
            return obj
        dtype = getattr(torch, obj.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{obj.name}: unknown dtype {obj.dtype!r}")
        local = paths.get(obj.name)
        if local is None:
            raise ValueError(f"the state refers to {obj.name}, which the manifest does not list")
        t = torch.empty(obj.shape, dtype=dtype)
        want = t.element_size() * t.nelement()
        if want != obj.nbytes or os.path.getsize(local) != want:
            raise ValueError(f"{obj.name}: {os.path.getsize(local)} bytes, not the {want} of {obj}")
        if want:
            with open(local, "rb") as f:
                f.readinto(t.reshape(-1).view(torch.uint8).numpy().data)
        if read is not None and t.nelement():
            read[path] = (obj, _probe(t))
        return t

    return map_tensors(skeleton, leaf)
