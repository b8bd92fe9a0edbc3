"""Snapshots of a state larger than `Config.snapshot_memory`, through a fixed set of buffers,
and snapshots that release the training step before the optimizer's tensors are written.

The training thread copies the tensors it cannot protect, in order, into two buffers of half
the budget each; a drain thread writes each full buffer to a spool file (`tensors.bin`) and
hands it back for the next chunk. The state itself becomes a skeleton in which every dense
tensor is a `TensorRef` (offset, size, dtype, shape into `tensors.bin`); the checkpoint's
`state.pt` is that skeleton, so restore is `torch.load` and then `fill_refs`.

**Gated tensors.** The parameters and state of the tracked optimizers (`Gated`: usually almost
all of the state) are not copied at all. The training thread returns as soon as the rest is
copied, and the drain writes each gated tensor straight from its own memory to the file (CPU
tensors: no buffer, no intermediate copy) while forward and backward run. What keeps those
bytes still is the gate (`Gate`): a step pre-hook on each tracked optimizer blocks its
`step()` until the drain has written every gated tensor. Writes the gate cannot see (user code
changing a parameter in place between saves and the next step) are caught after the fact by the
tensor's version counter (`Tensor._version`, bumped by every in-place op), read when the save
starts and again just after its bytes were written (for a CUDA tensor: when the step is
released, since from then on a kernel queued on the compute stream runs behind the host copy's
event, though its version bumps as it is queued): a change means the file may hold a torn
tensor, the drain reports it (`TornSnapshot`), the save is not committed and the checkpointer
falls back to copying everything before releasing the step. Not seen at all: writes through
`.data` or a numpy view (they bypass the version counter) made by code other than a tracked
optimizer's `step()` while the drain runs. A tracked optimizer's own `step()` may write through
`.data`: it is gated, not detected.

**The digest.** `tensors.bin` is hashed with BLAKE3 (`runtime/checkpoint/digest.py`) as it is written,
piece by piece (each piece hashed, then written while it is still in the CPU's cache): one
pass over the gated tensors' memory instead of a write and a read-back of the whole file, at
the price of the hash's time inside the gate (~0.3 s per 2 GB on one core). Only while nobody
waits at the gate, though: once a `step()` (or the next snapshot) waits, the drain writes the
rest unhashed, opens the gate, and hashes what is left by reading it back (`Gate.waiting`), so
the hash never lengthens a wait. A 2 GB save now
costs 0.8 CPU seconds in all (0.5 of them the write), against 2.5 with the sha256 read-back
and 4.7 for DCP's `async_save` (`bench_checkpoint.py --save-cost`, benchmarks/CHECKPOINT.md).
`Drain.hash_after_gate` restores the read-back after the gate opens (at nice 10), for that
comparison.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from spotnb.runtime.checkpoint import digest

__all__ = [
    "TensorRef",
    "ChunkBuffers",
    "Drain",
    "Gate",
    "Gated",
    "TornSnapshot",
    "dense_layout",
    "split_bytes",
    "copy_chunked",
    "fill_refs",
    "DATA_NAME",
]

log = logging.getLogger(__name__)

#: the manifest name of a chunked checkpoint's tensor bytes, beside its `state.pt` skeleton
DATA_NAME = "tensors.bin"
#: tensors start at multiples of this in `tensors.bin` (so a buffer slice can be viewed as any dtype)
ALIGN = 64
#: bytes read per hash update when the file is hashed after the gate opens
_HASH_READ = 8 * 1024 * 1024
#: bytes of a gated tensor hashed and then written at a time (about a core's L2 cache: the
#: write's copy reads what the hash just brought in)
_PIECE = 1024 * 1024


class TornSnapshot(RuntimeError):
    """A gated tensor changed while its bytes were being written: the file may mix two steps."""


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


def split_bytes(state: Any, gated: Gated | None) -> tuple[int, int]:
    """(bytes the training thread copies, padding included; bytes left gated in place)."""
    copied = kept = 0
    for _, t in _walk(state):
        n = t.element_size() * t.nelement()
        if gated is not None and t in gated:
            kept += n
        else:
            copied += n + ALIGN
    return copied, kept


def _version(t: torch.Tensor) -> int | None:
    try:
        return int(t._version)
    except RuntimeError:  # inference tensors have no version counter
        return None


class Gated:
    """The tensors a tracked optimizer's `step()` writes (its parameters and its state), by
    storage address: the ones a snapshot may leave in place and write later, behind the gate.

    Only contiguous, non-empty tensors with a version counter qualify, on the CPU, or on a GPU
    when `cuda` (their host copies fit the budget: `runtime/checkpoint/staging.py`); anything else (a view,
    an inference tensor) is copied before the step is released."""

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer], cuda: bool = False) -> None:
        self.optimizers = list(optimizers)
        self.cuda = cuda
        self.ptrs: set[int] = set()
        for opt in self.optimizers:
            for group in opt.param_groups:
                self.ptrs |= {p.data_ptr() for p in group["params"] if isinstance(p, torch.Tensor)}
            for st in opt.state.values():
                if isinstance(st, dict):
                    self.ptrs |= {v.data_ptr() for v in st.values() if isinstance(v, torch.Tensor)}

    def __contains__(self, t: torch.Tensor) -> bool:
        return (
            t.data_ptr() in self.ptrs
            and (t.device.type == "cpu" or (self.cuda and t.is_cuda))
            and t.is_contiguous()
            and t.nelement() > 0
            and not t.is_quantized
            and _version(t) is not None
        )


class Gate:
    """Holds back `step()` of the tracked optimizers while a drain writes their tensors.

    One step pre-hook per optimizer, installed once (`hook`) and left in place: a hook cannot be
    removed while torch iterates over the hooks, and an open gate costs one `Event.is_set`.
    `waited` adds up the seconds `step()` was held: part of the training thread's stall."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        #: set once a thread (an optimizer's `step()`, the next snapshot) waits at the gate
        self.waiting = threading.Event()
        #: the CUDA event of the current snapshot's device-to-host copies: the compute stream
        #: waits for it before an optimizer's kernels (the host does not)
        self.event: Any = None
        self.waited = 0.0
        #: told every wait's seconds (the checkpointer counts them into δ, the save's cost)
        self.on_wait: Callable[[float], None] | None = None
        self._hooked: dict[int, Any] = {}  # id(optimizer) -> hook handle

    def hook(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        for opt in optimizers:
            if id(opt) not in self._hooked:
                self._hooked[id(opt)] = opt.register_step_pre_hook(self._pre_step)

    def close(self) -> threading.Event:
        """A fresh closed gate for one snapshot's drain: `set()` on what this returns opens it.
        `waiting` (fresh too) is set once a thread waits at it."""
        self.open = threading.Event()
        self.waiting = threading.Event()
        return self.open

    def wait(self) -> None:
        """Until the current drain has written every gated tensor; the wait counts as stall."""
        gate = self.open
        if not gate.is_set():
            self.waiting.set()  # the drain stops hashing inline: the gate opens sooner
            t0 = time.perf_counter()
            gate.wait()
            dt = time.perf_counter() - t0
            self.waited += dt
            if self.on_wait is not None:
                self.on_wait(dt)

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)
        self.wait()

    def unhook(self) -> None:
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()


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


@dataclass
class _Direct:
    """A gated tensor the drain writes from its own memory: where, and its version at the start."""

    ref: TensorRef
    tensor: torch.Tensor  # what is written: the tensor itself, or its pinned host copy
    version: int | None
    where: str
    source: torch.Tensor | None = None  # the CUDA tensor a host copy is of (its version is checked)
    event: Any = None  # the CUDA event after which the host copy is complete


@dataclass
class _Work:
    direct: list[_Direct] = field(default_factory=list)


class Drain:
    """The thread that writes full buffers to the spool file and gives them back, then writes
    the gated tensors straight from memory, opens the gate, and hashes the file.

    After a write error it keeps taking buffers (and dropping them) so that the training
    thread, which waits for a free one, is never left blocked, and it opens the gate whatever
    happens; the error is raised by `result`."""

    #: hash the gated tensors by reading the file back after the gate opens (at nice 10), not
    #: while writing them: a shorter gate, one more pass (benchmarks/bench_checkpoint.py --profile)
    hash_after_gate = False

    def __init__(
        self,
        path: str,
        buffers: ChunkBuffers,
        on_done: Callable[[], None],
        released: threading.Event | None = None,
        on_torn: Callable[[str], None] | None = None,
        waiting: threading.Event | None = None,
    ) -> None:
        self.path, self.buffers = path, buffers
        #: set when a thread waits at the gate: from then on the gated tensors are written
        #: unhashed and hashed after the gate opens, by reading them back
        self.waiting = waiting
        self.full: queue.Queue[tuple[torch.Tensor, int] | _Work | None] = queue.Queue()
        self.free: queue.Queue[torch.Tensor] = queue.Queue()
        for buf in buffers.buffers:
            self.free.put(buf)
        self.digest: dict[str, Any] | None = None
        self.error: BaseException | None = None
        #: set once every gated tensor is written (or the drain gave up): the optimizers may step
        self.released = released if released is not None else threading.Event()
        self._on_done, self._on_torn = on_done, on_torn
        self._after_gate = self.hash_after_gate  # as when this save started
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotnb-snapshot-drain", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        algo, sha = digest.fresh()
        size = 0
        f = None
        direct: list[_Direct] = []
        try:
            try:
                f = open(self.path, "wb")  # noqa: SIM115 - closed below, after the last tensor
            except OSError as exc:
                self.error = exc
            while (item := self.full.get()) is not None:
                if isinstance(item, _Work):
                    direct = item.direct
                    continue
                buf, n = item
                try:
                    if f is not None and self.error is None:
                        view = buf[:n].numpy().data
                        sha.update(view)  # a private copy: hashed as written
                        f.write(view)
                        size += n
                except BaseException as exc:  # noqa: BLE001 - reported by result(), never lost
                    self.error = exc
                finally:
                    self.free.put(buf)
            hashed = size  # the file's first `hashed` bytes went through `sha`
            if direct and f is not None and self.error is None:
                size, hashed = self._write_direct(f, direct, size, None if self._after_gate else sha)
            direct = []  # the drain holds no live tensor past the gate
            self.released.set()
            _lower_priority()
            if f is not None:
                f.close()
                f = None
            if self.error is None and size > hashed:  # what was not hashed inline, read back
                with open(self.path, "rb") as fin:
                    fin.seek(hashed)
                    while part := fin.read(_HASH_READ):
                        sha.update(part)
        except BaseException as exc:  # noqa: BLE001
            self.error = self.error or exc
        finally:
            self.released.set()
            if f is not None:
                f.close()
            self.digest = {"size": size, algo: sha.hexdigest()}
            self._on_done()
            self._done.set()

    def _write_direct(self, f: Any, direct: list[_Direct], size: int, sha: Any) -> tuple[int, int]:
        """Write each gated tensor from its own memory at its offset, hashing each piece with
        `sha` first until someone waits at the gate (None: nothing hashed here); a changed
        version counter is a torn snapshot (reported once, for the first tensor that changed).
        (the file's size, how much of it `sha` has seen)."""
        inline, hashed = sha is not None, size

        def out(data: Any) -> None:
            nonlocal inline, hashed
            if not inline:
                f.write(data)
                return
            for i in range(0, len(data), _PIECE):
                piece = data[i : i + _PIECE]
                if inline and self.waiting is not None and self.waiting.is_set():
                    inline = False  # a step() waits: the rest is hashed once the gate is open
                if inline:
                    sha.update(piece)
                    hashed += len(piece)
                f.write(piece)

        try:
            for d in direct:
                if d.event is not None and not self.released.is_set():
                    # host copies of CUDA tensors come last: the optimizers' host threads need not
                    # wait for them (their compute stream waits for the event instead). Their
                    # versions are checked here, at the release, and not after the copy: a
                    # kernel queued from now on (the optimizer's step) bumps the version when
                    # it is queued, not when it runs, and runs behind the copy's event
                    for g in direct:
                        if g.source is not None:
                            self._check(g, g.source)
                    self.released.set()
                if d.event is not None:
                    d.event.synchronize()
                if d.ref.offset > size:
                    out(bytes(d.ref.offset - size))
                    size = d.ref.offset
                out(d.tensor.reshape(-1).view(torch.uint8).numpy().data)
                size += d.ref.nbytes
                if d.source is None:
                    self._check(d, d.tensor)
        except BaseException as exc:  # noqa: BLE001 - reported by result()
            self.error = self.error or exc
        return size, hashed

    def _check(self, d: _Direct, live: torch.Tensor) -> None:
        """A gated tensor whose version moved since the save began was written by something the
        gate does not hold back: the file may hold a torn copy (reported once)."""
        if _version(live) == d.version or self.error is not None:
            return
        reason = (
            f"{d.where} was changed in place (version {d.version} -> {_version(live)}) "
            "while the snapshot wrote it, by a write the optimizer gate does not hold "
            "back: this save is not committed (the previous checkpoint stays), and "
            "later saves copy every tensor before training resumes"
        )
        self.error = TornSnapshot(reason)
        if self._on_torn is not None:
            self._on_torn(reason)

    def put(self, buf: torch.Tensor, n: int) -> None:
        self.full.put((buf, n))

    def put_direct(self, direct: list[_Direct]) -> None:
        """The gated tensors, written after the last buffer."""
        self.full.put(_Work(direct))

    def take(self) -> torch.Tensor:
        return self.free.get()

    def close(self) -> None:
        """No more buffers: the drain writes what it has, then ends."""
        self.full.put(None)

    def wait(self) -> None:
        """Until the drain has ended (its buffers given back), whatever its outcome."""
        self._done.wait()

    def result(self) -> dict[str, Any]:
        """Wait for the last buffer to be written: the file's size and digest (`{"size": n,
        "blake3": hex}`), or its error."""
        self._done.wait()
        if self.error is not None:
            raise self.error
        assert self.digest is not None
        return self.digest


def _lower_priority() -> None:
    """Once the gate is open nobody waits for the drain's hashing: let the training threads
    have the cores first (Linux: a thread's own nice value; it cannot be raised back, and the
    drain thread ends with this save)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


def _path_name(path: tuple) -> str:
    return "/".join(str(p) for p in path) or "the state"


def copy_chunked(
    state: Any,
    drain: Drain,
    plain_copy: Callable[[Any], Any],
    gated: Gated | None = None,
    stage: Callable[[list[torch.Tensor]], tuple[list[torch.Tensor], Any]] | None = None,
) -> Any:
    """The skeleton of `state` (dense tensors replaced by `TensorRef`), having copied every
    dense tensor's bytes through the drain's buffers, except the `gated` ones: those are placed
    after the rest and handed to the drain to write from their own memory, before the gate opens
    (gated CUDA tensors last, from the host copies `stage` queues: `runtime/checkpoint/staging.py`).
    Runs in the training thread."""
    chunk = drain.buffers.chunk
    buf = drain.take()
    pos = 0
    offset = 0  # in tensors.bin
    cuda = False
    later: list[tuple[tuple, torch.Tensor, int | None]] = []

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

    def walk(obj: Any, path: tuple) -> Any:
        if _dense(obj):
            if gated is not None and obj in gated:
                t = obj.detach()
                later.append((path, t, _version(t)))
                return _Slot(len(later) - 1)
            return put_tensor(obj)
        if isinstance(obj, dict):
            return {k: walk(v, path + (k,)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [walk(v, path + (i,)) for i, v in enumerate(obj)]
            return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
        return plain_copy(obj)  # sparse tensors, numbers, RNG tuples: small, in the skeleton

    direct: list[_Direct] = []
    try:
        skeleton = walk(state, ())
        if cuda:
            torch.cuda.synchronize()
        drain.put(buf, pos)
        seen: dict[tuple, TensorRef] = {}  # a tensor listed twice (tied weights) is written once
        on_gpu: list[_Direct] = []
        for path, t, version in sorted(later, key=lambda item: item[1].is_cuda):  # CPU ones first
            key = _key(t)
            if key not in seen:
                offset += -offset % ALIGN
                nbytes = t.element_size() * t.nelement()
                seen[key] = TensorRef(offset, nbytes, str(t.dtype).removeprefix("torch."), tuple(t.shape))
                direct.append(_Direct(seen[key], t, version, _path_name(path)))
                if t.is_cuda:
                    on_gpu.append(direct[-1])
                offset += nbytes
        if on_gpu:
            if stage is None:
                raise ValueError("gated CUDA tensors need a stage for their host copies")
            hosts, event = stage([d.tensor for d in on_gpu])
            for d, host in zip(on_gpu, hosts, strict=True):
                d.source, d.tensor, d.event = d.tensor, host, event
        if direct:
            drain.put_direct(direct)
    finally:
        drain.close()
    refs = [seen[_key(t)] for _, t, _ in later] if later else []
    return _fill_slots(skeleton, refs) if refs else skeleton


def _key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), t.dtype)


@dataclass(frozen=True)
class _Slot:
    index: int


def _fill_slots(obj: Any, refs: list[TensorRef]) -> Any:
    if isinstance(obj, _Slot):
        return refs[obj.index]
    if isinstance(obj, dict):
        return {k: _fill_slots(v, refs) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_fill_slots(v, refs) for v in obj]
        return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
    return obj


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
