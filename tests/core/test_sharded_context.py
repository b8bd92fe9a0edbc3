"""`ctx` with a sharded model (FSDP2 `fully_shard`, gloo on CPU, real forked processes and
a real store on disk): a checkpoint written by 2 processes restores into 1 (resharded by DCP)
with the step and the exact weights of the save. (Forked, as `test_sharded.py`: a spawned
process imports torch again.)"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from spotnb.policy import resolve_policy
from spotnb.runtime.beacon import Beacon
from spotnb.runtime.checkpoint import Checkpointer
from spotnb.runtime.context import Context
from spotnb.runtime.local_group import Group
from spotnb.store import Store
from tests.elastic import procfns


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, url: str, incarnation: int, steps: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ckpt = Checkpointer(Store(url), "job", incarnation, lambda _e: None)
    ctx = Context(
        job_id="job",
        incarnation=incarnation,
        checkpointer=ckpt,
        policy=resolve_policy("static:5"),
        emit=lambda _e: None,
        flush=lambda: None,
        beacon=Beacon(None),
        market={"mttp": 3600.0, "restart": 60.0, "grace": 120.0},
        group=Group(rank, world) if world > 1 else None,
    )
    procfns.sharded_mlp(ctx, steps=steps, out=out, step_delay=0.0)
    torch.save({"resumed_from": ctx.resumed_from}, Path(out, f"ctx-{incarnation}-{rank}.pt"))
    ckpt.close()
    dist.destroy_process_group()


def _run(world: int, url: str, incarnation: int, steps: int, out: Path) -> None:
    args: Any = (world, _free_port(), url, incarnation, steps, str(out))
    mp.start_processes(_worker, args=args, nprocs=world, start_method="fork", join=True)


def test_a_checkpoint_of_two_processes_restores_into_one(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    _run(2, url, 1, 10, tmp_path)  # saves the shards of steps 5 and 10, ends at step 10
    _run(1, url, 2, 10, tmp_path)  # restores step 10 on one process: nothing left to train
    assert torch.load(tmp_path / "ctx-2-0.pt")["resumed_from"] == 10
    saved, restored = torch.load(tmp_path / "1-0.pt"), torch.load(tmp_path / "2-0.pt")
    assert sorted(saved) == sorted(restored)
    assert all(torch.equal(saved[k], restored[k]) for k in saved)
    assert not all(torch.equal(saved[k], torch.zeros_like(saved[k])) for k in saved)
