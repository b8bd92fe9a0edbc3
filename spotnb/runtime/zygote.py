"""The local market's zygote: one process per market that imports what an instance needs
(torch, the runtime) once, then forks each of the market's instances from itself.

An instance's start was mostly `import torch` (2–3 CPU seconds); a replacement forked from the
zygote starts in milliseconds, as an instance started from a warm image does. The forked child
becomes exactly what `python -m spotnb.runtime.agent ARGS` would be: its own session (the
market SIGKILLs the group), umask 077, its log on stdout and stderr, nothing on stdin, the
environment it was given (the job key included, which thus never shows in
`/proc/<pid>/environ`), then `agent.main(ARGS)`.

Protocol (JSON lines): the market writes one request per instance on stdin
(`{"argv", "env", "log", "cwd", "claim"}`); the zygote answers `{"ready": true}` once loaded, then
`{"forked": pid}` per request, in order, and `{"exit": pid, "code": c}` when one of its
instances ends (`c` as `Popen.returncode`: negative for a signal). It exits when its stdin
closes (its market closed, or the market's process died); its instances live on, as orphans of
a dead controller always do (`LocalProvider.reclaim`). See docs/dev/local-market.md.

`claim`: a file the child creates, with its pid, before it becomes an instance. A market that
got no answer (the zygote died or stopped between its fork and its answer) creates it first
when the child did not, and the child then ends without running anything; otherwise the market
adopts the pid the file names. Either way a request makes one instance, never two and never
one the market does not know of.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Any

__all__ = ["claim", "main"]


def _preload() -> None:
    """What every instance imports (`Agent.run`), once."""
    import cloudpickle  # noqa: F401

    import spotnb.runtime.agent  # noqa: F401
    from spotnb.policy import resolve_policy  # noqa: F401
    from spotnb.runtime import context, notice  # noqa: F401


def claim(path: str, text: str) -> bool:
    """Create `path` holding `text`, unless it exists (False): whole or absent to its reader
    (written aside, then linked into place, which fails if the name is taken)."""
    aside = f"{path}.{os.getpid()}.{time.monotonic_ns()}"
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    try:
        os.link(aside, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(aside)


def _send(doc: dict[str, Any]) -> None:
    os.write(1, (json.dumps(doc) + "\n").encode())


def _become_instance(req: dict[str, Any], keep: list[int]) -> None:
    """In the forked child: set up the process as a fresh instance's, run the agent, never
    return into the zygote's loop."""
    code = 70  # EX_SOFTWARE: the child could not become an instance
    try:
        os.setsid()
        os.umask(0o077)
        if req.get("claim") and not claim(req["claim"], str(os.getpid())):
            code = 0  # the market gave up on this request and started the instance cold
            return
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in {log, null, *keep}:
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        if "numpy.random" in sys.modules:  # a fresh seed per instance, as a process of its own
            sys.modules["numpy.random"].seed()  # has (`random` reseeds itself after a fork)
        from spotnb.runtime import agent

        agent._STARTED = time.time()  # boot_s: this instance's start, not the zygote's
        sys.argv = [agent.__file__, *req["argv"]]
        agent.main(req["argv"])  # ends the process (os._exit)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported in the instance's log
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap(children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def main() -> None:
    _preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: set[int] = set()
    _send({"ready": True})
    pending = b""
    while True:
        try:
            readable, _, _ = select.select([0, wake_r], [], [])
        except InterruptedError:  # pragma: no cover - Python retries select itself
            continue
        if wake_r in readable:
            os.read(wake_r, 512)
            _reap(children)
        if 0 not in readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # the market closed: its instances are its to end, not ours
            _reap(children)
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become_instance(req, [wake_r, wake_w])
            children.add(pid)
            _send({"forked": pid})
            del req, line  # the job key leaves this process's references with the request


if __name__ == "__main__":
    main()
