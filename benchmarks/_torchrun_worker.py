"""The torchrun-elastic side of benchmarks/bench_elastic.py: plain DDP on gloo, a checkpoint
every CKPT_EVERY steps from rank 0 (torch.save, atomic rename), restored at every (re)start —
what torchrun elastic, SkyPilot and SageMaker do after a lost node. Appends one JSON line per
committed step to $BENCH_LOG."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _elastic_workload import STEP_SLEEP, batch, make_model  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    steps, ckpt_every = int(os.environ["BENCH_STEPS"]), int(os.environ["BENCH_CKPT_EVERY"])
    path, log_path = os.environ["BENCH_CKPT"], os.environ["BENCH_LOG"]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    if os.path.exists(path):
        state = torch.load(path, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    with open(log_path, "a") as log:
        log.write(
            json.dumps({"event": "start", "rank": rank, "world": world, "step": step, "t": time.time()})
            + "\n"
        )
        while step < steps:
            x, y = batch(step, rank, world)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            time.sleep(STEP_SLEEP)
            log.write(
                json.dumps({"step": step, "rank": rank, "world": world, "t": time.time(), "pid": os.getpid()})
                + "\n"
            )
            log.flush()
            if rank == 0 and step % ckpt_every == 0:
                torch.save(
                    {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, path + ".tmp"
                )
                os.replace(path + ".tmp", path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
