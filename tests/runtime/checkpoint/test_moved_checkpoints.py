"""Checkpoints written before the re-layout (issue 27) restore after it, bit for bit.

tests/support/fixtures/ckpt_moved was written by spotnb at 695c75d, before its modules moved
into folders: a signed, incremental save of a model (a frozen 128x128 layer, referenced as a
blob) and its Adam state, whole (`whole`: seq 1 and 2) and streamed through 32 KB of buffers
(`chunked`: seq 2, its drain's `TensorRef`s in the pickle). Those pickles name
`spotnb.runtime.incremental.BlobRef` and `spotnb.runtime.chunked.TensorRef`, paths that no
longer exist: restore maps them (runtime/checkpoint/moved.py). The fixture is copied, never
modified; the damage tests re-sign what they damage, so only the damage itself is judged.
"""

from __future__ import annotations

import io
import shutil
import zipfile

import pytest
import torch
from blake3 import blake3

from spotnb.core.store import Store
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.checkpoint.manifest import Manifest
from tests.support.jobs import Recorder
from tests.support.paths import FIXTURES

FIXTURE = FIXTURES / "ckpt_moved"
KEY = b"moved fixture key, not a secret!"


def _replay() -> dict[int, dict[str, dict]]:
    """The states the fixture holds, recomputed the way it was written (two Adam steps on
    fixed gradients, on the CPU)."""
    model = torch.nn.Sequential(torch.nn.Linear(128, 128).requires_grad_(False), torch.nn.Linear(128, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.arange(p.numel()) % 89).reshape(p.shape) / 7)
    opt = torch.optim.Adam(model[1].parameters(), lr=0.125)
    want: dict[int, dict[str, dict]] = {}
    for step in (10, 20):
        for p in model[1].parameters():
            p.grad = torch.ones_like(p) / 4
        opt.step()
        want[step] = {
            "model": {k: v.clone() for k, v in model.state_dict().items()},
            "opt": {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()},
        }
    return want


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    same = a.dtype == b.dtype and a.shape == b.shape
    return same and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _checkpointer(store_url: str, kind: str) -> tuple[Checkpointer, Recorder]:
    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec, key=KEY)
    shutil.copytree(FIXTURE / kind / "jobs" / "job" / "ckpt", c.root, dirs_exist_ok=True)
    return c, rec


@pytest.mark.parametrize("kind", ["whole", "chunked"])
def test_a_checkpoint_written_before_the_relayout_restores_bit_for_bit(store_url: str, kind: str) -> None:
    want = _replay()
    c, rec = _checkpointer(store_url, kind)
    try:
        found = c.load_latest()
        assert found is not None
        manifest, state = found
        assert (manifest.seq, manifest.step) == (2, 20) and state["user"] == {"lr": 0.125}
        model = state["objects"]["model"]
        assert model.keys() == want[20]["model"].keys()
        assert all(_bit_equal(model[k], v) for k, v in want[20]["model"].items())
        opt = state["objects"]["opt"]["state"]
        for k, s in want[20]["opt"].items():
            assert all(_bit_equal(torch.as_tensor(opt[k][n]), torch.as_tensor(t)) for n, t in s.items())
        assert not rec.kinds("checkpoint_invalid")
    finally:
        c.close()


def _resign(c: Checkpointer, seq: int, state_pt: bytes) -> None:
    """Replace a checkpoint's state.pt, its manifest updated and signed as the agent would."""
    folder = f"{c.root}/{seq:08d}"
    c.store.write_bytes(f"{folder}/state.pt", state_pt)
    m = Manifest.parse(c.store.read_bytes(f"{folder}/MANIFEST.json"), f"{seq:08d}", key=KEY, job_id="job")
    m.files["state.pt"] = {"size": len(state_pt), "blake3": blake3(state_pt).hexdigest()}
    c.store.write_bytes(f"{folder}/MANIFEST.json", m.to_json(KEY, "job"))


def _renamed(state_pt: bytes, old: bytes, new: bytes) -> bytes:
    """The same zip with `old` (a module path in its pickle) replaced by `new`, same length."""
    assert len(old) == len(new)
    src, out = zipfile.ZipFile(io.BytesIO(state_pt)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                assert old in data
                data = data.replace(old, new)
            dst.writestr(info, data)
    return out.getvalue()


def _assert_falls_back_to_seq_1(c: Checkpointer, rec: Recorder) -> None:
    want = _replay()
    found = c.load_latest()
    assert found is not None
    manifest, state = found
    assert (manifest.seq, manifest.step) == (1, 10)
    assert all(_bit_equal(state["objects"]["model"][k], v) for k, v in want[10]["model"].items())
    assert [e["seq"] for e in rec.kinds("checkpoint_invalid")] == [2]
    # the committed older checkpoint and the blob it references are still there
    assert c.store.exists(f"{c.root}/00000001/MANIFEST.json")


def _whole(store_url: str) -> tuple[Checkpointer, Recorder]:
    return _checkpointer(store_url, "whole")


def test_a_state_naming_a_module_that_never_existed_falls_back_with_a_clear_reason(store_url: str) -> None:
    c, rec = _whole(store_url)
    try:
        raw = c.store.read_bytes(f"{c.root}/00000002/state.pt")
        _resign(c, 2, _renamed(raw, b"spotnb.runtime.incremental", b"spotnb.runtime.incrementax"))
        _assert_falls_back_to_seq_1(c, rec)
        reason = str(rec.kinds("checkpoint_invalid")[0])
        assert "incrementax" in reason, reason
    finally:
        c.close()


def test_a_truncated_old_state_falls_back(store_url: str) -> None:
    c, rec = _whole(store_url)
    try:
        raw = c.store.read_bytes(f"{c.root}/00000002/state.pt")
        _resign(c, 2, raw[: len(raw) // 2])  # hashes match: only unpickling can tell
        _assert_falls_back_to_seq_1(c, rec)
    finally:
        c.close()


def test_an_old_manifest_with_a_flipped_byte_falls_back(store_url: str) -> None:
    c, rec = _whole(store_url)
    try:
        path = f"{c.root}/00000002/MANIFEST.json"
        data = bytearray(c.store.read_bytes(path))
        at = data.index(b'"step": 20') + len(b'"step": 2')
        data[at] ^= 0x01  # 20 -> 21: still valid JSON, only the signature can tell
        c.store.write_bytes(path, bytes(data))
        _assert_falls_back_to_seq_1(c, rec)
    finally:
        c.close()
