"""Sharded checkpoints in PyTorch's own format: `torch.distributed.checkpoint` (DCP).

A model sharded over processes (FSDP, or any state dict of `DTensor`s) is saved by every
process at once, each writing only its own shard, and loads into a *different* number of
processes: DCP's planner matches the saved chunks to the shards the loading processes ask
for, so a job that ran on 4 processes resumes on 1 and the reverse.

What spotnb adds is what DCP leaves to its caller, the same guarantees as `checkpoint.py`:

- **Commit last.** Every process uploads its files to `ckpt/<seq>/dcp/` and reports their
  digest (BLAKE3, `runtime/checkpoint/digest.py`) and size; process 0 gathers them and writes
  `MANIFEST.json` only once it has every process's entries (a process that dies mid-save
  fails the collective, and no manifest is written: the half-written folder is never
  restored and the next prune removes it).
- **Verified restore, falling back together.** Each process fetches the shard files it
  reads (below), checks them against the manifest, and the processes agree (an all-reduce)
  before DCP reads any of them; a checkpoint that fails anywhere is passed over by all, for
  the one before. A checkpoint that verifies but does not hold the tracked state fails the
  restore on every process, as `dcp.load` would (falling back would silently lose progress).
- **One folder layout.** A sharded checkpoint is a numbered folder like any other, so listing,
  pruning and `checkpoint_invalid` events are `Checkpointer`'s; its `state.pt` is a small
  marker (`{"format": "dcp"}`) so that a tool that only knows the one-file format sees what it
  is instead of a state dict.
- **Asynchronous saves.** The training thread's stall is the copy of its shard to host RAM
  (DCP's `DefaultStager`, buffers reused from save to save); DCP's write, the hash and the
  upload run in one background thread per process, whose collectives (DCP's plan and the
  gather of "my files are up") run on a gloo group of their own, never on the training
  group (gloo collectives of two threads on one group interleave and deadlock). A new save
  waits for the previous one to finish (see `save_async`); a shard larger than the snapshot
  budget is written from the live state while the step waits (no copy).
- **Restore fetches what the rank reads.** Each process fetches DCP's `.metadata` first,
  plans its load with DCP's planner, and fetches (and verifies) only the files its read
  items live in: its own shard on the same world size, the overlapping ones after a
  reshard. Small entries (bytes, scalars: the step, RNG, Adam's step) go to a second,
  small file per process (`_SplitWriter`), so a process that needs one of another's small
  entries does not download that process's whole shard.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from spotnb.core import protocol as ev
from spotnb.core.protocol import SaveKind
from spotnb.runtime.checkpoint.checkpointer import Checkpointer, ewm
from spotnb.runtime.checkpoint.manifest import Manifest

__all__ = ["ShardedCheckpointer", "SHARD_DIR", "MARKER", "is_sharded", "needed_files", "whole_state"]

log = logging.getLogger(__name__)

#: the folder of a checkpoint that holds DCP's files (`.metadata` and one `.distcp` per process)
SHARD_DIR = "dcp"
#: what a sharded checkpoint's `state.pt` holds
MARKER = {"format": "dcp", "dir": SHARD_DIR}
#: entries below this size go to a process's small file (`__<rank>_1.distcp`)
SMALL = 64 * 1024
#: how long the background group waits for a peer inside one collective. The gather of "my
#: files are up" waits for the slowest process's whole upload (25 GB at 20 MB/s: 21 min), so
#: this must exceed any upload; a peer that died closes its sockets and fails the collective
#: at once, and one that hangs is caught by the instance's group (`runtime/group/local.py`)
BACKGROUND_TIMEOUT = timedelta(hours=6)


def is_sharded(manifest: Manifest) -> bool:
    """Whether a committed checkpoint is a DCP one (its files include DCP's metadata)."""
    return f"{SHARD_DIR}/.metadata" in manifest.files


def _entry_size(item: Any) -> int:
    if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
        return 0
    n = item.tensor_data.properties.dtype.itemsize
    for dim in item.tensor_data.size:
        n *= dim
    return int(n)


class _SplitWriter(dcp.FileSystemWriter):
    """DCP's file writer, with a process's entries in two files: its tensors of `SMALL` bytes
    or more in `__<rank>_0.distcp`, the rest (bytes, scalars) in `__<rank>_1.distcp`. Which
    process writes a replicated entry is DCP's choice (the least loaded), so without the split
    a process that needs rank 0's pickled step would fetch rank 0's whole shard."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Any:
        prefix = plan.storage_data.prefix
        big = [i for i in plan.items if _entry_size(i) >= SMALL]
        small = [i for i in plan.items if _entry_size(i) < SMALL]
        files: queue.Queue = queue.Queue()
        for n, bucket in enumerate((big, small)):
            if bucket:
                name = f"{prefix}{n}.distcp"
                files.put((self.fs.concat_path(self.path, name), name, bucket))
        return self._write_data(planner, files)


def _local_bytes(state_dict: dict[str, Any]) -> int:
    """Bytes of this process's part of a state dict's tensors (a `DTensor`'s local shard)."""
    total = 0
    stack: list[Any] = [state_dict]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, torch.Tensor):
            local = obj.to_local() if hasattr(obj, "to_local") else obj
            total += local.numel() * local.element_size()
    return total


def needed_files(state_dict: dict[str, Any], metadata: Metadata) -> set[str]:
    """The files of a DCP checkpoint (names relative to its folder) that loading
    `state_dict` reads: DCP's own planner's read items, mapped through the metadata's storage
    index to the file each one lives in."""
    planner = DefaultLoadPlanner()
    planner.set_up_planner(state_dict, metadata, is_coordinator=False)
    plan = planner.create_local_plan()
    storage = metadata.storage_data
    return {storage[item.storage_index].relative_path for item in plan.items}


def whole_state(metadata: Metadata) -> dict[str, Any]:
    """A state dict that loads every entry of a DCP checkpoint whole, into one process: the
    nested state dict that was saved (DCP's `planner_data` maps each flattened key back to
    its path), a CPU tensor of each saved tensor's full size (shards put together) and a
    placeholder for each other value (DCP replaces it with the saved one)."""
    out: dict[str, Any] = {}
    paths = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    for key, meta in metadata.state_dict_metadata.items():
        value: Any = None
        if isinstance(meta, TensorStorageMetadata):
            value = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        path = tuple(paths.get(key) or (key,))
        node: Any = out
        for part, after in zip(path, path[1:], strict=False):  # the containers on the way (lists by index)
            child: Any = [] if isinstance(after, int) else {}
            if isinstance(node, list):
                node.extend([None] * (part + 1 - len(node)))
                node[part] = child if node[part] is None else node[part]
                node = node[part]
            else:
                node = node.setdefault(part, child)
        last = path[-1]
        if isinstance(node, list):
            node.extend([None] * (last + 1 - len(node)))
        node[last] = value
    return out


class ShardedCheckpointer:
    """Collective save and restore of a sharded state dict through a `Checkpointer`'s store.

    Every process of `group` (None: the default process group; without an initialised one, a
    single process) calls `save`/`save_async` and `load` together, with its own
    `Checkpointer` (same job, same store). Process 0 of the group commits and emits the
    events."""

    def __init__(self, ckpt: Checkpointer, group: Any = None) -> None:
        self.ckpt = ckpt
        self.group = group
        #: the last restore's fetched files on this process (name in the checkpoint folder →
        #: bytes), and their total: what this process downloaded
        self.fetched: dict[str, int] = {}
        self.fetched_bytes = 0
        #: the last save's stall (the copy to host RAM) on this process, in seconds
        self.stall_s = 0.0
        cuda = torch.cuda.is_available()  # pinned buffers and a non-blocking copy from GPUs
        self._stager = DefaultStager(StagingOptions(cuda, False, False, cuda))
        self._staged_bytes = 0  # what the stager's buffers hold (reused by the next save)
        self._bg_group: Any = None  # the background thread's own gloo group (made at a save)
        self._jobs: queue.Queue = queue.Queue()
        self._inflight: Future[Manifest | None] | None = None
        self._thread: threading.Thread | None = None

    # -- who we are ----------------------------------------------------------------------
    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group) if self.distributed else 0

    @property
    def world(self) -> int:
        return dist.get_world_size(self.group) if self.distributed else 1

    def _src(self, group: Any) -> int:
        return dist.get_global_rank(group, 0) if group is not None else 0

    def _broadcast(self, value: Any, group: Any = None) -> Any:
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self._src(group), group=group)
        return box[0]

    def _gather(self, value: Any, group: Any = None) -> list[Any]:
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value, group=group)
        return out

    def _all(self, ok: bool) -> bool:
        """True on every process when `ok` is true on every process."""
        if not self.distributed:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    # -- save ----------------------------------------------------------------------------
    def save(
        self, state_dict: dict[str, Any], step: int, kind: SaveKind = SaveKind.PERIODIC
    ) -> Manifest | None:
        """`save_async` and wait for it: the committed manifest on every process, or None
        when a process failed (nothing was committed; the error is reported by the process
        that had it). For saves the job leaves after (emergency, move)."""
        return self.save_async(state_dict, step, kind).result()

    def save_async(
        self, state_dict: dict[str, Any], step: int, kind: SaveKind = SaveKind.PERIODIC
    ) -> Future[Manifest | None]:
        """Copy this process's shard to host RAM (the training thread's only stall), then
        write, hash, upload and (process 0) commit in the background. The future holds the
        committed manifest, on every process, or None.

        A save while the previous one is still in the background waits for it first: the
        whole-state checkpointer supersedes a queued save, but here one process's background
        thread may already be inside the previous save's collectives while another's is not,
        so superseding would need the processes to agree on which save to drop (a collective
        on the training thread at every step); waiting keeps every process's background
        collectives in the same order and bounds host memory to one staged copy."""
        self.wait()
        ck = self.ckpt
        t0 = time.perf_counter()
        seq = self._broadcast(ck._next_seq() if self.rank == 0 else None, self.group)
        if self.distributed and self._bg_group is None:
            ranks = dist.get_process_group_ranks(self.group) if self.group is not None else None
            self._bg_group = dist.new_group(
                ranks=ranks, backend="gloo", timeout=BACKGROUND_TIMEOUT, use_local_synchronization=True
            )
        staged: dict[str, Any] | None = None
        error: Exception | None = None
        # a shard larger than the snapshot budget is not copied: written from the live state
        # while the training thread waits (`Config.snapshot_memory`, as for whole-state saves)
        need = _local_bytes(state_dict)
        budget = ck.budget()
        if ck.snapshot_memory is None:  # what is free: our staging buffers, already held, count
            budget += self._staged_bytes
        in_place = need > budget
        try:
            staged = state_dict if in_place else self._stager.stage(state_dict)  # type: ignore[assignment]
            if not in_place:
                self._staged_bytes = need
        except Exception as exc:  # noqa: BLE001 - the background job says so, collectively
            error = exc
        done: Future[Manifest | None] = Future()
        self._inflight = done
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="spotnb-sharded-save", daemon=True)
            self._thread.start()
        self.stall_s = time.perf_counter() - t0
        self._jobs.put((self.rank, seq, step, kind, staged, error, self.stall_s, t0, done))
        if in_place:
            log.info("sharded save of step %d: the shard exceeds the snapshot budget, saved in place", step)
            done.result()
            self.stall_s = time.perf_counter() - t0
        return done

    def wait(self, timeout: float | None = None) -> Manifest | None:
        """Wait for the save in the background, if any; its manifest (None: none, or not
        committed)."""
        inflight = self._inflight
        if inflight is None:
            return None
        manifest = inflight.result(timeout)
        self._inflight = None
        return manifest

    @property
    def busy(self) -> bool:
        """Whether a save is still in the background."""
        return self._inflight is not None and not self._inflight.done()

    def _work(self) -> None:
        while True:
            rank, seq, step, kind, staged, error, stall_s, t0, done = self._jobs.get()
            manifest: Manifest | None = None
            try:
                manifest = self._write_and_commit(rank, seq, step, kind, staged, error, stall_s, t0)
            except BaseException as exc:  # noqa: BLE001 - a lost peer: no commit, training goes on
                log.warning("sharded save of step %d abandoned on process %d: %r", step, rank, exc)
                try:
                    self.ckpt.emit(
                        ev.CheckpointFailed(step=step, save_kind=kind, error=f"process {rank}: {exc!r}")
                    )
                except Exception:  # noqa: BLE001 - the future must resolve whatever happens
                    log.exception("could not report the failed save of step %d", step)
            finally:
                done.set_result(manifest)  # a waiting training thread always wakes

    def _write_and_commit(
        self,
        rank: int,
        seq: int,
        step: int,
        kind: SaveKind,
        staged: dict[str, Any] | None,
        error: Exception | None,
        stall_s: float,
        t0: float,
    ) -> Manifest | None:
        """The background part of one save, on every process; collectives on `_bg_group`."""
        ck = self.ckpt
        group = self._bg_group
        folder = f"{ck.root}/{seq:08d}"
        local = tempfile.mkdtemp(prefix=f"dcp-{seq}-", dir=ck.spool)
        entries: dict[str, dict[str, Any]] | None = None
        try:
            # a process whose staging failed still joins DCP's collectives, with nothing
            dcp.save(
                staged if staged is not None else {},
                storage_writer=_SplitWriter(local, sync_files=False),
                process_group=group,
            )
            if error is not None:
                raise error
            uploaded: dict[str, dict[str, Any]] = {}
            for name in sorted(os.listdir(local)):
                path = os.path.join(local, name)
                if os.path.isfile(path):
                    uploaded[f"{SHARD_DIR}/{name}"] = ck._upload(path, f"{folder}/{SHARD_DIR}/{name}")
            entries = uploaded
        except Exception as exc:  # noqa: BLE001 - the others must learn of it: no commit
            log.warning("sharded save of step %d failed on process %d: %r", step, rank, exc)
            ck.emit(ev.CheckpointFailed(step=step, save_kind=kind, error=f"process {rank}: {exc!r}"))
        finally:
            shutil.rmtree(local, ignore_errors=True)
        everyone = self._gather(entries, group)
        manifest: Manifest | None = None
        if all(e is not None for e in everyone) and rank == 0:
            files: dict[str, dict[str, Any]] = {}
            for part in everyone:
                files.update(part)
            manifest = self._commit(seq, step, kind, files, stall_s, time.perf_counter() - t0)
        return self._broadcast(manifest, group)

    def _commit(
        self,
        seq: int,
        step: int,
        kind: SaveKind,
        files: dict[str, dict[str, Any]],
        snapshot_s: float,
        upload_s: float,
    ) -> Manifest | None:
        ck = self.ckpt
        folder = f"{ck.root}/{seq:08d}"
        marker = io.BytesIO()
        torch.save(dict(MARKER), marker)
        spooled = os.path.join(ck.spool, f"marker-{seq}.pt")
        with open(spooled, "wb") as f:
            f.write(marker.getvalue())
        try:
            files["state.pt"] = ck._upload(spooled, f"{folder}/state.pt")
        finally:
            if os.path.exists(spooled):
                os.unlink(spooled)
        manifest = Manifest(
            seq=seq,
            step=step,
            kind=kind,
            files=files,
            incarnation=ck.incarnation,
            created=time.time(),
            snapshot_s=snapshot_s,
            upload_s=upload_s,
            nbytes=sum(meta["size"] for meta in files.values()),
        )
        try:
            if ck.before_commit is not None:
                ck.before_commit(step)
            ck.store.write_bytes(f"{folder}/MANIFEST.json", manifest.to_json(ck.key, ck.job_id))
        except Exception as exc:  # noqa: BLE001 - not committed: say so, keep the older ones
            ck.emit(ev.CheckpointFailed(step=step, save_kind=kind, error=f"commit: {exc!r}"))
            return None
        # the policy's δ and β (`Observation`): rank 0's write and upload, the whole size
        ck.snapshot_ema, ck.snapshot_var = ewm(ck.snapshot_ema, ck.snapshot_var, snapshot_s)
        ck.upload_ema, ck.upload_var = ewm(ck.upload_ema, ck.upload_var, max(0.0, upload_s - snapshot_s))
        ck.last_bytes = ck.last_written = manifest.nbytes
        ck.committed.append(manifest)
        ck.emit(
            ev.Checkpoint(
                seq=seq,
                save_kind=kind,
                step=step,
                snapshot_s=snapshot_s,
                upload_s=upload_s,
                nbytes=manifest.nbytes,
            )
        )
        ck._prune(manifest)
        return manifest

    # -- restore -------------------------------------------------------------------------
    def load(self, state_dict: dict[str, Any]) -> Manifest | None:
        """Load the newest sharded checkpoint that verifies on every process into
        `state_dict` (in place, resharded to this group's layout); None when there is none.
        Every process returns the same manifest."""
        found = self.load_with(lambda _keys: state_dict)
        return found[0] if found is not None else None

    def load_with(
        self,
        prepare: Callable[[Collection[str]], dict[str, Any]] | None,
        manifests: Sequence[Manifest] | None = None,
    ) -> tuple[Manifest, dict[str, Any]] | None:
        """`load`, with the state dict to load into made by `prepare(keys)` once the
        checkpoint's metadata is read (`keys`: the (flattened) keys it holds, e.g. per-process
        entries that exist only for the processes that wrote it). Returns the manifest and
        the loaded state dict. Each process fetches only the files its load reads.

        `prepare=None`: every entry as it was saved, whole (`whole_state`: a reader in one
        process, `spotnb.weights`). `manifests`: the candidates, newest first (default: every
        committed sharded checkpoint)."""
        self.wait()  # a save of this process still in the background is not a candidate yet
        ck = self.ckpt
        candidates: list[Manifest]
        if manifests is not None:
            candidates = [m for m in manifests if is_sharded(m)]
        else:
            mine = [m for m in ck.list_manifests() if is_sharded(m)] if self.rank == 0 else None
            candidates = self._broadcast(mine, self.group)
        self.fetched, self.fetched_bytes = {}, 0
        for manifest in candidates:
            local = tempfile.mkdtemp(prefix=f"restore-{manifest.seq}-", dir=ck.spool)
            fetched: dict[str, int] = {}
            try:
                reason = self._fetch(manifest, local, {".metadata"}, fetched)
                state_dict: dict[str, Any] = {}
                if self._all(reason is None):  # every process can plan: prepare may be collective
                    metadata = dcp.FileSystemReader(local).read_metadata()
                    if prepare is None:
                        state_dict = whole_state(metadata)
                    else:
                        state_dict = prepare(set(metadata.state_dict_metadata))
                    needed: set[str] = set()
                    unfit: str | None = None
                    try:
                        needed = needed_files(state_dict, metadata)
                    except Exception as exc:  # noqa: BLE001 - raised below, on every process
                        unfit = f"checkpoint {manifest.seq:08d} does not fit the tracked state: {exc}"
                    if not self._all(unfit is None):
                        # not damage (its files verified): a state the checkpoint does not hold,
                        # as `dcp.load` would raise; falling back would silently restart older
                        raise RuntimeError(
                            unfit or f"checkpoint {manifest.seq:08d}: another process cannot load it"
                        )
                    reason = self._fetch(manifest, local, needed, fetched)
                    if self._all(reason is None):
                        dcp.load(
                            state_dict,
                            storage_reader=dcp.FileSystemReader(local),
                            process_group=self.group if self.distributed else None,
                        )
                        self.fetched, self.fetched_bytes = fetched, sum(fetched.values())
                        log.info(
                            "restored checkpoint %d on process %d: fetched %d of its files, %d bytes",
                            manifest.seq,
                            self.rank,
                            len(fetched),
                            self.fetched_bytes,
                        )
                        return manifest, state_dict
                if reason is not None:  # the process that saw the damage says what it was
                    ck.emit(ev.CheckpointInvalid(seq=manifest.seq, step=manifest.step, reason=reason))
            finally:
                shutil.rmtree(local, ignore_errors=True)
        return None

    def _fetch(
        self, manifest: Manifest, local: str, names: Collection[str], fetched: dict[str, int]
    ) -> str | None:
        """Fetch and verify the checkpoint's DCP files `names` (relative to its DCP folder)
        into `local`, adding each to `fetched`; the reason it cannot be used, or None."""
        ck = self.ckpt
        folder = f"{ck.root}/{manifest.seq:08d}"
        try:
            for name in sorted(names):
                key = f"{SHARD_DIR}/{name}"
                meta = manifest.files.get(key)
                if meta is None or "/" in name or name.startswith(".."):
                    raise ValueError(f"{key} is not among the checkpoint's files")
                path = ck._fetch_verified(f"{folder}/{key}", meta)
                os.replace(path, os.path.join(local, name))
                fetched[key] = int(meta["size"])
        except Exception as exc:  # noqa: BLE001 - any damage: the previous checkpoint
            return f"checkpoint {manifest.seq:08d}: {exc}"
        return None
