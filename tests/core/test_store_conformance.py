"""One store contract, five backends: file://, memory://, S3 (moto_server), Azure Blob (Azurite)
and GCS (gcp-storage-emulator), each reached the way a VM reaches it (fsspec URL + the SDK's
environment), over real HTTP for the three clouds (fsspec's conformance-suite pattern).

What the rest of spotnb relies on: atomic replace, reads from an offset, listings of names,
exists/rm, the segmented event log read back in order, and checkpoints that commit, restore
and fall back to the previous one when the newest does not verify.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import torch

from spotnb.core import events as events_mod
from spotnb.core import protocol as ev
from spotnb.core.events import EventReader, EventWriter
from spotnb.core.store import Store
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures

BACKENDS = ["file", "memory", "s3", "az", "gs"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    kind = request.param
    if kind == "file":
        url = (tmp_path / "store").as_uri()
    elif kind == "memory":
        url = f"memory://spotnb-{uuid.uuid4().hex[:8]}"
    else:
        url = request.getfixturevalue(f"{kind}_store_url")
    return Store(url)


def test_write_read_replace(store: Store) -> None:
    path = store.path("a", "b.bin")
    store.write_bytes(path, b"first version")
    assert store.read_bytes(path) == b"first version"
    store.write_bytes(path, b"second")
    assert store.read_bytes(path) == b"second"  # replaced whole, never mixed
    assert store.read_bytes(path, start=3) == b"ond"
    assert store.size(path) == 6
    # no temporary object is left beside it
    assert store.ls(store.path("a")) == ["b.bin"]


def test_ls_exists_rm(store: Store) -> None:
    for name in ("x.json", "y.json"):
        store.write_bytes(store.path("dir", name), b"{}")
    store.write_bytes(store.path("dir", "sub", "z"), b"z")
    store.invalidate()
    assert store.ls(store.path("dir")) == ["sub", "x.json", "y.json"]
    assert store.ls(store.path("missing")) == []
    assert store.exists(store.path("dir", "x.json"))
    assert not store.exists(store.path("dir", "nope"))
    store.rm(store.path("dir", "x.json"))
    store.rm(store.path("dir", "never-there"))  # idempotent
    store.invalidate()
    assert not store.exists(store.path("dir", "x.json"))
    store.rm(store.path("dir"), recursive=True)
    store.invalidate()
    assert store.ls(store.path("dir")) == []


def test_event_segments_round_trip(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_mod, "SEGMENT_BYTES", 300)  # force several segments
    writer = EventWriter(store, "job1", 1, "agent")
    reader = EventReader(store, "job1")
    seen: list[dict] = []
    for i in range(12):
        writer.emit(ev.Metrics(t=1000.0 + i, rows=[{"step": i, "loss": 1.0 / (i + 1)}]))
        writer.flush()
        if i % 4 == 3:
            seen += reader.poll()
    seen += reader.poll()
    assert [e["rows"][0]["step"] for e in seen] == list(range(12))
    names = store.ls(store.job("job1", "events"))
    assert len(names) > 1 and all(n.startswith("0001-agent-") for n in names)
    # a second writer of the same name (a restarted process) continues the numbering
    again = EventWriter(store, "job1", 1, "agent")
    again.emit(ev.Done(t=2000.0, result="result.pkl", step=12))
    again.flush()
    assert [e["kind"] for e in EventReader(store, "job1").poll()][-1] == "done"


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "step": seed}


def test_checkpoint_commit_restore_fallback(store: Store) -> None:
    emitted: list[tuple[str, dict]] = []
    ck = Checkpointer(store, "job2", 1, lambda e: emitted.append((e.kind, e.to_json())), keep_last=3)
    try:
        first = ck.save_now(ck.snapshot(_state(1), 10, "periodic"))
        second = ck.save_now(ck.snapshot(_state(2), 20, "periodic"))
        assert [m.seq for m in ck.list_manifests()] == [second.seq, first.seq]
        manifest, state = ck.load_latest()
        assert manifest.step == 20 and torch.equal(state["w"], _state(2)["w"])
        # corrupt the newest checkpoint's payload: restore falls back to the one before
        folder = f"{ck.root}/{second.seq:08d}"
        store.write_bytes(f"{folder}/state.pt", b"not a checkpoint")
        manifest, state = ck.load_latest()
        assert manifest.step == 10 and torch.equal(state["w"], _state(1)["w"])
        assert any(k == "checkpoint_invalid" for k, _ in emitted)
        # a half-uploaded checkpoint (no manifest) does not exist
        store.write_bytes(f"{ck.root}/{second.seq + 1:08d}/state.pt", b"partial")
        assert [m.seq for m in ck.list_manifests()] == [second.seq, first.seq]
        doc = json.loads(store.read_bytes(f"{folder}/MANIFEST.json"))
        assert doc["files"]["state.pt"]["size"] > 0 and doc["kind"] == "periodic"
    finally:
        ck.close()


def test_checkpoint_background_upload(store: Store) -> None:
    ck = Checkpointer(store, "job3", 2, lambda e: None)
    try:
        ck.submit(ck.snapshot(_state(3), 30, "insurance"))
        assert ck.wait(timeout=60)
        restored = Checkpointer(store, "job3", 3, lambda e: None)
        try:
            manifest, state = restored.load_latest()
            assert (manifest.step, manifest.kind, manifest.incarnation) == (30, "insurance", 2)
            assert torch.equal(state["w"], _state(3)["w"])
        finally:
            restored.close()
    finally:
        ck.close()
