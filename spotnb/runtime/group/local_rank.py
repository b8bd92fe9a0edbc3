"""A rank other than 0 of an instance's replica group (`Config.procs_per_instance`):
`python -m spotnb.runtime.group.local_rank --store URL --job ID --incarnation N`, started by the
agent (`local_group.LocalGroup`) with torchrun's variables and the job key on stdin.

It runs the job's function with its own `Context` and writes no events (rank 0 speaks for
the group); an exception is left for rank 0 to report, in `<report dir>/<rank>.json`. Exit
codes: 0 done, 1 the function raised, 3 left with the group after a notice.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from spotnb.runtime.agent import Agent
from spotnb.runtime.group.local import ENV, EXIT_GROUP_LOST, REPORT_MAX, Group

__all__ = ["main"]


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when rank 0 dies; elsewhere, a thread watches."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(EXIT_GROUP_LOST)

    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(EXIT_GROUP_LOST)
    threading.Thread(target=watch, name="spotnb-parent", daemon=True).start()


def _member(store_url: str, job_id: str, incarnation: int) -> int:
    """A rank other than 0: run the job's function with a Context that writes no events."""
    import cloudpickle

    from spotnb.core.signing import KEY_ENV, unseal
    from spotnb.policy import resolve_policy
    from spotnb.runtime.beacon import Beacon
    from spotnb.runtime.checkpoint.checkpointer import Checkpointer
    from spotnb.runtime.context import Context, Evacuate, GroupFinished, set_current

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 0 hears the soft shutdown for the group
    os.environ[KEY_ENV] = sys.stdin.readline().strip()
    member = _Member(store_url, job_id, incarnation)
    refused = member._load_spec()
    if refused:
        raise RuntimeError(refused)
    sys.path.insert(0, os.getcwd())
    blob = member.store.read_bytes(member.store.job(job_id, "fn.pkl"))
    payload = cloudpickle.loads(unseal(member.key, job_id, "fn.pkl", blob))
    group = Group.from_env()
    assert group is not None
    group.init()
    checkpointer = Checkpointer(
        member.store, job_id, incarnation, _quiet, key=member.key, keep_last=member.spec.get("keep_last", 2)
    )
    ctx = Context(
        job_id=job_id,
        incarnation=incarnation,
        checkpointer=checkpointer,
        policy=resolve_policy(payload.get("policy") or member.spec.get("policy") or "hedged"),
        emit=_quiet,
        flush=lambda: None,
        beacon=Beacon(None),
        market=member.inc.get("market", {}),
        save_every=member.spec.get("save_every"),
        high_water=int(member.inc.get("high_water", 0)),
        checkpointed=bool(member.inc.get("checkpointed", False)),
        elastic=member._elastic(),
        group=group,
    )
    set_current(ctx)
    try:
        payload["fn"](ctx)
        ctx.wait_saves()  # rank 0 commits a sharded save only with this rank's files in
    except Evacuate:
        return 3
    except GroupFinished:
        return 0
    finally:
        checkpointer.close()
    return 0


def _quiet(event: Any) -> None:
    """A rank other than 0 writes no events: rank 0 speaks for the group."""


class _Member(Agent):
    """The agent's spec and function loading, with nothing written: no events leave a rank
    other than 0."""

    def emit(self, event: Any) -> None:
        pass

    def flush(self) -> None:
        pass


def _report(report: dict[str, str]) -> None:
    """Rank 0 reads this rank's failure from the pipe it gave (`ENV`), once this rank exited."""
    try:
        fd = int(os.environ.get(ENV, "-1"))
    except ValueError:
        return
    report["traceback"] = report["traceback"][-(REPORT_MAX // 2) :]
    report["message"] = report["message"][: REPORT_MAX // 8]
    data = json.dumps(report).encode()
    if fd < 0 or len(data) > REPORT_MAX:
        return
    try:
        os.write(fd, data)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="spotnb-local-rank")
    parser.add_argument("--store", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent(int(os.environ.get("SPOTNB_GROUP_PARENT", os.getppid())))
    try:
        code = _member(args.store, args.job, args.incarnation)
    except BaseException as exc:  # noqa: BLE001 - rank 0 reports it for the group
        report = {
            "message": f"{type(exc).__name__}: {exc}",
            "exc_type": type(exc).__name__,
            "traceback": "".join(traceback.format_exception(exc)),
        }
        _report(report)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
