"""The trained weights out of the store (`job.checkpoint`, `spot.load_checkpoint`, `spotnb export`):
real jobs on the local market, their checkpoints read back in the notebook's process (and in a
fresh one with only the store and the key), compared to the bit with what the job trained.

Three jobs, run at once by one module fixture: a tied-embedding model with a frozen blob (every
one-process format: a whole-state copy, gated `tensors.bin`, blobs by content), a sharded FSDP2
job (DCP, two processes) and a small Hugging Face Trainer job."""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import spotnb as spot
from spotnb import cli
from tests.support import procfns, weightfns

pytestmark = pytest.mark.jobs

HF = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("weights-home")
    out = tmp_path_factory.mktemp("weights-out")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOTNB_HOME", str(home))
    try:
        jobs = {
            # keep_last=4: every periodic save stays, so older steps can be asked for
            "tied": spot.train(
                weightfns.tied_lm,
                spot.Config(checkpoint="static:5", keep_last=4, ship_modules=["tests.support.weightfns"]),
            ),
            "sharded": spot.train(
                functools.partial(procfns.sharded_mlp, steps=10, out=str(out)),
                spot.Config(
                    ship_modules=["tests.support.procfns"],
                    procs_per_instance=2,
                    checkpoint="static:5",
                    local_alloc_delay=0.1,
                ),
            ),
        }
        if HF:
            from tests.integrations import hfjobs

            jobs["hf"] = spot.train(
                functools.partial(hfjobs.tiny_gpt2, out=str(out / "hf-out"), steps=10),
                spot.Config(checkpoint="static:5", ship_modules=["tests.integrations.hfjobs"]),
            )
        results = {name: job.result(timeout=180) for name, job in jobs.items()}
        return {"home": home, "out": out, "jobs": jobs, "results": results}
    finally:
        mp.undo()


@pytest.fixture
def at_home(trained: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The jobs' own machine: their job DB and their keys."""
    monkeypatch.setenv("SPOTNB_HOME", str(trained["home"]))
    return trained


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, w in want.items():
        assert got[name].device.type == "cpu", name
        assert torch.equal(got[name], w), name


def _store_copy(job: spot.Job, tmp_path: Path) -> tuple[str, Path]:
    """A copy of the job's store (its spec, events and checkpoints) to damage: (URL, its ckpt/)."""
    root = tmp_path / "copy"
    shutil.copytree(job.store.path(job.store.job(job.id)), root / "jobs" / job.id)
    return root.as_uri(), root / "jobs" / job.id / "ckpt"


def test_the_newest_checkpoint_is_the_trained_model_bit_for_bit(at_home: dict[str, Any]) -> None:
    job, result = at_home["jobs"]["tied"], at_home["results"]["tied"]
    ckpt = job.checkpoint()
    assert (ckpt.step, ckpt.seq, ckpt.kind, ckpt.state, ckpt.skipped) == (20, 4, "periodic", {"seen": 20}, [])
    assert sorted(ckpt) == ["model", "optimizer"]
    _equal(ckpt["model"], result["final"])
    # what a PyTorch user does with it: both load into fresh objects
    model = torch.nn.ModuleDict(
        {
            "emb": torch.nn.Embedding(16, 8),
            "head": torch.nn.Linear(8, 16, bias=False),
            "frozen": torch.nn.Linear(128, 128, bias=False),
        }
    )
    model.load_state_dict(ckpt["model"])
    torch.optim.Adam([model["emb"].weight], lr=1e-2).load_state_dict(ckpt["optimizer"])
    # older ones: step 5 is the whole-state copy that wrote the frozen blob, 10 a gated one
    for step in (5, 10):
        older = job.checkpoint(step=step)
        assert (older.step, older.state) == (step, {"seen": step})
        _equal(older["model"], result["at"][step])
    # by id (a prefix, as the CLI takes), through the job DB
    _equal(spot.load_checkpoint(job.id[:-2])["model"], result["final"])


def test_from_another_machine_it_takes_the_store_and_the_key(
    trained: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    job, result = trained["jobs"]["tied"], trained["results"]["tied"]
    elsewhere = tmp_path / "elsewhere-home"
    monkeypatch.setenv("SPOTNB_HOME", str(elsewhere))
    # no job DB entry here: the store must be named
    with pytest.raises(spot.SpotnbError, match="pass store="):
        spot.load_checkpoint(job.id)
    # the store, but not the key: refused, saying where the key goes
    key = elsewhere / "keys" / f"{job.id}.key"
    with pytest.raises(spot.SpotnbError, match=f"key is not on this machine \\({key}\\)"):
        spot.load_checkpoint(job.id, store=job.store.url)
    assert cli.main(["export", job.id, str(tmp_path / "x"), "--store", job.store.url]) == 2
    assert "copy the key file" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    # another job's key (or a forged spec): refused before any checkpoint is read
    key.parent.mkdir(parents=True)
    key.write_text(os.urandom(32).hex() + "\n")
    with pytest.raises(spot.SpotnbError, match="spec does not verify with the key on this machine"):
        spot.load_checkpoint(job.id, store=job.store.url)
    # with the key copied over: a fresh process reads it (nothing of this one's state)
    shutil.copy(trained["home"] / "keys" / f"{job.id}.key", key)
    saved = tmp_path / "model.pt"
    code = (
        "import sys, torch, spotnb as spot; "
        f"c = spot.load_checkpoint({job.id!r}, store={job.store.url!r}); "
        f"torch.save(dict(c['model']), {str(saved)!r}); print(c.step, c.state['seen'])"
    )
    env = {**os.environ, "SPOTNB_HOME": str(elsewhere), "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["20", "20"]
    _equal(torch.load(saved), result["final"])


def test_export_writes_safetensors_and_torch_files(
    at_home: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    job, result = at_home["jobs"]["tied"], at_home["results"]["tied"]
    out = tmp_path / "out"
    assert cli.main(["export", job.id, str(out)]) == 0
    assert capsys.readouterr().out.split() == [str(out / "model.safetensors")]
    # the tied weight is in the file twice (safetensors refuses shared memory): both load
    _equal(load_file(out / "model.safetensors"), result["final"])
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt", "spotnb_job": job.id, "step": "20", "seq": "4"}
    assert cli.main(["export", job.id, str(out / "t"), "--format", "torch", "--step", "10"]) == 0
    _equal(torch.load(out / "t" / "model.pt"), result["at"][10])
    # an existing file is not replaced without --overwrite
    before = (out / "model.safetensors").read_bytes()
    assert cli.main(["export", job.id, str(out), "--step", "15"]) == 2
    assert "model.safetensors already exist" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == before
    assert cli.main(["export", job.id, str(out), "--step", "15", "--overwrite"]) == 0
    _equal(load_file(out / "model.safetensors"), result["at"][15])
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "t"]  # no temp file left
    # a folder that cannot be made (a file is in the way): said, not a traceback
    (tmp_path / "file").write_text("x")
    assert cli.main(["export", job.id, str(tmp_path / "file" / "sub")]) == 2
    assert "cannot write model.safetensors" in capsys.readouterr().err
    with pytest.raises(spot.SpotnbError, match="choose one of safetensors, torch"):
        job.export(str(tmp_path / "y"), format="onnx")


def test_damaged_checkpoints_are_passed_over_saying_why(
    at_home: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job, result = at_home["jobs"]["tied"], at_home["results"]["tied"]
    url, ckpt_dir = _store_copy(job, tmp_path)
    load = functools.partial(spot.load_checkpoint, job.id, store=url)
    data = ckpt_dir / "00000004" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="spotnb"):
        ckpt = load()
    assert ckpt.step == 15 and "checkpoint 00000004 (step 20)" in ckpt.skipped[0], ckpt.skipped
    assert "do not match the manifest" in ckpt.skipped[0]
    assert "passed over 1 newer checkpoint" in caplog.text
    _equal(ckpt["model"], result["at"][15])
    with pytest.raises(spot.CheckpointError, match="checkpoint of step 20 does not verify.*step=None"):
        load(step=20)
    (ckpt_dir / "00000003" / "tensors.bin").unlink()  # a file gone
    ckpt = load()
    assert ckpt.step == 10 and len(ckpt.skipped) == 2, ckpt.skipped
    # a manifest rewritten (its step changed): its signature no longer holds
    path = ckpt_dir / "00000002" / "MANIFEST.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "step": 12}))
    ckpt = load()
    assert ckpt.step == 5 and "wrong signature" in ckpt.skipped[-1], ckpt.skipped
    _equal(ckpt["model"], result["at"][5])
    with pytest.raises(
        spot.CheckpointError, match=r"no checkpoint of step 10; .* steps \[5, 15, 20\].*wrong signature"
    ):
        load(step=10)
    with pytest.raises(spot.CheckpointError, match=r"no checkpoint of step 7"):
        load(step=7)
    # the frozen blob every checkpoint lists: none verifies any more
    (blob,) = (ckpt_dir / "blobs").iterdir()
    blob.write_bytes(b"\0" * blob.stat().st_size)
    with pytest.raises(spot.CheckpointError, match="no checkpoint verifies against its manifest"):
        load()
    # before its first save a job has no checkpoint folder at all
    shutil.rmtree(ckpt_dir)
    with pytest.raises(spot.CheckpointError, match="has no checkpoint yet"):
        load()
    with pytest.raises(spot.SpotnbError, match="step='20': a checkpoint's step is a non-negative int"):
        load(step="20")
    # a job that is in neither the job DB nor the store
    with pytest.raises(spot.SpotnbError, match="no job 'nope'"):
        spot.load_checkpoint("nope")
    with pytest.raises(spot.SpotnbError, match="'nope' is not in store"):
        spot.load_checkpoint("nope", store=url)


def test_a_sharded_checkpoint_loads_whole_into_one_process(at_home: dict[str, Any], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    job = at_home["jobs"]["sharded"]
    full = torch.load(at_home["out"] / "1-0.pt")  # what rank 0 gathered at the end
    ckpt = job.checkpoint()
    assert ckpt.sharded and ckpt.step == 10
    _equal(ckpt["model"], full)
    # the optimizer's state as get_optimizer_state_dict gives it: keyed by parameter name
    assert sorted(ckpt["optimizer"]["state"]) == sorted(full)
    job.export(str(tmp_path))
    _equal(load_file(tmp_path / "model.safetensors"), full)
    # rank 1's file of the newest damaged: that checkpoint is passed over, for step 5's
    url, ckpt_dir = _store_copy(job, tmp_path)
    newest = max(p for p in ckpt_dir.iterdir() if p.name.isdigit())
    shard = newest / "dcp" / "__1_1.distcp"
    shard.write_bytes(shard.read_bytes()[::-1])
    older = spot.load_checkpoint(job.id, store=url)
    assert older.step == 5 and "__1_1.distcp" in older.skipped[0], older.skipped
    with pytest.raises(spot.CheckpointError, match="step 10 does not verify"):
        spot.load_checkpoint(job.id, step=10, store=url)


@pytest.mark.skipif(not HF, reason="transformers is not installed (spotnb[hf])")
def test_a_hugging_face_job_exports_the_trainers_checkpoint_folder(
    at_home: dict[str, Any], tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    job, result = at_home["jobs"]["hf"], at_home["results"]["hf"]
    # reading it leaves the Trainer's output_dir alone (this machine's: a local-market job's),
    # where a restore would make the folder what the checkpoint holds
    later = at_home["out"] / "hf-out" / "written-after.txt"
    later.write_text("mine")
    assert job.checkpoint().step == 10
    assert later.read_text() == "mine"
    written = job.export(str(tmp_path))
    assert {p.parent for p in written} == {tmp_path / "checkpoint-10"}
    assert {"model.safetensors", "config.json", "trainer_state.json"} <= {p.name for p in written}
    weights = load_file(tmp_path / "checkpoint-10" / "model.safetensors")
    for name, w in weights.items():
        assert torch.equal(w, result["weights"][name]), name
