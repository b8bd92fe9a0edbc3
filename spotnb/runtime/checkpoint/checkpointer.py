"""Checkpoints that are never half there.

Phase 1 (`snapshot`, the only blocking part) copies the tracked state into CPU memory, reusing
buffers (pinned when CUDA is present) so later snapshots are a plain memcpy. Phase 2 (a
background thread) serialises the copy to a local spool file and uploads it in chunks,
hashing as it goes. Phase 3 writes `MANIFEST.json` (size and digest of every file, step,
kind) last: a checkpoint exists only once its manifest does. Restore takes the newest
checkpoint whose files verify and falls back to the one before. Files a save writes by value
carry a BLAKE3 digest, blobs stored by content their sha256 (`runtime/checkpoint/digest.py` says why);
restore checks whichever an entry carries.

A state larger than the snapshot memory budget (`Config.snapshot_memory`) is not copied whole:
`runtime/checkpoint/chunked.py` streams it through two half-budget buffers into `tensors.bin`, and
`state.pt` holds the skeleton that points into it. Every buffer a snapshot holds (whole-state
pools and chunk buffers) is counted in `Checkpointer.held_bytes`; their sum never exceeds
the budget, and `peak_bytes` records the highest it reached.

Files the script backs up (`ctx.backup(path)`, a file or a whole folder such as a Hugging Face
`checkpoint-500/`) are stored by content, once: `<root>/blobs/<sha256>`, listed in each manifest
that needs them. A file unchanged since an earlier checkpoint (a frozen base model, a tokenizer)
is not uploaded again; pruning deletes a blob when the last checkpoint that listed it goes.

Saves are incremental (`runtime/checkpoint/incremental.py`): a large tensor no optimizer trains is stored
the same way, as a blob, and a later save references it, neither copied nor hashed again,
while it is unchanged since the last committed save; the manifest lists it like a backed-up
file (`tensors/<sha256>`), so restore verifies it and pruning keeps it while any kept
checkpoint lists it. `Checkpointer.bandwidth` (bytes written per second of upload, measured)
and `pending_bytes` (what a save now would write) let the policy tell whether an emergency
save fits a notice before starting one.

`Checkpointer` is the facade the script's context uses: it takes snapshots (phase 1, and the
buffers they hold) and queues them for its one worker thread, and leaves the rest to its
collaborators: `upload.Uploader` (phases 2 and 3: write, upload, commit), `restore.Catalog`
and `restore.Restorer` (find the job's checkpoints in its stores, load the newest that
verifies), `prune.Pruner` (retention), all over the pure `manifest.Manifest`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spotnb.core import protocol as ev
from spotnb.core.files import remove_orphaned
from spotnb.core.protocol import SaveKind
from spotnb.core.sizes import available_memory, human_bytes, total_memory
from spotnb.core.store import Store
from spotnb.policy.base import EMERGENCY_MARGIN, Observation, snapshot_estimate, upload_estimate
from spotnb.runtime.beacon import Beacon, Phase
from spotnb.runtime.checkpoint.chunked import (
    ALIGN,
    ChunkBuffers,
    Drain,
    Gate,
    Gated,
    copy_chunked,
    dense_layout,
    split_bytes,
)
from spotnb.runtime.checkpoint.incremental import Incremental, Seen
from spotnb.runtime.checkpoint.manifest import Found, Manifest
from spotnb.runtime.checkpoint.prune import Pruner
from spotnb.runtime.checkpoint.restore import Catalog, Restorer
from spotnb.runtime.checkpoint.staging import CudaStage
from spotnb.runtime.checkpoint.upload import (
    SaveCancelled,
    Snapshot,
    Uploader,
    copy_hashing,
    remove_spooled,
)

__all__ = ["Checkpointer", "emergency_skipped", "ewm"]

log = logging.getLogger(__name__)

#: the default snapshot budget keeps this much of the host's RAM free: 10 % of it, at least
#: MARGIN_MIN (the training step's own allocations grow and shrink between saves)
MARGIN_MIN = 256 * 1024 * 1024
#: saves that wrote less than this measure the store's latency more than its bandwidth
BANDWIDTH_MIN = 256 * 1024
#: the default budget never goes below this (a host already short of memory still saves, slowly)
AUTO_MIN = 16 * 1024 * 1024


def emergency_skipped(obs: Observation, step: int, time_left: float) -> ev.EmergencySkipped:
    """The event of a notice too short for the emergency save `obs` describes (`save_bytes`:
    what it would write), saying what was not saved and why, in numbers: `needed` is the
    model's δ + β + margin."""
    delta, beta = snapshot_estimate(obs), upload_estimate(obs)
    size = obs.save_bytes or obs.state_bytes
    measured = obs.save_bytes and obs.upload_bps
    rate = f"at the measured {human_bytes(int(obs.upload_bps))}/s" if measured else "as measured"
    reason = (
        f"an emergency save would write {human_bytes(size)} (what changed since the last committed "
        f"save), ~{beta:.2f} s of upload {rate}, ~{delta:.2f} s of snapshot and {EMERGENCY_MARGIN} s to "
        f"spare, and {time_left:.2f} s were left: no upload was started (one that cannot finish "
        "before the kill would only abandon the save in flight). Nothing was written to the "
        "instance's disk, which a spot preemption does not keep; the job resumes from its last "
        "committed checkpoint"
    )
    needed = delta + beta + EMERGENCY_MARGIN
    return ev.EmergencySkipped(step=step, time_left=time_left, needed=needed, nbytes=size, reason=reason)


def ewm(mean: float, var: float, x: float, alpha: float = 0.3) -> tuple[float, float]:
    """Exponentially weighted mean and variance (recent saves count most)."""
    if not mean:
        return x, 0.0
    diff = x - mean
    return mean + alpha * diff, (1 - alpha) * (var + alpha * diff * diff)


class _BufferPool:
    """Keeps one CPU buffer per tensor position so repeated snapshots copy, not allocate."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.in_use = False
        self.pin = torch.cuda.is_available()
        self.layout: tuple[Any, ...] | None = None  # the state's tensors these buffers fit

    @property
    def nbytes(self) -> int:
        return sum(b.element_size() * b.nelement() for b in self.buffers.values())

    def clear(self) -> None:
        """Give the buffers' memory back (another layout, or room for another snapshot)."""
        self.buffers.clear()
        self.layout = None

    def copy(self, obj: Any, path: tuple = ()) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            key = path
            buf = self.buffers.get(key)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or t.is_sparse:
                buf = (
                    torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin and t.is_cuda)
                    if not t.is_sparse
                    else t.cpu()
                )
                if t.is_sparse:
                    return buf.clone()
                self.buffers[key] = buf
            buf.copy_(t, non_blocking=t.is_cuda)
            return buf
        if isinstance(obj, dict):
            return {k: self.copy(v, path + (k,)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self.copy(v, path + (i,)) for i, v in enumerate(obj)]
            return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
        # plain values (ints, floats, strings, numpy RNG tuples): copy so later mutation can't leak in
        try:
            return _plain_copy(obj)
        except Exception as exc:  # noqa: BLE001 - deepcopy raises what the object's reduce raises
            raise TypeError(
                f"{_where(path)} cannot be checkpointed ({type(exc).__name__}: {exc}): keep only values "
                "that can be pickled there, and make a lock, an open file or a connection again "
                "after the restore instead"
            ) from exc


def _where(path: tuple) -> str:
    """A snapshot path as the user wrote it: ctx.state['x'], ctx.track(model=...)['w']."""
    head, rest = (path[0], path[1:]) if path else ("", ())
    if head == "user":
        name = "ctx.state"
    elif head == "objects" and rest:
        name, rest = f"ctx.track({rest[0]}=...).state_dict()", rest[1:]
    else:
        name, rest = "the checkpoint's state", path
    return name + "".join(f"[{k!r}]" for k in rest)


def _plain_copy(obj: Any) -> Any:
    if obj is None or isinstance(obj, (int, float, str, bytes, bool)):
        return obj
    import copy

    return copy.deepcopy(obj)


class Checkpointer:
    """Snapshots in the caller's thread; writes, uploads, commits and prunes in one worker."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        incarnation: int,
        emit: Callable[..., Any],
        beacon: Beacon | None = None,
        keep_last: int = 2,
        upload_bps: float | None = None,
        spool_dir: str | None = None,
        before_commit: Callable[[int], None] | None = None,
        key: bytes | None = None,
        snapshot_memory: int | None = None,
        read_stores: Sequence[Store] = (),
    ) -> None:
        #: fixed for the checkpointer's life (its collaborators hold them too)
        self.store, self.job_id, self.incarnation = store, job_id, incarnation
        #: most bytes of host RAM snapshot buffers may hold at once (None: what is free, see
        #: `budget`)
        self.snapshot_memory = snapshot_memory
        self.peak_bytes = 0  # the most `held_bytes` reached (tests and benchmarks read it)
        self.emit = emit
        self.beacon = beacon or Beacon(None)
        if spool_dir is None and store.local:  # beside the store, so a save can be renamed in
            spool_dir = store.path(".spool")
            os.makedirs(spool_dir, exist_ok=True)
        remove_orphaned(spool_dir or tempfile.gettempdir(), "spotnb-spool-")
        self.spool = tempfile.mkdtemp(prefix=f"spotnb-spool-{os.getpid()}-", dir=spool_dir)
        self.incremental = Incremental()
        # blobs of the write store that failed verification at restore: a save writes them
        # again instead of reusing them (same size, so the uploader would take them as good)
        damaged: set[str] = set()
        #: the job's checkpoint folders in every store that may hold them (`catalog.stores`:
        #: this one first, then `read_stores`), read by restore and pruning
        self.catalog = Catalog(store, job_id, emit, key, read_stores)
        self.stores, self.root = self.catalog.stores, self.catalog.root
        self.uploader = Uploader(
            store,
            self.root,
            self.spool,
            job_id,
            incarnation,
            self.beacon,
            self.incremental,
            damaged,
            self._cancelled,
            key=key,
            upload_bps=upload_bps,
            before_commit=before_commit,
        )
        self.restorer = Restorer(self.catalog, self.spool, emit, self.incremental, damaged)
        self.pruner = Pruner(self.catalog, emit, keep_last)
        self._pools: list[_BufferPool] = []
        self._chunks: ChunkBuffers | None = None
        self._cv = threading.Condition()
        self._pending: Snapshot | None = None
        self._busy = False
        self._cancel = threading.Event()
        self._closed = False
        self.snapshot_ema = 0.0  # δ
        self.upload_ema = 0.0  # β
        self.snapshot_var = 0.0  # their spread: an emergency save must fit the slow ones too
        self.upload_var = 0.0
        self.last_bytes = 0  # the last checkpoint's size: written + referenced
        self.last_written = 0  # what it wrote
        #: bytes per second a save's upload achieved (EWMA over saves that wrote BANDWIDTH_MIN
        #: or more; 0.0 until one has): β of a save of n bytes is about n / bandwidth
        self.bandwidth = 0.0
        #: holds back the tracked optimizers' `step()` while a snapshot's drain writes their
        #: tensors in place (`runtime/checkpoint/chunked.py`); `gate.waited` is stall time spent there
        self.gate = Gate()
        self.gate.on_wait = self._gate_waited
        self._snapshots = 0  # samples in snapshot_ema
        self._stage = CudaStage()  # pinned host copies of gated CUDA tensors, reused
        #: why saves copy every tensor before training resumes (a torn snapshot was seen), or ""
        self.blocking = ""
        #: write saves whose tensors fit the budget the gated way too (their optimizers' tensors
        #: written in place, no copy); False keeps them as one whole-state copy + torch.save
        self.stream = True
        self.committed: list[Manifest] = []
        self.failures = 0
        self._seq = max(self.catalog.seqs(), default=0)
        self._worker = threading.Thread(target=self._work, name="spotnb-checkpoint", daemon=True)
        self._worker.start()

    # -- settings its collaborators hold -----------------------------------------------------
    @property
    def key(self) -> bytes | None:
        """With a key, manifests are signed at commit and only signed ones are restored (the
        agent always has one; without, as in unit tests, nothing is authenticated)."""
        return self.catalog.key

    @key.setter
    def key(self, value: bytes | None) -> None:
        self.catalog.key = self.uploader.key = value

    @property
    def upload_bps(self) -> float | None:
        """Bytes per second uploads are throttled to (None: as fast as the store takes them)."""
        return self.uploader.upload_bps

    @upload_bps.setter
    def upload_bps(self, value: float | None) -> None:
        self.uploader.upload_bps = value

    @property
    def before_commit(self) -> Callable[[int], None] | None:
        """Called with the step just before a manifest is written; raising aborts the commit."""
        return self.uploader.before_commit

    @before_commit.setter
    def before_commit(self, value: Callable[[int], None] | None) -> None:
        self.uploader.before_commit = value

    @property
    def keep_last(self) -> int:
        """How many periodic (or final) checkpoints pruning keeps (`prune.retained`)."""
        return self.pruner.keep_last

    @keep_last.setter
    def keep_last(self, value: int) -> None:
        self.pruner.keep_last = value

    @property
    def restored_from(self) -> str | None:
        """The URL of the store the last `load_latest` restored from (None: nothing restored)."""
        return self.restorer.restored_from

    # -- phase 1 -------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        """Bytes of host RAM the snapshot buffers hold right now (idle ones included)."""
        chunks = self._chunks.nbytes if self._chunks else 0
        return sum(p.nbytes for p in self._pools) + chunks + self._stage.nbytes

    def budget(self) -> int:
        """The most bytes snapshot buffers may hold: `snapshot_memory` when given, else what
        the host has available now (psutil, or /proc/meminfo's MemAvailable) plus what the
        buffers already hold, minus a margin of 10 % of the RAM (at least 256 MB), and never
        below 16 MB. Unbounded when the host's memory cannot be read."""
        if self.snapshot_memory is not None:
            return self.snapshot_memory
        free = available_memory()
        if free is None:
            return 2**62
        margin = max(MARGIN_MIN, (total_memory() or 0) // 10)
        return max(AUTO_MIN, self.held_bytes + free - margin)

    def snapshot(
        self,
        state: Any,
        step: int,
        kind: SaveKind,
        files: list[tuple[str, str]] | None = None,
        dirs: dict[str, str] | None = None,
        frozen: set[int] | None = None,
        optimizers: list[torch.optim.Optimizer] | None = None,
    ) -> Snapshot:
        """Copy `state` (nested dicts/lists of tensors and plain values) into CPU memory, and
        the script's `files` ((path, manifest name); `dirs`: folders backed up whole) to the
        spool, hashing them.

        `frozen`: storage addresses of tensors no optimizer trains (`incremental.frozen_tensors`);
        those unchanged since the last committed save are referenced, not copied.

        `optimizers`: the tracked optimizers. Their parameters and state are not copied: a drain
        writes them from their own memory after this returns, and their `step()` waits until it
        has (`runtime/checkpoint/chunked.py`). The rest (or everything, without optimizers or after a torn
        snapshot) is copied before this returns: whole into a pool of buffers when it fits the
        budget and nothing is gated, else streamed through two buffers of at most half the
        budget to a spool file. Either way the buffers held never exceed the budget: a snapshot
        waits for the writer to give some back rather than allocate more."""
        self.beacon.set_snapshot(True)
        t0 = time.perf_counter()
        self.gate.wait()  # the previous snapshot's gated tensors are written: one gate at a time
        referenced: dict[tuple, Seen] = {}
        fresh: dict[tuple, Seen] = {}
        try:
            if frozen:
                state, referenced, fresh = self.incremental.split(state, frozen)
            layout, need = dense_layout(state)
            budget = self.budget()
            data: tuple[str, Drain] | None = None
            pool: _BufferPool | None = None
            gated = (
                Gated(optimizers, cuda=torch.cuda.is_available())
                if optimizers and not self.blocking
                else None
            )
            if gated is not None and need <= budget and (not self.stream or fresh):
                # within the budget, and streaming not wanted or frozen tensors to store as blobs
                # (tensors.bin would hold their bytes a second time): the whole-state copy
                gated = None
            if need <= budget and gated is None:
                pool = self._take_pool(layout, need, budget)
                try:
                    copied = pool.copy(state)
                    pool.layout = layout
                except BaseException:
                    pool.clear()
                    self._give_back(pool)
                    raise
                self.peak_bytes = max(self.peak_bytes, self.held_bytes)
            else:
                copied, data = self._snapshot_chunked(state, budget, gated)
            if pool is not None and torch.cuda.is_available():
                torch.cuda.synchronize()  # the pool's non-blocking copies (a gated snapshot's
                # device-to-host copies run on a side stream the optimizer gate waits for)
            spooled: list[tuple[str, str]] = []
            dests: dict[str, str] = {}
            hashes: dict[str, tuple[str, int]] = {}
            for src, name in files or []:
                local = os.path.join(self.spool, f"user-{uuid.uuid4().hex[:8]}")
                hashes[name] = copy_hashing(src, local)  # the upload then knows if the store has it
                spooled.append((local, name))
                dests[name] = src
        finally:
            self.beacon.set_snapshot(False)
        dt = time.perf_counter() - t0
        snap = Snapshot(
            copied, step, kind, dt, need, spooled, dests, hashes, dict(dirs or {}), data, referenced, fresh
        )
        if pool is not None:
            snap._pool = pool  # type: ignore[attr-defined]
        self.snapshot_ema, self.snapshot_var = ewm(self.snapshot_ema, self.snapshot_var, dt)
        self._snapshots += 1
        return snap

    def pending_bytes(self, state: Any, frozen: set[int] | None = None) -> tuple[int, int]:
        """(bytes a save of `state` now would write, bytes it would reference): what decides
        whether an emergency save fits a notice. Copies nothing."""
        referenced: dict[tuple, Seen] = {}
        if frozen:
            state, referenced, _ = self.incremental.split(state, frozen)
        _, need = dense_layout(state)
        return need, sum(seen.ref().nbytes for seen in referenced.values())

    def adopt(self, state: Any, frozen: set[int]) -> int:
        """Call after loading a restored state into the live objects: its unchanged frozen
        tensors are then referenced by the next save, as if this process had saved them
        (`Incremental.adopt`). The bytes adopted."""
        return self.incremental.adopt(state, frozen)

    def _take_pool(self, layout: tuple[Any, ...], need: int, budget: int) -> _BufferPool:
        """A pool for a state of `need` bytes, made room for within the budget: an idle one
        (one whose buffers already fit this state first), the queued save's, or a new one;
        idle buffers are freed, or the writer waited for, until the budget allows it."""
        with self._cv:
            while True:
                idle = [p for p in self._pools if not p.in_use]
                pool = next((p for p in idle if p.layout == layout), idle[0] if idle else None)
                if pool is None and self._pending is not None and "_pool" in self._pending.__dict__:
                    # one save uploading, one queued behind it: this snapshot supersedes the queued
                    # one at submit anyway, so it takes its buffers now rather than a third copy
                    # of the state (fresh memory costs page faults on the training thread)
                    superseded, self._pending = self._pending, None
                    pool = superseded.__dict__.pop("_pool")
                    pool.in_use = False  # this snapshot's now, or idle if it must wait below
                    self._discard(superseded)
                if pool is None:
                    pool = _BufferPool()
                if pool.layout != layout:
                    pool.clear()
                others = self.held_bytes - (pool.nbytes if pool in self._pools else 0)
                if others + need > budget:  # free what no save is using, then look again
                    others -= self._free_idle(keep=pool)
                if others + need <= budget:
                    pool.in_use = True
                    if pool not in self._pools:
                        self._pools.append(pool)
                    return pool
                self._wait_for_buffers()

    def _snapshot_chunked(
        self, state: Any, budget: int, gated: Gated | None
    ) -> tuple[Any, tuple[str, Drain]]:
        """Stream the state through two buffers of at most half the budget to a spool file, the
        `gated` tensors left for the drain to write in place: the skeleton, and (the file, its
        drain)."""
        chunk = budget // 2 // ALIGN * ALIGN
        if gated is not None:  # buffers for what is copied, not for the gated tensors
            copied, kept = split_bytes(state, gated)
            chunk = min(chunk, max(copied, 1024 * ALIGN) // ALIGN * ALIGN + ALIGN)
            if gated.cuda and kept + 2 * chunk > budget:  # no room for host copies of the GPU's
                gated = Gated(gated.optimizers, cuda=False)
                chunk = budget // 2 // ALIGN * ALIGN
        if gated is None or not gated.cuda:
            self._stage.clear()
        if chunk < ALIGN:
            raise ValueError(
                f"Config.snapshot_memory is {budget} bytes, too little to hold two {ALIGN}-byte "
                f"chunks: raise it (a few MB at least, e.g. snapshot_memory='64MB')"
            )
        with self._cv:
            if self._pending is not None and "_pool" in self._pending.__dict__:
                superseded, self._pending = self._pending, None  # superseded at submit anyway
                self._discard(superseded)
            while True:
                self._free_idle(keep=None)
                chunks = self._chunks
                if chunks is not None and not chunks.in_use and chunks.chunk != chunk:
                    self._chunks = chunks = None
                if chunks is None and self.held_bytes + 2 * chunk <= budget:
                    self._chunks = chunks = ChunkBuffers(chunk, pin=torch.cuda.is_available())
                if chunks is not None and not chunks.in_use:
                    chunks.in_use = True
                    break
                self._wait_for_buffers()
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        path = os.path.join(self.spool, f"data-{uuid.uuid4().hex[:8]}.bin")
        released = waiting = None
        if gated is not None and gated.optimizers:
            self.gate.hook(gated.optimizers)
            released = self.gate.close()
            waiting = self.gate.waiting
        drain = Drain(
            path,
            chunks,
            on_done=lambda: self._give_back(chunks),
            released=released,
            on_torn=self._torn,
            waiting=waiting,
        )
        try:
            skeleton = copy_chunked(state, drain, _plain_copy, gated, self._stage_cuda)
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        except BaseException:
            try:
                drain.result()
            except BaseException:  # noqa: BLE001 - the copy's own error is the one to report
                pass
            if os.path.exists(path):
                os.unlink(path)
            raise
        return skeleton, (path, drain)

    def _gate_waited(self, seconds: float) -> None:
        """`step()` waited for a gated snapshot: that is part of the save's δ too (the EWMA is
        linear in each sample, so adding to the last sample adds α·seconds to the mean)."""
        self.snapshot_ema += seconds if self._snapshots == 1 else 0.3 * seconds

    def _stage_cuda(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
        """Host copies of gated CUDA tensors on the side stream; the gate's event is theirs."""
        hosts, event = self._stage.stage(tensors)
        self.gate.event = event
        return hosts, event

    def _torn(self, reason: str) -> None:
        """A gated tensor changed under the drain (called from it): later snapshots copy
        everything before the step goes on; the save itself fails with `TornSnapshot`."""
        if not self.blocking:
            log.warning("checkpoint: %s", reason)
            self.emit(ev.JobWarning(message=f"checkpoint: {reason}"))
        self.blocking = reason

    def _free_idle(self, keep: _BufferPool | None) -> int:
        """Free every idle buffer (pools and chunk buffers) but `keep`'s; the bytes freed."""
        freed = 0
        for p in self._pools:
            if p is not keep and not p.in_use:
                freed += p.nbytes
                p.clear()
        self._pools = [p for p in self._pools if p is keep or p.in_use or p.buffers]
        if self._chunks is not None and not self._chunks.in_use:
            freed += self._chunks.nbytes
            self._chunks = None
        return freed

    def _wait_for_buffers(self) -> None:
        """Wait (holding `_cv`) until the writer gives buffers back; refuse to wait for ones no
        save will give back (snapshots taken but never submitted)."""
        draining = self._chunks is not None and self._chunks.in_use
        if not (self._busy or self._pending is not None or draining):
            raise RuntimeError(
                f"snapshot buffers ({human_bytes(self.held_bytes)}) are all held by snapshots "
                f"not submitted, and Config.snapshot_memory ({human_bytes(self.budget())}) allows "
                "no more: submit or save them first"
            )
        self._cv.wait(1.0)  # woken by _give_back; the timeout only re-checks the above

    def _give_back(self, holder: _BufferPool | ChunkBuffers) -> None:
        with self._cv:
            holder.in_use = False
            self._cv.notify_all()

    # -- phase 2 + 3 ---------------------------------------------------------------------
    def submit(self, snap: Snapshot) -> None:
        """Queue for background upload. A newer snapshot replaces one not started yet."""
        with self._cv:
            if self._pending is not None:
                self._discard(self._pending)
            self._pending = snap
            self._cv.notify_all()

    def save_now(self, snap: Snapshot) -> Manifest:
        """Upload in the caller's thread (emergency): abandon what the worker is doing first."""
        with self._cv:
            if self._pending is not None:
                self._release(self._pending)
                remove_spooled(self._pending)
                self._pending = None
            if self._busy:
                self._cancel.set()
            while self._busy:
                self._cv.wait()
            self._cancel.clear()
            self._busy = True
        try:
            return self._write(snap)
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is pending or in flight."""
        deadline = None if timeout is None else time.time() + timeout
        with self._cv:
            while self._pending is not None or self._busy:
                left = None if deadline is None else deadline - time.time()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    @property
    def idle(self) -> bool:
        return self._pending is None and not self._busy

    def close(self) -> None:
        self.gate.unhook()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        shutil.rmtree(self.spool, ignore_errors=True)

    def _discard(self, snap: Snapshot) -> None:
        """A queued snapshot a newer one supersedes: its buffers back, its spooled files gone,
        and the event that says so."""
        self._release(snap)
        remove_spooled(snap)
        self.emit(
            ev.CheckpointSkipped(
                step=snap.step,
                save_kind=snap.kind,
                reason="superseded by a newer snapshot before its upload began",
            )
        )

    def _release(self, snap: Snapshot) -> None:
        """Give the snapshot's buffers back, exactly once: a second release could free a pool
        that a newer snapshot has taken meanwhile and let a third one overwrite it mid-save."""
        pool = snap.__dict__.pop("_pool", None)
        if pool is not None:
            self._give_back(pool)

    def _work(self) -> None:
        # Background saves must not slow training: on Linux a thread has its own nice value, so
        # the writer yields the cores to the training threads whenever both want them.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                snap, self._pending = self._pending, None
                assert snap is not None  # the loop above waits for one
                self._busy = True
            try:
                self._write(snap)
            except SaveCancelled:
                self.emit(
                    ev.CheckpointSkipped(
                        step=snap.step, save_kind=snap.kind, reason="abandoned for an emergency checkpoint"
                    )
                )
            except Exception as exc:  # noqa: BLE001 - a failed save must not stop training
                self.failures += 1
                self.emit(ev.CheckpointFailed(step=snap.step, save_kind=snap.kind, error=repr(exc)))
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _cancelled(self) -> bool:
        """Whether the upload in progress is to be abandoned: the worker's, when an emergency
        save (`save_now`) wants the store (a sharded save's uploads are never cancelled)."""
        return self._cancel.is_set() and threading.current_thread() is self._worker

    def _next_seq(self) -> int:
        """A number no checkpoint folder has: another incarnation may have committed one (an
        emergency save during this one's start) since this checkpointer was made."""
        existing = self.catalog.seqs()
        with self._cv:
            self._seq = max(self._seq, *existing, 0) + 1
            return self._seq

    def _write(self, snap: Snapshot) -> Manifest:
        """Commit `snap` (`Uploader.write`), then what a commit means here: the estimates the
        policy reads (δ, β, bandwidth, sizes), the `checkpoint` event, and pruning."""
        manifest = self.uploader.write(snap, self._next_seq(), self._release)
        upload_s, total = manifest.upload_s, manifest.nbytes
        self.upload_ema, self.upload_var = ewm(self.upload_ema, self.upload_var, upload_s)
        if total >= BANDWIDTH_MIN and upload_s > 0:  # smaller ones measure latency, not bandwidth
            self.bandwidth = ewm(self.bandwidth, 0.0, total / upload_s)[0]
        self.last_bytes, self.last_written = total + manifest.referenced, total
        self.committed.append(manifest)
        self.emit(
            ev.Checkpoint(
                seq=manifest.seq,
                save_kind=snap.kind,
                step=snap.step,
                snapshot_s=snap.snapshot_s,
                upload_s=upload_s,
                nbytes=total,
                referenced_bytes=manifest.referenced,
            )
        )
        # COMMIT lasts until the checkpoint is announced, so the local market can land a kill
        # between a commit and the news of it
        self.beacon.set_phase(Phase.IDLE)
        self._prune(manifest)
        return manifest

    # -- the collaborators, as sharded saves (`sharded.py`) and readers (`spotnb.weights`,
    # -- `runtime/group/torchrun.py`) use them through this checkpointer --------------------
    def _upload(self, local: str, dest: str, known: dict[str, Any] | None = None) -> dict[str, Any]:
        """`Uploader.upload`: a spooled file copied into the write store; its manifest entry."""
        return self.uploader.upload(local, dest, known)

    def _prune(self, newest: Manifest) -> None:
        """`Pruner.prune`, after `newest` was committed."""
        self.pruner.prune(newest)

    def _scan(self) -> list[tuple[int, Found, Store]]:
        """`Catalog.scan`: every checkpoint folder of every store, newest first."""
        return self.catalog.scan()

    def list_manifests(self, strict: bool = False) -> list[Manifest]:
        """Committed checkpoints (a well-formed manifest present), newest first. With `strict`,
        a manifest that exists but cannot be read (a transient store error, not a bad shape)
        raises instead of being skipped."""
        return self.catalog.list_manifests(strict)

    # -- restore -------------------------------------------------------------------------
    def load_latest(self) -> tuple[Manifest, Any] | None:
        """The newest checkpoint whose manifest is well formed and whose files all verify, and
        its state; None if there is none. Every checkpoint passed over is reported as a
        `checkpoint_invalid` event saying why. With several stores, a checkpoint whose copy in
        one fails is taken from its copy in the next before an older one is tried."""
        return self.restorer.load_latest()

    def _load(
        self, manifest: Manifest, store: Store | None = None, files: dict[str, str] | None = None
    ) -> Any | None:
        """`Restorer.load`: the state of `manifest` once every file it lists verified, or None."""
        return self.restorer.load(manifest, store, files)

    def _fetch_verified(self, path: str, meta: dict[str, Any], store: Store | None = None) -> str:
        """`Restorer.fetch_verified`: `path` copied to the spool and verified; the copy's path."""
        return self.restorer.fetch_verified(path, meta, store)
