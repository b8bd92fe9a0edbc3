"""Finding a job's checkpoints across its stores, and loading the newest one that verifies.

`Catalog` lists the numbered checkpoint folders of every store that may hold the job's
checkpoints (`Config.regional_stores`: the write store first), reading each folder's manifest:
a checkpoint copied to several stores is one checkpoint (one number). `Restorer` walks them
newest first (`manifest.newest_first`) and takes the first whose every file verifies against
its manifest (size and digest), falling back over damaged or partial ones with a
`checkpoint_invalid` event for each, and puts the backed-up files back where they came from.
Nothing here writes to a store.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spotnb.core import protocol as ev
from spotnb.core.store import Store
from spotnb.runtime.checkpoint import digest, moved
from spotnb.runtime.checkpoint.chunked import DATA_NAME, fill_refs
from spotnb.runtime.checkpoint.incremental import BlobRef, Incremental, fill_blobs
from spotnb.runtime.checkpoint.manifest import (
    BLOBS,
    CHUNK,
    Found,
    InvalidManifest,
    Manifest,
    check_copy,
    distinct,
    newest_first,
)

__all__ = ["Catalog", "Restorer"]


class Catalog:
    """The checkpoint folders of a job in its stores: `store` (the one written) first, then
    `read_stores` (others that may hold copies), each once. `key`: with one, only manifests
    this job signed are taken as committed."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        emit: Callable[..., Any],
        key: bytes | None = None,
        read_stores: Sequence[Store] = (),
    ) -> None:
        self.store, self.job_id, self.emit, self.key = store, job_id, emit, key
        #: every store that may hold this job's checkpoints, the one this checkpointer writes
        #: first (`Config.regional_stores`: the home store and the regions' stores). Restore
        #: takes the newest committed, verified checkpoint among them; a checkpoint copied to
        #: several is one checkpoint (one seq), its copies tried in this order
        self.stores = [store] + [s for s in read_stores if s.url != store.url]
        self.stores = [s for i, s in enumerate(self.stores) if s.url not in {t.url for t in self.stores[:i]}]
        self.root = self.root_of(store)
        self.unreachable: set[str] = set()  # stores whose listing failed (warned once)

    def root_of(self, store: Store) -> str:
        """The job's checkpoint folder in `store`."""
        return store.job(self.job_id, "ckpt")

    def seqs(self) -> list[int]:
        """Every checkpoint folder's number in every store: a number is one checkpoint across
        them (a copy keeps its number), so a new save must take one no store has."""
        out = [int(n) for n in self.store.ls(self.root) if n.isdigit()]
        for other in self.stores[1:]:
            try:
                out += [int(n) for n in other.ls(self.root_of(other)) if n.isdigit()]
            except OSError:
                pass  # a store out of reach now: its numbers are older than the write store's
        return out

    def scan(self) -> list[tuple[int, Found, Store]]:
        """Every checkpoint folder of every store, newest first (a number found in several
        stores: the write store's copy first, then in `stores` order), with its manifest, None
        when it has none (a partial upload or copy), or the exception that reading or
        checking it raised. A store other than the write store that cannot be listed now (a
        region's bucket out of reach) is left out of this scan, with a warning."""
        out: list[tuple[int, int, Found, Store]] = []
        for rank, store in enumerate(self.stores):
            try:
                found = self.scan_store(store)
            except OSError as exc:
                if store is self.store:
                    raise
                if store.url not in self.unreachable:  # once per store, not at every save
                    self.unreachable.add(store.url)
                    self.emit(
                        ev.JobWarning(message=f"checkpoints in {store.url} cannot be listed now: {exc!r}")
                    )
                continue
            self.unreachable.discard(store.url)
            out += [(seq, rank, manifest, store) for seq, manifest in found]
        # one number in two stores is one checkpoint's copies (same step), or two checkpoints
        # numbered while one store was out of reach (`seqs`): the one further on first
        return newest_first(out)

    def scan_store(self, store: Store) -> list[tuple[int, Found]]:
        """One store's checkpoint folders, highest number first, each with what its manifest
        gave (see `scan`); OSError when the store cannot be listed."""
        store.invalidate()
        root = self.root_of(store)
        out: list[tuple[int, Found]] = []
        for name in reversed(store.ls(root)):
            if not name.isdigit():
                continue
            try:
                raw = store.read_bytes(f"{root}/{name}/MANIFEST.json")
                found: Found = Manifest.parse(raw, name, self.key, self.job_id)
            except FileNotFoundError:
                found = None
            except (ValueError, OSError) as exc:  # InvalidManifest is a ValueError
                found = exc
            out.append((int(name), found))
        return out

    def list_manifests(self, strict: bool = False) -> list[Manifest]:
        """Committed checkpoints (a well-formed manifest present), newest first. With `strict`,
        a manifest that exists but cannot be read (a transient store error, not a bad shape)
        raises instead of being skipped."""
        scan = self.scan()
        for _, found, _ in scan:
            if strict and isinstance(found, Exception) and not isinstance(found, InvalidManifest):
                raise found
        return distinct(found for _, found, _ in scan)  # one entry per checkpoint, whatever its copies


def _restore_dir(folder: str, files: dict[str, str]) -> None:
    """Make `folder` hold exactly `files` (verified local copy -> path inside it): built beside
    it, then swapped in, so a kill leaves either the old folder or the restored one whole."""
    folder = os.path.abspath(folder)
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    fresh = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.restore-", dir=parent)
    for local, dest in files.items():
        rel = os.path.relpath(os.path.abspath(dest), folder)
        target = os.path.join(fresh, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(local, target)
    old = None
    if os.path.lexists(folder):
        old = f"{fresh}.old"
        os.replace(folder, old)
    os.replace(fresh, folder)
    if old is not None and os.path.isdir(old):
        shutil.rmtree(old, ignore_errors=True)
    elif old is not None:
        os.unlink(old)


def _put_back(manifest: Manifest, paths: dict[str, str]) -> None:
    """Copy a restored checkpoint's backed-up files (verified local copies: `paths`) to the
    paths they were backed up from, each backed-up folder made whole again."""
    in_dirs = {n for n in manifest.dests if any(n.startswith(p + "/") for p in manifest.dirs)}
    for name, dest in manifest.dests.items():
        if name not in in_dirs:
            os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
            shutil.copyfile(paths[name], dest)
    for prefix, folder_path in manifest.dirs.items():
        _restore_dir(
            folder_path, {paths[n]: manifest.dests[n] for n in in_dirs if n.startswith(prefix + "/")}
        )


class Restorer:
    """Loads checkpoints the `catalog` finds, fetching each file to the `spool` and verifying it.

    `damaged`: sha256 of the write store's blobs found damaged here (shared with
    `upload.Uploader`, which then writes them again instead of reusing them). `incremental`:
    told which restored tensors came from the write store's blobs, for the next save to
    reference (`Incremental.adopt`)."""

    def __init__(
        self,
        catalog: Catalog,
        spool: str,
        emit: Callable[..., Any],
        incremental: Incremental,
        damaged: set[str],
    ) -> None:
        self.catalog, self.spool, self.emit = catalog, spool, emit
        self.incremental, self.damaged = incremental, damaged
        #: the URL of the store the last `load_latest` restored from (None: nothing restored)
        self.restored_from: str | None = None

    def load_latest(self) -> tuple[Manifest, Any] | None:
        """The newest checkpoint whose manifest is well formed and whose files all verify, and
        its state; None if there is none. Every checkpoint passed over is reported as a
        `checkpoint_invalid` event saying why. With several stores, a checkpoint whose copy in
        one fails is taken from its copy in the next before an older one is tried."""
        several = len(self.catalog.stores) > 1
        for seq, manifest, store in self.catalog.scan():
            where = f" in {store.url}" if several else ""
            if manifest is None:
                continue
            if isinstance(manifest, Exception):
                self.emit(
                    ev.CheckpointInvalid(
                        seq=seq, step=None, reason=f"checkpoint {seq:08d}{where}: {manifest}"
                    )
                )
                continue
            found = self.load(manifest, store)
            if found is not None:
                self.restored_from = store.url
                return manifest, found
        return None

    def load(
        self, manifest: Manifest, store: Store | None = None, files: dict[str, str] | None = None
    ) -> Any | None:
        """The state of `manifest` once every file it lists verified (None, with a
        `checkpoint_invalid` event, when one does not), its backed-up files put back at their
        paths. With `files` (a reader outside the job: `spotnb.weights`) they are not put back:
        their verified copies stay in the spool, listed in `files` (manifest name -> local path)
        for the caller to use before the checkpointer closes."""
        store = store or self.catalog.store
        root = self.catalog.root_of(store)
        folder = f"{root}/{manifest.seq:08d}"
        paths: dict[str, str] = {}
        read: dict[tuple, tuple[BlobRef, torch.Tensor]] = {}  # tensors read from blobs: to adopt
        try:
            for name, meta in manifest.files.items():
                where = f"{root}/{BLOBS}/{meta['sha256']}" if meta.get("blob") else f"{folder}/{name}"
                try:
                    paths[name] = self.fetch_verified(where, meta, store)
                except ValueError:  # its bytes do not match its hash
                    if meta.get("blob") and store is self.catalog.store:
                        self.damaged.add(meta["sha256"])
                    raise
            state = torch.load(
                paths["state.pt"], map_location="cpu", weights_only=False, pickle_module=moved.pickle_module
            )
            if DATA_NAME in paths:  # written chunked: the skeleton's tensors are in tensors.bin
                state = fill_refs(state, paths[DATA_NAME])
            if any(name.startswith("tensors/") for name in paths):  # stored by content
                state = fill_blobs(state, paths, read)
            if files is not None:
                files.update({name: paths[name] for name in manifest.dests})
            else:
                _put_back(manifest, paths)
        except Exception as exc:  # noqa: BLE001 - any damage means: take the previous checkpoint
            reason = str(exc) if len(self.catalog.stores) == 1 else f"in {store.url}: {exc}"
            self.emit(ev.CheckpointInvalid(seq=manifest.seq, step=manifest.step, reason=reason))
            return None
        finally:
            kept = set((files or {}).values())
            for path in paths.values():
                if path.startswith(self.spool) and os.path.exists(path) and path not in kept:
                    os.unlink(path)
        # for `adopt`, once the caller has loaded the state: only blobs the write store holds
        # can be referenced by the next save (one restored from another store is written anew)
        self.incremental.restored = read if store is self.catalog.store else {}
        return state

    def fetch_verified(self, path: str, meta: dict[str, Any], store: Store | None = None) -> str:
        """Copy `path` to the spool, checking its size and the digest its entry carries (sha256
        or BLAKE3, `digest.of`); ValueError when they differ. The local copy's path."""
        algo, _ = digest.of(meta)
        hasher = digest.new(algo)
        local = os.path.join(self.spool, f"restore-{uuid.uuid4().hex[:8]}")
        size = 0
        with (store or self.catalog.store).fs.open(path, "rb") as src, open(local, "wb") as out:
            while chunk := src.read(CHUNK):
                hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
        try:
            check_copy(path, meta, size, hasher.hexdigest())
        except ValueError:
            os.unlink(local)
            raise
        return local
