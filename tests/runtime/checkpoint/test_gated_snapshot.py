"""Gated snapshots (`runtime/checkpoint/chunked.py`): the training step is released before the tracked
optimizers' tensors are written; their `step()` waits for the drain, forward and backward do
not. The checkpoint holds the tensors as they were at the save's step, bit for bit; a write
the gate cannot see makes that save fail (never a torn commit) and later saves block.

Real checkpointer, real store directory, real threads and a real SIGKILL. Where a test needs
the drain to be mid-write it holds `Drain._write_direct` back on an event (the file write
itself is real)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from spotnb.core.store import Store
from spotnb.runtime.checkpoint import chunked
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.checkpoint.chunked import DATA_NAME
from tests.support.jobs import Recorder, assert_same_state

MB = 1024 * 1024


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """~2.1 MB of parameters + as much SGD momentum, and a BatchNorm whose buffers forward writes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.BatchNorm1d(512), torch.nn.Linear(512, 512)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step(model, opt)  # momentum buffers exist
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor | None = None) -> None:
    x = torch.randn(16, 512) if x is None else x
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> dict:
    return {"step": step, "objects": {"model": model.state_dict(), "opt": opt.state_dict()}}


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(v) for v in obj)
    return obj


class _HeldDrain:
    """Holds the drain just before it writes the gated tensors, until `release`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writing, self.go = threading.Event(), threading.Event()
        real = chunked.Drain._write_direct

        def held(drain, *args):
            self.writing.set()
            assert self.go.wait(30)
            return real(drain, *args)

        monkeypatch.setattr(chunked.Drain, "_write_direct", held)

    def release(self) -> None:
        self.go.set()


def test_training_runs_during_a_gated_save_and_the_checkpoint_holds_the_saved_step(
    store_url, monkeypatch
) -> None:
    """A state 4× the budget: the snapshot returns before the parameters are written, forward
    and backward run, `step()` waits for the drain; the checkpoint has the weights of the save's
    step bit for bit, and the snapshot buffers never held more than the budget."""
    model, opt = _model()
    state = _state(model, opt, 1)
    nbytes = chunked.dense_layout(state)[1]
    budget = nbytes // 4
    held = _HeldDrain(monkeypatch)
    c = Checkpointer(Store(store_url), "job", 1, Recorder(), snapshot_memory=budget)
    try:
        expected = _clone(state)
        snap = c.snapshot(state, 1, "periodic", optimizers=[opt])
        c.submit(snap)
        assert held.writing.wait(30)  # the snapshot returned; the parameters are not written yet
        x = torch.randn(16, 512)
        opt.zero_grad()
        model(x).square().mean().backward()  # forward (BatchNorm's buffers too) and backward run
        stepped = threading.Event()
        stepper = threading.Thread(target=lambda: (opt.step(), stepped.set()))
        stepper.start()
        assert not stepped.wait(0.5), "optimizer.step() ran while the drain had not written its tensors"
        held.release()
        stepper.join(30)
        assert stepped.is_set() and c.gate.waited > 0
        assert c.snapshot_ema >= c.gate.waited  # the wait is part of the save's δ
        assert c.wait(60) and c.failures == 0
        manifest, restored = c.load_latest()
        assert manifest.step == 1 and DATA_NAME in manifest.files
        assert_same_state(expected, restored)
        assert not torch.equal(restored["objects"]["model"]["0.weight"], model[0].weight.detach())
        assert c.peak_bytes <= budget
    finally:
        held.release()
        c.close()


def test_a_write_the_gate_cannot_see_fails_that_save_and_later_saves_block(store_url, monkeypatch) -> None:
    """A parameter changed in place (not by the optimizer) while the drain writes: that save is
    not committed and says why, the previous checkpoint restores, and the next save copies
    everything before returning, and commits."""
    model, opt = _model()
    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec, snapshot_memory=MB)
    held = None
    try:
        first = _clone(_state(model, opt, 1))
        c.save_now(c.snapshot(_state(model, opt, 1), 1, "periodic", optimizers=[opt]))
        _step(model, opt)
        held = _HeldDrain(monkeypatch)
        c.submit(c.snapshot(_state(model, opt, 2), 2, "periodic", optimizers=[opt]))
        assert held.writing.wait(30)
        with torch.no_grad():
            model[2].bias.add_(1.0)  # user code, in place, between the save and the next step
        held.release()
        assert c.wait(60)
        failed = rec.kinds("checkpoint_failed")
        assert [e["step"] for e in failed] == [2] and "changed in place" in failed[0]["error"]
        assert "2.bias" in failed[0]["error"]
        assert any("changed in place" in e["message"] for e in rec.kinds("warning"))
        manifest, restored = c.load_latest()
        assert manifest.step == 1
        assert_same_state(first, restored)
        assert c.blocking
        # later saves: everything copied before the snapshot returns, so a write right after is harmless
        third = _clone(_state(model, opt, 3))
        c.submit(c.snapshot(_state(model, opt, 3), 3, "periodic", optimizers=[opt]))
        assert c.gate.open.is_set()
        with torch.no_grad():
            model[2].bias.add_(1.0)
        assert c.wait(60) and len(rec.kinds("checkpoint_failed")) == 1
        manifest, restored = c.load_latest()
        assert manifest.step == 3
        assert_same_state(third, restored)
    finally:
        if held is not None:
            held.release()
        c.close()


def test_a_save_requested_while_the_previous_is_gated_waits_and_both_are_exact(
    store_url, monkeypatch
) -> None:
    """The second snapshot waits for the first one's drain (its wait is stall); tensors
    resized/replaced between saves are written as they are at each save."""
    model, opt = _model()
    c = Checkpointer(Store(store_url), "job", 1, Recorder(), snapshot_memory=MB)
    held = _HeldDrain(monkeypatch)
    try:
        one = _clone(_state(model, opt, 1))
        c.submit(c.snapshot(_state(model, opt, 1), 1, "periodic", optimizers=[opt]))
        assert held.writing.wait(30)
        second: list = []
        model[2] = torch.nn.Linear(512, 256)  # replaced between saves: not in the optimizer
        t = threading.Thread(
            target=lambda: second.append(c.snapshot(_state(model, opt, 2), 2, "x", optimizers=[opt]))
        )
        t.start()
        assert not second and t.is_alive()
        held.release()
        t.join(30)
        assert second
        c.submit(second[0])
        assert c.wait(60) and c.failures == 0
        manifest, restored = c.load_latest()
        assert manifest.step == 2 and restored["objects"]["model"]["2.weight"].shape == (256, 512)
        assert_same_state(_state(model, opt, 2), restored)
        older = [m for m in c.list_manifests() if m.step == 1]
        assert older and c._load(older[0]) is not None
        assert_same_state(one, c._load(older[0]))
    finally:
        held.release()
        c.close()


def test_a_flipped_byte_of_a_gated_save_is_caught_by_its_blake3_and_the_previous_one_restores(
    store_url,
) -> None:
    """The drain hashes the parameters as it writes them (BLAKE3, no read-back): a byte of them
    changed in the committed `tensors.bin` fails that checkpoint's digest at restore, which
    takes the one before, bit for bit."""
    model, opt = _model()
    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec)  # default budget: gated all the same
    try:
        first = _clone(_state(model, opt, 1))
        c.submit(c.snapshot(_state(model, opt, 1), 1, "periodic", optimizers=[opt]))
        _step(model, opt)  # held by the gate until the parameters are written and hashed
        assert c.wait(60)
        c.submit(c.snapshot(_state(model, opt, 2), 2, "periodic", optimizers=[opt]))
        _step(model, opt)
        assert c.wait(60) and c.failures == 0
        newest = c.list_manifests()[0]
        entry = newest.files[DATA_NAME]
        assert newest.step == 2 and set(entry) == {"size", "blake3"}
        path = f"{c.root}/{newest.seq:08d}/{DATA_NAME}"
        with open(path, "r+b") as f:  # the last bytes: a gated tensor's (they are written last)
            f.seek(entry["size"] - 3)
            byte = f.read(1)
            f.seek(entry["size"] - 3)
            f.write(bytes([byte[0] ^ 0x10]))
        manifest, restored = c.load_latest()
        assert manifest.step == 1
        assert_same_state(first, restored)
        (invalid,) = rec.kinds("checkpoint_invalid")
        assert (
            invalid["seq"] == newest.seq and DATA_NAME in invalid["reason"] and "blake3" in invalid["reason"]
        )
    finally:
        c.close()


def test_a_step_waiting_mid_write_stops_the_inline_hash_and_the_rest_is_hashed_after_the_gate(
    store_url, monkeypatch
) -> None:
    """The drain hashes the parameters as it writes them only while nobody waits at the gate:
    here a `step()` starts waiting after the third piece, the drain writes the rest unhashed,
    opens the gate, and hashes the rest by reading it back. The digest covers the file exactly
    (restore verifies it), and the wait was not spent hashing."""
    from blake3 import blake3

    from spotnb.runtime.checkpoint import digest

    model, opt = _model()
    c = Checkpointer(Store(store_url), "job", 1, Recorder())
    # per hash update of tensors.bin (the drain's hasher; the writer hashes the other files
    # meanwhile, in its own thread): was the gate open
    updates: list[bool] = []
    third = threading.Event()  # the step comes after the third piece, however slow the drain

    class Hasher:
        def __init__(self) -> None:
            self.h = blake3()
            self.drain = threading.current_thread().name == "spotnb-snapshot-drain"

        def update(self, data) -> None:
            self.h.update(data)
            if not self.drain:
                return
            updates.append(c.gate.open.is_set())
            if len(updates) == 3:
                c.gate.waiting.set()  # what `Gate.wait` does when a step() arrives
                third.set()

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    monkeypatch.setattr(chunked, "_PIECE", 64 * 1024)
    monkeypatch.setattr(digest, "fresh", lambda: ("blake3", Hasher()))
    try:
        expected = _clone(_state(model, opt, 1))
        c.submit(c.snapshot(_state(model, opt, 1), 1, "periodic", optimizers=[opt]))
        assert third.wait(60)
        _step(model, opt)
        assert c.wait(60) and c.failures == 0
        # three updates inside the gate, then none until it opened, then the read-back
        assert updates[:3] == [False] * 3 and len(updates) > 3 and all(updates[3:])
        manifest, restored = c.load_latest()
        assert manifest.step == 1
        assert_same_state(expected, restored)
    finally:
        c.close()


def test_a_full_spool_disk_during_the_gated_write_opens_the_gate_and_fails_the_save(
    tmp_path, store_url
) -> None:
    """ENOSPC while the drain writes the parameters in place: `step()` is not left blocked, the
    save fails, the previous checkpoint restores."""
    from tests.support.jobs import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "spool", "1m") as spool:
        model, opt = _model()
        rec = Recorder()
        c = Checkpointer(Store(store_url), "job", 1, rec, spool_dir=str(spool), snapshot_memory=256 * 1024)
        try:
            c.save_now(c.snapshot({"step": 1, "w": torch.ones(1000)}, 1, "periodic"))
            c.submit(c.snapshot(_state(model, opt, 2), 2, "periodic", optimizers=[opt]))  # 4 MB
            _step(model, opt)  # the gate opens although the write failed
            assert c.wait(60)
            assert "No space left" in rec.kinds("checkpoint_failed")[0]["error"]
            manifest, state = c.load_latest()
            assert manifest.step == 1 and torch.equal(state["w"], torch.ones(1000))
            assert not c.blocking and [n for n in os.listdir(c.spool) if n.startswith("data-")] == []
        finally:
            c.close()


_KILLED = """
import sys, threading, torch
from spotnb.runtime.checkpoint import chunked
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.core.store import Store

torch.manual_seed(0)
w = torch.nn.Linear(1024, 1024)
opt = torch.optim.SGD(w.parameters(), lr=0.1)
c = Checkpointer(Store(sys.argv[1]), "job", 1, lambda e: None, snapshot_memory=1 << 20)
c.save_now(c.snapshot({"step": 1, "w": w.state_dict()}, 1, "periodic", optimizers=[opt]))
real = chunked.Drain._write_direct

def stuck(drain, f, direct, size, sha):
    f.write(direct[0].tensor.reshape(-1).view(torch.uint8).numpy().data[:1 << 20])
    f.flush()
    open(sys.argv[2], "w").close()  # half of the parameters are in the spool file: kill me now
    threading.Event().wait()

chunked.Drain._write_direct = stuck
with torch.no_grad():
    w.weight.add_(1.0)
c.submit(c.snapshot({"step": 2, "w": w.state_dict()}, 2, "periodic", optimizers=[opt]))
threading.Event().wait()
"""


def test_a_process_killed_mid_gated_write_leaves_the_previous_checkpoint(store_url, tmp_path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(_KILLED))
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(script), store_url, str(ready)], env=env)
    try:
        from tests.support.jobs import wait_for

        wait_for(
            lambda: ready.exists() or proc.poll() is not None, 40, "the save never reached the gated write"
        )
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    c = Checkpointer(Store(store_url), "job", 2, Recorder())
    try:
        manifest, state = c.load_latest()
        torch.manual_seed(0)
        assert manifest.step == 1 and torch.equal(
            state["w"]["weight"], torch.nn.Linear(1024, 1024).weight.detach()
        )
        assert [m.step for m in c.list_manifests()] == [1]
    finally:
        c.close()


class _QueuedStep:
    """Stands for the CUDA event of a gated tensor's device-to-host copy. A CUDA kernel bumps its
    tensor's version when the host queues it, not when the GPU runs it: the released optimizer
    step's in-place update is queued (here: the version bumped) while the copy is still running,
    and runs behind the copy's event, so the bytes written are the save's."""

    def __init__(self, source: torch.Tensor, released: threading.Event, before_release: bool) -> None:
        self.source, self.released, self.before_release = source, released, before_release

    def synchronize(self) -> None:
        if not self.before_release:
            assert self.released.wait(10), "the drain waits for the copy before releasing the step"
            self.source.add_(1)  # the optimizer's step, queued on the compute stream


def _drain_one_staged_tensor(tmp_path, before_release: bool) -> chunked.Drain:
    source = torch.arange(1024, dtype=torch.float32)
    host = source.clone()  # the host copy, as the side stream made it
    released = threading.Event()
    drain = chunked.Drain(
        str(tmp_path / DATA_NAME), chunked.ChunkBuffers(4096), on_done=lambda: None, released=released
    )
    ref = chunked.TensorRef(0, host.nbytes, "float32", (1024,))
    staged = chunked._Direct(
        ref, host, chunked._version(source), "objects/model/w", source=source,
        event=_QueuedStep(source, released, before_release),
    )  # fmt: skip
    if before_release:
        source.mul_(2)  # user code wrote the weight after the save began, before the step's release
    drain.put_direct([staged])
    drain.close()
    return drain


def test_an_optimizer_step_queued_behind_the_gpu_copy_does_not_tear_the_save(tmp_path) -> None:
    """On a GPU the gate releases `step()` before the host copy is done (the compute stream waits
    for the copy's event): the step's kernels bump the weight's version as they are queued. That
    is ordered behind the copy: the save commits (it did not: one save per run was lost)."""
    drain = _drain_one_staged_tensor(tmp_path, before_release=False)
    assert drain.result()["size"] == 4096
    assert torch.equal(
        torch.frombuffer(bytearray((tmp_path / DATA_NAME).read_bytes()), dtype=torch.float32),
        torch.arange(1024, dtype=torch.float32),
    )


def test_a_gpu_weight_written_before_the_step_is_released_tears_the_save(tmp_path) -> None:
    """A write to a gated CUDA tensor before the release is not ordered behind the copy (nothing
    made the compute stream wait for it): the save is not committed."""
    drain = _drain_one_staged_tensor(tmp_path, before_release=True)
    with pytest.raises(chunked.TornSnapshot, match="objects/model/w was changed in place"):
        drain.result()
