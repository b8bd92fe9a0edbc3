"""Sharded (DCP) checkpoints (issue 11): the training thread's stall per save, synchronous
against background saves, and the bytes each process fetches at restore. Prints; asserts
nothing.

    python benchmarks/bench_sharded.py                 # 2 processes, 300 MB state
    python benchmarks/bench_sharded.py --mb 600 --saves 6

2 forked processes (gloo, CPU) hold a state of `--mb` MB as `--tensors` fp32 tensors sharded
row-wise (`DTensor`, as FSDP shards them) and the step, on a local store. Between saves each
process "trains" for `--work` ms (matrix products, changing the state in place).

* **stall**: the time `save` (sync: write, hash, upload and commit, then return) or
  `save_async` (the copy to host RAM; the rest in the background) blocks the training
  thread; median of the saves after the first (the first allocates the staging buffers);
  ÷ RAM copy divides by one `clone()` of the process's shard.
* **fetched**: the bytes each restoring process downloaded (`ShardedCheckpointer.fetched_bytes`),
  against what the restore before fetched (every DCP file of the checkpoint, on every process),
  restoring on 2 processes (the same layout) and on 1 and 3 (resharded).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spotnb.core.sizes import human_bytes  # noqa: E402
from spotnb.core.store import Store  # noqa: E402
from spotnb.runtime.checkpoint.checkpointer import Checkpointer  # noqa: E402
from spotnb.runtime.checkpoint.sharded import SHARD_DIR, ShardedCheckpointer  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mesh(rank: int, world: int, port: int) -> Any:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)  # forked: the parent's thread pool is not ours
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


def _shapes(mb: int, tensors: int) -> list[tuple[int, int]]:
    cols = 1024
    rows = max(2, mb * 2**20 // 4 // cols // tensors // 6 * 6)  # divisible by 1, 2 and 3
    return [(rows, cols)] * tensors


def _state(mesh: Any, shapes: list[tuple[int, int]], fill: float) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    out: dict[str, Any] = {
        f"w{i}": distribute_tensor(torch.full(s, fill + i), mesh, [Shard(0)]) for i, s in enumerate(shapes)
    }
    out["step"] = 0
    return out


def _train(state: dict[str, Any], ms: float) -> None:
    """About `ms` of work that changes the state in place, as a training step does."""
    a = torch.randn(256, 256)
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)
    for k, v in state.items():
        if k != "step":
            v.to_local().add_(1.0)


def _save_worker(rank: int, world: int, port: int, url: str, args: dict[str, Any], out: str) -> None:
    import torch.distributed as dist

    mesh = _mesh(rank, world, port)
    shapes = _shapes(args["mb"], args["tensors"])
    state = _state(mesh, shapes, 1.0)
    t = time.perf_counter()
    for v in state.values():
        if not isinstance(v, int):
            v.to_local().clone()
    copy_s = time.perf_counter() - t
    report: dict[str, Any] = {"copy_s": copy_s}
    step = 0
    for mode in ("sync", "async"):
        ck = Checkpointer(Store(url), "bench", 1, lambda _e: None, keep_last=2)
        sharded = ShardedCheckpointer(ck)
        stalls, copies = [], []
        dist.barrier()
        t_mode = time.perf_counter()
        for _ in range(args["saves"]):
            _train(state, args["work"])
            step += 1
            state["step"] = step
            t = time.perf_counter()
            if mode == "sync":
                sharded.save(state, step)
            else:
                sharded.save_async(state, step)
            stalls.append(time.perf_counter() - t)
            copies.append(sharded.stall_s if mode == "async" else stalls[-1])
        sharded.wait()
        report[mode] = {"stalls": stalls, "copies": copies, "wall_s": time.perf_counter() - t_mode}
        ck.close()
    Path(out, f"save-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def _load_worker(rank: int, world: int, port: int, url: str, args: dict[str, Any], out: str) -> None:
    import torch.distributed as dist

    mesh = _mesh(rank, world, port)
    state = _state(mesh, _shapes(args["mb"], args["tensors"]), 0.0)
    ck = Checkpointer(Store(url), "bench", 2, lambda _e: None)
    sharded = ShardedCheckpointer(ck)
    t = time.perf_counter()
    manifest = sharded.load(state)
    took = time.perf_counter() - t
    assert manifest is not None
    everything = sum(m["size"] for n, m in manifest.files.items() if n.startswith(f"{SHARD_DIR}/"))
    Path(out, f"load-{world}-{rank}.json").write_text(
        json.dumps(
            {"fetched": sharded.fetched_bytes, "before": everything, "files": len(sharded.fetched), "s": took}
        )
    )
    ck.close()
    dist.destroy_process_group()


def _run(fn: Any, world: int, url: str, args: dict[str, Any], out: str) -> None:
    mp.start_processes(
        fn, args=(world, _free_port(), url, args, out), nprocs=world, start_method="fork", join=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="state size, MB (all processes)")
    parser.add_argument("--tensors", type=int, default=6)
    parser.add_argument("--saves", type=int, default=5, help="saves per mode")
    parser.add_argument("--work", type=float, default=1000.0, help="ms of training between saves")
    ns = parser.parse_args()
    args = vars(ns)
    with tempfile.TemporaryDirectory(prefix="bench-sharded-") as tmp:
        url = Path(tmp, "store").as_uri()
        _run(_save_worker, 2, url, args, tmp)
        saves = [json.loads(Path(tmp, f"save-{r}.json").read_text()) for r in range(2)]
        print(
            f"state {ns.mb} MB over 2 processes, {ns.saves} saves per mode, {ns.work:.0f} ms of work between"
        )
        print("| mode | stall, 1st | stall, later (median) | of it, the copy | ÷ RAM copy | wall |")
        print("|---|---:|---:|---:|---:|---:|")
        for mode in ("sync", "async"):
            first = max(s[mode]["stalls"][0] for s in saves)
            later = max(statistics.median(s[mode]["stalls"][1:]) for s in saves)
            staged = max(statistics.median(s[mode]["copies"][1:]) for s in saves)
            copy = max(s["copy_s"] for s in saves)
            wall = max(s[mode]["wall_s"] for s in saves)
            print(
                f"| {mode} | {first * 1e3:.0f} ms | {later * 1e3:.0f} ms | {staged * 1e3:.0f} ms "
                f"| {later / copy:.2f} | {wall:.2f} s |"
            )
        print()
        print("| restore on | process | fetched before | fetched now | files now | restore |")
        print("|---|---:|---:|---:|---:|---:|")
        for world in (2, 1, 3):
            _run(_load_worker, world, url, args, tmp)
            for r in range(world):
                got = json.loads(Path(tmp, f"load-{world}-{r}.json").read_text())
                print(
                    f"| {world} | {r} | {human_bytes(got['before'])} | {human_bytes(got['fetched'])} "
                    f"| {got['files']} | {got['s']:.2f} s |"
                )


if __name__ == "__main__":
    main()
