"""The instance's log, capped: a chatty script or function cannot fill the disk with it.

A script printed 300 MB and its instance log under `$SPOTNB_HOME/logs/<job>/` grew to 310 MB
(issue #29 item 9). The log is the agent's stdout and stderr, a file the local market opened
for it (`SPOTNB_INSTANCE_LOG` names it); what the agent's children print reaches it through
the agent (`forward`: the script's stdout and stderr, `runtime.script`; the other local ranks',
`runtime.local_group`), so the agent alone writes it.

Rotation, as logrotate and `RotatingFileHandler(backupCount=1)` do: once the log passes half
the cap (`SPOTNB_LOG_MAX` bytes in all, default `LOG_MAX`, 50 MB) it is renamed `<log>.1`
(replacing the previous one) and a fresh file takes its place on the agent's descriptors 1
and 2 (`dup2`, atomic for every thread and for C code writing to them), starting with a note
and the last eighth of the cap of `<log>.1`. Why rotation rather than a head and a tail in
one file: the path in the job's events (an `InstanceCrashed` error names it) always holds the
newest output, which is what a failure is read from, even just after a rotation, and `<log>.1`
the output before it; a write racing the rotation lands in one file or the other, never
nowhere. What is dropped is the middle and the start of a long run's output: the start of
the instance (versions, restore) is also in the job's events. The cap is checked every
`CHECK_EVERY` seconds and after every `CHECK_BYTES` forwarded, so the files overshoot it by at
most what the function prints in that time.

Runtime side: standard library only.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, BinaryIO

__all__ = ["ENV_PATH", "ENV_MAX", "LOG_MAX", "LogCap", "install", "cap_bytes", "forward", "wrote"]

#: The instance log's path, set by the market that opened it for the agent.
ENV_PATH = "SPOTNB_INSTANCE_LOG"
#: Bytes the log and its `.1` may take together (tests set it small).
ENV_MAX = "SPOTNB_LOG_MAX"
LOG_MAX = 50_000_000
#: Smallest cap taken: below it the rotation notes alone would fill the files.
LOG_MIN = 64 * 1024
CHECK_EVERY = 0.25
CHECK_BYTES = 256 * 1024

_current: LogCap | None = None


class LogCap:
    """Rotates the file on descriptors 1 (and 2, if the same file) at `path` past half of
    `max_bytes`."""

    def __init__(self, path: str, max_bytes: int = LOG_MAX) -> None:
        self.path = path
        self.max_bytes = max(LOG_MIN, int(max_bytes))
        self.segment = self.max_bytes // 2
        self.rotations = 0
        self._lock = threading.Lock()
        self._unchecked = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LogCap:
        self._thread = threading.Thread(target=self._watch, name="spotnb-logcap", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(CHECK_EVERY):
            self.check()

    def wrote(self, n: int) -> None:
        """`n` bytes were forwarded to the log: check it every `CHECK_BYTES`."""
        self._unchecked += n
        if self._unchecked >= min(CHECK_BYTES, self.segment // 4):
            self._unchecked = 0
            self.check()

    def check(self) -> bool:
        """Rotate if the log is past its share of the cap; whether it did."""
        with self._lock:
            try:
                st = os.fstat(1)
                here = os.stat(self.path)
            except OSError:
                return False  # no log any more (its folder removed): nothing to cap
            same = (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)
            if not stat.S_ISREG(st.st_mode) or not same or st.st_size < self.segment:
                return False  # stdout is not (or no longer) this log: not ours to move
            try:
                self._rotate(st)
            except OSError:
                return False  # a full disk or a read-only folder: write on, as before
            return True

    def _rotate(self, old: os.stat_result) -> None:
        """The new log is made aside first (its note and the old one's tail), so a full disk
        changes nothing; then the old one becomes `.1` and the new one takes its name and the
        agent's descriptors. What is written between the tail's copy and `dup2` is in `.1`."""
        fresh = f"{self.path}.new"
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            seed = self.segment // 4
            note = (
                f"[spotnb {time.strftime('%Y-%m-%d %H:%M:%S')}] this instance's log passed "
                f"{_mb(self.segment)}: what came before is in {os.path.basename(self.path)}.1"
                + (" (older output was dropped" if self.rotations else " (nothing dropped yet")
                + f"; the two keep about {_mb(self.max_bytes)}: {ENV_MAX}), and its last "
                f"{_mb(seed)} are repeated here\n"
            )
            _write_all(fd, note.encode())
            _copy_tail(self.path, fd, seed)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError, AttributeError):
                    pass
            os.replace(self.path, self.path + ".1")
            try:
                os.replace(fresh, self.path)
            except OSError:
                os.replace(self.path + ".1", self.path)  # as it was: write on into the old one
                raise
        except OSError:
            os.close(fd)
            try:
                os.unlink(fresh)
            except OSError:
                pass
            raise
        try:
            err = os.fstat(2)
            also_2 = (err.st_dev, err.st_ino) == (old.st_dev, old.st_ino)
        except OSError:
            also_2 = False
        os.dup2(fd, 1)
        if also_2:
            os.dup2(fd, 2)
        os.close(fd)
        self.rotations += 1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_tail(path: str, fd: int, most: int) -> None:
    """The last `most` bytes of `path`, from a line's start, written to `fd`: the log's path
    always shows the newest output, even just after a rotation."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - most))
        tail = f.read(most)
    if size > most and b"\n" in tail:
        tail = tail.split(b"\n", 1)[1]
    _write_all(fd, tail)


def _mb(n: int) -> str:
    return f"{n / 1e6:.3g} MB"


def install(env: Mapping[str, str] | None = None) -> LogCap | None:
    """Cap this process's log if the market named it (`ENV_PATH`); the running cap, or None."""
    global _current
    env = os.environ if env is None else env
    path = env.get(ENV_PATH)
    if not path or _current is not None:
        return _current
    _current = LogCap(path, cap_bytes(env)).start()
    return _current


def cap_bytes(env: Mapping[str, str]) -> int:
    """`ENV_MAX` as bytes; what is not a finite number is the default (`LOG_MAX`)."""
    try:
        return int(float(env.get(ENV_MAX) or LOG_MAX))
    except (ValueError, OverflowError):  # not a number, NaN, inf
        return LOG_MAX


def wrote(n: int) -> None:
    """`n` bytes went to the log through `forward` (or another pump)."""
    cap = _current
    if cap is not None:
        cap.wrote(n)


def forward(source: IO[bytes], to: str = "stdout", name: str = "spotnb-forward") -> threading.Thread:
    """Copy `source` (a child's pipe) to this process's stdout or stderr until it ends, in a
    daemon thread, counting the bytes for the cap."""

    def pump() -> None:
        out: BinaryIO | None = getattr(getattr(sys, to), "buffer", None)
        read = getattr(source, "read1", source.read)
        try:
            while chunk := read(65536):
                if out is not None:
                    try:
                        out.write(chunk)
                        out.flush()
                    except (OSError, ValueError):
                        out = None  # our own output is gone: keep draining the child's
                wrote(len(chunk))
        except (OSError, ValueError):
            pass
        finally:
            try:
                source.close()
            except OSError:
                pass

    thread = threading.Thread(target=pump, name=name, daemon=True)
    thread.start()
    return thread
