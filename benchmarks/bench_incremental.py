"""Incremental checkpoints of a LoRA-style fine-tune (issue 11): bytes written per save, full
against incremental, and the training thread's stall. Prints; asserts nothing.

    python benchmarks/bench_incremental.py --lora                  # 200 MB frozen base
    python benchmarks/bench_incremental.py --lora --mb 1000 --saves 5

The model is a stack of frozen square Linear layers (the base, `--mb` of fp32) with a rank-8
adapter on each (trainable, Adam). Both savers are spotnb's `ctx.save` on a local store:

* **full**: no tensor is stored by content (`Incremental.blob_min` set past any tensor), so every
  save copies and writes the whole state, as before incremental saves;
* **incremental**: the default, so the base is written once and referenced afterwards.

Per save it prints the bytes written and referenced, the stall (the blocking part of
`ctx.save`, median of the saves after the first) and stall ÷ one RAM copy of the state, and the
upload time; then what an emergency save would need at 100 MB/s (the delta's bytes / bandwidth,
what the policy now compares with the notice).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_core import _Never, make_context  # noqa: E402

from spotnb.core.sizes import human_bytes  # noqa: E402
from spotnb.core.store import Store  # noqa: E402


class Lora(torch.nn.Module):
    """Frozen square layers adding up to about `mb` MB, a rank-`rank` adapter on each."""

    def __init__(self, mb: int, width: int = 1024, rank: int = 8) -> None:
        super().__init__()
        layers = max(1, round(mb * 1e6 / 4 / (width * width + width)))
        self.base = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(layers)])
        self.base.requires_grad_(False)
        self.down = torch.nn.ModuleList([torch.nn.Linear(width, rank, bias=False) for _ in range(layers)])
        self.up = torch.nn.ModuleList([torch.nn.Linear(rank, width, bias=False) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for base, down, up in zip(self.base, self.down, self.up, strict=True):
            x = torch.relu(base(x) + up(down(x)))
        return x


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    return []


def run(mode: str, mb: int, saves: int, steps: int) -> dict[str, list[float]]:
    torch.manual_seed(0)
    model = Lora(mb)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    folder = tempfile.mkdtemp(prefix="spotnb-bench-inc-")
    ctx, ckpt = make_context(Store(folder), _Never())
    if mode == "full":
        ckpt.incremental.blob_min = 2**62
    ctx.track(model=model, optimizer=opt)
    ctx.restore()
    x = torch.randn(16, model.base[0].in_features)
    out: dict[str, list[float]] = {"written": [], "referenced": [], "stall": [], "upload": [], "copy": []}
    try:
        for _ in range(saves):
            for _ in range(steps):
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            state = {"m": model.state_dict(), "o": opt.state_dict()}
            t0 = time.perf_counter()
            _copy = [v.clone() for d in (state["m"], state["o"]["state"]) for v in _tensors(d)]
            out["copy"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ctx.save("periodic")
            out["stall"].append(time.perf_counter() - t0)
            ckpt.wait()
            m = ckpt.committed[-1]
            out["written"].append(m.nbytes)
            out["referenced"].append(m.referenced)
            out["upload"].append(m.upload_s)
    finally:
        ckpt.close()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lora", action="store_true", help="the LoRA-style fine-tune (the only workload)")
    ap.add_argument("--mb", type=int, default=200, help="frozen base, MB of fp32")
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="training steps between saves")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {mode: run(mode, args.mb, args.saves, args.steps) for mode in ("full", "incremental")}
    print(f"LoRA-style fine-tune, {args.mb} MB frozen base, {args.saves} saves, local store")
    print(
        f"{'saver':<12} {'1st written':>12} {'later written':>14} {'later referenced':>17} "
        f"{'stall (later)':>14} {'÷ RAM copy':>11} {'upload (later)':>15} {'β at 100 MB/s':>14}"
    )
    for mode, r in results.items():
        later = slice(1, None)
        stall = statistics.median(r["stall"][later])
        copy = statistics.median(r["copy"][later])
        print(
            f"{mode:<12} {human_bytes(int(r['written'][0])):>12} "
            f"{human_bytes(int(statistics.median(r['written'][later]))):>14} "
            f"{human_bytes(int(statistics.median(r['referenced'][later]))):>17} "
            f"{stall * 1e3:>11.1f} ms {stall / copy:>11.3f} "
            f"{statistics.median(r['upload'][later]) * 1e3:>12.1f} ms "
            f"{statistics.median(r['written'][later]) / 100e6:>12.3f} s"
        )
    full, inc = (statistics.median(results[m]["written"][1:]) for m in ("full", "incremental"))
    print(f"bytes written per later save: incremental / full = {inc / full:.4f}")


if __name__ == "__main__":
    main()
