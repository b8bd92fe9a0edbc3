"""`Config.files`: collected and uploaded at submit, laid out on the instance before `fn` runs.

Why through the store: a cloud VM sees nothing of the notebook machine but the store. Each
file is stored once under `files/<sha256>` at the store root, so resubmitting a job (or
another job with the same data) uploads nothing new, and the job spec lists where each one
goes, relative to the job's working directory, with its hash. The spec is signed, so the
instance only writes bytes the notebook shipped.

Where a file goes: a path inside the notebook's working directory keeps its relative path;
one outside it (an absolute path elsewhere, `../x`) goes to the top by its name; a folder
recurses. On the local market the working directory is the notebook's own: identical files
are skipped and a different existing file is never overwritten (a clear error instead).

Shared by the notebook side (`collect`, `upload`) and the runtime (`lay_out`): imports neither.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import stat
import uuid
from collections.abc import Iterable
from typing import Any

from spotnb.store import Store

__all__ = ["FILES_MAX_BYTES", "FilesError", "collect", "upload", "lay_out", "blob_path", "remove_orphaned"]

FILES_MAX_BYTES = 1 << 30  # 1 GiB: more belongs in a bucket the function reads itself
_CHUNK = 4 * 1024 * 1024


class FilesError(ValueError):
    """A file that cannot be shipped or laid out; the message names it and the fix."""


def blob_path(store: Store, sha256: str) -> str:
    return store.path("files", sha256)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _sources(paths: Iterable[str], cwd: str) -> Iterable[tuple[str, str, str]]:
    """(given path, local file, destination relative to the working directory) per file."""
    cwd = os.path.realpath(cwd)
    for given in paths:
        full = os.path.realpath(os.path.join(cwd, given))
        inside = full == cwd or full.startswith(cwd + os.sep)
        base = os.path.relpath(full, cwd) if inside else os.path.basename(full)
        if os.path.isdir(full):
            for root, dirs, names in os.walk(full):
                dirs.sort()
                for name in sorted(names):
                    local = os.path.join(root, name)
                    rel = os.path.relpath(local, full)
                    dest = rel if base == "." else os.path.join(base, rel)
                    yield given, local, dest.replace(os.sep, "/")
        else:
            yield given, full, base.replace(os.sep, "/")


def collect(paths: Iterable[str], cwd: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Hash every file (folders recurse), checking the total against `limit` (default
    FILES_MAX_BYTES) before anything is uploaded. Entries: path, sha256, size, mode, source."""
    limit = FILES_MAX_BYTES if limit is None else limit
    out: dict[str, dict[str, Any]] = {}
    total = 0
    for given, local, dest in _sources(paths, cwd):
        st = os.stat(local)
        if not stat.S_ISREG(st.st_mode):
            continue  # sockets, fifos: nothing to ship
        total += st.st_size
        if total > limit:
            raise FilesError(
                f"Config.files: {given!r} ({local}) brings the files shipped with the job "
                f"to {_human(total)}, over the {_human(limit)} limit; put large data in "
                "a bucket and read it from the function"
            )
        entry = {
            "path": dest,
            "sha256": _sha256(local),
            "size": st.st_size,
            "mode": stat.S_IMODE(st.st_mode) & 0o755 | 0o600,
            "source": local,
        }
        prior = out.get(dest)
        if prior is not None and prior["sha256"] != entry["sha256"]:
            raise FilesError(
                f"Config.files: {prior['source']} and {local} would both go to {dest!r} "
                "on the instance; rename one or ship their folders instead"
            )
        out[dest] = entry
    return list(out.values())


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def upload(store: Store, entries: list[dict[str, Any]]) -> int:
    """Put each file's content at `files/<sha256>` unless it is there already. Returns the
    bytes uploaded (0 when every file was shipped before, by this job or another)."""
    sent = 0
    for entry in entries:
        dest = blob_path(store, entry["sha256"])
        if store.exists(dest) and store.size(dest) == entry["size"]:
            continue
        store.put_file(entry["source"], dest)
        sent += entry["size"]
    return sent


def _safe_dest(workdir: str, rel: str) -> str:
    """`rel` under `workdir`, refusing anything that would land outside it."""
    norm = posixpath.normpath(rel)
    if not rel or posixpath.isabs(rel) or norm == ".." or norm.startswith("../"):
        raise FilesError(f"shipped file path {rel!r} is not inside the working directory")
    return os.path.join(workdir, *norm.split("/"))


def lay_out(store: Store, files: Iterable[Any], workdir: str) -> list[str]:
    """Write the job's files under `workdir`, each verified against its hash in the (signed)
    spec. An identical file already there is kept; a different one is an error, never
    overwritten. Returns the paths written."""
    written = []
    for f in files:
        path, sha, mode = f.path, f.sha256, f.mode
        dest = _safe_dest(workdir, path)
        if os.path.lexists(dest):
            if os.path.isfile(dest) and _sha256(dest) == sha:
                continue
            raise FilesError(
                f"Config.files: {path!r} already exists in {workdir} with other content; "
                "spotnb never overwrites a file there. Move or rename it, or run the "
                "notebook from another directory"
            )
        data = store.read_bytes(blob_path(store, sha))
        if hashlib.sha256(data).hexdigest() != sha:
            raise FilesError(
                f"Config.files: the stored content of {path!r} does not match its hash in "
                "the job spec (modified in the store); resubmit the job"
            )
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as out:
            out.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
        written.append(dest)
    return written


def remove_orphaned(parent: str, prefix: str) -> None:
    """Remove the folders `<prefix><pid>-*` in `parent` whose process is gone: a process that
    was SIGKILLed (a preemption, `Job.stop`) cannot remove its own scratch, spool or market
    folder, so the next one of its kind does. A live process, or one of another user, keeps its
    folder."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0]
        if not name.startswith(prefix) or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except OSError:
            continue  # alive under another user: not ours to judge
