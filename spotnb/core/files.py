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

What is shipped is what the function would read: symbolic links are followed (`cp -rL`, `tar
-h`), wherever they point, within the size and count limits. Whatever cannot be shipped that
way is refused at submit, naming the path and the fix (`FilesError`, a `ConfigError` at
`spot.train`), rather than skipped: a link to a missing target, a loop of links or a link to a
folder that holds it, a file or folder that cannot be read. Skipped with a warning, the file
would be missing on the instance and the function fail there, minutes and dollars later, far
from the cause, and a notebook's warning is easy to miss. Two things are left out: pipes,
sockets and devices inside a folder (no content; a warning lists them; named directly, they
are refused) and editors' lock links (`.#name`, Emacs), which are always dangling.

Shared by the notebook side (`collect`, `upload`) and the runtime (`lay_out`): imports neither.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import posixpath
import shutil
import stat
import uuid
from collections.abc import Iterable
from typing import Any

from spotnb.core.store import Store

__all__ = [
    "FILES_MAX_BYTES",
    "FILES_MAX_COUNT",
    "FilesError",
    "collect",
    "upload",
    "lay_out",
    "blob_path",
    "remove_orphaned",
]

FILES_MAX_BYTES = 1 << 30  # 1 GiB: more belongs in a bucket the function reads itself
#: Most files one job ships: each is a store object, a line of the signed spec and a write on
#: every instance (100,000 small files made a 13 MB spec and as many uploads); a tree that big
#: travels better as one archive.
FILES_MAX_COUNT = 10_000
_CHUNK = 4 * 1024 * 1024
log = logging.getLogger(__name__)


class FilesError(ValueError):
    """A file that cannot be shipped or laid out; the message names it and the fix."""


def blob_path(store: Store, sha256: str) -> str:
    return store.path("files", sha256)


class _Grew(Exception):
    """A file held more bytes than its size said (it grows, or has no fixed size)."""


def _sha256(path: str, most: int | None = None) -> str:
    """The file's hash; `_Grew` past `most` bytes (a file that never ends, /proc's, is never
    read to its end)."""
    digest = hashlib.sha256()
    read = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK if most is None else min(_CHUNK, most - read + 1)):
            read += len(chunk)
            if most is not None and read > most:
                raise _Grew(path)
            digest.update(chunk)
    return digest.hexdigest()


def _sources(paths: Iterable[str], cwd: str, skipped: list[str]) -> Iterable[tuple[str, str, str]]:
    """(given path, local file, destination relative to the working directory) per file; what
    is left out (`_walk`) is appended to `skipped`."""
    cwd = os.path.realpath(cwd)
    for i, given in enumerate(paths):
        joined = os.path.join(cwd, given)
        _check_link(joined, f"Config.files[{i}]: {given!r}")
        full = os.path.realpath(joined)
        inside = full == cwd or full.startswith(cwd + os.sep)
        base = os.path.relpath(full, cwd) if inside else os.path.basename(full)
        try:
            st = os.stat(full)
        except OSError as exc:
            raise FilesError(
                f"Config.files[{i}]: {given!r} cannot be read ({_why(exc)}); {_FIX_READ}"
            ) from None
        if stat.S_ISDIR(st.st_mode):
            for local, rel in _walk(given, full, (st.st_dev, st.st_ino), skipped):
                dest = rel if base == "." else posixpath.join(base.replace(os.sep, "/"), rel)
                yield given, local, dest
        elif stat.S_ISREG(st.st_mode):
            yield given, full, base.replace(os.sep, "/")
        else:
            raise FilesError(
                f"Config.files[{i}]: {given!r} is {_kind(st.st_mode)}, not a file or folder: there are "
                "no bytes to ship (a pipe or a socket means something only on this machine); "
                "remove it from Config.files"
            )


#: What to do about a file that cannot be read.
_FIX_READ = "make it readable (chmod u+r), or move it out of what Config.files ships"


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _check_link(path: str, what: str) -> None:
    """Refuse a symbolic link that leads nowhere (its target is missing, or links lead back to
    themselves), naming the link, its target and the fix."""
    if not os.path.islink(path):
        return
    try:
        os.stat(path)
        return
    except OSError as exc:
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        if exc.errno == errno.ELOOP:
            raise FilesError(
                f"{what}: the symbolic link {path} -> {target} leads back to itself (a loop of links); "
                "point it at a file or folder, or remove it"
            ) from None
        raise FilesError(
            f"{what}: the symbolic link {path} points to {target}, which does not exist "
            f"({_why(exc)}); create the target, point the link at an existing file, or remove the "
            "link (or ship the folder's other files by name)"
        ) from None


def _walk(given: str, top: str, top_id: tuple[int, int], skipped: list[str]) -> Iterable[tuple[str, str]]:
    """(local file, path relative to `top`, '/'-separated) for each file under `top`, depth
    first in name order, following links (see the module docstring for what is refused and
    what is left out; left out entries are appended to `skipped`). Iterative: a deep tree
    cannot exhaust the stack; a loop is a folder whose (device, inode) is one of its ancestors'."""
    what = f"Config.files: {given!r}"
    stack: list[tuple[str, str, tuple[tuple[int, int], ...]]] = [(top, "", (top_id,))]
    while stack:
        folder, rel, ancestors = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise FilesError(
                f"{what}: the folder {folder} cannot be listed ({_why(exc)}); {_FIX_READ}"
            ) from None
        folders = []
        for entry in entries:
            path = entry.path
            sub = f"{rel}/{entry.name}" if rel else entry.name
            link = entry.is_symlink()
            if link:
                if entry.name.startswith(".#") and not os.path.exists(path):
                    continue  # an editor's lock (Emacs: .#name -> user@host.pid), never content
                _check_link(path, what)
            try:
                st = os.stat(path)  # through links
            except OSError as exc:  # removed since the folder was listed, or not searchable
                raise FilesError(f"{what}: {path} cannot be read ({_why(exc)}); {_FIX_READ}") from None
            if stat.S_ISDIR(st.st_mode):
                node = (st.st_dev, st.st_ino)
                if node in ancestors:
                    how = f"the symbolic link {path} -> {os.readlink(path)}" if link else f"{path}"
                    raise FilesError(
                        f"{what}: {how} leads to a folder that contains it, so the folder would "
                        "hold itself for ever (a loop); remove the link, or point it elsewhere"
                    )
                folders.append((path, sub, (*ancestors, node)))
            elif stat.S_ISREG(st.st_mode):
                yield path, sub
            else:
                skipped.append(f"{path} ({_kind(st.st_mode)})")
        stack.extend(reversed(folders))  # depth first, in name order


def collect(paths: Iterable[str], cwd: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Hash every file (folders recurse, links are followed: `_walk`), checking the total
    against `limit` (default FILES_MAX_BYTES) and the count against FILES_MAX_COUNT before
    anything is uploaded. Entries: path, sha256, size, mode, source. Anything that cannot be
    shipped as the function would see it is a `FilesError` naming the file and the fix."""
    limit = FILES_MAX_BYTES if limit is None else limit
    most = FILES_MAX_COUNT
    out: dict[str, dict[str, Any]] = {}
    total = 0
    skipped: list[str] = []
    for count, (given, local, dest) in enumerate(_sources(paths, cwd, skipped), 1):
        try:
            st = os.stat(local)
        except OSError as exc:
            raise FilesError(f"Config.files: {local} cannot be read ({_why(exc)}); {_FIX_READ}") from None
        total += st.st_size
        if total > limit:
            raise FilesError(
                f"Config.files: {given!r} ({local}) brings the files shipped with the job "
                f"to {_human(total)}, over the {_human(limit)} limit; put large data in "
                "a bucket and read it from the function"
            )
        if count > most:
            raise FilesError(
                f"Config.files: {given!r} brings the files shipped with the job to more than "
                f"{most:,}, spotnb's limit (each is a store object, listed in the job spec and "
                "written by every instance); pack them (tar or zip, unpacked by the function) or "
                "put them in a bucket and read it from the function"
            )
        try:
            digest = _sha256(local, most=st.st_size)
        except OSError as exc:
            raise FilesError(f"Config.files: {local} cannot be read ({_why(exc)}); {_FIX_READ}") from None
        except _Grew:
            raise FilesError(
                f"Config.files: {local} grew while it was read ({_human(st.st_size)} when listed): "
                "a file being written (a log?) or one with no fixed size (/proc), whose shipped "
                "copy would not match its hash; ship a finished copy, or leave it out"
            ) from None
        entry = {
            "path": dest,
            "sha256": digest,
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
    if skipped:
        log.warning(
            "Config.files: %d entr%s left out, with no content to ship: %s",
            len(skipped),
            "y" if len(skipped) == 1 else "ies",
            ", ".join(skipped[:5]) + (", …" if len(skipped) > 5 else ""),
        )
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
    folder; a zombie (killed, its parent has not reaped it yet) or a process that started
    after the folder was last changed (the pid came round again) is not its owner."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0]
        if not name.startswith(prefix) or not pid.isdigit():
            continue
        path = os.path.join(parent, name)
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            continue
        except OSError:
            continue  # alive under another user: not ours to judge
        if _not_the_owner(int(pid), path):
            shutil.rmtree(path, ignore_errors=True)


def _not_the_owner(pid: int, path: str) -> bool:
    """Whether live-looking `pid` is not the process that made `path`: a zombie, or one that
    started after `path` was last modified (Linux /proc; False where it cannot say)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
        if fields[0] in ("Z", "X"):
            return True
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
        started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        # btime is whole seconds: a margin of 2 s keeps the owner of a fresh folder its owner
        return started > os.stat(path).st_mtime + 2.0
    except (OSError, IndexError, ValueError, StopIteration):
        return False
