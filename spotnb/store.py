"""The store: specs, events and checkpoints under one fsspec URL. It is the source of truth.

Layout under the store root (see DESIGN.md):

    jobs/<id>/spec.json, fn.pkl            what to run
    jobs/<id>/events/<inc>-<writer>-<seg>.jsonl   what happened (append-free: object stores
                                                  cannot append, so each writer rewrites its
                                                  current bounded segment, then starts a new one)
    jobs/<id>/ckpt/<seq>/...  + MANIFEST.json    state; a checkpoint exists once its manifest does
    jobs/<id>/result.pkl                         fn's return value

Every write is atomic: a reader sees the old object or the new one, never half of one.
This module is shared by the notebook side and the runtime; it imports neither.
"""
from __future__ import annotations

import os
import posixpath
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = ["Store", "open_store"]


class Store:
    """A rooted view of one fsspec filesystem with atomic writes and job paths."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options)
        self.root = self.root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        # how often to look for new events: a LIST on an object store costs money and quota
        # (10/s would cost about as much as a small spot instance), a local listing nothing
        self.poll_interval = 0.1 if self.local or self.fs.protocol in ("memory", ("memory",)) else 2.0
        if self.local:
            os.makedirs(self.root, exist_ok=True)

    # -- paths ---------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def job(self, job_id: str, *parts: str) -> str:
        return self.path("jobs", job_id, *parts)

    # -- io --------------------------------------------------------------------------------
    def write_bytes(self, path: str, data: bytes) -> None:
        """Atomically replace `path` with `data` (tmp + rename locally; a PUT is atomic remotely)."""
        if self.local:
            os.makedirs(posixpath.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, data)

    def put_file(self, local_path: str, path: str) -> None:
        """Upload a local file atomically (used for checkpoint payloads)."""
        if self.local:
            os.makedirs(posixpath.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            self.fs.cp_file(local_path, tmp)
            os.replace(tmp, path)
        else:
            self.fs.put_file(local_path, path)

    def read_bytes(self, path: str, start: int | None = None) -> bytes:
        return self.fs.cat_file(path, start=start)

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def ls(self, path: str) -> list[str]:
        """Names (not paths) directly under `path`; empty if it does not exist."""
        try:
            entries = self.fs.ls(path, detail=False, refresh=True) if not self.local else \
                self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(e.rstrip("/")) for e in entries)

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def rm(self, path: str, recursive: bool = False) -> None:
        try:
            self.fs.rm(path, recursive=recursive)
        except FileNotFoundError:
            pass

    def invalidate(self) -> None:
        """Forget cached listings (remote filesystems cache them)."""
        invalidate = getattr(self.fs, "invalidate_cache", None)
        if invalidate:
            invalidate()


def open_store(url: str) -> Store:
    return Store(url)
