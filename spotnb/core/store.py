"""The store: specs, events and checkpoints under one fsspec URL. It is the source of truth.

Layout under the store root (see ARCHITECTURE.md, "The parts"):

    jobs/<id>/spec.json, fn.pkl            what to run
    jobs/<id>/events/<inc>-<writer>-<seg>.jsonl   what happened (append-free: object stores
                                                  cannot append, so each writer rewrites its
                                                  current bounded segment, then starts a new one)
    jobs/<id>/ckpt/<seq>/...  + MANIFEST.json    state; a checkpoint exists once its manifest does
    jobs/<id>/ckpt/blobs/<sha256>                files the script backed up, by content
    jobs/<id>/result.pkl                         fn's return value

Every write is atomic: a reader sees the old object or the new one, never half of one.
This module is shared by the notebook side and the runtime; it imports neither.
"""

from __future__ import annotations

import os
import posixpath
import time
import uuid
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = ["Store", "open_store", "private_dir", "is_temp_name", "is_safe_name", "TEMP_MARK", "STALE_TEMP_S"]

TEMP_MARK = ".tmp-"  # `<name>.tmp-<hex>`: an atomic write in flight (or one that died)
STALE_TEMP_S = 600.0  # a temp file untouched this long belongs to no live writer


def is_temp_name(name: str) -> bool:
    """Whether `name` is the temp file of an atomic write, not an object of the store."""
    return TEMP_MARK in name


def is_safe_name(name: Any) -> bool:
    """A file name a manifest may list: relative, inside its checkpoint's folder (a manifest read
    from a store is input: `../` or an absolute path must not reach outside it)."""
    return (
        isinstance(name, str)
        and bool(name)
        and not name.startswith("/")
        and ".." not in name.split("/")
        and "\\" not in name
    )


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create `path` (and parents) readable by its owner only: a spotnb home or a local store
    holds pickles that run code when loaded, checkpoints and the job DB."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for p in missing:  # mkdir's mode reaches the leaf only; umask may narrow it further
        os.chmod(p, 0o700)
    return path


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
            private_dir(self.root)

    # -- paths ---------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def job(self, job_id: str, *parts: str) -> str:
        return self.path("jobs", job_id, *parts)

    # -- io --------------------------------------------------------------------------------
    def write_bytes(self, path: str, data: bytes) -> None:
        """Atomically replace `path` with `data` (tmp + rename locally; a PUT is atomic remotely)."""
        if self.local:
            private_dir(posixpath.dirname(path))
            tmp = f"{path}{TEMP_MARK}{uuid.uuid4().hex[:8]}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                # a full disk or a failed rename must not leave a temp file behind
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        else:
            self.fs.pipe_file(path, data)

    def put_file(self, local_path: str, path: str) -> None:
        """Upload a local file atomically (used for checkpoint payloads)."""
        if self.local:
            private_dir(posixpath.dirname(path))
            tmp = f"{path}{TEMP_MARK}{uuid.uuid4().hex[:8]}"
            self.fs.cp_file(local_path, tmp)
            os.chmod(tmp, 0o600)
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
            entries = (
                self.fs.ls(path, detail=False, refresh=True)
                if not self.local
                else self.fs.ls(path, detail=False)
            )
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

    def clean_temp(self, path: str, older_than: float = STALE_TEMP_S) -> list[str]:
        """Remove temp files directly under `path` left by writes that died (SIGKILL, full
        disk) and untouched for `older_than` seconds; a live writer's temp file is younger.
        Returns the names removed. Only local stores have temp files (a PUT is atomic)."""
        if not self.local:
            return []
        removed = []
        now = time.time()
        for name in self.ls(path):
            if not is_temp_name(name):
                continue
            full = posixpath.join(path, name)
            try:
                if now - os.stat(full).st_mtime >= older_than:
                    os.unlink(full)
                    removed.append(name)
            except FileNotFoundError:
                continue  # its writer renamed or removed it meanwhile
        return removed

    def invalidate(self) -> None:
        """Forget cached listings (remote filesystems cache them)."""
        invalidate = getattr(self.fs, "invalidate_cache", None)
        if invalidate:
            invalidate()


_AZURE_SCHEMES = {"az": "blob", "abfs": "dfs", "abfss": "dfs"}


def with_azure_account(url: str, account: str | None) -> str:
    """`url` with the storage account in it when it is an Azure store that names none
    (`az://container/path` → `az://container@account.blob.core.windows.net/path`): adlfs then
    opens it without $AZURE_STORAGE_ACCOUNT_NAME. Any other URL is returned as it is."""
    scheme, sep, rest = url.partition("://")
    endpoint = _AZURE_SCHEMES.get(scheme.lower()) if sep else None
    if not account or endpoint is None:
        return url
    container, slash, path = rest.partition("/")
    if not container or "@" in container:
        return url
    return f"{scheme}://{container}@{account}.{endpoint}.core.windows.net{slash}{path}"


def open_store(url: str) -> Store:
    return Store(url)
