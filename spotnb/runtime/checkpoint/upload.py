"""Phases 2 and 3 of a save: a snapshot's files written, uploaded and committed.

`Uploader.write` serialises a snapshot (the copy phase 1 took, `checkpointer.py`) to the spool,
hashing as it writes, uploads every file in chunks (cancellable by an emergency save, throttled
when asked), stores backed-up files and unchanged tensors by content (`<root>/blobs/<sha256>`,
uploaded once), and writes `MANIFEST.json` last: a checkpoint exists only once its manifest
does. What happens once it is committed (the estimates, the event, pruning) is the
checkpointer's; the uploader only turns one snapshot into one committed checkpoint, or raises
and leaves nothing that looks committed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, cast

import cloudpickle
import torch

from spotnb.core.protocol import SaveKind
from spotnb.core.store import Store
from spotnb.runtime.beacon import Beacon, Phase
from spotnb.runtime.checkpoint import digest
from spotnb.runtime.checkpoint.chunked import DATA_NAME, Drain, TensorRef
from spotnb.runtime.checkpoint.incremental import BlobRef, Incremental, Seen, map_tensors
from spotnb.runtime.checkpoint.manifest import BLOBS, CHUNK, Manifest, build

__all__ = ["Uploader", "Snapshot", "SaveCancelled", "copy_hashing", "remove_spooled"]


class SaveCancelled(Exception):
    """An upload was abandoned because a newer (emergency) checkpoint superseded it."""


@dataclass
class Snapshot:
    state: Any
    step: int
    kind: SaveKind
    snapshot_s: float
    nbytes: int
    files: list[tuple[str, str]] = field(default_factory=list)  # (spooled local copy, manifest name)
    dests: dict[str, str] = field(default_factory=dict)  # manifest name -> restore path
    hashes: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (sha256, size)
    dirs: dict[str, str] = field(default_factory=dict)  # manifest name prefix -> folder restored
    #: a chunked snapshot: (its tensors.bin in the spool, the drain writing it); `state` is then
    #: the skeleton that points into it
    data: tuple[str, Drain] | None = None
    #: tensors stored by content (runtime/checkpoint/incremental.py): unchanged ones, already `BlobRef`s in
    #: `state`, and changed ones, copied, which the writer turns into new blobs
    referenced: dict[tuple, Seen] = field(default_factory=dict)
    fresh: dict[tuple, Seen] = field(default_factory=dict)


def copy_hashing(src: str, dest: str) -> tuple[str, int]:
    """Copy `src` to `dest`; its sha256 and size, from the one read."""
    sha = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        while chunk := fin.read(CHUNK):
            sha.update(chunk)
            fout.write(chunk)
            size += len(chunk)
    return sha.hexdigest(), size


def remove_spooled(snap: Snapshot) -> None:
    """Delete a snapshot's spooled files (the script's, and a chunked snapshot's tensors)."""
    locals_ = [f for f, _ in snap.files] + ([snap.data[0]] if snap.data is not None else [])
    for local in locals_:
        if os.path.exists(local):
            os.unlink(local)


def _write_tensor_hashing(t: torch.Tensor, dest: str) -> str:
    """Write a copied (contiguous, CPU) tensor's bytes to `dest`; their sha256."""
    sha = hashlib.sha256()
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().data if t.nelement() else memoryview(b"")
    with open(dest, "wb") as out:
        for i in range(0, len(raw), CHUNK):
            part = raw[i : i + CHUNK]
            sha.update(part)
            out.write(part)
    return sha.hexdigest()


def _copy_slice_hashing(src: str, offset: int, nbytes: int, dest: str) -> str:
    """Copy `nbytes` of `src` from `offset` to `dest`; their sha256."""
    sha = hashlib.sha256()
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        fin.seek(offset)
        left = nbytes
        while left:
            chunk = fin.read(min(CHUNK, left))
            if not chunk:
                raise ValueError(f"{DATA_NAME} ends before a tensor at {offset} (+{nbytes})")
            sha.update(chunk)
            fout.write(chunk)
            left -= len(chunk)
    return sha.hexdigest()


class _HashingFile:
    """A write-only file that hashes what passes through (torch.save only calls write)."""

    def __init__(self, f: Any) -> None:
        self.f, self.size = f, 0
        self.algo, self.sha = digest.fresh()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()

    def digest(self) -> dict[str, Any]:
        return {"size": self.size, self.algo: self.sha.hexdigest()}


class Uploader:
    """Writes snapshots into the write store's checkpoint folder `root` and commits them.

    `damaged`: sha256 of blobs restore found damaged (shared with `restore.Restorer`): written
    again rather than reused, since they have the size a good copy would. `cancelled`: asked
    between chunks; True abandons the upload with `SaveCancelled` (an emergency save wants the
    store). `before_commit(step)` runs just before the manifest is written; raising aborts the
    commit."""

    def __init__(
        self,
        store: Store,
        root: str,
        spool: str,
        job_id: str,
        incarnation: int,
        beacon: Beacon,
        incremental: Incremental,
        damaged: set[str],
        cancelled: Callable[[], bool],
        key: bytes | None = None,
        upload_bps: float | None = None,
        before_commit: Callable[[int], None] | None = None,
    ) -> None:
        self.store, self.root, self.spool = store, root, spool
        self.job_id, self.incarnation = job_id, incarnation
        self.beacon, self.incremental = beacon, incremental
        self.damaged, self.cancelled = damaged, cancelled
        self.key, self.upload_bps, self.before_commit = key, upload_bps, before_commit

    def write(self, snap: Snapshot, seq: int, release: Callable[[Snapshot], None]) -> Manifest:
        """Commit `snap` as checkpoint `seq`: its manifest once `MANIFEST.json` is written.
        `release(snap)` gives its buffers back, as soon as they are serialised (and again, as a
        no-op, at the end); a failed save leaves no spooled file and no committed-looking
        folder, and sets the beacon back to idle (a committed one stays in COMMIT until the
        caller has announced it)."""
        folder = f"{self.root}/{seq:08d}"
        t0 = time.perf_counter()
        committed = False
        spool = os.path.join(self.spool, f"state-{seq}.pt")
        blobs: list[tuple[str, BlobRef]] = []
        written: dict[tuple, Seen] = {}
        try:
            self.beacon.set_phase(Phase.SAVE)
            state = snap.state
            if snap.fresh:  # changed candidates: each to its own spool file, hashed once
                state, blobs, written = self._spool_blobs(snap)
            with open(spool, "wb") as f:
                hashed = _HashingFile(f)
                # hashed as it is written: no second read. cloudpickle, as the function came: a
                # class or function defined in the notebook (or a shipped module) that the state
                # holds has no importable home here, and plain pickle refuses it
                torch.save(state, cast(IO[bytes], hashed), pickle_module=cloudpickle)
            release(snap)
            files: dict[str, dict[str, Any]] = {}
            self.beacon.set_phase(Phase.UPLOAD)
            if snap.referenced:
                files.update(self._referenced(snap.referenced))
            for local, ref in blobs:
                files[ref.name] = self.upload_blob(local, ref.sha256, ref.nbytes)
            files["state.pt"] = self.upload(spool, f"{folder}/state.pt", hashed.digest())
            if snap.data is not None:  # a chunked snapshot: its tensors, once the drain is done
                data, drain = snap.data
                files[DATA_NAME] = self.upload(data, f"{folder}/{DATA_NAME}", drain.result())
            for local, name in snap.files:
                files[name] = self.upload_blob(local, *snap.hashes[name])
                if os.path.exists(local):
                    os.unlink(local)
            upload_s = time.perf_counter() - t0
            manifest = build(
                seq=seq,
                step=snap.step,
                kind=snap.kind,
                files=files,
                incarnation=self.incarnation,
                created=time.time(),
                snapshot_s=snap.snapshot_s,
                upload_s=upload_s,
                dests=snap.dests,
                dirs=snap.dirs,
            )
            if self.before_commit is not None:
                # what the run logged up to this step becomes durable no later than the state:
                # a kill right after the commit must not leave a hole in the loss curve that
                # the resume (which starts after this step) would never fill
                self.before_commit(snap.step)
            self.beacon.set_phase(Phase.COMMIT)
            self.store.write_bytes(f"{folder}/MANIFEST.json", manifest.to_json(self.key, self.job_id))
            committed = True
            self.incremental.commit(snap.referenced, written)
        finally:
            for local, _ in blobs:
                if os.path.exists(local):
                    os.unlink(local)
            release(snap)
            if not committed:
                self.beacon.set_phase(Phase.IDLE)
            if os.path.exists(spool):
                os.unlink(spool)  # a failed save must not leave its copy in the spool
            if snap.data is not None:
                snap.data[1].wait()  # a failed save still ends with its chunk buffers given back
            remove_spooled(snap)
        return manifest

    def _spool_blobs(self, snap: Snapshot) -> tuple[Any, list[tuple[str, BlobRef]], dict[tuple, Seen]]:
        """The snapshot's state with every changed candidate replaced by its `BlobRef`, each
        written to a spool file and hashed on the way: (state, [(file, ref)], path -> the
        candidate with its blob, for the next save to reference once this one commits)."""
        data = None
        if snap.data is not None:  # chunked: the candidates' bytes are slices of tensors.bin
            data = snap.data[0]
            snap.data[1].result()
        blobs: list[tuple[str, BlobRef]] = []
        written: dict[tuple, Seen] = {}

        def leaf(path: tuple, obj: Any) -> Any:
            seen = snap.fresh.get(path)
            if seen is None or not isinstance(obj, (torch.Tensor, TensorRef)):
                return obj
            local = os.path.join(self.spool, f"blob-{uuid.uuid4().hex[:8]}")
            blobs.append((local, BlobRef("", 0, "", ())))  # listed first: removed even if this fails
            if isinstance(obj, TensorRef):
                assert data is not None
                sha = _copy_slice_hashing(data, obj.offset, obj.nbytes, local)
            else:
                sha = _write_tensor_hashing(obj, local)
            written[path] = dataclasses.replace(seen, sha256=sha)
            ref = written[path].ref()
            blobs[-1] = (local, ref)
            return ref

        return map_tensors(snap.state, leaf), blobs, written

    def _referenced(self, referenced: dict[tuple, Seen]) -> dict[str, dict[str, Any]]:
        """Manifest entries of the unchanged tensors a save references, after one listing of
        the blobs folder shows each is still there (one missing cannot be written from here:
        its bytes were not copied, so the save fails and the next one writes them again)."""
        have = set(self.store.ls(f"{self.root}/{BLOBS}"))
        out: dict[str, dict[str, Any]] = {}
        for seen in referenced.values():
            ref = seen.ref()
            if ref.sha256 not in have:
                self.incremental.forget()
                raise RuntimeError(
                    f"{BLOBS}/{ref.sha256[:12]}…, an unchanged tensor this save references, is no "
                    "longer in the store: save abandoned, the next one writes every tensor again"
                )
            out[ref.name] = {"size": ref.nbytes, "sha256": ref.sha256, "blob": True, "reused": True}
        return out

    def upload_blob(self, local: str, sha256: str, size: int) -> dict[str, Any]:
        """A backed-up file, stored by content: not uploaded again when the store has it (an
        earlier checkpoint's copy, checked by size; restore checks its hash)."""
        path = f"{self.root}/{BLOBS}/{sha256}"
        try:
            damaged = sha256 in self.damaged
            if not damaged and self.store.exists(path) and self.store.fs.size(path) == size:
                return {"size": size, "sha256": sha256, "blob": True, "reused": True}
        except OSError:
            pass  # cannot tell: upload it
        meta = self.upload(local, path, {"size": size, "sha256": sha256})
        self.damaged.discard(sha256)
        return {**meta, "blob": True}

    def upload(self, local: str, dest: str, known: dict[str, Any] | None = None) -> dict[str, Any]:
        """Copy a spooled file to the store in chunks, hashing as it goes (throttled if asked);
        its manifest entry (`known`: already hashed). On a local store a file already hashed is
        simply renamed into place when it can be."""
        if known is not None and self.store.local and not self.upload_bps:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            try:
                os.replace(local, dest)  # same filesystem: atomic, and no copy at all
                return known
            except OSError:
                pass  # another filesystem: copy below
        algo, hasher = digest.fresh()  # a file written by value (not a blob: those come `known`)
        start = time.perf_counter()
        target = f"{dest}.tmp-{uuid.uuid4().hex[:8]}" if self.store.local else dest
        if self.store.local:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            size = self._copy(local, target, known is None, hasher, start)
        except BaseException:
            if self.store.local and os.path.exists(target):
                os.unlink(target)  # a full disk or a cancel must not leave debris in the store
            raise
        if self.store.local:
            os.replace(target, dest)
        return known if known is not None else {"size": size, algo: hasher.hexdigest()}

    def _copy(self, local: str, target: str, hash_it: bool, hasher: Any, start: float) -> int:
        """Chunked, cancellable, throttled copy into the store; returns the bytes copied."""
        size = 0
        with open(local, "rb") as src, self.store.fs.open(target, "wb") as out:
            while True:
                if self.cancelled():
                    raise SaveCancelled()
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                if hash_it:
                    hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
                if self.upload_bps:
                    ahead = size / self.upload_bps - (time.perf_counter() - start)
                    if ahead > 0:
                        time.sleep(ahead)
        return size
