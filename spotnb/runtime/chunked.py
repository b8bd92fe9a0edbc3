"""Snapshots of a state larger than `Config.snapshot_memory`, through a fixed set of buffers.

The training thread copies the tracked tensors, in order, into two buffers of half the budget
each; a drain thread writes each full buffer to a spool file (`tensors.bin`, hashed as it is
written) and hands it back for the next chunk. The state itself becomes a skeleton in which
every dense tensor is a `TensorRef` (offset, size, dtype, shape into `tensors.bin`); the
checkpoint's `state.pt` is that skeleton, so restore is `torch.load` and then `fill_refs`.

The training thread stays blocked until the last chunk is copied, not only until the tensors
not yet copied are about to be mutated: spotnb cannot see every in-place write to a tracked
tensor (the optimizer's step, user code on `ctx.state`, a module's buffers in forward), so
letting training go on mid-copy could only be made safe for the writes it knows of, and a torn
checkpoint restores silently. A tensor's version counter could detect a write after the fact,
but only to throw the save away. The pause is therefore copy + write of all but the last two
chunks; the last two are written while training goes on.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TensorRef", "ChunkBuffers", "Drain", "dense_layout", "copy_chunked", "fill_refs", "DATA_NAME"]

#: the manifest name of a chunked checkpoint's tensor bytes, beside its `state.pt` skeleton
DATA_NAME = "tensors.bin"
#: tensors start at multiples of this in `tensors.bin` (so a buffer slice can be viewed as any dtype)
ALIGN = 64


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor's bytes are in `tensors.bin` (C order, on CPU at restore)."""

    offset: int
    nbytes: int
    dtype: str  # "float32", as in torch.float32
    shape: tuple[int, ...]


def _dense(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.layout == torch.strided


def _walk(obj: Any, path: tuple = ()) -> Iterator[tuple[tuple, torch.Tensor]]:
    if _dense(obj):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, path + (i,))


def dense_layout(state: Any) -> tuple[tuple[Any, ...], int]:
    """(path, shape, dtype, device) of every dense tensor a snapshot copies, in order, and their
    bytes: what a pool of buffers must match to be reused, and what the budget is checked on."""
    parts = []
    total = 0
    for path, t in _walk(state):
        parts.append((path, tuple(t.shape), t.dtype, t.device.type))
        total += t.element_size() * t.nelement()
    return tuple(parts), total


class ChunkBuffers:
    """Two byte buffers of `chunk` bytes: one filled by the training thread while the drain
    writes the other."""

    def __init__(self, chunk: int, pin: bool = False) -> None:
        self.chunk = chunk
        self.buffers = [torch.empty(chunk, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self.in_use = False

    @property
    def nbytes(self) -> int:
        return self.chunk * len(self.buffers)


class Drain:
    """The thread that writes full buffers to the spool file, hashing, and gives them back.

    After a write error it keeps taking buffers (and dropping them) so that the training
    thread, which waits for a free one, is never left blocked; the error is raised by `result`."""

    def __init__(self, path: str, buffers: ChunkBuffers, on_done: Callable[[], None]) -> None:
        self.path, self.buffers = path, buffers
        self.full: queue.Queue[tuple[torch.Tensor, int] | None] = queue.Queue()
        self.free: queue.Queue[torch.Tensor] = queue.Queue()
        for buf in buffers.buffers:
            self.free.put(buf)
        self.digest: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._on_done = on_done
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotnb-snapshot-drain", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sha, size = hashlib.sha256(), 0
        try:
            f = open(self.path, "wb")  # noqa: SIM115 - closed below, after the last buffer
        except OSError as exc:
            f, self.error = None, exc
        try:
            while (item := self.full.get()) is not None:
                buf, n = item
                try:
                    if f is not None and self.error is None:
                        view = buf[:n].numpy().data
                        sha.update(view)
                        f.write(view)
                        size += n
                except BaseException as exc:  # noqa: BLE001 - reported by result(), never lost
                    self.error = exc
                finally:
                    self.free.put(buf)
            if f is not None:
                f.close()
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            self.digest = {"size": size, "sha256": sha.hexdigest()}
            self._on_done()
            self._done.set()

    def put(self, buf: torch.Tensor, n: int) -> None:
        self.full.put((buf, n))

    def take(self) -> torch.Tensor:
        return self.free.get()

    def close(self) -> None:
        """No more buffers: the drain writes what it has, then ends."""
        self.full.put(None)

    def wait(self) -> None:
        """Until the drain has ended (its buffers given back), whatever its outcome."""
        self._done.wait()

    def result(self) -> dict[str, Any]:
        """Wait for the last buffer to be written: the file's size and sha256, or its error."""
        self._done.wait()
        if self.error is not None:
            raise self.error
        assert self.digest is not None
        return self.digest


def copy_chunked(state: Any, drain: Drain, plain_copy: Callable[[Any], Any]) -> Any:
    """The skeleton of `state` (dense tensors replaced by `TensorRef`), having copied every
    dense tensor's bytes through the drain's buffers. Runs in the training thread."""
    chunk = drain.buffers.chunk
    buf = drain.take()
    pos = 0
    offset = 0  # in tensors.bin
    cuda = False

    def ship() -> None:
        nonlocal buf, pos
        if cuda:
            torch.cuda.synchronize()  # the non-blocking copies into the pinned buffer are done
        drain.put(buf, pos)
        buf, pos = drain.take(), 0

    def pad() -> None:
        nonlocal pos, offset
        gap = -offset % ALIGN
        while gap:
            if pos == chunk:
                ship()
            k = min(gap, chunk - pos)
            buf[pos : pos + k].zero_()
            pos, offset, gap = pos + k, offset + k, gap - k

    def put_tensor(t: torch.Tensor) -> TensorRef:
        nonlocal pos, offset, cuda
        t = t.detach()
        cuda = cuda or t.is_cuda
        pad()
        start, nbytes = offset, t.element_size() * t.nelement()
        if t.is_contiguous():
            src = t.reshape(-1).view(torch.uint8) if t.nelement() else None
            done = 0
            while src is not None and done < nbytes:
                if pos == chunk:
                    ship()
                k = min(nbytes - done, chunk - pos)
                buf[pos : pos + k].copy_(src[done : done + k], non_blocking=t.is_cuda)
                pos, done, offset = pos + k, done + k, offset + k
        else:  # strided: whole rows along the first dimension, each chunk viewed as the dtype
            row = nbytes // t.shape[0] if t.shape[0] else 0
            if row > chunk:
                raise ValueError(
                    f"a non-contiguous tensor of shape {tuple(t.shape)} has rows of {row} bytes, more than "
                    f"the snapshot's chunk of {chunk} bytes (half of Config.snapshot_memory): raise "
                    f"snapshot_memory to at least {2 * row} bytes, or make the tensor contiguous"
                )
            i = 0
            while i < t.shape[0]:
                if chunk - pos < row or pos % t.element_size():
                    ship()
                rows = min(t.shape[0] - i, (chunk - pos) // row)
                dst = buf[pos : pos + rows * row].view(t.dtype).view(rows, *t.shape[1:])
                dst.copy_(t[i : i + rows], non_blocking=t.is_cuda)
                pos, offset, i = pos + rows * row, offset + rows * row, i + rows
        return TensorRef(start, nbytes, str(t.dtype).removeprefix("torch."), tuple(t.shape))

    def walk(obj: Any) -> Any:
        if _dense(obj):
            return put_tensor(obj)
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [walk(v) for v in obj]
            return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
        return plain_copy(obj)  # sparse tensors, numbers, RNG tuples: small, in the skeleton

    try:
        skeleton = walk(state)
        if cuda:
            torch.cuda.synchronize()
        drain.put(buf, pos)
    finally:
        drain.close()
    return skeleton


def fill_refs(skeleton: Any, path: str) -> Any:
    """The state with every `TensorRef` read back from `path` (a verified `tensors.bin`).
    A reference outside the file or inconsistent with its dtype and shape is damage: ValueError."""
    import os

    size = os.path.getsize(path)
    with open(path, "rb") as f:

        def read(ref: TensorRef) -> torch.Tensor:
            dtype = getattr(torch, ref.dtype, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"{DATA_NAME}: unknown dtype {ref.dtype!r}")
            t = torch.empty(ref.shape, dtype=dtype)
            want = t.element_size() * t.nelement()
            if want != ref.nbytes or ref.offset < 0 or ref.offset + want > size:
                raise ValueError(
                    f"{DATA_NAME}: a tensor reference ({ref}) does not fit the file ({size} bytes)"
                )
            if want:
                f.seek(ref.offset)
                got = f.readinto(t.reshape(-1).view(torch.uint8).numpy().data)
                if got != want:
                    raise ValueError(f"{DATA_NAME}: short read at {ref.offset}")
            return t

        def walk(obj: Any) -> Any:
            if isinstance(obj, TensorRef):
                return read(obj)
            if isinstance(obj, dict):
                return {k: walk(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                items = [walk(v) for v in obj]
                return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
            return obj

        return walk(skeleton)
