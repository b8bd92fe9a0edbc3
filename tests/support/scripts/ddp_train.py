"""A torchrun DDP script as people write them (gloo, CPU), plus spotnb's ctx: every `every`
steps rank 0 saves `ckpt/state.pt` and backs the folder up; every run resumes from that file.

Its arithmetic is exact: sample i of step s adds c(s, i) / 8 to weight i whatever the world size
(each rank takes its share of the 8 samples and DDP averages), with every value a multiple of
1/8, so the final weights say to the bit whether each step was applied exactly once.

    python -m torch.distributed.run --nproc-per-node=2 ddp_train.py STEPS CKPT EVERY DELAY [bugR]

(`bugR`: rank R raises at step 5.)
"""

import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist

import spotnb

steps, out, every, delay = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
fail = sys.argv[5] if len(sys.argv) > 5 else ""
try:
    ctx = spotnb.ctx()
except spotnb.SpotnbError:
    ctx = None  # plain torchrun
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
WIDTH = 8


def c(step: int, i: int) -> int:
    return (step % 7) + i + 1


model = torch.nn.Linear(WIDTH, 1, bias=False).double()
torch.nn.init.zeros_(model.weight)
path = os.path.join(out, "state.pt")
start = 0
if os.path.exists(path):
    saved = torch.load(path)
    start = saved["step"]
    with torch.no_grad():
        model.weight.copy_(saved["weight"])
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=1.0)
mine = [i for i in range(WIDTH) if i % world == rank]
step = start
while step < steps:
    with ctx.step() if ctx else contextlib.nullcontext():
        if fail.startswith("bug") and rank == int(fail[3:] or 0) and step == 5:  # "bug1": rank 1
            raise ValueError(f"a bug in the script at step {step}")
        x = torch.zeros(len(mine), WIDTH, dtype=torch.float64)
        for row, i in enumerate(mine):
            x[row, i] = float(c(step, i))
        loss = -(ddp(x).sum() * world / WIDTH)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if ctx:
            ctx.log(loss=float(loss.item()), world=world)
        time.sleep(delay)
    if step % every == 0 or (ctx and ctx.should_save()):  # the policy's saves, a notice's
        if rank == 0:
            os.makedirs(out, exist_ok=True)
            torch.save({"step": step, "weight": model.weight.detach().clone()}, path + ".tmp")
            os.replace(path + ".tmp", path)
        if ctx:
            ctx.backup(out)  # rank 0's is the job's checkpoint; the others' do nothing
weights = model.weight.detach().flatten().tolist()
everyone: list = [None] * world
dist.all_gather_object(everyone, weights)
result = {"weights": weights, "agree": all(w == weights for w in everyone), "world": world, "start": start}
if ctx:
    ctx.set_result(result)  # rank 0's is the job's result
elif rank == 0:
    print(result)
dist.destroy_process_group()
