"""What torchrun starts for each worker of a script on several instances
(`python -m spotnb.runtime.group.torchrun_worker script args`; see `spotnb.runtime.group.torchrun`).

Before the script runs, in every rendezvous round:

1. **The round's store.** Global rank 0 hosts the workers' TCPStore at `MASTER_ADDR:MASTER_PORT`
   (a fresh one each round) and the script's `init_process_group` joins it as a client
   (`TORCHELASTIC_USE_AGENT_STORE`), as under torchrun's own shared store.
2. **The round's checkpoint.** Rank 0 asks its agent for the newest checkpoint that restores
   (after its own pending save committed) and publishes it with a round id in that store;
   every worker asks its agent to restore exactly that one. All ranks start the round from the
   same step with the same files.
3. **The script's `spotnb.ctx()`.** Rank 0's is the agent's context. Another rank's `backup`,
   `set_result` and `log` do nothing (rank 0 writes the job's checkpoints, result and series;
   it says so once in the instance log); a worker that is not its instance's local rank 0 also
   keeps `steps`/`step` to itself, so each instance's agent counts each step once.

Then the script runs as `__main__` (`runpy`), with `sys.argv = [script, *args]`. How it ends:

- normally, or `sys.exit(0)`: exit 0 (rank 0 leaves its result file, None by default, which
  tells its agent that it holds the job's result);
- an exception of the collectives (a peer was lost: gloo/NCCL errors, the store's, a
  connection reset): exit 1, and torchrun starts a new round;
- any other exception or exit code: the script failed. The traceback goes to the file named by
  `SPOTNB_TORCHRUN_FAILED`, which the agent watches: the job fails with it instead of torchrun
  restarting a script that would fail again.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import sys
import traceback
import uuid
from datetime import timedelta
from typing import Any

from spotnb.runtime.group.torchrun import FAILED_FILE_ENV
from spotnb.runtime.script import client as script_client
from spotnb.runtime.script.client import EXIT_EVACUATED, RESULT_ENV, ScriptContext

__all__ = ["main", "is_collective_error", "RankContext"]

log = logging.getLogger("spotnb.torchrun")

ROUND_KEY = "spotnb/round"
#: how long the other ranks wait for rank 0's store and choice: its restore may download a
#: large checkpoint first (if rank 0 dies after it made the store, they fail at once; before,
#: a replacement's arrival restarts the round)
ROUND_TIMEOUT = timedelta(seconds=float(os.environ.get("SPOTNB_ROUND_TIMEOUT", "600")))

#: words of the errors a lost peer causes in a collective or the store (gloo, NCCL, c10d)
_LOST_PEER = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "gloo",
    "nccl",
    "socket timeout",
    "timed out",
    "connection refused",
    "tcpstore",
    "process group",
    "processgroup",
    "rendezvous",
)
#: words of a backend this instance cannot have (NCCL on CPU, MPI not built in): they name a
#: backend too, but no round could ever succeed, so they are the script's failure, not a peer's
_NEVER_WORKS = (
    "built in",
    "not compiled",
    "only supported with gpus",
    "no gpus found",
    "no cuda gpus",
)


def is_collective_error(exc: BaseException) -> bool:
    """Whether `exc` is what a lost peer (or a lost store) raises in the script, not a bug:
    torch.distributed's own error types, connection errors, and runtime errors of the
    backends (whose types say nothing: gloo raises RuntimeError)."""
    try:
        from torch.distributed import DistError

        if isinstance(exc, DistError):
            return True
    except ImportError:  # an older torch: the words decide
        pass
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if type(exc) is RuntimeError or type(exc).__name__.startswith("Dist"):
        text = str(exc).lower()
        if any(words in text for words in _NEVER_WORKS):
            return False
        return any(word in text for word in _LOST_PEER)
    return False


class RankContext:
    """`spotnb.ctx()` of a worker that is not global rank 0: forwards to the agent's context
    what every rank may ask (`should_save`, `notice`, the step loop on an instance's local
    rank 0), keeps the rest to rank 0."""

    def __init__(self, inner: ScriptContext, rank: int, local_rank: int, step: int) -> None:
        self._inner, self._rank, self._local_rank = inner, rank, local_rank
        self._address = inner._address  # spotnb.ctx() returns this object while it is current
        self._step = step
        self._said = False

    def _skip(self, what: str) -> None:
        if not self._said:
            self._said = True
            log.warning(
                "rank %d: ctx.%s() and the like do nothing on ranks other than 0 (rank 0 writes the "
                "job's checkpoints, result and metrics)",
                self._rank,
                what,
            )

    def backup(self, *paths: str, **kwargs: Any) -> None:
        self._skip("backup")
        if self._local_rank == 0:  # the save the policy asked for is answered (by rank 0)
            self._inner._request({"op": "group_backup_skipped"})

    def set_result(self, value: Any) -> None:
        self._skip("set_result")

    def log(self, **metrics: Any) -> None:
        self._skip("log")

    def save(self, *args: Any, **kwargs: Any) -> None:
        self._skip("save")

    @property
    def step_index(self) -> int:
        return self._inner.step_index if self._local_rank == 0 else self._step

    def steps(self, n: int) -> Any:
        if self._local_rank == 0:
            return self._inner.steps(n)
        return self._local_steps(n)

    def _local_steps(self, n: int) -> Any:
        while self._step < n:
            yield self._step
            self._step += 1

    def step(self) -> Any:
        if self._local_rank == 0:
            return self._inner.step()
        import contextlib

        @contextlib.contextmanager
        def one() -> Any:
            yield self._step
            self._step += 1

        return one()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _round_store(rank: int, world: int) -> Any:
    """The round's store at MASTER_ADDR:MASTER_PORT: hosted here on rank 0, joined elsewhere."""
    from torch.distributed import TCPStore

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = TCPStore(host, port, world, is_master=rank == 0, timeout=ROUND_TIMEOUT, wait_for_workers=False)
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # the script's init joins it as a client
    return store


def _start_round(client: ScriptContext, store: Any, rank: int) -> dict[str, Any]:
    """Rank 0 chooses the round's checkpoint (restoring it); the others restore the same."""
    if rank == 0:
        nonce = uuid.uuid4().hex
        reply = client._request({"op": "group_round", "choose": True, "round": nonce})
        chosen = {"round": nonce, "seq": reply.get("seq"), "step": reply.get("step", 0)}
        store.set(ROUND_KEY, json.dumps(chosen))
        return chosen
    chosen = json.loads(store.get(ROUND_KEY))
    client._request({"op": "group_round", "round": chosen["round"], "seq": chosen["seq"]})
    return chosen


def _failed(text: str) -> None:
    path = os.environ.get(FAILED_FILE_ENV)
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"rank": int(os.environ.get("RANK", "0")), "traceback": text}, f)
        os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("usage: python -m spotnb.runtime.group.torchrun_worker script.py [args ...]\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    store = _round_store(rank, world)
    client = script_client.ctx()
    chosen = _start_round(client, store, rank)
    log.info(
        "rank %d of %d: round %s starts from %s",
        rank,
        world,
        chosen["round"][:8],
        f"checkpoint {chosen['seq']} (step {chosen['step']})" if chosen["seq"] is not None else "the start",
    )
    if rank != 0:
        script_client._client = RankContext(client, rank, local_rank, int(chosen["step"]))  # type: ignore[assignment]
    sys.argv = args
    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    code = 0
    try:
        runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code not in (0, EXIT_EVACUATED):
            _failed(
                f"{args[0]} exited with code {code}"
                + (f": {exc.code}" if not isinstance(exc.code, int) else "")
            )
    except BaseException as exc:  # noqa: BLE001 - told apart: a lost peer, or the script's bug
        text = traceback.format_exc()
        sys.stderr.write(text)
        sys.stderr.flush()
        if not is_collective_error(exc):
            _failed(text)
        return 1
    if code == 0 and rank == 0:
        _leave_result()
    return code


def _leave_result() -> None:
    """Rank 0 always leaves a result file (None unless the script set one): its agent then knows
    that it holds the job's result."""
    path = os.environ.get(RESULT_ENV)
    if path and not os.path.exists(path):
        import cloudpickle

        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(cloudpickle.dumps(None))
        os.replace(tmp, path)


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the round's store server and any thread of the script end with us
