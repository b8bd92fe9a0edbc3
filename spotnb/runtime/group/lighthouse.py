"""The job's coordinator for several instances: torchft's lighthouse, which computes the quorum
of live replicas every step (`python -m spotnb.runtime.group.lighthouse --min-replicas N`).

It must outlive any one spot instance, so it never runs on one: the local market runs it as a
process of the market (beside the metadata server), a cloud as a small on-demand instance.
It prints `LIGHTHOUSE <address>` once it listens and serves until its stdin closes (the market
that started it died or closed) or it is killed. One started again after a death, at the same
address, numbers its quorums from 1 again: the replicas do not take a number for a process
group across that (`spotnb.runtime.group.elastic.Communicators`).

It also hosts the rendezvous store of a script run with torchrun on several instances (a
`torch.distributed.TCPStore` on the lighthouse's port + 1, `rendezvous_endpoint`): torchrun's
agents on the instances connect to it as clients (`is_host=false`), so no spot instance holds
the rendezvous. Its key `spotnb/epoch` names this life of the coordinator: the instances take
it into torchrun's run id, so a coordinator started again (an empty store) is a new rendezvous
rather than a half-remembered one (`spotnb.runtime.group.torchrun`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import uuid
from typing import Any

__all__ = [
    "JOIN_TIMEOUT_MS",
    "HEARTBEAT_TIMEOUT_MS",
    "QUORUM_TICK_MS",
    "EPOCH_KEY",
    "main",
    "rendezvous_endpoint",
]

#: How long a quorum waits for members of the previous one that have not asked yet. A replica
#: that left after a notice never asks again, so the survivors wait this long, once.
JOIN_TIMEOUT_MS = int(os.environ.get("SPOTNB_LIGHTHOUSE_JOIN_MS", "200"))
#: Silence after which a replica is out of the quorum (replicas beat every 100 ms). Short, so
#: survivors of a kill without notice go on within a fraction of a second (SPOTNIK: < 300 ms);
#: a replica starved past it only sits out a step and rejoins from a peer.
HEARTBEAT_TIMEOUT_MS = int(os.environ.get("SPOTNB_LIGHTHOUSE_HEARTBEAT_MS", "1000"))
QUORUM_TICK_MS = 20

#: the key of the rendezvous store that names this life of the coordinator
EPOCH_KEY = "spotnb/epoch"

log = logging.getLogger("spotnb.lighthouse")


def rendezvous_endpoint(lighthouse: str) -> str:
    """`host:port` of the rendezvous store of the coordinator at `lighthouse`
    (`http://host:port`): the next port, so every coordinator (a market's process, a cloud's
    VM with the job's all-TCP rule) has it without another field to carry."""
    rest = lighthouse.split("://", 1)[-1].rstrip("/")
    host, port = rest.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def _rendezvous_store(port: int) -> Any:
    """The TCPStore server torchrun's agents rendezvous in (None if the port is taken)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    try:
        store = TCPStore(
            "0.0.0.0", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
    except (RuntimeError, OSError) as exc:  # DistNetworkError is a RuntimeError
        log.warning("rendezvous store: port %d is not free (%s)", port, exc)
        return None
    store.set(EPOCH_KEY, f"{int(time.time())}-{uuid.uuid4().hex[:6]}")
    return store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotnb-lighthouse", description=__doc__)
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--bind", default="[::]:0")
    parser.add_argument("--host", default="127.0.0.1", help="the address instances reach it at")
    parser.add_argument("--job", default="", help="the job it coordinates (shown by ps)")
    args = parser.parse_args(argv)
    from torchft.coordination import LighthouseServer

    for _ in range(20):  # an ephemeral port whose next one is free too (a fixed one: once)
        server = LighthouseServer(
            bind=args.bind,
            min_replicas=args.min_replicas,
            join_timeout_ms=JOIN_TIMEOUT_MS,
            quorum_tick_ms=QUORUM_TICK_MS,
            heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
        )
        port = server.address().rsplit(":", 1)[1]
        store = _rendezvous_store(int(port) + 1)
        if store is not None or not args.bind.endswith(":0"):
            break
        server.shutdown()
    sys.stdout.write(f"LIGHTHOUSE http://{args.host}:{port}\n")
    sys.stdout.flush()
    try:
        sys.stdin.read()  # returns when the market that started us closes the pipe or dies
    finally:
        server.shutdown()
        del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
