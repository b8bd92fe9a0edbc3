"""Training functions the GPU tests ship to local instances (importable by the agent: the tests
run from the repository root)."""

from __future__ import annotations

import os
import time
from typing import Any


def cuda_mlp(
    ctx: Any,
    steps: int = 160,
    width: int = 1024,
    amp: bool = True,
    fused: bool = True,
    hold_at: int | None = None,
    device: str = "cuda",
) -> dict[str, Any]:
    """A residual MLP with LayerNorm and dropout on the GPU, AdamW (fused or foreach), fp16
    autocast with a GradScaler: model, optimizer, scaler and the CUDA RNG (dropout) must all be
    restored for a resumed run to equal a calm one bit for bit. Deterministic algorithms: the
    same inputs give the same bits on the same GPU. `hold_at`: the first incarnation waits there
    for the market's notice (a test of the emergency save's time)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
    import torch

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    dev = torch.device(device)
    blocks = [
        torch.nn.Sequential(
            torch.nn.LayerNorm(width), torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Dropout(0.1)
        )
        for _ in range(4)
    ]
    model = torch.nn.ModuleList(blocks).to(dev)
    head = torch.nn.Linear(width, 1).to(dev)
    params = [*model.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=fused, foreach=None if fused else True)
    scaler = torch.amp.GradScaler(device, enabled=amp, init_scale=2.0**14, growth_interval=20)
    ctx.track(model=model, head=head, optimizer=opt, scaler=scaler)
    loss = torch.zeros((), device=dev)
    for step in ctx.steps(steps):
        g = torch.Generator(device=dev).manual_seed(step)
        x = torch.randn(256, width, device=dev, generator=g)
        y = x[:, :1] * 0.5
        with torch.autocast(device, dtype=torch.float16, enabled=amp):
            h = x
            for block in model:
                h = h + block(h)
            loss = torch.nn.functional.mse_loss(head(h).float(), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        ctx.log(loss=loss.item(), scale=scaler.get_scale())
        if step == hold_at and ctx.incarnation == 1:
            deadline = time.monotonic() + 300
            while ctx.notice is None and time.monotonic() < deadline:
                time.sleep(0.01)
    return {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "head": {k: v.detach().cpu() for k, v in head.state_dict().items()},
        "scaler": scaler.state_dict(),
        "rng": torch.cuda.get_rng_state().clone() if device == "cuda" else torch.get_rng_state(),
        "loss": loss.item(),
    }


def cuda_group_dp(ctx: Any, steps: int = 40, width: int = 8) -> dict[str, Any]:
    """Data parallel over every GPU of the instance (NCCL): exact arithmetic (multiples of 1/8
    in float64), so the result is known to the bit: sample i of step s adds (s + i) % 5 / width
    to weight i, whoever computed it."""
    import torch

    dev = ctx.device
    model = torch.nn.Linear(width, 1, bias=False).double().to(dev)
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model, opt = ctx.replicate(model, opt)
    ctx.track(model=model, optimizer=opt)
    for step in ctx.steps(steps):
        r, n = ctx.local_rank, ctx.local_world_size
        mine = [i for i in range(width) if i % n == r]
        x = torch.zeros(len(mine), width, dtype=torch.float64, device=dev)
        for row, i in enumerate(mine):
            x[row, i] = float((step + i) % 5)
        loss = -(model(x).sum() * n / width)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=float(loss.item()))
    return {"weights": model.weight.detach().cpu().flatten().tolist(), "ranks": ctx.local_world_size}


def cuda_group_expected(steps: int, width: int = 8) -> list[float]:
    return [sum((s + i) % 5 for s in range(steps)) / width for i in range(width)]
