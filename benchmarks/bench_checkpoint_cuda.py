"""spotnb's save on a GPU next to PyTorch's best (issue 26): `bench_checkpoint.py --device cuda`.
Prints; asserts nothing.

    python benchmarks/bench_checkpoint.py --device cuda                    # 2 GB and 10 GB
    python benchmarks/bench_checkpoint.py --device cuda --mb 2000 --optimizers adamw

The model is square 4096-wide linear layers on the GPU, sized so that what a checkpoint holds
(parameters and optimizer state) is `--mb` megabytes: SGD (momentum 0: the parameters alone)
and AdamW (fused: parameters and two moments, a third of the bytes each). Each saver saves the
model's and the optimizer's state dicts:

* **torch.save**: synchronous, from the GPU;
* **DCP async_save**: `torch.distributed.checkpoint.async_save` with its defaults (staged to
  fresh CPU memory before it returns, written in a thread);
* **DCP pinned**: `async_save` with `DefaultStager(StagingOptions(use_pinned_memory=True,
  use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=True))`, the way
  torchtitan configures it (pinned buffers reused from save to save, staging overlapped with
  the next forward and backward); like torchtitan, the next `optimizer.step()` first waits
  for the staging (`staging_completion`), and that wait counts as stall; a thread writes
  (torchtitan's process writer needs a process group);
* **spotnb**: `ctx.save()` with the model and optimizer tracked (the gated save: host copies
  on a side stream, the optimizer's kernels queued behind them).

Printed per size and optimizer:

* the floor: a pinned device-to-host copy of the checkpoint's tensors (buffers allocated
  beforehand), synchronised;
* stall per save (median of `--rounds`, after a warm-up save each): the wall of `save()` plus
  the next training step's excess over a normal step, both synchronised (`cuda.synchronize`);
  and that stall ÷ the pinned copy. Goal: spotnb ≤ 1.5× the pinned copy and below every peer;
* throughput: steps/s with a save every 10 steps ÷ steps/s without saves (`--steps` steps, the
  last save waited for), unless `--stall-only`;
* whether every save of spotnb's committed (a torn save is thrown away).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from bench_core import _Never, make_context

from spotnb.core.store import Store

warnings.filterwarnings("ignore", message="torch.distributed is disabled")
WIDTH = 4096
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Trainer:
    """The model, its optimizer and one batch, on `device`; `step(before_opt)` is one training
    step, `before_opt` called between backward and the optimizer's step (where torchtitan waits
    for DCP's staging)."""

    def __init__(self, mb: int, optimizer: str, device: str, batch: int) -> None:
        per_param = 3 if optimizer == "adamw" else 1  # bytes held per parameter byte
        layers = max(1, round(mb * 1e6 / per_param / LAYER_BYTES))
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = True  # the step time of a real fp32 run on a GPU
        self.model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)]).to(device)
        if optimizer == "adamw":
            fused = device == "cuda"
            self.opt: torch.optim.Optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6, fused=fused)
        else:
            self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-6)
        self.x = torch.randn(batch, WIDTH, device=device)
        self.step()  # AdamW's moments exist

    def step(self, before_opt: Callable[[], None] | None = None) -> None:
        loss = self.model(self.x).square().mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if before_opt is not None:
            before_opt()
        self.opt.step()

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a checkpoint of the model and optimizer holds."""
        out = list(self.model.state_dict().values())
        for st in self.opt.state.values():
            out += [v for v in st.values() if isinstance(v, torch.Tensor) and v.numel() > 1]
        return out

    def state(self) -> dict[str, Any]:
        # plain dicts: DCP's stager cannot copy the OrderedDict a module's state_dict is
        # (KeyError: <class 'type'>), so torchtitan hands it plain ones too
        return {"model": dict(self.model.state_dict()), "optim": self.opt.state_dict()}


class Saver:
    name = ""

    def __init__(self, trainer: Trainer, folder: str) -> None:
        self.t, self.folder = trainer, folder
        self.asked = 0

    def save(self, step: int) -> None:
        raise NotImplementedError

    def before_opt(self) -> None:
        """Called between backward and the next optimizer step."""

    @property
    def held(self) -> float:
        return 0.0

    @property
    def committed(self) -> int:
        return self.asked

    def finish(self) -> None:
        pass

    def close(self) -> None:
        self.finish()


class TorchSave(Saver):
    name = "torch.save"

    def save(self, step: int) -> None:
        path = os.path.join(self.folder, "ckpt.pt")
        torch.save(self.t.state(), path)
        os.unlink(path)


class DcpAsync(Saver):
    name = "DCP async_save"
    stager: Any = None

    def __init__(self, trainer: Trainer, folder: str) -> None:
        super().__init__(trainer, folder)
        self.upload: Any = None
        self.staging: Any = None
        self.path = ""

    def save(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        self.finish()  # DCP's rule: one async save in flight
        self.path = os.path.join(self.folder, f"dcp-{step}")
        kw = {"async_stager": self.stager} if self.stager is not None else {}
        got = dcp.async_save(self._state(), checkpoint_id=self.path, **kw)
        if hasattr(got, "upload_completion"):  # AsyncSaveResponse: staging may still run
            self.upload, self.staging = got.upload_completion, got.staging_completion
        else:
            self.upload, self.staging = got, None

    def _state(self) -> dict[str, Any]:
        """The state as torchtitan hands it to DCP: `get_state_dict`'s plain dicts, keyed by
        parameter name (torch 2.11's stager cannot copy a module's OrderedDict or the
        optimizer's own state_dict: KeyError <class 'type'>, seen on the H200)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.t.model, self.t.opt)
        return {"model": model, "optim": optim}

    def before_opt(self) -> None:
        if self.staging is not None:  # torchtitan's maybe_wait_for_staging
            t0 = time.perf_counter()
            self.staging.result()
            self._held = getattr(self, "_held", 0.0) + time.perf_counter() - t0
            self.staging = None

    @property
    def held(self) -> float:
        return getattr(self, "_held", 0.0)

    def finish(self) -> None:
        if self.upload is not None:
            self.upload.result()
            self.upload = None
            shutil.rmtree(self.path, ignore_errors=True)


class DcpPinned(DcpAsync):
    name = "DCP pinned"

    def __init__(self, trainer: Trainer, folder: str) -> None:
        super().__init__(trainer, folder)
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        cuda = torch.cuda.is_available()
        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=cuda,
            )
        )

    def close(self) -> None:
        super().close()
        self.stager.close()


class Spotnb(Saver):
    name = "spotnb"

    def __init__(self, trainer: Trainer, folder: str) -> None:
        super().__init__(trainer, folder)
        self.ctx, self.ckpt = make_context(Store(folder), _Never())
        self.ctx.track(model=trainer.model, opt=trainer.opt)
        self.ctx.restore()

    def save(self, step: int) -> None:
        self.ctx.save("periodic")

    @property
    def held(self) -> float:
        return self.ckpt.gate.waited

    @property
    def committed(self) -> int:
        return len(self.ckpt.committed)

    def finish(self) -> None:
        self.ckpt.wait()

    def close(self) -> None:
        self.finish()
        self.ckpt.close()


SAVERS: tuple[type[Saver], ...] = (TorchSave, DcpAsync, DcpPinned, Spotnb)


def pinned_copy(tensors: list[torch.Tensor], rounds: int = 5) -> float:
    """Seconds of one device-to-host copy of `tensors` into pinned buffers allocated beforehand
    (median): the floor of any save that must not let the optimizer overwrite the state first."""
    pin = torch.cuda.is_available()
    bufs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for t in tensors]
    times = []
    for _ in range(rounds):
        _sync()
        t0 = time.perf_counter()
        for b, t in zip(bufs, tensors, strict=True):
            b.copy_(t, non_blocking=pin)
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_time(t: Trainer, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        _sync()
        t0 = time.perf_counter()
        t.step()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stalls(t: Trainer, savers: list[Saver], rounds: int, normal: float) -> dict[str, list[float]]:
    """Per saver, each round: the synchronised wall of save() and the next step, minus a normal
    step. Rounds interleaved across savers; each saver's writing finishes before the next."""
    out: dict[str, list[float]] = {s.name: [] for s in savers}
    for r in range(rounds + 1):  # round 0 warms up (buffers, files, CUDA streams)
        for s in list(savers):
            try:
                _sync()
                t0 = time.perf_counter()
                s.save(r)
                t.step(s.before_opt)
                _sync()
                if r:
                    out[s.name].append(max(0.0, time.perf_counter() - t0 - normal))
                    print(f"    {s.name}: {out[s.name][-1] * 1e3:.0f} ms", flush=True)  # kept if cut off
                s.finish()
            except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, the rest go on
                print(f"    {s.name} FAILED: {type(exc).__name__}: {exc}", flush=True)
                savers.remove(s)
                del out[s.name]
    return out


def throughput(t: Trainer, saver: Saver | None, steps: int) -> float:
    """Steps per second with a save every 10 steps (none without a saver), the last save
    waited for."""
    _sync()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        t.step(saver.before_opt if saver is not None else None)
        if saver is not None and step % 10 == 0:
            saver.save(step)
            saver.asked += 1
    if saver is not None:
        saver.finish()
    _sync()
    return steps / (time.perf_counter() - t0)


def bench(
    mb: int,
    optimizer: str,
    device: str,
    rounds: int,
    steps: int,
    stall_only: bool,
    batch: int,
    only: tuple[str, ...] = (),
) -> dict[str, Any]:
    t = Trainer(mb, optimizer, device, batch)
    state_bytes = sum(x.nbytes for x in t.tensors())
    floor = pinned_copy(t.tensors())
    normal = step_time(t)
    print(
        f"\n== {optimizer}, {state_bytes / 1e9:.2f} GB of checkpoint ({device}): pinned D2H copy "
        f"{floor * 1e3:.0f} ms ({state_bytes / floor / 1e9:.0f} GB/s), step {normal * 1e3:.0f} ms ==",
        flush=True,
    )
    classes = [c for c in SAVERS if not only or c.name in only]
    folders = {c: tempfile.mkdtemp(prefix="spotnb-bench-cuda-") for c in classes}
    savers = [c(t, folders[c]) for c in classes]
    rates: dict[str, float] = {}
    committed: dict[str, str] = {}
    try:
        got = stalls(t, savers, rounds, normal)
        for s in savers:
            print(f"  stall {s.name:15} {statistics.median(got[s.name]) * 1e3:8.0f} ms  all "
                  f"{[round(v * 1e3) for v in got[s.name]]}", flush=True)  # fmt: skip
        if not stall_only:
            base = throughput(t, None, steps)
            for s in savers:
                s.asked = 0
                done0 = s.committed
                rates[s.name] = throughput(t, s, steps) / base
                committed[s.name] = f"{s.committed - done0}/{s.asked}"
    finally:
        for s in savers:
            s.close()
        for f in folders.values():
            shutil.rmtree(f, ignore_errors=True)
    print(f"{'':16}{'stall/save':>12}{'÷ pinned D2H':>14}{'throughput':>12}{'committed':>11}")
    rows = {}
    for s in savers:
        med = statistics.median(got[s.name])
        rows[s.name] = {"stall_ms": round(med * 1e3, 1), "x_pinned": round(med / floor, 2)}
        rate = f"{rates[s.name]:12.3f}" if s.name in rates else f"{'-':>12}"
        print(f"{s.name:16}{med * 1e3:10.0f}ms{med / floor:14.2f}{rate}{committed.get(s.name, '-'):>11}")
        if s.name in rates:
            rows[s.name]["throughput"] = round(rates[s.name], 3)
    if "spotnb" in rows:
        mine = rows["spotnb"]["x_pinned"]
        peers = [v["x_pinned"] for k, v in rows.items() if k != "spotnb"]
        failed = [c.name for c in classes if c.name not in rows]  # a peer that failed is no figure
        below = "yes" if all(mine < p for p in peers) else "NO"
        print(
            f"spotnb: {mine:.2f}× the pinned copy (goal ≤ 1.5: {'met' if mine <= 1.5 else 'NOT met'}); "
            f"below every peer measured: {below}"
            + (f" (failed, not measured: {', '.join(failed)})" if failed else ""),
            flush=True,
        )
    del t
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return {"gb": round(state_bytes / 1e9, 2), "optimizer": optimizer, "pinned_ms": round(floor * 1e3, 1),
            "step_ms": round(normal * 1e3, 1), "rows": rows}  # fmt: skip


def main(args: Any) -> None:
    import json

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    sizes = [int(x) for x in (args.mb if args.mb != "200" else "2000,10000").split(",")]
    only = tuple(args.only.split(",")) if args.only else ()
    results = []
    for mb in sizes:
        for optimizer in args.optimizers.split(","):
            stall_only = args.stall_only or mb > args.throughput_up_to
            results.append(
                bench(mb, optimizer, device, args.rounds, args.steps, stall_only, args.batch, only)
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
