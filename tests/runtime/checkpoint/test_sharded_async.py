"""Sharded (DCP) checkpoints saved in the background and restored by fetching only what each
process reads: real forked processes, gloo on CPU, a real store on disk (forked as in
`test_sharded.py`: a spawned process imports torch again).

The upload is held back by an event the training thread sets after it has trained on (so
the test shows the step went on while the shard was not yet up, without a clock); a process
that dies inside its upload leaves no manifest; a restore on the same number of processes
fetches only the process's own shard, and still falls back together when that shard is
damaged."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from spotnb.core.store import Store
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.checkpoint.manifest import Manifest
from spotnb.runtime.checkpoint.sharded import SHARD_DIR, ShardedCheckpointer
from tests.support.jobs import EventList, free_port, gloo_mesh

# 128 kB per process's shard on 2 processes: above the small-entry threshold (64 kB)
ROWS, COLS = 128, 512
HELD = 30.0  # the most a held upload waits for the training thread: a synchronous save fails


def _full(step: int) -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) + 1000 * step


def _state(mesh: Any, step: int) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    return {"w": distribute_tensor(_full(step), mesh, [Shard(0)]), "step": step}


def _checkpointer(url: str, incarnation: int, events: EventList) -> Checkpointer:
    return Checkpointer(Store(url), "job", incarnation, events, keep_last=5)


def _async_worker(rank: int, world: int, port: int, url: str, out: str, die_in_upload: bool) -> None:
    """Save step 3 and wait; save step 4 in the background with the upload held until the
    training thread has changed the weights in place (a training step); report."""
    import torch.distributed as dist

    mesh = gloo_mesh(rank, world, port)
    events = EventList()
    ck = _checkpointer(url, 1, events)
    sharded = ShardedCheckpointer(ck)
    first = sharded.save(_state(mesh, 3), 3)
    trained = threading.Event()
    upload = ck._upload

    def held(*args: Any, **kw: Any) -> Any:
        if die_in_upload and rank == world - 1:
            os._exit(9)  # preempted mid-upload, after DCP wrote the shard
        if not trained.wait(HELD):
            raise TimeoutError("the training thread never went on: the save was not asynchronous")
        return upload(*args, **kw)

    ck._upload = held  # type: ignore[method-assign]
    state = _state(mesh, 4)
    future = sharded.save_async(state, 4)
    pending = not future.done()  # the shard is not up yet, and we are back to training
    state["w"].to_local().add_(7.0)  # the next step changes the weights in place
    trained.set()
    second = future.result(timeout=120)
    failed = [e.error for e in events if e.kind == "checkpoint_failed"]
    report = {
        "first": first.seq if first else None,
        "second": second.seq if second else None,
        "pending": pending,
        "stall": sharded.stall_s,
        "failed": failed,
    }
    Path(out, f"async-{rank}.json").write_text(json.dumps(report))
    if die_in_upload:
        os._exit(0)  # its peer is gone: the training group cannot be torn down cleanly
    ck.close()
    dist.destroy_process_group()


def _load_worker(rank: int, world: int, port: int, url: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = gloo_mesh(rank, world, port)
    events = EventList()
    ck = _checkpointer(url, 2, events)
    state: dict[str, Any] = {"w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(0)]), "step": -1}
    sharded = ShardedCheckpointer(ck)
    manifest = sharded.load(state)
    torch.save(
        {
            "seq": None if manifest is None else manifest.seq,
            "step": state["step"],
            "full": state["w"].full_tensor(),
            "fetched": dict(sharded.fetched),
            "invalid": [e.reason for e in events if e.kind == "checkpoint_invalid"],
        },
        Path(out, f"loaded-{rank}.pt"),
    )
    ck.close()
    dist.destroy_process_group()


def _run(fn: Any, world: int, *args: Any) -> None:
    mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, start_method="fork", join=True)


def _run_tolerating_death(fn: Any, world: int, *args: Any) -> None:
    """Run `world` processes where one is meant to die; the survivors run to their end (not
    `mp.start_processes`, which terminates them once one process has failed)."""
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    port = free_port()
    procs = [fork.Process(target=fn, args=(r, world, port, *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    hung = [p for p in procs if p.exitcode is None]
    for p in hung:
        p.kill()
        p.join()
    assert not hung, "a survivor hung instead of failing its save"


def _load(tmp_path: Path, url: str, world: int) -> list[dict[str, Any]]:
    _run(_load_worker, world, url, str(tmp_path))
    return [torch.load(tmp_path / f"loaded-{r}.pt") for r in range(world)]


def _manifests(url: str) -> list[Manifest]:
    ck = Checkpointer(Store(url), "job", 9, EventList())
    try:
        return ck.list_manifests()
    finally:
        ck.close()


def _big(rank: int) -> str:
    """The file of process `rank`'s tensors (its small entries are in `__<rank>_1`)."""
    return f"{SHARD_DIR}/__{rank}_0.distcp"


def test_training_goes_on_while_the_shards_upload_and_the_commit_restores_exactly(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    _run(_async_worker, 2, url, str(tmp_path), False)
    reports = [json.loads((tmp_path / f"async-{r}.json").read_text()) for r in range(2)]
    for r in reports:  # back to training before the upload: the upload waited for a step
        assert r["pending"] and not r["failed"], r
        assert r["second"] is not None and r["second"] == reports[0]["second"] > r["first"]
    newest = _manifests(url)[0]
    assert newest.step == 4 and newest.seq == reports[0]["second"]
    for world in (2, 1):  # the weights of the save, not those changed after it
        for got in _load(tmp_path, url, world):
            assert got["step"] == 4 and torch.equal(got["full"], _full(4)), world


def test_a_process_that_dies_mid_upload_commits_nothing_and_the_previous_restores(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    _run_tolerating_death(_async_worker, 2, url, str(tmp_path), True)
    survivor = json.loads((tmp_path / "async-0.json").read_text())
    assert survivor["first"] is not None and survivor["second"] is None
    assert survivor["failed"], "the survivor says its save failed"
    assert [m.step for m in _manifests(url)] == [3]
    (got,) = _load(tmp_path, url, 1)
    assert got["step"] == 3 and torch.equal(got["full"], _full(3))


def _save_two(tmp_path: Path) -> str:
    """Steps 3 and 4, each by 2 processes (background saves, the upload not held)."""
    url = (tmp_path / "store").as_uri()
    _run(_save_worker, 2, url)
    return url


def _save_worker(rank: int, world: int, port: int, url: str) -> None:
    import torch.distributed as dist

    mesh = gloo_mesh(rank, world, port)
    ck = _checkpointer(url, 1, EventList())
    sharded = ShardedCheckpointer(ck)
    for step in (3, 4):
        sharded.save_async(_state(mesh, step), step)
    sharded.wait()
    ck.close()
    dist.destroy_process_group()


def test_a_restore_on_as_many_processes_fetches_only_each_ones_shard(tmp_path: Path) -> None:
    url = _save_two(tmp_path)
    newest = _manifests(url)[0]
    # a save asked for while the previous one uploads waits for it: both commit
    assert [m.step for m in _manifests(url)] == [4, 3]
    loaded = _load(tmp_path, url, 2)
    for rank, got in enumerate(loaded):
        assert got["step"] == 4 and torch.equal(got["full"], _full(4))
        big = {n for n in got["fetched"] if n.endswith("_0.distcp")}
        assert big == {_big(rank)}, got["fetched"]  # not the other process's shard
        # everything else it fetched is small: the metadata and the small entries' files
        rest = sum(v for n, v in got["fetched"].items() if n not in big)
        assert rest < newest.files[_big(rank)]["size"] // 10, got["fetched"]
    # on one process, the one process reads (and fetches) both shards
    (alone,) = _load(tmp_path, url, 1)
    assert {_big(0), _big(1)} <= set(alone["fetched"])


def test_a_damaged_shard_only_one_process_reads_still_sends_both_back_together(tmp_path: Path) -> None:
    url = _save_two(tmp_path)
    newest = _manifests(url)[0]
    path = Path(Store(url).path("jobs", "job", "ckpt", f"{newest.seq:08d}", _big(1)))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    loaded = _load(tmp_path, url, 2)
    for got in loaded:  # process 0 never fetched the damaged file, yet it falls back too
        assert got["step"] == 3 and torch.equal(got["full"], _full(3))
    assert _big(1) not in loaded[0]["fetched"]
    assert any("do not match the manifest" in r for r in loaded[1]["invalid"])


def _full_disk_worker(rank: int, world: int, port: int, url: str, out: str) -> None:
    """Steps 3, 4 and 5 in the background; the spool disk of the last process is full while
    DCP writes its shard of step 4 (before any upload)."""
    import torch.distributed as dist

    from spotnb.runtime.checkpoint import sharded as sharded_mod

    mesh = gloo_mesh(rank, world, port)
    events = EventList()
    ck = _checkpointer(url, 1, events)
    sharded = ShardedCheckpointer(ck)
    write = sharded_mod._SplitWriter.write_data
    seqs = []
    for step in (3, 4, 5):
        if step == 4 and rank == world - 1:

            def full(*_: Any, **__: Any) -> Any:
                raise OSError(28, "No space left on device")

            sharded_mod._SplitWriter.write_data = full  # type: ignore[method-assign]
        future = sharded.save_async(_state(mesh, step), step)
        manifest = future.result(timeout=120)
        sharded_mod._SplitWriter.write_data = write  # type: ignore[method-assign]
        seqs.append(None if manifest is None else manifest.seq)
    failed = [e.error for e in events if e.kind == "checkpoint_failed"]
    Path(out, f"disk-{rank}.json").write_text(json.dumps({"seqs": seqs, "failed": failed}))
    ck.close()
    dist.destroy_process_group()


def test_a_full_spool_disk_on_one_process_fails_that_save_for_all_and_the_next_commits(
    tmp_path: Path,
) -> None:
    url = (tmp_path / "store").as_uri()
    _run(_full_disk_worker, 2, url, str(tmp_path))
    reports = [json.loads((tmp_path / f"disk-{r}.json").read_text()) for r in range(2)]
    assert [r["seqs"][1] for r in reports] == [None, None]  # nobody commits step 4
    assert reports[0]["seqs"][2] == reports[1]["seqs"][2] is not None
    assert any("No space left" in f for r in reports for f in r["failed"])
    assert [m.step for m in _manifests(url)] == [5, 3]
    (got,) = _load(tmp_path, url, 1)
    assert got["step"] == 5 and torch.equal(got["full"], _full(5))


def _budget_worker(rank: int, world: int, port: int, url: str, out: str) -> None:
    import torch.distributed as dist

    mesh = gloo_mesh(rank, world, port)
    ck = Checkpointer(Store(url), "job", 1, EventList(), snapshot_memory=4096)
    sharded = ShardedCheckpointer(ck)
    future = sharded.save_async(_state(mesh, 3), 3)
    done = future.done()  # no copy fits the budget: written from the live state, waited for
    manifest = future.result(timeout=120)
    Path(out, f"budget-{rank}.json").write_text(json.dumps({"done": done, "seq": manifest and manifest.seq}))
    ck.close()
    dist.destroy_process_group()


def test_a_shard_larger_than_the_snapshot_budget_is_saved_in_place_without_a_copy(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    _run(_budget_worker, 2, url, str(tmp_path))
    reports = [json.loads((tmp_path / f"budget-{r}.json").read_text()) for r in range(2)]
    assert all(r["done"] and r["seq"] is not None for r in reports), reports
    (got,) = _load(tmp_path, url, 1)
    assert got["step"] == 3 and torch.equal(got["full"], _full(3))


def _misfit_worker(rank: int, world: int, port: int, url: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = gloo_mesh(rank, world, port)
    ck = _checkpointer(url, 2, EventList())
    state = _state(mesh, 0)
    state["head"] = distribute_tensor(torch.zeros(4, 4), mesh, [Shard(0)])  # tracked since the save
    try:
        ShardedCheckpointer(ck).load(state)
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    Path(out, f"misfit-{rank}.json").write_text(json.dumps({"error": error}))
    ck.close()
    dist.destroy_process_group()


def test_a_state_the_checkpoint_does_not_hold_fails_the_restore_on_every_process(tmp_path: Path) -> None:
    """Not a damaged checkpoint (its files verify): falling back to an older one, or to step
    0, would lose the job's progress without a word."""
    url = _save_two(tmp_path)
    _run(_misfit_worker, 2, url, str(tmp_path))
    for r in range(2):
        error = json.loads((tmp_path / f"misfit-{r}.json").read_text())["error"]
        assert "does not fit the tracked state" in error and "head" in error, error


def _old_format_worker(rank: int, world: int, port: int, url: str) -> None:
    """Saves as the version before the split did: one file per process holding everything."""
    import torch.distributed as dist

    from spotnb.runtime.checkpoint import sharded as sharded_mod

    sharded_mod._SplitWriter = sharded_mod.dcp.FileSystemWriter  # type: ignore[misc, assignment]
    mesh = gloo_mesh(rank, world, port)
    ck = _checkpointer(url, 1, EventList())
    ShardedCheckpointer(ck).save(_state(mesh, 3), 3)
    ck.close()
    dist.destroy_process_group()


def test_a_checkpoint_of_the_format_before_restores_on_as_many_and_on_one_process(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    _run(_old_format_worker, 2, url)
    (manifest,) = _manifests(url)
    assert sorted(n for n in manifest.files if n.endswith(".distcp")) == [_big(0), _big(1)]
    for world in (2, 1):
        loaded = _load(tmp_path, url, world)
        for got in loaded:
            assert got["step"] == 3 and torch.equal(got["full"], _full(3))
        # the step lives in one process's only file: the other fetches that whole shard for
        # it (what the small-entries file avoids)
        assert any({_big(0), _big(1)} <= set(got["fetched"]) for got in loaded)


@pytest.fixture(autouse=True)
def _no_gpu_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
