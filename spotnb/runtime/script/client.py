"""`spotnb.ctx()`: the job's context from anywhere in the code a job runs.

In a function run by `spot.train` it returns the very `Context` the function received (the
agent runs the function in its own process). In a script run by `spot.run` / `spotnb run` the
script is a child process of the agent (see `spotnb.runtime.script.runner` for why), so it returns a
`ScriptContext`: a stand-in with the same methods, each call carried over a private Unix
socket to the agent's real `Context` and run there. Outside a job it raises `SpotnbError`.

This module is what a script imports: standard library only (no torch), so a script that does
not use torch does not pay for importing it.

The environment a script sees (documented in docs/guide/scripts.md):

- `SPOTNB_NOTICE_FILE`: a path that appears, as JSON `{"deadline", "time_left", "source",
  "action"}`, when a preemption notice arrives; it is written before the script gets SIGTERM.
- `SPOTNB_JOB_ID`, `SPOTNB_INCARNATION`: which job and which of its instances (1, 2, ...).
- `SPOTNB_CTX_SOCKET`, `SPOTNB_RESULT_FILE`, `SPOTNB_JOB_WORKDIR`: spotnb's own plumbing.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

from spotnb.errors import SpotnbError

__all__ = [
    "ctx",
    "ScriptContext",
    "Evacuate",
    "NOTICE_ENV",
    "SOCKET_ENV",
    "RESULT_ENV",
    "WORKDIR_ENV",
    "EXIT_EVACUATED",
    "OUTSIDE_JOB",
    "encode",
]

SOCKET_ENV = "SPOTNB_CTX_SOCKET"
NOTICE_ENV = "SPOTNB_NOTICE_FILE"
RESULT_ENV = "SPOTNB_RESULT_FILE"
WORKDIR_ENV = "SPOTNB_JOB_WORKDIR"
EXIT_EVACUATED = 3  # the agent's code for "left after an emergency checkpoint"

OUTSIDE_JOB = (
    "spotnb.ctx() is only available inside a spotnb job: in a function run by spot.train (which "
    "also receives the context as its argument) or in a script run by spot.run / `spotnb run`"
)
_NOT_HERE = (
    "ctx.{name}() is not available in a script: the objects live in the script's process, the "
    "context in spotnb's agent. Save them to a file or folder and call ctx.backup(path) instead; "
    "it is restored before the script runs again"
)


class Evacuate(SystemExit):
    """Raised by a `ScriptContext` call once the emergency checkpoint after a preemption notice
    is committed: the script leaves at once, with the agent's 'evacuated' exit code. A
    SystemExit, so an uncaught one prints no traceback and `finally` blocks still run."""

    def __init__(self) -> None:
        super().__init__(EXIT_EVACUATED)


def encode(value: Any) -> Any:
    """`json.dumps` default: tensors and numpy scalars as numbers, dataclasses (a Notice) as
    dicts, enums by value, anything else by its text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return str(value)


class _Remote:
    """An iterator or context manager the agent's Context returned (`ctx.steps(n)`,
    `ctx.step()`), driven from the script."""

    def __init__(self, owner: ScriptContext, handle: int) -> None:
        self._owner, self._handle = owner, handle

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        reply = self._owner._request({"op": "next", "handle": self._handle})
        if reply.get("stop"):
            raise StopIteration
        return reply.get("value")

    def __enter__(self) -> Any:
        return self._owner._request({"op": "enter", "handle": self._handle}).get("value")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and issubclass(exc_type, SystemExit):
            return  # leaving (Evacuate included): nothing to tell the agent
        self._owner._request({"op": "exit", "handle": self._handle, "raised": exc_type is not None})

    def close(self) -> None:
        self._owner._request({"op": "close", "handle": self._handle})


class ScriptContext:
    """The job's context in a script: every public attribute of the agent's `Context` (those
    another version adds too), reached over a socket. Arguments and return values travel as
    JSON: metrics may be numbers, numpy scalars or one-element tensors; a Notice comes back as
    a dict. `track`, `replicate` and `state` are not available (they would need the script's
    objects in the agent's process); write files and `backup` them.

    Thread-, signal- and fork-safe: each call takes a free connection or opens one, so a call
    made from a SIGTERM handler while the script's main loop is inside another call does not
    wait for, or read, that call's reply; a forked worker (a data loader's) opens its own.
    Another process the script starts reaches the same context through the environment."""

    def __init__(self, address: str, workdir: str | None = None) -> None:
        self._address = address
        self._workdir = workdir
        self._free: list[socket.socket] = []
        self._pid = os.getpid()
        self._methods: dict[str, bool] = {}

    # -- transport -------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self._address)
        except OSError as exc:
            sock.close()
            raise SpotnbError(
                f"spotnb.ctx(): cannot reach the agent at {self._address} ({exc}); it ended, or "
                "this process is not the script spotnb started"
            ) from None
        return sock

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        if os.getpid() != self._pid:  # a forked worker: its parent's connections are not its own
            self._free, self._pid = [], os.getpid()
        try:
            sock = self._free.pop()
        except IndexError:
            sock = self._connect()
        data = json.dumps(message, default=encode).encode() + b"\n"
        try:
            sock.sendall(data)
            reply = self._read_line(sock)
        except BaseException:
            sock.close()  # a reply may still be in flight: never reuse this connection
            raise
        self._free.append(sock)
        if reply.get("evacuate"):
            raise Evacuate()
        error = reply.get("error")
        if error:
            raise _exception(error.get("type", "RuntimeError"), error.get("message", ""))
        return reply

    @staticmethod
    def _read_line(sock: socket.socket) -> dict[str, Any]:
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise SpotnbError("spotnb.ctx(): the agent closed the connection (the instance is ending)")
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                return dict(json.loads(b"".join(chunks)))

    # -- the Context's attributes ----------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in ("track", "replicate"):
            raise AttributeError(_NOT_HERE.format(name=name))
        if name == "state":
            raise AttributeError(_NOT_HERE.format(name="state").replace("ctx.state()", "ctx.state"))
        method = self._methods.get(name)
        if method is None:
            reply = self._request({"op": "attr", "name": name})
            if not reply.get("callable"):
                return reply.get("value")
            self._methods[name] = method = True

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, args, kwargs)

        call.__name__ = name
        return call

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name == "backup":
            args = tuple(self._path(p) for p in args)
        reply = self._request({"op": "call", "name": name, "args": list(args), "kwargs": kwargs})
        if "handle" in reply:
            return _Remote(self, int(reply["handle"]))
        return reply.get("value")

    def _path(self, path: Any) -> Any:
        """A path as the agent must see it: the script may have changed its directory, the
        agent has not; a path under the job's working directory stays relative (restored
        there on the next instance)."""
        if not isinstance(path, (str, os.PathLike)) or self._workdir is None:
            return path
        full = os.path.abspath(os.fspath(path))
        inside = full == self._workdir or full.startswith(self._workdir.rstrip(os.sep) + os.sep)
        return os.path.relpath(full, self._workdir) if inside else full

    def set_result(self, value: Any) -> None:
        """What `job.result()` returns once the script exits with 0 (a function returns its
        result instead). Pickled here (cloudpickle, so classes of the script travel by value)
        and signed by the agent; the last call wins. Without it the result is None."""
        import cloudpickle

        path = os.environ.get(RESULT_ENV)
        if not path:
            raise SpotnbError(
                "ctx.set_result(): no result file was given to this script (run it with spot.run)"
            )
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(cloudpickle.dumps(value))
        os.replace(tmp, path)

    def __repr__(self) -> str:
        return f"<spotnb ScriptContext job={os.environ.get('SPOTNB_JOB_ID')} via {self._address}>"


def _exception(kind: str, message: str) -> BaseException:
    """The agent's exception as the same builtin type when there is one (ValueError,
    FileNotFoundError, ...), else a RuntimeError naming it."""
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except TypeError:
            pass
    return RuntimeError(f"{kind}: {message}")


_client: ScriptContext | None = None  # no lock: a SIGTERM handler calling spotnb.ctx() must never wait


def ctx() -> Any:
    """The current job's context; raises SpotnbError outside a spotnb job."""
    global _client
    address = os.environ.get(SOCKET_ENV)
    if address:
        client = _client
        if client is None or client._address != address:
            _client = client = ScriptContext(address, os.environ.get(WORKDIR_ENV))
        return client
    import sys

    context = sys.modules.get("spotnb.runtime.context")  # loaded where a function runs
    if context is not None:
        return context.ctx()
    raise SpotnbError(OUTSIDE_JOB)
