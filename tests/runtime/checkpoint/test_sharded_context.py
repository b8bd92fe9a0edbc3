"""`ctx` with a sharded model (FSDP2 `fully_shard`, gloo on CPU, real forked processes and
a real store on disk): a checkpoint written by 2 processes restores into 1 (resharded by DCP)
with the step and the exact weights of the save. (Forked, as `test_sharded.py`: a spawned
process imports torch again.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from spotnb.core.store import Store
from spotnb.policy import resolve_policy
from spotnb.runtime.beacon import Beacon
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.context import Context
from spotnb.runtime.group.local import Group
from tests.support import procfns
from tests.support.jobs import free_port


def _worker(
    rank: int, world: int, port: int, url: str, incarnation: int, steps: int, out: str, hold: bool = False
) -> None:
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
    if hold:  # each upload waits until training has gone past the saved step (or ended)
        _hold_uploads(ctx, ckpt, steps)
    procfns.sharded_mlp(ctx, steps=steps, out=out, step_delay=0.0)
    torch.save({"resumed_from": ctx.resumed_from}, Path(out, f"ctx-{incarnation}-{rank}.pt"))
    ckpt.close()
    dist.destroy_process_group()


def _hold_uploads(ctx: Context, ckpt: Checkpointer, steps: int) -> None:
    """Make every shard upload wait (on a condition the training thread notifies, 30 s at
    most) until the training thread has counted a step after the one saved: a save that
    blocked the training thread until its upload was done would time out and commit nothing."""
    import threading

    moved = threading.Condition()
    end_step, save, upload = ctx._end_step, ctx._saves.save_sharded, ckpt._upload

    def notify() -> None:
        with moved:
            moved.notify_all()

    def stepped(*args: Any, **kw: Any) -> None:
        end_step(*args, **kw)
        notify()

    def saving(*args: Any, **kw: Any) -> Any:
        notify()  # the step is counted already: a held upload of the previous save goes on
        return save(*args, **kw)

    def held(*args: Any, **kw: Any) -> Any:
        step = ctx.step_index  # the save of this step (or an earlier one) is uploading
        with moved:
            if not moved.wait_for(lambda: ctx.step_index > step or ctx.step_index >= steps, 30):
                raise TimeoutError("the training thread did not go on while its shard uploaded")
        return upload(*args, **kw)

    ctx._end_step = stepped  # type: ignore[method-assign]
    ctx._saves.save_sharded = saving  # type: ignore[method-assign]
    ckpt._upload = held  # type: ignore[method-assign]


def _run(world: int, url: str, incarnation: int, steps: int, out: Path, hold: bool = False) -> None:
    args: Any = (world, free_port(), url, incarnation, steps, str(out), hold)
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


def test_ctx_uploads_shards_while_training_goes_on_and_the_last_save_commits_before_the_end(
    tmp_path: Path,
) -> None:
    """Every upload is held until the training thread has gone past the saved step: the saves
    of steps 5 and 10 both commit (a synchronous save would time out), the one of the last
    step before the function returns, and they restore exactly."""
    url = (tmp_path / "store").as_uri()
    _run(2, url, 1, 10, tmp_path, hold=True)
    ck = Checkpointer(Store(url), "job", 9, lambda _e: None)
    assert [m.step for m in ck.list_manifests()] == [10, 5]
    ck.close()
    _run(1, url, 2, 10, tmp_path)
    assert torch.load(tmp_path / "ctx-2-0.pt")["resumed_from"] == 10
    saved, restored = torch.load(tmp_path / "1-0.pt"), torch.load(tmp_path / "2-0.pt")
    assert all(torch.equal(saved[k], restored[k]) for k in saved)
