"""Sharded checkpoints in PyTorch's own format: `torch.distributed.checkpoint` (DCP).

A model sharded over processes (FSDP, or any state dict of `DTensor`s) is saved by every
process at once, each writing only its own shard, and loads into a *different* number of
processes: DCP's planner matches the saved chunks to the shards the loading processes ask
for, so a job that ran on 4 processes resumes on 1 and the reverse.

What spotnb adds is what DCP leaves to its caller, the same guarantees as `checkpoint.py`:

- **Commit last.** Every process uploads its files to `ckpt/<seq>/dcp/` and reports their
  sha256 and size; process 0 gathers them and writes `MANIFEST.json` only once it has every
  process's entries (a process that dies mid-save fails the collective, and no manifest is
  written: the half-written folder is never restored and the next prune removes it).
- **Verified restore, falling back together.** Each process fetches the shard files, checks
  them against the manifest, and the processes agree (an all-reduce) before DCP reads any of
  them; a checkpoint that fails anywhere is passed over by all, for the one before.
- **One folder layout.** A sharded checkpoint is a numbered folder like any other, so listing,
  pruning and `checkpoint_invalid` events are `Checkpointer`'s; its `state.pt` is a small
  marker (`{"format": "dcp"}`) so that a tool that only knows the one-file format sees what it
  is instead of a state dict.

Limits of this version: the save is synchronous (the training step waits for its shard's
write and upload), and on restore every process fetches every shard file (each file is
verified whole before DCP reads parts of it), so restore moves `processes × size` bytes.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from spotnb import protocol as ev
from spotnb.protocol import SaveKind
from spotnb.runtime.checkpoint import Checkpointer, Manifest, _ewm

__all__ = ["ShardedCheckpointer", "SHARD_DIR", "MARKER", "is_sharded"]

log = logging.getLogger(__name__)

#: the folder of a checkpoint that holds DCP's files (`.metadata` and one `.distcp` per process)
SHARD_DIR = "dcp"
#: what a sharded checkpoint's `state.pt` holds
MARKER = {"format": "dcp", "dir": SHARD_DIR}


def is_sharded(manifest: Manifest) -> bool:
    """Whether a committed checkpoint is a DCP one (its files include DCP's metadata)."""
    return f"{SHARD_DIR}/.metadata" in manifest.files


class ShardedCheckpointer:
    """Collective save and restore of a sharded state dict through a `Checkpointer`'s store.

    Every process of `group` (None: the default process group; without an initialised one, a
    single process) calls `save` and `load` together, with its own `Checkpointer` (same job,
    same store). Process 0 of the group commits and emits the events."""

    def __init__(self, ckpt: Checkpointer, group: Any = None) -> None:
        self.ckpt = ckpt
        self.group = group

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

    def _broadcast(self, value: Any) -> Any:
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(
            box, src=dist.get_global_rank(self.group, 0) if self.group is not None else 0, group=self.group
        )
        return box[0]

    def _gather(self, value: Any) -> list[Any]:
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value, group=self.group)
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
        """Write this process's shard, upload it, and (process 0) commit once every process
        has uploaded. Returns the committed manifest on every process; None when a process
        failed (nothing was committed; the error is reported by the process that had it)."""
        ck = self.ckpt
        seq = self._broadcast(ck._next_seq() if self.rank == 0 else None)
        folder = f"{ck.root}/{seq:08d}"
        local = tempfile.mkdtemp(prefix=f"dcp-{seq}-", dir=ck.spool)
        t0 = time.perf_counter()
        entries: dict[str, dict[str, Any]] | None = None
        try:
            uploaded: dict[str, dict[str, Any]] = {}
            writer = dcp.FileSystemWriter(local, sync_files=False)
            dcp.save(
                state_dict, storage_writer=writer, process_group=self.group if self.distributed else None
            )
            snapshot_s = time.perf_counter() - t0
            for name in sorted(os.listdir(local)):
                path = os.path.join(local, name)
                if os.path.isfile(path):
                    uploaded[f"{SHARD_DIR}/{name}"] = ck._upload(path, f"{folder}/{SHARD_DIR}/{name}")
            entries = uploaded
        except Exception as exc:  # noqa: BLE001 - the others must learn of it: no commit
            log.warning("sharded save of step %d failed on process %d: %r", step, self.rank, exc)
            ck.emit(ev.CheckpointFailed(step=step, save_kind=kind, error=f"process {self.rank}: {exc!r}"))
            snapshot_s = time.perf_counter() - t0
        finally:
            shutil.rmtree(local, ignore_errors=True)
        everyone = self._gather(entries)
        if any(e is None for e in everyone):
            return None
        files: dict[str, dict[str, Any]] = {}
        for part in everyone:
            files.update(part)
        manifest: Manifest | None = None
        if self.rank == 0:
            manifest = self._commit(seq, step, kind, files, snapshot_s, time.perf_counter() - t0)
        return self._broadcast(manifest)

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
        ck.snapshot_ema, ck.snapshot_var = _ewm(ck.snapshot_ema, ck.snapshot_var, snapshot_s)
        ck.upload_ema, ck.upload_var = _ewm(ck.upload_ema, ck.upload_var, max(0.0, upload_s - snapshot_s))
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
        self, prepare: Callable[[Collection[str]], dict[str, Any]]
    ) -> tuple[Manifest, dict[str, Any]] | None:
        """`load`, with the state dict to load into made by `prepare(keys)` once the
        checkpoint to load is chosen (`keys`: the (flattened) keys it holds, e.g. per-process
        entries that exist only for the processes that wrote it). Returns the manifest and
        the loaded state dict."""
        ck = self.ckpt
        candidates = [m for m in ck.list_manifests() if is_sharded(m)] if self.rank == 0 else None
        candidates = self._broadcast(candidates)
        for manifest in candidates:
            local = tempfile.mkdtemp(prefix=f"restore-{manifest.seq}-", dir=ck.spool)
            try:
                reason = self._fetch(manifest, local)
                if self._all(reason is None):
                    reader = dcp.FileSystemReader(local)
                    state_dict = prepare(set(reader.read_metadata().state_dict_metadata))
                    dcp.load(
                        state_dict,
                        storage_reader=dcp.FileSystemReader(local),
                        process_group=self.group if self.distributed else None,
                    )
                    return manifest, state_dict
                if reason is not None:  # the process that saw the damage says what it was
                    ck.emit(ev.CheckpointInvalid(seq=manifest.seq, step=manifest.step, reason=reason))
            finally:
                shutil.rmtree(local, ignore_errors=True)
        return None

    def _fetch(self, manifest: Manifest, local: str) -> str | None:
        """Fetch and verify the checkpoint's shard files into `local`; the reason it cannot
        be used, or None."""
        ck = self.ckpt
        folder = f"{ck.root}/{manifest.seq:08d}"
        try:
            for name, meta in manifest.files.items():
                if not name.startswith(f"{SHARD_DIR}/"):
                    continue
                fetched = ck._fetch_verified(f"{folder}/{name}", meta)
                os.replace(fetched, os.path.join(local, name[len(SHARD_DIR) + 1 :]))
        except Exception as exc:  # noqa: BLE001 - any damage: the previous checkpoint
            return f"checkpoint {manifest.seq:08d}: {exc}"
        return None
