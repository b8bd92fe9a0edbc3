"""spotnb's checkpoints next to PyTorch's own (issue 11), in one run, on the same model, machine
and disk, rounds interleaved. Prints; asserts nothing.

    python benchmarks/bench_checkpoint.py                 # 200 MB of parameters
    python benchmarks/bench_checkpoint.py --mb 200,2000   # and 2 GB (needs ~8 GB RAM, slow)

For each way of saving — **torch.save** (synchronous, the baseline everyone has),
**DCP async_save** (`torch.distributed.checkpoint`, staging to CPU then writing in a thread)
and **spotnb** (`ctx.save`: a snapshot into reused buffers, then a background writer) — it
prints:

* the training thread's stall per save (median), and that stall ÷ a plain RAM copy of the state:
  the time `save` blocks plus, for spotnb, the time the next step's `optimizer.step()` waits
  at the optimizer gate for the parameters to be written (each save is followed by one
  training step);
* throughput with a save every 10 steps ÷ throughput without saves (the step is a real
  forward/backward/SGD step of the same model), median of `--repeats` interleaved runs;
* CPU/step: CPU seconds the process used per step (every thread: training and the saver's
  work) ÷ the same without saves. Unlike the throughput it hardly depends on what else the
  machine runs, so it still compares the savers' cost on a shared machine;
* peak extra host memory during the saving run (resident set size above the run's start,
  sampled every 5 ms);
* bytes written per save, and how many of the saves asked for were committed (spotnb drops a
  queued save that a newer one supersedes; the others block until theirs is written).

**spotnb** tracks the model and its optimizer, so its saves are gated (`runtime/checkpoint/chunked.py`):
the parameters are written from their own memory while the next forward/backward runs.
**spotnb copy** is spotnb with `Checkpointer.stream = False`: the whole-state copy +
`torch.save` writer of earlier versions, for comparison. **spotnb read-back** hashes the
gated tensors as before this digest's change: by reading `tensors.bin` back after the gate
opens, instead of while the drain writes them. **spotnb ¼ budget** is spotnb with
`Config.snapshot_memory` set to a quarter of the state (gated too: only what the optimizer
does not write goes through the buffers). For the spotnb rows the last column is the most
bytes the snapshot buffers held (`Checkpointer.peak_bytes`) against the budget they were given
(the default budget is what is free minus a margin).

Goal (issue 11): spotnb's stall ≤ DCP async_save's and its throughput ratio ≥ DCP's at every
size, peak extra memory ≤ the snapshot budget.

    python benchmarks/bench_checkpoint.py --profile       # where one 200 MB save's time goes
    python benchmarks/bench_checkpoint.py --save-cost     # CPU seconds of one save, by digest
    python benchmarks/bench_checkpoint.py --device cuda   # on a GPU: bench_checkpoint_cuda.py
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_core import _Never, make_context, make_model  # noqa: E402

from spotnb.core.store import Store  # noqa: E402

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Highest resident set size seen while inside the block, minus the size at its start."""

    def __enter__(self) -> PeakRss:
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def extra(self) -> int:
        return self.peak - self.base


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


class Saver:
    """One way of saving: `save(step)` is what the training thread calls; `finish()` waits for
    everything in flight; `written` is the bytes of the last complete save."""

    name = ""

    def __init__(self, model: torch.nn.Module, folder: str, opt: torch.optim.Optimizer) -> None:
        self.model, self.folder, self.opt = model, folder, opt
        self.written = 0
        self.asked = 0

    @property
    def held(self) -> float:
        """Seconds the training thread has been held outside `save` (spotnb's optimizer gate)."""
        return 0.0

    @property
    def committed(self) -> int:
        return self.asked

    def save(self, step: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass

    def close(self) -> None:
        self.finish()


class TorchSave(Saver):
    name = "torch.save"

    def save(self, step: int) -> None:
        path = os.path.join(self.folder, f"{step}.pt")
        torch.save(self.model.state_dict(), path)
        self.written = os.path.getsize(path)
        os.unlink(path)


class DcpAsync(Saver):
    name = "DCP async_save"
    #: checkpoints left on disk (`--dcp-keep`): 0 deletes each as soon as it is written, so the
    #: kernel drops its dirty pages unwritten; 2 keeps the last two, as spotnb's keep_last=2
    #: does, so both pay for the page cache's writeback to disk
    keep = 0

    def __init__(self, model: torch.nn.Module, folder: str, opt: torch.optim.Optimizer) -> None:
        super().__init__(model, folder, opt)
        self.future: Any = None
        self.path = ""
        self.kept: list[str] = []

    def save(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        self.finish()  # DCP's own rule: one async save in flight
        self.path = os.path.join(self.folder, f"dcp-{step}")
        self.future = dcp.async_save({"model": self.model.state_dict()}, checkpoint_id=self.path)

    def finish(self) -> None:
        if self.future is not None:
            self.future.result()
            self.future = None
            self.written = _size(self.path)
            self.kept.append(self.path)
            while len(self.kept) > self.keep:
                shutil.rmtree(self.kept.pop(0), ignore_errors=True)

    def close(self) -> None:
        self.finish()
        for path in self.kept:
            shutil.rmtree(path, ignore_errors=True)


class Spotnb(Saver):
    name = "spotnb"

    budget_fraction: float | None = None  # of the state's bytes; None: the default budget
    stream = True  # Checkpointer.stream: gated saves within the budget too

    def __init__(self, model: torch.nn.Module, folder: str, opt: torch.optim.Optimizer) -> None:
        super().__init__(model, folder, opt)
        self.ctx, self.ckpt = make_context(Store(folder), _Never())
        self.ckpt.stream = self.stream
        if self.budget_fraction is not None:
            nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
            self.ckpt.snapshot_memory = int(nbytes * self.budget_fraction)
        self.ctx.track(model=model, opt=opt)
        self.ctx.restore()

    @property
    def held(self) -> float:
        return self.ckpt.gate.waited

    def save(self, step: int) -> None:
        self.ctx.save("periodic")

    @property
    def committed(self) -> int:
        return len(self.ckpt.committed)

    def finish(self) -> None:
        self.ckpt.wait()
        self.written = self.ckpt.last_bytes

    def close(self) -> None:
        self.finish()
        self.ckpt.close()
        BUFFERS[self.name] = (
            max(BUFFERS.get(self.name, (0, 0))[0], self.ckpt.peak_bytes),
            self.ckpt.budget(),
        )


class SpotnbQuarter(Spotnb):
    name = "spotnb ¼ budget"
    budget_fraction = 0.25


class SpotnbReadBack(Spotnb):
    """spotnb with the gated tensors hashed by reading `tensors.bin` back after the gate opens
    (at nice 10), as before, instead of while the drain writes them."""

    name = "spotnb read-back"

    def save(self, step: int) -> None:
        from spotnb.runtime.checkpoint.chunked import Drain

        Drain.hash_after_gate = True  # read by the drain this save starts
        try:
            super().save(step)
        finally:
            Drain.hash_after_gate = False


class SpotnbCopy(Spotnb):
    name = "spotnb copy"  # the whole-state copy + torch.save of earlier versions (stream=False)
    stream = False


SAVERS: tuple[type[Saver], ...] = (TorchSave, DcpAsync, Spotnb, SpotnbQuarter, SpotnbReadBack, SpotnbCopy)
#: saver name -> (most bytes its snapshot buffers held, its budget), filled as spotnb savers close
BUFFERS: dict[str, tuple[int, int]] = {}


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def stalls(model: torch.nn.Module, rounds: int) -> dict[str, float]:
    """Median seconds the training thread is blocked per save, each saver's save after a
    warm-up one, interleaved with a plain clone of the state (the floor: one RAM copy). The
    save is followed by one training step: time its `step()` spends held by spotnb's optimizer
    gate is stall too, and counted."""
    sd = model.state_dict()
    x = torch.randn(32, model[0].in_features)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    out: dict[str, list[float]] = {"RAM copy": []}
    folders = {cls: tempfile.mkdtemp(prefix="spotnb-bench-ckpt-") for cls in SAVERS}
    savers = [cls(model, folders[cls], opt) for cls in SAVERS]
    for s in savers:
        s.save(0)
        _train_step(model, opt, x)
        s.finish()
    for r in range(1, rounds + 1):
        t0 = time.perf_counter()
        {k: v.clone() for k, v in sd.items()}
        out["RAM copy"].append(time.perf_counter() - t0)
        for s in savers:
            t0 = time.perf_counter()
            s.save(r)
            stall = time.perf_counter() - t0
            held = s.held
            _train_step(model, opt, x)
            out.setdefault(s.name, []).append(stall + s.held - held)
            s.finish()  # the next save does not wait behind this one
    for s in savers:
        s.close()
    for f in folders.values():
        shutil.rmtree(f, ignore_errors=True)
    return {k: statistics.median(v) for k, v in out.items()}


def _cpu() -> float:
    """CPU seconds this process (every thread) and its waited-for children have used."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_training(
    model: torch.nn.Module, steps: int, make: Callable[[str, torch.optim.Optimizer], Saver] | None
) -> tuple[float, int, int, str, float]:
    """Steps per second of `steps` SGD steps with a save every 10 (none if `make` is None),
    waiting for the last save; peak extra RSS; bytes of a save; CPU seconds per step (all
    threads: the saver's work included, whatever else the machine runs)."""
    x = torch.randn(32, model[0].in_features)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    folder = tempfile.mkdtemp(prefix="spotnb-bench-ckpt-")
    saver = make(folder, opt) if make is not None else None
    with PeakRss() as mem:
        cpu0 = _cpu()
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if saver is not None and step % 10 == 0:
                saver.save(step)
                saver.asked += 1
        if saver is not None:
            saver.finish()
        dt = time.perf_counter() - t0
        cpu = (_cpu() - cpu0) / steps
    written = saver.written if saver is not None else 0
    done = f"{saver.committed}/{saver.asked}" if saver is not None else ""
    if saver is not None:
        saver.close()
    shutil.rmtree(folder, ignore_errors=True)
    return steps / dt, mem.extra, written, done, cpu


def bench(mb: int, steps: int, rounds: int, stall_only: bool = False, repeats: int = 2) -> None:
    BUFFERS.clear()
    model = make_model(mb)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    print(f"\n== {nbytes / 1e6:.0f} MB of parameters, {os.cpu_count()} cores ==")
    stall = stalls(model, rounds)
    copy = stall["RAM copy"]
    print(
        "stall/save: " + ", ".join(f"{k} {v * 1e3:.0f} ms ({v / copy:.2f})" for k, v in stall.items()),
        flush=True,
    )
    if stall_only:
        return
    run_training(model, 10, None)  # warm-up
    base: list[float] = []
    base_cpu: list[float] = []
    cpus: dict[str, list[float]] = {cls.name: [] for cls in SAVERS}
    rates: dict[str, list[float]] = {cls.name: [] for cls in SAVERS}
    peaks: dict[str, int] = {cls.name: 0 for cls in SAVERS}
    written: dict[str, int] = {}
    done: dict[str, str] = {}
    for _ in range(repeats):  # interleaved, so drift in machine speed hits every saver alike
        rate, _, _, _, cpu = run_training(model, steps, None)
        base.append(rate)
        base_cpu.append(cpu)
        print(f"  no saves: {rate:.3f} steps/s, {cpu:.3f} CPU s/step", flush=True)
        for cls in SAVERS:
            rate, peak, nbytes_written, committed, cpu = run_training(
                model, steps, lambda f, o, c=cls: c(model, f, o)
            )
            print(f"  {cls.name}: {rate:.3f} steps/s, {cpu:.3f} CPU s/step", flush=True)
            rates[cls.name].append(rate)
            cpus[cls.name].append(cpu)
            peaks[cls.name] = max(peaks[cls.name], peak)
            written[cls.name], done[cls.name] = nbytes_written, committed
    b = statistics.median(base)
    bc = statistics.median(base_cpu)
    print(f"no saves: {b:.2f} steps/s; one RAM copy of the state: {copy * 1e3:.0f} ms")
    print(
        f"{'':16}{'stall/save':>12}{'÷ RAM copy':>12}{'throughput':>12}{'peak extra':>12}{'bytes':>10}"
        f"{'committed':>11}{'CPU/step':>10}  buffers/budget"
    )
    for cls in SAVERS:
        n = cls.name
        print(
            f"{n:16}{stall[n] * 1e3:10.0f}ms{stall[n] / copy:12.2f}{statistics.median(rates[n]) / b:12.3f}"
            f"{peaks[n] / 1e6:10.0f}MB{written.get(n, 0) / 1e6:8.0f}MB{done.get(n, ''):>11}"
            f"{statistics.median(cpus[n]) / bc:10.3f}"
            + (f"  {BUFFERS[n][0] / 1e6:.0f}MB/{BUFFERS[n][1] / 1e6:.0f}MB" if n in BUFFERS else "")
        )
    s, d = "spotnb", "DCP async_save"
    if s not in stall or d not in stall:
        return
    verdict_stall = "≤" if stall[s] <= stall[d] else ">"
    verdict_rate = "≥" if statistics.median(rates[s]) >= statistics.median(rates[d]) else "<"
    verdict_cpu = "≤" if statistics.median(cpus[s]) <= statistics.median(cpus[d]) else ">"
    print(
        f"spotnb stall {verdict_stall} DCP's; spotnb throughput ratio {verdict_rate} DCP's; "
        f"spotnb CPU per step {verdict_cpu} DCP's"
    )


class _Sink:
    """A file that only counts: torch.save's own cost without a disk or a hash."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.size += n
        return n

    def flush(self) -> None:
        pass


def profile(mb: int, rounds: int) -> None:
    """Where one save's time goes, phase by phase (median of `rounds`), on the state of the
    `mb` MB model: the snapshot copy, torch.save's serialisation with and without its zip CRC32,
    each hash (sha256, BLAKE3, xxh3_128 when installed, CRC32), the write to a spool file on
    this disk (page cache, no fsync), and the whole save (spotnb's `save_now`: all of them plus
    the rename into the store), whole-state, chunked and gated (BLAKE3 while the drain writes,
    or read back after the gate opens)."""
    import hashlib
    import zlib

    from torch.serialization import set_crc32_options

    from spotnb.runtime.checkpoint import digest
    from spotnb.runtime.checkpoint.checkpointer import Checkpointer
    from spotnb.runtime.checkpoint.chunked import Drain

    model = make_model(mb)
    sd = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    folder = tempfile.mkdtemp(prefix="spotnb-bench-ckpt-")
    times: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        times.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    def write_raw() -> None:
        with open(os.path.join(folder, "raw.bin"), "wb") as f:
            for t in sd.values():
                f.write(memoryview(t.numpy()))

    def hasher(make: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            h = make()
            for t in sd.values():
                h.update(memoryview(t.numpy()).cast("B"))

        return run

    class _Crc:
        def __init__(self) -> None:
            self.value = 0

        def update(self, data: Any) -> None:
            self.value = zlib.crc32(data, self.value)

    hashes: dict[str, Callable[[], Any]] = {
        "sha256": hashlib.sha256,
        "blake3 (used)": lambda: digest.new("blake3"),
    }
    try:
        import xxhash

        hashes["xxh3_128 (not cryptographic)"] = xxhash.xxh3_128
    except ImportError:
        pass  # not a dependency of spotnb: its row is left out
    hashes["zlib.crc32"] = _Crc

    def no_crc() -> None:
        set_crc32_options(False)
        try:
            torch.save(sd, _Sink())
        finally:
            set_crc32_options(True)

    whole = Checkpointer(Store(folder), "whole", 1, lambda e: None)
    chunked = Checkpointer(Store(folder), "chunked", 1, lambda e: None, snapshot_memory=nbytes // 4)
    gated = Checkpointer(Store(folder), "gated", 1, lambda e: None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    for r in range(rounds + 1):  # the first round allocates buffers: not counted
        snap = whole.snapshot({"model": sd}, r, "periodic")
        times.setdefault("copy (snapshot)", []).append(snap.snapshot_s)
        timed("serialise (torch.save, CRC32 on)", lambda s=snap: torch.save(s.state, _Sink()))
        timed("serialise (torch.save, CRC32 off)", no_crc)
        for name, make in hashes.items():
            timed(f"hash: {name}", hasher(make))
        timed("write to spool (no fsync)", write_raw)
        timed("whole save: writer (save_now)", lambda s=snap: whole.save_now(s))
        snap = timed("chunked ¼ budget: stall", lambda r=r: chunked.snapshot({"model": sd}, r, "periodic"))
        timed("chunked ¼ budget: writer after", lambda s=snap: chunked.save_now(s))
        for after in (False, True):  # BLAKE3 inline until a waiter (the gate.wait below), or read back
            how = "read-back" if after else "now (inline until a step() waits)"
            Drain.hash_after_gate = after
            t0 = time.perf_counter()
            snap = gated.snapshot({"model": sd}, r, "periodic", optimizers=[opt])
            Drain.hash_after_gate = False
            times.setdefault(f"gated, {how}: snapshot returns", []).append(time.perf_counter() - t0)
            gated.gate.wait()  # what a step() right after the save would wait, no forward/backward
            times.setdefault(f"gated, {how}: + until step()", []).append(time.perf_counter() - t0)
            timed(f"gated, {how}: writer after", lambda s=snap: gated.save_now(s))
        if r == 0:
            times.clear()
    whole.close()
    chunked.close()
    gated.close()
    shutil.rmtree(folder, ignore_errors=True)
    print(f"\n== profile: one save of {nbytes / 1e6:.0f} MB, median of {rounds} ==")
    for name, values in times.items():
        t = statistics.median(values)
        print(f"{name:48}{t * 1e3:8.0f} ms {nbytes / t / 1e9:6.2f} GB/s")


def save_cost(mb: int, rounds: int) -> None:
    """CPU seconds (every thread of this process) and wall seconds of one save with no training
    beside it, median of `rounds` after a warm-up: spotnb's gated save with its digest computed
    each way, against DCP async_save. The checkpoint is deleted after each save (no page-cache
    writeback in either). On a shared machine the CPU seconds stay comparable where the
    throughput ratios drown in the neighbours' load."""
    import torch.distributed.checkpoint as dcp

    from spotnb.runtime.checkpoint import digest
    from spotnb.runtime.checkpoint.checkpointer import Checkpointer
    from spotnb.runtime.checkpoint.chunked import Drain

    model = make_model(mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    _train_step(model, opt, torch.randn(32, model[0].in_features))
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())

    class _NoHash:
        def update(self, data: Any) -> None:
            pass

        def hexdigest(self) -> str:
            return "0" * 64

    fresh = digest.fresh
    ways: dict[str, tuple[Callable[[], tuple[str, Any]], bool]] = {
        "spotnb: BLAKE3 while written (now)": (fresh, False),
        "spotnb: BLAKE3 read back after the gate": (fresh, True),
        "spotnb: sha256 read back (before)": (lambda: ("sha256", digest.new("sha256")), True),
        "spotnb: no hash at all (the floor)": (lambda: ("blake3", _NoHash()), False),
    }

    def cpu() -> float:
        me = resource.getrusage(resource.RUSAGE_SELF)
        return me.ru_utime + me.ru_stime

    def spotnb(folder: str, way: str) -> tuple[float, float, float]:
        c = Checkpointer(Store(folder), "cost", 1, lambda e: None)
        digest.fresh, Drain.hash_after_gate = ways[way]  # type: ignore[assignment]
        try:
            c0, t0 = cpu(), time.perf_counter()
            state = {"model": model.state_dict(), "opt": opt.state_dict()}
            c.submit(c.snapshot(state, 1, "periodic", optimizers=[opt]))
            c.gate.open.wait()  # not `gate.wait()`: a waiter makes the drain stop hashing inline
            gated = time.perf_counter() - t0
            c.wait()
            return cpu() - c0, time.perf_counter() - t0, gated
        finally:
            digest.fresh, Drain.hash_after_gate = fresh, False  # type: ignore[assignment]
            c.close()

    def dcp_async(folder: str, way: str) -> tuple[float, float, float]:
        c0, t0 = cpu(), time.perf_counter()
        future = dcp.async_save({"model": model.state_dict()}, checkpoint_id=os.path.join(folder, "dcp"))
        returned = time.perf_counter() - t0
        future.result()
        return cpu() - c0, time.perf_counter() - t0, returned

    rows = [(way, spotnb) for way in ways] + [("DCP async_save", dcp_async)]
    out: dict[str, list[tuple[float, float, float]]] = {}
    for r in range(rounds + 1):
        for name, fn in rows:
            folder = tempfile.mkdtemp(prefix="spotnb-bench-ckpt-")
            try:
                got = fn(folder, name)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            if r:  # the first round allocates and warms up
                out.setdefault(name, []).append(got)
    print(f"\n== one save of {nbytes / 1e6:.0f} MB, no training beside it, median of {rounds} ==")
    print(f"{'':42}{'CPU s':>8}{'wall s':>8}  until step() may run (DCP: until async_save returns)")
    for name, got in out.items():
        cpu_s, wall, gated = (statistics.median(g[i] for g in got) for i in range(3))
        print(f"{name:42}{cpu_s:8.3f}{wall:8.3f}{gated:8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", default="200", help="state sizes in MB, comma separated (default 200)")
    parser.add_argument("--steps", type=int, default=100, help="training steps per run (default 100)")
    parser.add_argument("--rounds", type=int, default=5, help="stall measurements per saver (default 5)")
    parser.add_argument(
        "--only",
        default="",
        help="savers to run by name, comma separated (default: all)",
    )
    parser.add_argument("--profile", action="store_true", help="per-phase costs of one save, then exit")
    parser.add_argument(
        "--save-cost",
        action="store_true",
        help="CPU and wall seconds of one save, each digest way, and DCP's",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="interleaved runs of each saver for the throughput (default 2)"
    )
    parser.add_argument(
        "--dcp-keep",
        type=int,
        default=0,
        help="DCP checkpoints left on disk, like spotnb's keep_last (default 0: each deleted once written)",
    )
    parser.add_argument("--stall-only", action="store_true", help="measure the stalls, not the throughput")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cuda: the GPU benchmark against torch.save and DCP (bench_checkpoint_cuda.py; --mb 2000,10000)",
    )
    parser.add_argument("--optimizers", default="sgd,adamw", help="with --device cuda: sgd, adamw or both")
    parser.add_argument("--batch", type=int, default=2048, help="with --device cuda: rows per training batch")
    parser.add_argument(
        "--throughput-up-to",
        type=int,
        default=2000,
        help="with --device cuda: measure the throughput at sizes up to this many MB, stalls only above",
    )
    parser.add_argument("--json", default="", help="with --device cuda: also write the figures to this file")
    args = parser.parse_args()
    if args.device == "cuda":
        import bench_checkpoint_cuda

        bench_checkpoint_cuda.main(args)
        return
    torch.manual_seed(0)
    DcpAsync.keep = args.dcp_keep
    if args.only:
        global SAVERS
        SAVERS = tuple(cls for cls in SAVERS if cls.name in args.only.split(","))
    if args.profile:
        profile(int(args.mb.split(",")[0]), args.rounds)
        return
    if args.save_cost:
        save_cost(int(args.mb.split(",")[0]), args.rounds)
        return
    for mb in (int(x) for x in args.mb.split(",")):
        bench(mb, args.steps, args.rounds, args.stall_only, args.repeats)


if __name__ == "__main__":
    main()
