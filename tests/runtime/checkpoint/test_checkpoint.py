"""The checkpointer against a real file store: commit protocol, verification, retention."""

from __future__ import annotations

import json

import torch

from tests.support.jobs import ckpt_save, ckpt_state

_state, _save = ckpt_state, ckpt_save


def test_restore_takes_the_newest_verified_checkpoint(ckpt) -> None:
    c, _ = ckpt
    for step in (10, 20, 30):
        _save(c, step)
    manifest, state = c.load_latest()
    assert manifest.step == 30 and torch.equal(state["objects"]["w"], torch.full((64, 64), 30.0))


def test_a_corrupt_file_is_never_used(ckpt) -> None:
    c, rec = ckpt
    _save(c, 10)
    _save(c, 20)
    newest = c.list_manifests()[0]
    path = f"{c.root}/{newest.seq:08d}/state.pt"
    data = bytearray(c.store.read_bytes(path))
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte: only the hash can tell
    c.store.write_bytes(path, bytes(data))
    manifest, state = c.load_latest()
    assert manifest.step == 10
    assert rec.kinds("checkpoint_invalid")[0]["seq"] == newest.seq


def test_a_checkpoint_without_manifest_does_not_exist(ckpt) -> None:
    c, _ = ckpt
    _save(c, 10)
    _save(c, 20)
    newest = c.list_manifests()[0]
    c.store.rm(f"{c.root}/{newest.seq:08d}/MANIFEST.json")
    manifest, _ = c.load_latest()
    assert manifest.step == 10


def test_nothing_to_restore_on_a_fresh_job(ckpt) -> None:
    c, _ = ckpt
    assert c.load_latest() is None


def test_manifest_lists_sizes_and_hashes(ckpt) -> None:
    from blake3 import blake3

    c, _ = ckpt
    _save(c, 5, "insurance")
    m = c.list_manifests()[0]
    raw = c.store.read_bytes(f"{c.root}/{m.seq:08d}/state.pt")
    # written by value: BLAKE3 (runtime/checkpoint/digest.py); blobs stored by content keep their sha256
    assert m.files["state.pt"] == {"size": len(raw), "blake3": blake3(raw).hexdigest()}
    doc = json.loads(c.store.read_bytes(f"{c.root}/{m.seq:08d}/MANIFEST.json"))
    assert doc["kind"] == "insurance" and doc["step"] == 5


def test_retention_keeps_a_fallback_and_keep_last_periodic(ckpt) -> None:
    c, _ = ckpt
    _save(c, 10, "periodic")
    _save(c, 20, "periodic")
    _save(c, 30, "periodic")
    _save(c, 35, "insurance")
    _save(c, 40, "insurance")
    _save(c, 45, "emergency")
    kept = [(m.step, m.kind) for m in c.list_manifests()]
    # newest two of any kind, plus the two newest periodic; superseded insurance is gone
    assert kept == [(45, "emergency"), (40, "insurance"), (30, "periodic"), (20, "periodic")]


def test_background_saves_do_not_reuse_a_buffer_still_queued(ckpt) -> None:
    """A snapshot is a copy: mutating the tensor after snapshot() never leaks into the file."""
    c, _ = ckpt
    w = torch.zeros(256, 256)
    state = {"step": 1, "objects": {"w": w}, "rng": {}, "user": {}}
    snap = c.snapshot(state, 1, "periodic")
    w.fill_(7.0)
    c.submit(snap)
    assert c.wait(30)
    _, restored = c.load_latest()
    assert restored["objects"]["w"].sum().item() == 0.0


def test_a_save_behind_a_queued_one_takes_its_buffers_not_a_third_copy(store_url, monkeypatch) -> None:
    """Saves asked for faster than the writer serialises them: one being written, one waiting,
    and the next supersedes the waiting one — in its buffers, so the state is never held three
    times in RAM (and the training thread never page-faults a fresh copy in)."""
    import threading

    from spotnb.core.store import Store
    from spotnb.runtime.checkpoint import checkpointer as checkpoint
    from tests.support.jobs import Recorder

    writing, release = threading.Event(), threading.Event()
    real_save = torch.save

    def slow_save(obj, f, *a, **kw):  # the writer thread, serialising the first snapshot
        writing.set()
        release.wait(30)
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(checkpoint.torch, "save", slow_save)
    rec = Recorder()
    c = checkpoint.Checkpointer(Store(store_url), "job", 1, rec)
    try:
        c.submit(c.snapshot(_state(10), 10, "periodic"))
        assert writing.wait(30)
        queued = c.snapshot(_state(20), 20, "periodic")
        c.submit(queued)
        queued_pool = id(queued._pool)
        newest = c.snapshot(_state(30), 30, "periodic")
        assert id(newest._pool) == queued_pool  # the queued save's buffers, not fresh memory
        assert [e["step"] for e in rec.kinds("checkpoint_skipped")] == [20]
        c.submit(newest)
        release.set()
        assert c.wait(30)
        assert [m.step for m in c.list_manifests()] == [30, 10]
        _, state = c.load_latest()
        assert torch.equal(state["objects"]["w"], torch.full((64, 64), 30.0))
    finally:
        release.set()
        c.close()


def test_a_value_that_cannot_be_checkpointed_is_named_as_the_user_wrote_it(ckpt) -> None:
    """A lock (an open file, a connection) in ctx.state fails the save on the training thread:
    the error must say which value, where the user put it, and what to do, not only
    "cannot pickle '_thread.lock' object" from deep inside the snapshot."""
    import threading

    import pytest

    c, _ = ckpt
    state = {"step": 3, "user": {"loader": {"pos": 5, "lock": threading.Lock()}}, "objects": {}}
    with pytest.raises(
        TypeError, match=r"ctx\.state\['loader'\]\['lock'\] cannot be checkpointed.*_thread\.lock"
    ):
        c.snapshot(state, 3, "periodic")
    tracked = {"step": 3, "user": {}, "objects": {"sampler": {"gen": (i for i in range(3))}}}
    with pytest.raises(TypeError, match=r"ctx\.track\(sampler=\.\.\.\)\.state_dict\(\)\['gen'\] cannot"):
        c.snapshot(tracked, 3, "periodic")
    # a lambda or a class of the notebook's is not refused: saves pickle with cloudpickle
    c.save_now(c.snapshot({"step": 4, "user": {"f": lambda x: x + 1}, "objects": {}}, 4, "periodic"))
    _, restored = c.load_latest()
    assert restored["user"]["f"](1) == 2
