"""`Config.files` reach the instance through the store: uploaded at submit (hashed, stored
once, size-limited), laid out relative to the job's working directory before `fn` runs, never
clobbering a different file. Real agents on the local market, and the real boot script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.errors import ConfigError
from spotnb.store import Store

SHIP = [__name__]  # this module by value: its helpers run on the instance
ROOT = Path(__file__).resolve().parents[2]
FILES = {"conf/params.json": b'{"lr": 0.1}', "data/a.txt": b"alpha\n", "data/sub/b.bin": bytes(range(256))}


def read_back(ctx: Any) -> dict[str, Any]:
    """What the function sees in its working directory."""
    for _ in ctx.steps(1):
        pass
    out = {"cwd": os.getcwd()}
    for root, _, names in os.walk("."):
        for name in names:
            path = os.path.relpath(os.path.join(root, name)).replace(os.sep, "/")
            with open(path, "rb") as f:
                out[path] = f.read()
    return out


@pytest.fixture
def notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A notebook directory holding conf/params.json, and a data folder outside it."""
    nb, src = tmp_path / "nb", tmp_path / "src"
    for rel, data in FILES.items():
        base = nb if rel.startswith("conf/") else src
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(data)
    monkeypatch.chdir(nb)
    return nb, src


def test_files_are_laid_out_in_the_instance_workdir_from_the_store(
    notebook: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb, src = notebook
    vm = tmp_path / "vm"  # the instance works somewhere else, as on a cloud VM
    monkeypatch.setenv("SPOTNB_WORKDIR", str(vm))
    config = spot.Config(ship_modules=SHIP, files=["conf/params.json", str(src / "data")])
    job = spot.train(read_back, config)
    seen = job.result(timeout=120)
    assert os.path.realpath(seen.pop("cwd")) == os.path.realpath(vm)
    assert seen == FILES  # relative paths kept inside the notebook dir; an outside folder by name
    # stored once each, by content; a second job uploads nothing new
    store = Store(config.store_url())
    blobs = sorted(store.ls(store.path("files")))
    assert len(blobs) == len(FILES)
    stamps = {b: os.stat(store.path("files", b)).st_mtime_ns for b in blobs}
    assert spot.train(read_back, config).result(timeout=120)["data/a.txt"] == b"alpha\n"
    assert {b: os.stat(store.path("files", b)).st_mtime_ns for b in blobs} == stamps
    assert sorted(store.ls(store.path("files"))) == blobs


def test_on_the_notebooks_own_dir_identical_files_are_kept_and_different_ones_refused(
    notebook: tuple[Path, Path],
) -> None:
    nb, src = notebook
    (nb / "data").mkdir()
    (nb / "data" / "a.txt").write_bytes(b"alpha\n")  # identical: kept as is
    job = spot.train(read_back, spot.Config(ship_modules=SHIP, files=["conf/params.json", str(src / "data")]))
    seen = job.result(timeout=120)
    assert os.path.realpath(seen["cwd"]) == os.path.realpath(nb)
    assert seen["data/sub/b.bin"] == FILES["data/sub/b.bin"]
    laid = next(e for e in job.events if e["kind"] == "files")
    assert (laid["count"], laid["written"]) == (3, 1)  # only the missing one was written

    (nb / "data" / "a.txt").write_bytes(b"my own edits\n")  # differs from the shipped one
    (src / "data" / "a.txt").write_bytes(b"alpha, shipped\n")
    job = spot.train(read_back, spot.Config(ship_modules=SHIP, files=[str(src / "data")]))
    with pytest.raises(spot.JobFailed, match=r"'data/a.txt' already exists in .* never overwrites"):
        job.result(timeout=120)
    assert (nb / "data" / "a.txt").read_bytes() == b"my own edits\n"


def test_too_many_bytes_are_refused_before_anything_is_submitted(
    notebook: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    nb, src = notebook
    import spotnb.files

    monkeypatch.setattr(spotnb.files, "FILES_MAX_BYTES", 200)
    with pytest.raises(
        ConfigError,
        match=r"Config.files: '.*data' \(.*\) brings the files .* to "
        r"\d+ bytes, over the 200 bytes limit",
    ):
        spot.train(read_back, spot.Config(ship_modules=SHIP, files=[str(src / "data")]))
    assert spot.jobs() == []


def test_the_boot_script_lays_the_files_out_in_its_workdir(
    notebook: tuple[Path, Path], tmp_path: Path
) -> None:
    """The cloud path without a cloud: the real boot script runs the real agent, which finds
    the files in the store and writes them under SPOTNB_WORKDIR."""
    from spotnb import api
    from spotnb.providers.base import LaunchSpec
    from spotnb.providers.bootstrap import bootstrap_script
    from spotnb.signing import load_key

    nb, src = notebook
    config = spot.Config(ship_modules=SHIP, files=["conf/params.json", str(src / "data")])
    _, payload, files = api._prepare(read_back, config)
    job = api._submit(payload, config, files, detach=True)  # submitted; no controller
    store = job.store
    store.write_bytes(
        store.job(job.id, "incarnations", "0001.json"),
        json.dumps({"incarnation": 1, "market": {}, "notice": {}}).encode(),
    )
    key = load_key(job.id)
    assert key is not None
    spec = LaunchSpec(
        job_id=job.id,
        incarnation=1,
        store_url=store.url,
        instance_type="x",
        region=None,
        command=[
            "python",
            "-m",
            "spotnb.runtime.agent",
            "--store",
            store.url,
            "--job",
            job.id,
            "--incarnation",
            "1",
        ],
        spotnb_version=spot.__version__,
        job_key=key.hex(),
    )
    script = tmp_path / "boot.sh"
    script.write_text(bootstrap_script(spec, "aws"))
    vm, log, elsewhere = tmp_path / "vm-work", tmp_path / "boot.log", tmp_path / "boot-cwd"
    elsewhere.mkdir()
    env = {
        **os.environ,
        "SPOTNB_PYTHON": sys.executable,
        "SPOTNB_LOG": str(log),
        "SPOTNB_POWEROFF_CMD": "true",
        "SPOTNB_VENV": str(tmp_path / "venv"),
        "SPOTNB_WORKDIR": str(vm),
        "PYTHONPATH": str(ROOT),
    }
    subprocess.run(["bash", str(script)], env=env, cwd=elsewhere, timeout=300, check=True)
    from spotnb.events import read_all

    kinds = [e["kind"] for e in read_all(store, job.id)]  # no controller: read the log itself
    assert "done" in kinds and "error" not in kinds, kinds
    import cloudpickle

    from spotnb.signing import unseal

    seen = cloudpickle.loads(
        unseal(key, job.id, "result.pkl", store.read_bytes(store.job(job.id, "result.pkl")))
    )
    assert os.path.realpath(seen.pop("cwd")) == os.path.realpath(vm)
    assert seen == FILES
    assert key.hex() not in log.read_text()  # the boot log never shows the key
