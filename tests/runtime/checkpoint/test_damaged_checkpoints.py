"""Checkpoints under attack: damaged manifests and files fall back, never fail the job.

The unit tests run the real checkpointer against a real directory store and damage what it
wrote; the end-to-end test damages a committed manifest between two incarnations of a real
job on the local market and checks the job still ends bit-exact.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import spotnb as spot
from spotnb.core.store import Store
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.checkpoint.manifest import InvalidManifest, Manifest
from tests.support import jobfns
from tests.support.jobs import Recorder, ckpt_save, ckpt_state, mounted_tmpfs

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


def _state(step: int) -> dict:
    return ckpt_state(step, 16)


def _save(c: Checkpointer, step: int, kind: str = "periodic") -> None:
    ckpt_save(c, step, kind, 16)


def _manifest_path(c: Checkpointer, seq: int) -> str:
    return f"{c.root}/{seq:08d}/MANIFEST.json"


def _doc(c: Checkpointer, seq: int) -> dict:
    return json.loads(c.store.read_bytes(_manifest_path(c, seq)))


def _rewrite(c: Checkpointer, seq: int, change: Callable[[dict], Any]) -> None:
    doc = _doc(c, seq)
    out = change(doc)
    c.store.write_bytes(
        _manifest_path(c, seq),
        out if isinstance(out, bytes) else json.dumps(doc if out is None else out).encode(),
    )


def _pop(key: str) -> Callable[[dict], None]:
    return lambda d: d.pop(key) and None


def _set(key: str, value: Any) -> Callable[[dict], None]:
    return lambda d: d.__setitem__(key, value)


def _only(entry: dict, *keys: str) -> None:
    """Drop every field of a manifest entry but `keys`."""
    for k in set(entry) - set(keys):
        del entry[k]


DAMAGE: dict[str, Callable[[dict], Any]] = {
    "unparseable": lambda d: b'{"seq": 2, "step":',
    "empty file": lambda d: b"",
    "not utf-8": lambda d: b"\xff\xfe\x00",
    "a list": lambda d: [d],
    "null": lambda d: b"null",
    "missing files": _pop("files"),
    "missing step": _pop("step"),
    "missing seq": _pop("seq"),
    "empty file list": _set("files", {}),
    "files is a list": lambda d: d.__setitem__("files", list(d["files"])),
    "entry without a digest": lambda d: _only(d["files"]["state.pt"], "size"),
    "entry with a digest spotnb cannot check": lambda d: (
        d["files"]["state.pt"].update({"xxh3_128": "0" * 32})
        or _only(d["files"]["state.pt"], "size", "xxh3_128")
    ),
    "digest not hex": lambda d: d["files"]["state.pt"].__setitem__("blake3", "g" * 64),
    "digest of the wrong length": lambda d: d["files"]["state.pt"].__setitem__("blake3", "0" * 63),
    "entry without size": lambda d: d["files"]["state.pt"].pop("size") and None,
    "entry is a string": lambda d: d["files"].__setitem__("state.pt", "abc"),
    "step is a string": _set("step", "20"),
    "step is negative": _set("step", -1),
    "step is a bool": _set("step", True),
    "seq of another folder": _set("seq", 1),
    "kind is a number": _set("kind", 3),
    "created is a string": _set("created", "yesterday"),
    "file outside the folder": lambda d: d["files"].__setitem__(
        "../00000001/state.pt", d["files"]["state.pt"]
    ),
    "dests names an unlisted file": _set("dests", {"other.bin": "/tmp/x"}),
    "lists a file that is not there": lambda d: d["files"].__setitem__(
        "extra.bin", {"size": 3, "sha256": "0" * 64}
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_manifest_falls_back_to_the_previous_checkpoint(ckpt, damage: str) -> None:
    c, rec = ckpt
    _save(c, 10)
    _save(c, 20)
    newest = c.list_manifests()[0]
    _rewrite(c, newest.seq, DAMAGE[damage])
    manifest, state = c.load_latest()
    assert manifest.step == 10 and torch.equal(state["objects"]["w"], torch.full((16, 16), 10.0))
    invalid = rec.kinds("checkpoint_invalid")
    assert [e["seq"] for e in invalid] == [newest.seq] and invalid[0]["reason"]


@pytest.mark.parametrize("damage", ["unparseable", "a list", "missing files", "empty file list"])
def test_pruning_goes_on_after_a_damaged_manifest(ckpt, damage: str) -> None:
    """Today's bug: one unparseable manifest made every later prune give up (8 kept, not 2)."""
    c, _ = ckpt
    _save(c, 10, "insurance")
    _save(c, 20, "insurance")
    _rewrite(c, 1, DAMAGE[damage])
    for step in range(30, 100, 10):
        _save(c, step, "insurance")
    folders = [n for n in c.store.ls(c.root) if n.isdigit()]
    assert [m.step for m in c.list_manifests()] == [90, 80]
    assert len(folders) == 2, folders


def test_pruning_keeps_the_newest_two_valid_when_newer_ones_are_damaged(ckpt) -> None:
    c, _ = ckpt
    for step in (10, 20, 30):
        _save(c, step, "insurance")
    # the two newest survivors are damaged after the fact; the next save must not take the
    # last good one with them
    _rewrite(c, 3, DAMAGE["missing files"])
    _rewrite(c, 2, DAMAGE["unparseable"])
    _save(c, 40, "insurance")
    assert [m.step for m in c.list_manifests()] == [40]
    manifest, _ = c.load_latest()
    assert manifest.step == 40
    c.store.rm(f"{c.root}/{manifest.seq:08d}/state.pt")
    assert c.load_latest() is None  # nothing good left, and nothing raised


@pytest.mark.parametrize("how", ["truncate", "delete", "flip", "empty", "append"])
def test_a_damaged_state_file_falls_back(ckpt, how: str) -> None:
    c, rec = ckpt
    _save(c, 10)
    _save(c, 20)
    local = f"{c.root}/{c.list_manifests()[0].seq:08d}/state.pt"  # a local store: a path
    data = Path(local).read_bytes()
    if how == "delete":
        os.unlink(local)
    else:
        new = {
            "truncate": data[: len(data) // 2],
            "empty": b"",
            "append": data + b"x",
            "flip": data[:100] + bytes([data[100] ^ 1]) + data[101:],
        }[how]
        with open(local, "wb") as f:
            f.write(new)
    manifest, _ = c.load_latest()
    assert manifest.step == 10
    assert rec.kinds("checkpoint_invalid")[0]["step"] == 20


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"size": 3}, "carries no digest: it needs one of 'blake3', 'sha256'"),
        ({"size": 3, "xxh3_128": "0" * 32}, "carries no digest"),
        ({"size": 3, "blake3": "0" * 64, "blob": True}, "a blob without the sha256 that names it"),
        ({"blake3": "0" * 64}, "has size None"),
    ],
)
def test_a_manifest_entry_without_a_digest_it_can_check_is_refused_naming_it(entry, says) -> None:
    """An entry must carry a digest restore can check (BLAKE3 for files written by value, the
    sha256 of manifests before it and of blobs): one with neither is refused when the manifest
    is read, naming the entry and what it lacks, never verified as "nothing to compare"."""
    doc = {
        "seq": 2,
        "step": 20,
        "kind": "periodic",
        "incarnation": 1,
        "created": 0.0,
        "files": {"state.pt": {"size": 3, "sha256": "0" * 64}, "tensors.bin": entry},
    }
    with pytest.raises(InvalidManifest) as err:
        Manifest.parse(json.dumps(doc).encode(), "00000002")
    assert "'tensors.bin'" in str(err.value) and says in str(err.value)


def test_a_signed_manifest_covers_the_blake3_digest(tmp_path) -> None:
    """The HMAC covers every entry's digest: whoever rewrites a BLAKE3 digest in a signed
    manifest (to match a tensors.bin they changed) makes the manifest invalid, and restore
    takes the previous checkpoint."""
    key = b"k" * 32
    rec = Recorder()
    c = Checkpointer(Store(str(tmp_path / "store")), "job", 1, rec, key=key)
    try:
        _save(c, 10)
        _save(c, 20)
        newest, older = c.list_manifests()
        assert "blake3" in newest.files["state.pt"]
        # the attacker puts another state in the newest folder and rewrites its entry to match
        swapped = c.store.read_bytes(f"{c.root}/{older.seq:08d}/state.pt")
        c.store.write_bytes(f"{c.root}/{newest.seq:08d}/state.pt", swapped)
        _rewrite(c, newest.seq, lambda d: d["files"].__setitem__("state.pt", older.files["state.pt"]))
        manifest, state = c.load_latest()
        assert manifest.step == 10 and manifest.seq == older.seq
        invalid = rec.kinds("checkpoint_invalid")
        assert [e["seq"] for e in invalid] == [newest.seq] and "signature" in invalid[0]["reason"]
    finally:
        c.close()


def test_a_full_store_fails_the_save_not_the_job(tmp_path) -> None:
    """A store on a 1 MB tmpfs: saves that do not fit fail (an event), earlier ones survive,
    and nothing half-written is left behind to be mistaken for a checkpoint or a segment."""
    with mounted_tmpfs(tmp_path / "small", "1m") as mnt:
        rec = Recorder()
        c = Checkpointer(Store(mnt.as_uri()), "job", 1, rec, spool_dir=str(tmp_path))
        c.save_now(c.snapshot(_state(10), 10, "periodic"))
        big = {"step": 20, "objects": {"w": torch.zeros(512, 1024)}, "rng": {}, "user": {}}
        with pytest.raises(OSError):
            c.save_now(c.snapshot(big, 20, "periodic"))
        manifest, _ = c.load_latest()
        assert manifest.step == 10
        leftovers = [p for p in glob.glob(f"{mnt}/**/*", recursive=True) if ".tmp-" in p]
        assert leftovers == []
        c.close()


# -- end to end -----------------------------------------------------------------------------
class _DamagingContext:
    """The job's real context, except that incarnation 1 damages the newest committed manifest
    in the store when it reaches step `at` (after the save at `saved` is committed)."""

    def __init__(self, ctx: Any, store_dir: str, change: str, at: int, saved: int) -> None:
        self._ctx, self._store_dir, self._change, self._at, self._saved = ctx, store_dir, change, at, saved

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def steps(self, n: int):
        for step in self._ctx.steps(n):
            if step == self._at and self._ctx.incarnation == 1:
                self._damage()
            yield step

    def _damage(self) -> None:
        pattern = os.path.join(self._store_dir, "jobs", "*", "ckpt", "*", "MANIFEST.json")
        deadline = time.time() + 60
        while True:  # the save at `saved` commits in the background
            found = [p for p in glob.glob(pattern) if json.loads(Path(p).read_text())["step"] == self._saved]
            if found or time.time() > deadline:
                break
            time.sleep(0.05)
        newest = found[0]
        doc = json.loads(Path(newest).read_text())
        if self._change == "list":
            out = json.dumps([doc])
        elif self._change == "missing files":
            doc.pop("files")
            out = json.dumps(doc)
        else:
            out = Path(newest).read_text()[:30]
        with open(newest, "w") as f:
            f.write(out)


def mlp_with_damage(ctx: Any, store_dir: str, change: str) -> dict:
    """Held at step 50 until the kill: a kill that landed after the save at 60 committed would
    resume from there, past the damaged checkpoint, and test nothing."""
    damaging = _DamagingContext(ctx, store_dir, change, at=45, saved=40)
    return jobfns.seeded_mlp(damaging, step_delay=0.01, hold_at=50)


@pytest.mark.parametrize("change", ["list", "missing files", "truncated"])
def test_a_job_survives_a_damaged_manifest_between_incarnations(reference, tmp_path, change) -> None:
    """Incarnation 1 commits steps 20 and 40, the step-40 manifest is damaged, the instance is
    killed at 50: incarnation 2 must report the damage, resume from 20 and end bit-exact."""
    ref_result, _ = reference
    store_dir = tmp_path / "store"
    config = spot.Config(
        checkpoint="static:20",
        store=store_dir.as_uri(),
        ship_modules=[*SHIP, __name__],  # the damaging context, by value
        local_schedule=[{"step": 50, "phase": "step"}],
        local_alloc_delay=(0.05, 0.1),
    )
    job = spot.train(functools.partial(mlp_with_damage, store_dir=str(store_dir), change=change), config)
    result = job.result(timeout=240)
    invalid = [e for e in job.events if e["kind"] == "checkpoint_invalid"]
    resumed = [e for e in job.events if e["kind"] == "resumed"]
    assert invalid and invalid[0]["reason"]
    assert [e["step"] for e in job.events if e["kind"] == "preempted"] == [50]
    assert [e["from_step"] for e in resumed] == [20]
    for name, tensor in ref_result["params"].items():
        assert torch.equal(result["params"][name], tensor), name


# -- the local market's scratch folders ---------------------------------------------------
def test_a_local_job_leaves_no_scratch_folder(tmp_path, monkeypatch) -> None:
    """Each local job left two /tmp/spotnb-local-* folders (one from the config check at
    submit, one from its controller); now none once the controller is done, and the folder
    of a market whose process died is removed by the next market."""
    import subprocess
    import sys
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the controller and the agents
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # this process
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (scratch / f"spotnb-local-{dead}-stale").mkdir()
    (scratch / f"spotnb-local-{os.getpid()}-alive").mkdir()
    job = spot.train(
        functools.partial(jobfns.slow_steps, steps=20, step_time=0.01),
        spot.Config(checkpoint="static:10", ship_modules=SHIP, local_alloc_delay=(0.05, 0.1)),
    )
    assert job.result(timeout=180) == 20

    def left() -> list[str]:
        return sorted(p.name for p in scratch.iterdir() if p.name.startswith("spotnb-local-"))

    deadline = time.time() + 60  # the controller closes its market after the job's last event
    while left() != [f"spotnb-local-{os.getpid()}-alive"] and time.time() < deadline:
        time.sleep(0.1)
    assert left() == [f"spotnb-local-{os.getpid()}-alive"]
