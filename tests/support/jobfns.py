"""Training functions the core tests ship to local instances (importable by the agent, since
the tests run from the repository root; cloudpickle ships them by reference or value)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any


def refuse_first_move_commit(ctx: Any, until_next_gives_up: bool = False) -> None:
    """The store refuses (ENOSPC, a full disk) the commit of the first checkpoint saved after a
    request to move: the move's save fails the way a store failure makes it fail.
    `until_next_gives_up`: the refusal comes only once the move's new instance has given up
    waiting for this one (its warning is in the store), a store that hangs that long first."""
    store = ctx._ckpt.store
    real = store.write_bytes
    refused: list[str] = []

    def gave_up() -> bool:
        store.invalidate()
        folder = store.job(ctx.job_id, "events")
        for path in store.fs.glob(f"{folder}/{ctx.incarnation + 1:04d}-agent*"):
            if b'"warning"' in store.fs.cat_file(path):
                return True
        return False

    def write_bytes(path: str, data: bytes) -> None:
        notice = ctx.notice
        if not refused and path.endswith("MANIFEST.json") and notice is not None and notice.source == "move":
            refused.append(path)
            deadline = time.monotonic() + 120
            while until_next_gives_up and not gave_up() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise OSError(28, "No space left on device", path)
        real(path, data)

    store.write_bytes = write_bytes


def seeded_mlp(
    ctx: Any,
    steps: int = 200,
    width: int = 512,
    step_delay: float = 0.0,
    hold_at: int | None = None,
    fail_move_save: bool = False,
    next_gives_up: bool = False,
) -> dict[str, Any]:
    """An MLP with dropout and Adam: exercises model, optimizer and torch/python RNG restore.
    `hold_at`: the first instance waits at that step until it is asked to leave (a notice or a
    move), so that what happens next does not depend on how fast this machine is.
    `fail_move_save`: the first save after a request to move fails (`refuse_first_move_commit`),
    once the move's new instance gave up waiting if `next_gives_up`.

    One intra-op thread: with two, MKL's float results on a heavily loaded CPU differ from an
    idle run in the last bit from the first step on (measured: 16 of 16 concurrent jobs
    diverged at 1 ulp with 2 threads, 0 of 16 with 1, before any preemption), which a
    bit-exact comparison with the reference run would blame on resume."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, width),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ctx.track(model=model, optimizer=opt)
    if fail_move_save:
        refuse_first_move_commit(ctx, until_next_gives_up=next_gives_up)
    for step in ctx.steps(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 32, generator=g)
        y = x[:, :1] * 2 + random.random() * 0.01  # python RNG is restored too
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
        if step_delay:
            time.sleep(step_delay)
        if step == hold_at and ctx.incarnation == 1:
            deadline = time.monotonic() + 300
            while ctx.notice is None and time.monotonic() < deadline:
                time.sleep(0.01)
    return {"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "loss": loss.item()}


def slow_steps(ctx: Any, steps: int = 400, step_time: float = 0.02, hold_at: int | None = None) -> int:
    """Small state, steps of known duration: for notice and breakdown tests. `hold_at`: the
    first incarnation waits at that step until the market kills it or sends a notice
    (`hold_for_the_market`)."""
    import torch

    model = torch.nn.Linear(8, 8)
    ctx.track(model=model)
    for step in ctx.steps(steps):
        time.sleep(step_time)
        ctx.log(step_value=float(step))
        if step == hold_at and ctx.incarnation == 1:
            hold_for_the_market(ctx)
    return ctx.step_index


def hold_for_the_market(ctx: Any, timeout: float = 120) -> None:
    """Wait inside the current step until the market kills this instance (the kill ends the
    wait) or a notice comes, at most `timeout` s. A kill scheduled at a step lands when the
    market's injector, which looks at the beacon about every millisecond, sees that step: on a
    loaded machine it may look only after the last of a few fast steps, and the job ends
    unpreempted. Held at the step, the kill lands there whatever the load."""
    deadline = time.monotonic() + timeout
    while ctx.notice is None and time.monotonic() < deadline:
        time.sleep(0.01)


def wait_for_checkpoint(ctx: Any, store_root: str, step: int, timeout: float = 120) -> None:
    """Wait until this job's checkpoint of `step` is committed (its MANIFEST.json, written
    last, is in the store): a kill after this finds it, whatever the load. Saves upload in
    the background, and a job with fast steps reaches a scheduled kill before they land."""
    import glob
    import json
    import os

    pattern = os.path.join(store_root, "jobs", ctx.job_id, "ckpt", "*", "MANIFEST.json")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in glob.glob(pattern):
            try:
                with open(path, encoding="utf-8") as f:
                    if json.load(f).get("step") == step:
                        return
            except (OSError, ValueError):
                pass  # being written
        time.sleep(0.01)
    raise TimeoutError(f"no checkpoint of step {step} in {pattern} after {timeout} s")


class HoldInRestore:
    """A tracked object whose restore holds until the market kills the instance, so a kill
    scheduled for the restore phase lands there whatever the load (a small checkpoint loads
    in a few ms, which a busy machine's injector can miss). It holds only while the file
    `armed` exists: the job creates it before the restore it wants held and removes it in
    the incarnations that must go through (the kill may land before the hold starts)."""

    def __init__(self, armed: str) -> None:
        self.armed = armed

    def state_dict(self) -> dict[str, Any]:
        return {"gate": _Gate(self.armed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _Gate:
    def __init__(self, armed: str) -> None:
        self.armed = armed

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_open_gate, (self.armed,))


def _open_gate(armed: str, timeout: float = 120) -> _Gate:
    """Runs as the checkpoint unpickles, inside the restore phase."""
    import os

    deadline = time.monotonic() + timeout
    while os.path.exists(armed) and time.monotonic() < deadline:  # the kill ends the wait
        time.sleep(0.01)
    return _Gate(armed)


def fails_at(ctx: Any, step_fail: int = 5) -> None:
    for step in ctx.steps(100):
        if step == step_fail:
            raise ValueError(f"bad batch at step {step}")


def low_level(ctx: Any, steps: int = 60, path: str = "my_ckpt.txt") -> int:
    """The low-level API: the script writes its own checkpoint file and backs it up."""
    import os

    total = 0
    restored = ctx.restore()
    if restored is not None and os.path.exists(path):
        total = int(Path(path).read_text())
    while ctx.step_index < steps:
        with ctx.step() as i:
            total += i
            time.sleep(0.01)
        if ctx.should_save():
            with open(path, "w") as f:
                f.write(str(total))
            ctx.backup(path)
    return total


def exact_dp(ctx: Any, steps: int = 60, step_delay: float = 0.02, width: int = 8) -> dict[str, Any]:
    """Data parallel whose arithmetic is exact, so 'each step's global batch applied exactly
    once' can be checked to the bit: sample i of step s adds c(s, i) / width to weight i
    (`exact_dp_expected`), whatever the quorum, with every value a multiple of 1/8 (width 8).
    Each replica logs a checksum of its weights at the end (`final`)."""
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Linear(width, 1, bias=False).double()
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(steps):
        r, n = ctx.replica, ctx.replicas
        mine = [i for i in range(width) if i % n == r]  # this replica's share of the batch
        x = torch.zeros(len(mine), width, dtype=torch.float64)
        for row, i in enumerate(mine):
            x[row, i] = float(exact_c(step, i))
        loss = -(model(x).sum() * n / width) if mine else model.weight.sum() * 0.0
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=float(loss.item()), replicas=n)
        if step_delay:
            time.sleep(step_delay)
    weights = model.weight.detach().flatten().tolist()
    ctx.log(final=sum(w * (k + 1) for k, w in enumerate(weights)))
    return {"weights": weights, "step": ctx.step_index}


def batchnorm_dp(ctx: Any, steps: int = 30) -> dict[str, Any]:
    """A model with BatchNorm on several instances: each replica's forward passes see only its
    share of the batch (shifted per replica, so the shares' statistics differ), which moves its
    running statistics its own way. Each replica logs a checksum of its buffers (`buffers`)
    and of its weights (`final`) at the end."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(steps):
        g = torch.Generator().manual_seed(step * 100 + ctx.replica)
        x = torch.randn(16, 4, generator=g) + float(ctx.replica)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=float(loss.item()))
    bn = model[1]
    buffers = float((bn.running_mean * torch.arange(1, 9)).sum() + bn.running_var.sum())
    weights = sum(float(p.double().sum()) for p in model.parameters())
    ctx.log(buffers=buffers, final=weights)
    return {"buffers": buffers}


def exact_dp_slow_result(ctx: Any, steps: int, linger: float) -> dict[str, Any]:
    """`exact_dp`, but replica 0 takes `linger` seconds to return: a kill then lands after the
    last commit and before the job's result is written."""
    weights = exact_dp(ctx, steps=steps, step_delay=0.02)
    if ctx.replica == 0:
        time.sleep(linger)
    return weights


def exact_c(step: int, i: int) -> int:
    return (step % 7) + i + 1


def exact_dp_expected(steps: int, width: int = 8) -> list[float]:
    return [sum(exact_c(s, i) for s in range(steps)) / width for i in range(width)]


def misuse_replicate(ctx: Any, mistake: str) -> None:
    """Each way to get ctx.replicate wrong (tests/runtime/group/test_elastic.py: the error must say
    how to fix it)."""
    import torch

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if mistake == "twice":
        ctx.replicate(model, opt)
        ctx.replicate(model, opt)
    elif mistake == "after_track":
        ctx.track(model=model)
        ctx.replicate(model, opt)
    elif mistake == "no_replicate":
        ctx.track(model=model)
        for _ in ctx.steps(3):
            pass
    elif mistake == "no_step":
        model, opt = ctx.replicate(model, opt)
        ctx.track(model=model)
        for _ in ctx.steps(3):
            model(torch.ones(1, 2)).sum().backward()


def folder_trainer(ctx: Any, steps: int = 60, out: str = "out", base_bytes: int = 1 << 20) -> dict[str, Any]:
    """A trainer that keeps its own checkpoint folder, as Hugging Face's Trainer does:
    `out/base.bin` (frozen weights, written once), `out/checkpoint-<step>/state.txt` (a running
    total) and `out/latest`; it resumes from the newest `checkpoint-*` it finds in `out`, and
    backs the whole folder up with `ctx.backup(out)` when spotnb says a save is due."""
    import os
    import shutil

    total = 0
    if ctx.restore() is None:  # nothing committed yet: start afresh, as on a new instance
        shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    base = os.path.join(out, "base.bin")
    if not os.path.exists(base):
        with open(base, "wb") as f:
            f.write(bytes(range(256)) * (base_bytes // 256))
    found = sorted((int(n.split("-")[1]), n) for n in os.listdir(out) if n.startswith("checkpoint-"))
    resumed_from = found[-1][0] if found else 0
    if found:
        total = int(Path(out, found[-1][1], "state.txt").read_text())
    while ctx.step_index < steps:
        with ctx.step() as i:
            total += i
            time.sleep(0.01)
        if ctx.should_save():
            folder = os.path.join(out, f"checkpoint-{ctx.step_index}")
            os.makedirs(folder, exist_ok=True)
            Path(folder, "state.txt").write_text(str(total))
            Path(out, "latest").write_text(str(ctx.step_index))
            ctx.backup(out)
    return {"total": total, "resumed_from": resumed_from, "folders": sorted(os.listdir(out))}


def finish_when_moving(ctx: Any, steps: int = 100_000, step_time: float = 0.01) -> int:
    """Announces a long run, then finishes as soon as the controller starts allocating a move's
    new instance (its incarnation document, written before the launch), so the job ends
    before that instance is up."""
    store = ctx._ckpt.store
    nxt = store.job(ctx.job_id, "incarnations", f"{ctx.incarnation + 1:04d}.json")
    for step in ctx.steps(steps):
        time.sleep(step_time)
        store.invalidate()
        if store.exists(nxt):
            return step
    return steps


def lora_mlp(
    ctx: Any,
    steps: int = 120,
    width: int = 512,
    rank: int = 4,
    step_delay: float = 0.0,
    settle_at: int | None = None,
    hold_at: int | None = None,
) -> dict[str, Any]:
    """A LoRA-style fine-tune: a frozen base MLP (about 1.2 MB at width 512) and small trainable
    low-rank adapters on its hidden layer, Adam on the adapters only. `settle_at`: at that step
    the first instance waits until its checkpoint uploads are committed, so that a notice
    after it finds the base model in the store whatever this machine's speed. `hold_at`: there
    the first instance waits for a notice, so the step boundary that acts on it comes as soon
    as the notice is seen, however loaded the machine."""
    import torch

    torch.set_num_threads(1)  # bit-exact against the calm run (see seeded_mlp)
    torch.manual_seed(0)
    random.seed(0)
    model = torch.nn.ModuleDict(
        {
            "inp": torch.nn.Linear(64, width),
            "hidden": torch.nn.Linear(width, width),
            "out": torch.nn.Linear(width, 1),
            "down": torch.nn.Linear(width, rank, bias=False),
            "up": torch.nn.Linear(rank, width, bias=False),
        }
    )
    for name in ("inp", "hidden", "out"):
        model[name].requires_grad_(False)
    torch.nn.init.zeros_(model["up"].weight)
    adapters = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(adapters, lr=1e-2)
    ctx.track(model=model, optimizer=opt)
    loss = torch.zeros(())
    for step in ctx.steps(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(32, 64, generator=g)
        y = x[:, :1] * 2 + random.random() * 0.01
        h = torch.relu(model["inp"](x))
        h = torch.relu(model["hidden"](h) + model["up"](model["down"](torch.nn.functional.dropout(h, 0.1))))
        loss = torch.nn.functional.mse_loss(model["out"](h), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss.item())
        if step_delay:
            time.sleep(step_delay)
        if step == settle_at and ctx.incarnation == 1:
            ctx._ckpt.wait(timeout=60)
        if step == hold_at and ctx.incarnation == 1:
            deadline = time.monotonic() + 60
            while ctx.notice is None and time.monotonic() < deadline:
                time.sleep(0.005)
    return {"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "loss": loss.item()}


def who_started_me(
    ctx: Any, steps: int = 60, out: str = "", wait_for: str = "", hold_at: int | None = None
) -> int:
    """Writes, per incarnation, the instance's parent pid, its session and a draw of numpy's
    global generator to `out`/<incarnation>.json; the first incarnation waits at step 10 until
    the file `wait_for` exists (the test's signal that it may be preempted). `hold_at`: the
    first incarnation waits at that step until the market kills it (at most 120 s): its steps
    take microseconds, far less than the market's look at the beacon (`Injector`), so without
    the hold a kill scheduled for that step lands when the job has already run past it."""
    import json
    import os

    import numpy as np
    import torch

    model = torch.nn.Linear(4, 4)
    ctx.track(model=model)
    ppid = os.getppid()
    parent = Path(f"/proc/{ppid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    me = {"ppid": ppid, "parent": parent, "sid": os.getsid(0), "pid": os.getpid(), "draw": np.random.rand()}
    Path(out, f"{ctx.incarnation}.json").write_text(json.dumps(me))
    for step in ctx.steps(steps):
        if step == 10 and wait_for:
            deadline = time.monotonic() + 120
            while not Path(wait_for).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        if step == hold_at and ctx.incarnation == 1:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # the market's kill ends the wait
                time.sleep(0.01)
        ctx.log(step_value=float(step))
    return ctx.step_index
