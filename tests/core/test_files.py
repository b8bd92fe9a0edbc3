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
from spotnb.core.store import Store
from spotnb.errors import ConfigError
from tests.support.jobs import agent_command

pytestmark = pytest.mark.jobs

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
    import spotnb.core.files

    monkeypatch.setattr(spotnb.core.files, "FILES_MAX_BYTES", 200)
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
    from spotnb import api, submit
    from spotnb.core.signing import load_key
    from spotnb.providers.base import LaunchSpec
    from spotnb.providers.bootstrap import bootstrap_script

    nb, src = notebook
    config = spot.Config(ship_modules=SHIP, files=["conf/params.json", str(src / "data")])
    _, payload, files = api._prepare(read_back, config)
    job = submit.submit_job(payload, config, files, detach=True)  # submitted; no controller
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
        command=agent_command(store.url, job.id),
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
    from spotnb.core.events import read_all

    kinds = [e["kind"] for e in read_all(store, job.id)]  # no controller: read the log itself
    assert "done" in kinds and "error" not in kinds, kinds
    import cloudpickle

    from spotnb.core.signing import unseal

    seen = cloudpickle.loads(
        unseal(key, job.id, "result.pkl", store.read_bytes(store.job(job.id, "result.pkl")))
    )
    assert os.path.realpath(seen.pop("cwd")) == os.path.realpath(vm)
    assert seen == FILES
    assert key.hex() not in log.read_text()  # the boot log never shows the key


# -- what a shipped folder may hold (issue #29 item 7): links, loops, unreadable and special
# files, huge trees; refused at submit naming the path and the fix, or left out with a warning
def _tree(root: Path) -> Path:
    data = root / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_bytes(b"alpha\n")
    (data / "sub" / "b.txt").write_bytes(b"beta\n")
    return data


def _collect(paths: list[str], cwd: Path) -> dict[str, bytes]:
    from spotnb.core.files import collect

    return {e["path"]: Path(e["source"]).read_bytes() for e in collect(paths, str(cwd))}


def test_a_dangling_link_in_a_folder_is_refused_naming_the_link_its_target_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _tree(tmp_path)
    (data / "sub" / "ghost.bin").symlink_to(tmp_path / "gone" / "weights.bin")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:  # it was a raw FileNotFoundError
        spot.train(read_back, spot.Config(ship_modules=SHIP, files=["data"]))
    message = str(info.value)
    assert message.startswith("Config.files: 'data'") and "ghost.bin" in message, message
    assert "gone/weights.bin" in message and "remove the" in message, message
    assert spot.jobs() == []
    # named directly: the same, before the function is pickled
    with pytest.raises(
        ConfigError, match=r"Config.files\[0\]: .*ghost.bin.* is a symbolic link to .*weights.bin"
    ):
        spot.train(read_back, spot.Config(ship_modules=SHIP, files=["data/sub/ghost.bin"]))


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda d: (d / "self").symlink_to(d / "self"), "leads back to itself"),
        (lambda d: ((d / "x").symlink_to(d / "y"), (d / "y").symlink_to(d / "x")), "leads back to itself"),
        (lambda d: (d / "sub" / "up").symlink_to(d), "contains it"),
        (lambda d: (d / "sub" / "here").symlink_to("."), "contains it"),
    ],
    ids=["self", "pair", "to-ancestor", "to-dot"],
)
def test_a_loop_of_links_is_refused(tmp_path: Path, make: Any, words: str) -> None:
    from spotnb.core.files import FilesError, collect

    data = _tree(tmp_path)
    make(data)
    with pytest.raises(FilesError, match=words):
        collect(["data"], str(tmp_path))


def test_links_are_followed_wherever_they_point(tmp_path: Path) -> None:
    """The instance gets what the function would read through the link (cp -rL): a file or a
    folder outside the shipped one, a link to a sibling folder; an Emacs lock is left out."""
    data = _tree(tmp_path)
    outside = tmp_path / "elsewhere"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "c.txt").write_bytes(b"gamma\n")
    (outside / "w.bin").write_bytes(b"\x00\x01")
    (data / "weights.bin").symlink_to(outside / "w.bin")
    (data / "ext").symlink_to(outside)
    (data / "twin").symlink_to("sub")  # a sibling, not an ancestor: no loop
    (data / ".#a.txt").symlink_to("me@host.1234:1700000000")  # Emacs's lock: dangling, left out
    got = _collect(["data"], tmp_path)
    assert got == {
        "data/a.txt": b"alpha\n",
        "data/weights.bin": b"\x00\x01",
        "data/ext/w.bin": b"\x00\x01",
        "data/ext/deep/c.txt": b"gamma\n",
        "data/sub/b.txt": b"beta\n",
        "data/twin/b.txt": b"beta\n",
    }


def test_an_unreadable_file_or_folder_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """chmod 0 does not stop root (the test may run as root): the refusals are made to happen."""
    import spotnb.core.files
    from spotnb.core.files import FilesError, collect

    data = _tree(tmp_path)
    (data / "sub" / "secret.key").write_bytes(b"k")
    (data / "locked").mkdir()
    real_hash, real_scandir = spotnb.core.files._sha256, os.scandir

    def hash_(path: str, most: int | None = None) -> str:
        if path.endswith("secret.key"):
            raise PermissionError(13, "Permission denied", path)
        return real_hash(path, most)

    monkeypatch.setattr(spotnb.core.files, "_sha256", hash_)
    with pytest.raises(
        FilesError, match=r"secret.key cannot be read \(Permission denied\); make it readable"
    ):
        collect(["data"], str(tmp_path))
    (data / "sub" / "secret.key").unlink()

    def scandir(path: Any) -> Any:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(spotnb.core.files.os, "scandir", scandir)
    # os.walk skipped such a folder silently: the job ran without its files
    with pytest.raises(FilesError, match=r"the folder .*locked cannot be listed \(Permission denied\)"):
        collect(["data"], str(tmp_path))


def test_pipes_and_sockets_are_left_out_with_a_warning_and_refused_when_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import socket

    from spotnb.core.files import FilesError, collect

    data = _tree(tmp_path)
    os.mkfifo(data / "fifo")  # opening it to hash it would block for ever
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(data / "sub" / "s.sock"))
    try:
        with caplog.at_level("WARNING", logger="spotnb.core.files"):
            got = _collect(["data"], tmp_path)
        assert set(got) == {"data/a.txt", "data/sub/b.txt"}
        assert "2 entries left out" in caplog.text and "named pipe" in caplog.text and "socket" in caplog.text
        with pytest.raises(FilesError, match=r"Config.files\[1\]: 'data/fifo' is a named pipe .* remove it"):
            collect(["data/a.txt", "data/fifo"], str(tmp_path))
        with pytest.raises(FilesError, match="is a device"):
            collect(["/dev/null"], str(tmp_path))
    finally:
        sock.close()


def test_too_many_files_are_refused_before_any_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100,000 small files made a 13 MB signed spec and 100,000 uploads: refused, naming the
    fix (the count is checked as the tree is walked, not after hashing it all)."""
    import spotnb.core.files
    from spotnb.core.files import FilesError, collect

    data = tmp_path / "many"
    data.mkdir()
    for i in range(60):
        (data / f"f{i:03d}.txt").write_bytes(b"%d" % i)
    monkeypatch.setattr(spotnb.core.files, "FILES_MAX_COUNT", 50)
    hashed = []
    real = spotnb.core.files._sha256
    monkeypatch.setattr(spotnb.core.files, "_sha256", lambda p, most=None: hashed.append(p) or real(p, most))
    with pytest.raises(FilesError, match=r"more than 50, spotnb's limit .* pack them \(tar or zip"):
        collect(["many"], str(tmp_path))
    assert len(hashed) == 50


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="no /proc here")
def test_a_file_that_grows_while_it_is_read_is_refused(tmp_path: Path) -> None:
    """A /proc file says 0 bytes and holds more (/proc/self/pagemap holds terabytes): reading
    it to its end hashed for ever; a log being written would ship other bytes than it hashed."""
    from spotnb.core.files import FilesError, collect

    data = _tree(tmp_path)
    (data / "status").symlink_to("/proc/self/status")
    with pytest.raises(FilesError, match=r"status grew while it was read \(0 bytes when listed\)"):
        collect(["data"], str(tmp_path))


def test_unicode_and_odd_names_keep_their_path(tmp_path: Path) -> None:
    data = tmp_path / "données"
    data.mkdir()
    for name in ("résumé.txt", "日本語.bin", "with space", "-dash", "new\nline", "back\\slash", "x" * 200):
        (data / name).write_bytes(name.encode())
    got = _collect(["données"], tmp_path)
    assert got == {f"données/{n}": n.encode() for n in os.listdir(data)}


#: zombie states and start times come from /proc; elsewhere the pid check alone decides
NEEDS_PROC = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads process states from /proc, which only Linux has"
)


@NEEDS_PROC
def test_a_killed_process_s_folder_goes_while_it_is_still_a_zombie(tmp_path: Path) -> None:
    """`Job.stop` returns once the killed instance is a zombie (the local market reads its
    end from /proc before its parent reaps it): the next script to start must already count
    its scratch folder as orphaned, or one folder per stopped job stays in /tmp."""
    from spotnb.core.files import remove_orphaned

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    folder = tmp_path / f"spotnb-script-{child.pid}-abc"
    folder.mkdir()
    mine = tmp_path / f"spotnb-script-{os.getpid()}-def"  # a live owner keeps its folder
    mine.mkdir()
    try:
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":
            os.sched_yield()  # until it has exited, unreaped
        remove_orphaned(str(tmp_path), "spotnb-script-")
        assert not folder.exists() and mine.exists()
    finally:
        child.wait()


@NEEDS_PROC
def test_a_folder_whose_pid_came_round_again_is_orphaned(tmp_path: Path) -> None:
    """A pid is reused once the counter wraps (at 32768 on many machines, which a test suite
    does): a live process that started after the folder was last changed did not make it."""
    from spotnb.core.files import remove_orphaned

    folder = tmp_path / f"spotnb-spool-{os.getpid()}-abc"
    folder.mkdir()
    remove_orphaned(str(tmp_path), "spotnb-spool-")
    assert folder.exists()  # made by this process, which still runs
    day_ago = folder.stat().st_mtime - 86400  # before this process started
    os.utime(folder, (day_ago, day_ago))
    remove_orphaned(str(tmp_path), "spotnb-spool-")
    assert not folder.exists()
