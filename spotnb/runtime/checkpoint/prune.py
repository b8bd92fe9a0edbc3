"""Retention: which checkpoints a save leaves in the stores, and deleting the rest.

After each commit the newest two checkpoints of any kind stay (one to fall back to if the
newest turns out damaged), and `keep_last` periodic or final ones; superseded insurance and
emergency saves, uploads a preemption abandoned and checkpoints whose manifest is damaged go.
A checkpoint that is kept keeps every copy in every store and every blob it lists; one whose
manifest cannot be read right now is kept (it might be committed). Pruning is housekeeping:
it warns, never fails a save.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spotnb.core import protocol as ev
from spotnb.core.store import Store
from spotnb.runtime.checkpoint.manifest import BLOBS, InvalidManifest, Manifest, distinct
from spotnb.runtime.checkpoint.restore import Catalog

__all__ = ["Pruner", "PERSISTENT", "retained"]

#: the kinds of save `keep_last` counts (insurance and emergency ones are only kept while newest)
PERSISTENT = ("periodic", "final")


def retained(manifests: Sequence[Manifest], keep_last: int) -> set[int]:
    """The numbers of the committed checkpoints (`manifests`, newest first, one per number)
    that retention keeps: the newest two of any kind, and the newest `keep_last` periodic or
    final ones."""
    keep = {m.seq for m in manifests[:2]}
    keep |= {m.seq for m in [m for m in manifests if m.kind in PERSISTENT][:keep_last]}
    return keep


class Pruner:
    """Deletes what retention does not keep from the stores the `catalog` lists."""

    def __init__(self, catalog: Catalog, emit: Callable[..., Any], keep_last: int = 2) -> None:
        self.catalog, self.emit, self.keep_last = catalog, emit, keep_last

    def prune(self, newest: Manifest) -> None:
        """Keep the newest two checkpoints of any kind (one to fall back to) and `keep_last`
        periodic ones; drop superseded insurance/emergency ones, abandoned partial uploads and
        checkpoints whose manifest is damaged. `newest`: the checkpoint just committed, kept
        whatever a listing says.

        Decided folder by folder: one manifest that cannot be read right now is kept and left
        out of the count (it might be committed), never a reason to stop pruning the rest.
        Across stores (`Config.regional_stores`) the count is of checkpoints, not copies: a
        kept checkpoint keeps every copy, so the only copy of a kept one is never deleted."""
        catalog = self.catalog
        try:
            scan = catalog.scan()
        except Exception as exc:  # noqa: BLE001 - pruning is housekeeping, never fatal
            self.emit(ev.JobWarning(message=f"checkpoint pruning failed: {exc!r}"))
            return
        manifests = distinct(m for _, m, _ in scan)
        try:  # blobs' temp files of uploads and copies that died (a live one's is younger)
            catalog.store.clean_temp(f"{catalog.root}/{BLOBS}")
        except OSError:
            pass
        gone: dict[str, set[str]] = {}
        keep = retained(manifests, self.keep_last)
        for seq, found, store in scan:
            if seq in keep or seq == newest.seq:
                continue
            root = catalog.root_of(store)
            if isinstance(found, Manifest):
                doomed = True
            elif found is None:
                # a partial upload a preemption or cancel left behind (older than this save,
                # and still without a manifest: not one committing right now)
                doomed = seq < newest.seq and not store.exists(f"{root}/{seq:08d}/MANIFEST.json")
            else:
                # a damaged manifest is never restorable; one unreadable for now may be fine
                doomed = isinstance(found, InvalidManifest) and seq < newest.seq
            if not doomed:
                continue
            try:
                self.delete(seq, store)
            except Exception as exc:  # noqa: BLE001 - the next save prunes again
                self.emit(ev.JobWarning(message=f"checkpoint pruning could not delete {seq}: {exc!r}"))
                continue
            if isinstance(found, Manifest):
                gone.setdefault(store.url, set()).update(found.blobs())
        # a blob goes with the last checkpoint of its store that listed it (only blobs of
        # checkpoints just deleted: one a save of another writer has uploaded but not
        # committed yet stays)
        for store in catalog.stores:
            kept = set().union(
                *(
                    m.blobs()
                    for _, m, s in scan
                    if s is store and isinstance(m, Manifest) and m.seq in keep | {newest.seq}
                )
            )
            for sha in sorted(gone.get(store.url, set()) - kept):
                try:
                    store.rm(f"{catalog.root_of(store)}/{BLOBS}/{sha}")
                except Exception as exc:  # noqa: BLE001 - the next prune does not see it again: say so
                    self.emit(
                        ev.JobWarning(message=f"checkpoint pruning could not delete blob {sha[:12]}: {exc!r}")
                    )

    def delete(self, seq: int, store: Store | None = None) -> None:
        """Delete checkpoint `seq` from `store` (the write store by default): its manifest
        first, so what a kill leaves half-deleted never looks committed."""
        store = store or self.catalog.store
        folder = f"{self.catalog.root_of(store)}/{seq:08d}"
        store.rm(f"{folder}/MANIFEST.json")  # manifest first: never a valid-looking half
        store.rm(folder, recursive=True)
