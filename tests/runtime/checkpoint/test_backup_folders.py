"""`ctx.backup(folder)`: scripts and trainers that write their own checkpoint folders (Hugging
Face's `checkpoint-500/`, Lightning's `.ckpt` files) get them back exactly, and a file an earlier
checkpoint holds is not uploaded again. Real checkpointer on a real directory store; one job on
the local market, really killed."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch

import spotnb as spot
from spotnb.runtime.checkpoint.manifest import BLOBS
from spotnb.runtime.context import backup_files
from tests.support import jobfns

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


def _state(step: int) -> dict:
    return {"step": step, "objects": {"w": torch.full((4,), float(step))}, "rng": {}, "user": {}}


def _save(c, step: int, folder: Path) -> None:
    files, dirs = backup_files((str(folder),))
    c.save_now(c.snapshot(_state(step), step, "periodic", files=files, dirs=dirs))


def _blobs(c) -> list[str]:
    root = f"{c.root}/{BLOBS}"
    return sorted(c.store.ls(root)) if c.store.exists(root) else []


def test_a_folder_comes_back_exactly_as_committed(ckpt, tmp_path: Path) -> None:
    """Files written into the folder after the checkpoint go, deleted ones come back, nested
    folders and odd file names survive: a trainer resuming from 'the newest checkpoint-* in
    the folder' finds the committed one."""
    c, rec = ckpt
    out = tmp_path / "out"
    (out / "checkpoint-10").mkdir(parents=True)
    (out / "checkpoint-10" / "state.txt").write_text("45")
    (out / "odd \\ name ✓.json").write_text("{}")
    (out / "empty").mkdir()
    _save(c, 10, out)
    (out / "checkpoint-20").mkdir()  # written after the checkpoint, never committed
    (out / "checkpoint-20" / "state.txt").write_text("190")
    (out / "checkpoint-10" / "state.txt").unlink()
    manifest, state = c.load_latest()
    assert manifest.step == 10 and torch.equal(state["objects"]["w"], torch.full((4,), 10.0))
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-10", "odd \\ name ✓.json"]
    assert (out / "checkpoint-10" / "state.txt").read_text() == "45"
    assert not [p for p in tmp_path.iterdir() if ".restore-" in p.name]  # no debris beside it


def test_files_an_earlier_checkpoint_holds_are_not_uploaded_again(ckpt, tmp_path: Path) -> None:
    """A LoRA-style fine-tune: a large frozen base beside a small changing adapter. The base is
    uploaded once; later checkpoints list it and count only the bytes they wrote."""
    c, rec = ckpt
    out = tmp_path / "out"
    out.mkdir()
    (out / "base.bin").write_bytes(os.urandom(1 << 20))
    for step in (10, 20, 30):
        (out / "adapter.bin").write_bytes(os.urandom(1024) + bytes([step]))
        _save(c, step, out)
    written = [e["bytes"] for e in rec.kinds("checkpoint")]
    assert written[0] > 1 << 20 and all(n < 100_000 for n in written[1:]), written
    blobs = _blobs(c)
    manifests = c.list_manifests()
    listed = set().union(*(m.blobs() for m in manifests))
    # pruning (2 kept) deleted the adapters of the pruned checkpoint, never the shared base
    assert set(blobs) == listed and len(manifests) == 2 and len(blobs) == 3
    (out / "base.bin").unlink()
    manifest, _ = c.load_latest()
    assert manifest.step == 30 and (out / "base.bin").stat().st_size == 1 << 20


def test_a_damaged_blob_falls_back_to_the_previous_checkpoint(ckpt, tmp_path: Path) -> None:
    c, rec = ckpt
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("one")
    _save(c, 10, out)
    (out / "a.txt").write_text("two")
    _save(c, 20, out)
    newest = c.list_manifests()[0]
    (sha,) = newest.blobs() - c.list_manifests()[1].blobs()
    Path(c.store.fs._strip_protocol(f"{c.root}/{BLOBS}/{sha}")).write_text("tww")  # same size
    manifest, _ = c.load_latest()
    assert manifest.step == 10 and (out / "a.txt").read_text() == "one"
    assert [e["seq"] for e in rec.kinds("checkpoint_invalid")] == [newest.seq]


def test_backing_up_a_path_that_is_not_there_says_which() -> None:
    with pytest.raises(FileNotFoundError, match="nope/ckpt"):
        backup_files(("nope/ckpt",))


def test_a_trainer_with_its_own_checkpoint_folder_resumes_exactly_after_a_kill(tmp_path: Path) -> None:
    """The whole loop on the local market: the job is killed while a save uploads (the first at
    or after step 40: on a busy machine the market may see a later one), after the trainer wrote
    that save's `checkpoint-<step>/`; the relaunch gets the folder as last committed (without
    the uploading one), resumes from the same step as spotnb, and ends with a calm run's total."""
    out = str(tmp_path / "out")
    fn = functools.partial(jobfns.folder_trainer, steps=60, out=out)
    config = spot.Config(
        checkpoint="static:10",
        ship_modules=SHIP,
        local_schedule=[{"step": 40, "phase": "upload"}],
    )
    job = spot.train(fn, config)
    result = job.result(timeout=120)
    assert result["total"] == sum(range(60))
    resumed = [e for e in job.events if e["kind"] == "resumed"]
    kills = [e for e in job.events if e["kind"] == "preempted"]
    assert len(kills) == 1 and kills[0]["phase"] == "upload", kills
    committed = [e["step"] for e in job.events if e["kind"] == "checkpoint" and e["incarnation"] == 1]
    # the folder's newest checkpoint is the newest *committed* one, not the one being uploaded
    assert resumed and result["resumed_from"] == resumed[0]["from_step"] == committed[-1], (result, resumed)
    assert committed[-1] >= 30, committed
    sizes = [e["bytes"] for e in job.events if e["kind"] == "checkpoint"]
    assert sizes[0] > 1 << 20 and max(sizes[1:]) < 1 << 19, sizes  # the frozen base once
