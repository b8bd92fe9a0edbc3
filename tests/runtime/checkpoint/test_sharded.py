"""Sharded (DCP) checkpoints: real processes, gloo on CPU, a real store on disk.

(Forked, not spawned: a spawned process imports torch again, 5-10 s each on a busy machine.)

A model sharded row-wise over 2 processes (`DTensor`, as FSDP shards it) is saved by both at
once; it loads into 1 process and into 3, resharded, with exactly the saved values; a damaged
or missing shard makes every process fall back to the previous checkpoint together; a process
that dies before uploading leaves no manifest."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from spotnb.core.store import Store
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.checkpoint.manifest import Manifest
from spotnb.runtime.checkpoint.sharded import MARKER, ShardedCheckpointer, is_sharded
from tests.support.jobs import EventList, free_port, gloo_mesh

ROWS, COLS = 12, 5


def _full(step: int) -> torch.Tensor:
    """The unsharded weights at `step` (distinct per step, so a restore shows which one)."""
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) + 1000 * step


def _sharded_state(mesh: Any, step: int) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    return {"w": distribute_tensor(_full(step), mesh, [Shard(0)]), "step": step}


def _save_worker(
    rank: int,
    world: int,
    port: int,
    url: str,
    steps: list[int],
    die_at: int | None,
    out: str,
    full_at: int | None,
) -> None:
    import torch.distributed as dist

    mesh = gloo_mesh(rank, world, port)
    events = EventList()
    ck = Checkpointer(Store(url), "job", 1, events, keep_last=5)
    sharded = ShardedCheckpointer(ck)
    seqs = []
    for step in steps:
        if die_at == step and rank == world - 1:
            os._exit(9)  # a preemption mid-save: this process never uploads its shard
        if full_at == step and rank == world - 1:

            def full(*_: Any, **__: Any) -> Any:
                raise OSError(28, "No space left on device")

            ck._upload = full  # type: ignore[method-assign]  # this process's disk is full
        manifest = sharded.save(_sharded_state(mesh, step), step)
        ck.__dict__.pop("_upload", None)  # the disk has room again
        seqs.append(None if manifest is None else manifest.seq)
    failed = [e.error for e in events if e.kind == "checkpoint_failed"]
    Path(out, f"saved-{rank}.json").write_text(json.dumps({"seqs": seqs, "failed": failed}))
    ck.close()
    dist.destroy_process_group()


def _load_worker(rank: int, world: int, port: int, url: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = gloo_mesh(rank, world, port)
    events = EventList()
    ck = Checkpointer(Store(url), "job", 2, events)
    state = {"w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(0)]), "step": -1}
    manifest = ShardedCheckpointer(ck).load(state)
    local = state["w"].to_local()
    full = state["w"].full_tensor()
    torch.save(
        {
            "seq": None if manifest is None else manifest.seq,
            "step": state["step"],
            "local_rows": local.shape[0],
            "full": full,
            "invalid": [e.reason for e in events if e.kind == "checkpoint_invalid"],
        },
        Path(out, f"loaded-{rank}.pt"),
    )
    ck.close()
    dist.destroy_process_group()


def _save(
    tmp_path: Path, world: int, steps: list[int], die_at: int | None = None, full_at: int | None = None
) -> str:
    url = (tmp_path / "store").as_uri()
    args = (world, free_port(), url, steps, die_at, str(tmp_path), full_at)
    if die_at is None:
        mp.start_processes(_save_worker, args=args, nprocs=world, start_method="fork", join=True)
    else:
        _spawn_tolerating_death(_save_worker, args, world)
    return url


def _spawn_tolerating_death(fn: Any, args: tuple, world: int) -> None:
    """Run `world` processes where one is meant to die: the survivors must end (their
    collective fails) rather than hang; their exit codes are not the point."""
    ctx = mp.start_processes(fn, args=args, nprocs=world, start_method="fork", join=False)
    try:
        while not ctx.join():
            pass
    except Exception:  # noqa: BLE001 - the planned death surfaces here
        for p in ctx.processes:
            p.join()


def _load(tmp_path: Path, url: str, world: int) -> list[dict[str, Any]]:
    mp.start_processes(
        _load_worker,
        args=(world, free_port(), url, str(tmp_path)),
        nprocs=world,
        start_method="fork",
        join=True,
    )
    return [torch.load(tmp_path / f"loaded-{r}.pt") for r in range(world)]


def _manifests(url: str) -> list[Manifest]:
    ck = Checkpointer(Store(url), "job", 9, EventList())
    try:
        return ck.list_manifests()
    finally:
        ck.close()


def test_a_state_sharded_over_two_processes_loads_into_one_and_into_three(tmp_path: Path) -> None:
    url = _save(tmp_path, 2, [3, 4])
    (newest, older) = _manifests(url)
    assert is_sharded(newest) and (newest.step, older.step) == (4, 3)
    # one shard file per process, and DCP's metadata, each with its digest (BLAKE3: written by value)
    shards = sorted(n for n in newest.files if n.endswith(".distcp"))
    assert len(shards) == 2 and all(len(newest.files[n]["blake3"]) == 64 for n in shards)
    assert torch.load(Store(url).path("jobs", "job", "ckpt", f"{newest.seq:08d}", "state.pt")) == MARKER

    for world in (1, 3):
        loaded = _load(tmp_path, url, world)
        for r, got in enumerate(loaded):
            assert got["seq"] == newest.seq and got["step"] == 4
            assert torch.equal(got["full"], _full(4)), f"{world} process(es), rank {r}"
        assert sum(got["local_rows"] for got in loaded) == ROWS  # resharded, not replicated


def test_a_damaged_shard_makes_every_process_take_the_previous_checkpoint(tmp_path: Path) -> None:
    url = _save(tmp_path, 2, [3, 4])
    newest = _manifests(url)[0]
    shard = sorted(n for n in newest.files if n.endswith(".distcp"))[1]
    path = Path(Store(url).path("jobs", "job", "ckpt", f"{newest.seq:08d}", shard))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    loaded = _load(tmp_path, url, 2)
    for got in loaded:  # both fall back, though only one file of one process is damaged
        assert got["step"] == 3 and torch.equal(got["full"], _full(3))
    assert any("do not match the manifest" in r for got in loaded for r in got["invalid"])


def test_a_process_that_dies_before_uploading_leaves_no_manifest(tmp_path: Path) -> None:
    url = _save(tmp_path, 2, [3, 4], die_at=4)
    assert [m.step for m in _manifests(url)] == [3]  # the save of step 4 never committed
    loaded = _load(tmp_path, url, 1)
    assert loaded[0]["step"] == 3 and torch.equal(loaded[0]["full"], _full(3))


def test_a_process_whose_upload_fails_fails_the_save_for_all_and_commits_nothing(tmp_path: Path) -> None:
    url = _save(tmp_path, 2, [3, 4, 5], full_at=4)
    saved = [json.loads((tmp_path / f"saved-{r}.json").read_text()) for r in range(2)]
    # both processes learn the save of step 4 failed (and go on: step 5 commits)
    assert [s["seqs"][1] for s in saved] == [None, None]
    assert saved[0]["seqs"][2] == saved[1]["seqs"][2] is not None
    assert any("No space left" in f for f in saved[1]["failed"])
    assert [m.step for m in _manifests(url)] == [5, 3]


def test_no_sharded_checkpoint_loads_nothing_and_leaves_the_state(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    loaded = _load(tmp_path, url, 1)
    assert loaded[0]["seq"] is None and loaded[0]["step"] == -1


@pytest.fixture(autouse=True)
def _no_gpu_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
