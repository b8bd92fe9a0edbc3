"""spotnb ships itself (spotnb.providers.shipping, spotnb.providers.code_fetch, the boot scripts' install).

What a VM installs is the notebook's own spotnb, built as a wheel from the imported package,
stored by content, named by the job's signed code.json, fetched by the VM with its identity and
checked against the sha256 its boot script carries. These tests build the wheel from this
checkout; install it into a venv that has never seen spotnb (and rebuild it there: the same
bytes); run the real boot script with a tampered, a truncated and a good wheel; and sign an S3
request the way botocore does. One venv per session, made with uv when it is there.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.core.signing import new_key, save_key
from spotnb.core.store import Store
from spotnb.errors import ConfigError
from spotnb.providers import code_fetch, shipping
from spotnb.providers.base import LaunchSpec
from spotnb.providers.bootstrap import TORCH_SPEC, bootstrap_script, coordinator_script
from spotnb.providers.shipping import CodeError, CodeRef
from spotnb.settings.registry import get_provider_class
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures (moto for the S3 read)
from tests.support.paths import REPO

ROOT = REPO
JOB = "20260101-000000-c0de00"


def _zip(data: bytes) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(data))


def _config(store_url: str, **kw: Any) -> spot.Config:
    # a cloud provider's settings without its SDK calls: only the fields shipping reads
    return spot.Config(provider="aws", instance_type="g4dn.xlarge", store=store_url, **kw)


@pytest.fixture
def key(spotnb_home: Path) -> bytes:
    k = new_key()
    save_key(JOB, k)
    return k


# -- the wheel --------------------------------------------------------------------------------------
def test_wheel_is_the_package_without_the_extension_and_with_pinned_runtime_deps() -> None:
    from importlib import metadata

    wheel = shipping.build_wheel()
    z = _zip(wheel.data)
    names = z.namelist()
    package = sorted(n for n in names if n.startswith("spotnb/"))
    expected = sorted(
        "spotnb/" + p.relative_to(ROOT / "spotnb").as_posix()
        for p in (ROOT / "spotnb").rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and "labextension" not in p.relative_to(ROOT / "spotnb").parts[:1]
        and not p.name.startswith(".")
        and p.suffix not in (".pyc", ".pyo")
    )
    assert package == expected and "spotnb/providers/shipping.py" in package
    assert not [n for n in names if "labextension" in n or "__pycache__" in n or n.endswith(".pyc")]
    info = f"spotnb-{spot.__version__}.dist-info"
    assert names[-1] == f"{info}/RECORD"  # the dist-info last, RECORD last of all
    meta = z.read(f"{info}/METADATA").decode()
    requires = [line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")]
    base = [r for r in requires if ";" not in r]
    for dep in ("pydantic", "cloudpickle", "fsspec", "blake3"):
        assert f"{dep}=={metadata.version(dep)}" in base
    assert "numpy" in base  # the image's, any version
    joined = " ".join(requires)
    for left_out in ("torch", "ipywidgets", "plotly", "anywidget", "jupyter", "pyyaml"):
        assert not any(r.split("=")[0].split(";")[0].strip() == left_out for r in requires), left_out
    assert "torch==" not in joined and "torch>" not in joined
    extras = {r.split('extra == "')[1].rstrip('"'): r.split(";")[0] for r in requires if "extra ==" in r}
    assert set(extras) == {"aws", "azure", "gcp", "elastic"}
    assert all("==" in r.split(";")[0] for r in requires if ";" in r), requires
    # RECORD: every other file with its sha256 and size, as the wheel spec says
    rows = [line.split(",") for line in z.read(f"{info}/RECORD").decode().splitlines()]
    assert sorted(r[0] for r in rows) == sorted(names)
    for name, digest, size in rows:
        if name.endswith("RECORD"):
            assert (digest, size) == ("", "")
            continue
        data = z.read(name)
        b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={b64}", len(data))
    assert z.read(f"{info}/WHEEL").decode().count("Tag: py3-none-any") == 1


def test_extras_match_pyproject() -> None:
    """The extras a VM asks for are pyproject's (their packages, not their bounds)."""
    import re

    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, names in shipping.EXTRAS.items():
        theirs = {re.match(r"[A-Za-z0-9._-]+", r).group(0) for r in declared[extra]}  # type: ignore[union-attr]
        assert set(names) == theirs, extra
    runtime = {
        re.match(r"[A-Za-z0-9._-]+", r).group(0)
        for r in tomllib.loads(  # type: ignore[union-attr]
            (ROOT / "pyproject.toml").read_text()
        )["project"]["dependencies"]
    }
    assert set(shipping.RUNTIME_DEPS) | set(shipping.IMAGE_DEPS) <= runtime


def test_same_code_same_bytes_and_a_change_is_a_new_sha(tmp_path: Path) -> None:
    first = shipping.build_wheel()
    shipping._CACHE.clear()
    assert shipping.build_wheel().data == first.data  # deterministic, not only cached
    # a copy of the package with new mtimes, __pycache__, dot-files and an extension: the same
    copy = tmp_path / "spotnb"
    shutil.copytree(shipping.package_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (copy / ".orig.swp").write_bytes(b"junk")
    (copy / "labextension" / "static").mkdir(parents=True, exist_ok=True)
    (copy / "labextension" / "static" / "remoteEntry.js").write_text("x")
    os.utime(copy / "api.py", (1, 1))
    again = shipping._build(first.version, shipping._files(copy), first.requires)
    assert again.sha256 == first.sha256
    # an uncommitted edit of the checkout: another wheel, another name in the store
    with open(copy / "api.py", "a") as f:
        f.write("\n# an edit\n")
    edited = shipping._build(first.version, shipping._files(copy), first.requires)
    assert edited.sha256 != first.sha256 and edited.store_name != first.store_name


def test_a_second_build_is_cached() -> None:
    import time

    shipping.build_wheel()
    t0 = time.perf_counter()
    assert shipping.build_wheel() is shipping.build_wheel()
    assert time.perf_counter() - t0 < 0.5


# -- the store: uploaded once, signed per job, checked at each launch ---------------------------------
def test_ship_uploads_once_per_content_and_signs_code_json(store_url: str, key: bytes) -> None:
    store = Store(store_url)
    cfg = _config(store_url)
    ref = shipping.ship(store, JOB, key, cfg)
    other = "20260101-000000-c0de01"
    key2 = new_key()
    save_key(other, key2)
    ref2 = shipping.ship(store, other, key2, cfg)
    assert ref is not None and ref2 is not None and ref.sha256 == ref2.sha256
    assert store.ls(store.path("code")) == [shipping.build_wheel().store_name]  # once
    data = store.read_bytes(store.path("code", shipping.build_wheel().store_name))
    assert hashlib.sha256(data).hexdigest() == ref.sha256 and len(data) == ref.size
    doc = json.loads(store.read_bytes(store.job(JOB, "code.json")))
    assert doc["sha256"] == ref.sha256 and "signature" in doc and key.hex() not in json.dumps(doc)
    launch = shipping.code_for_launch(cfg, JOB, ["aws", None, "aws"])
    assert launch == ref.with_extras(["aws"]) and launch.extras == ("aws",)  # type: ignore[union-attr]


def test_a_job_without_shipping_needs_no_wheel(store_url: str, key: bytes) -> None:
    store = Store(store_url)
    assert shipping.ship(store, JOB, key, _config(store_url, spotnb_source="index")) is None
    local = spot.Config(provider="local", store=store_url)
    assert shipping.ship(store, JOB, key, local, get_provider_class("local").ships_code) is None
    own = _config(store_url, requirements=["spotnb @ git+https://example.org/spotnb@main"])
    assert shipping.ship(store, JOB, key, own) is None
    assert not store.exists(store.path("code")) and not store.exists(store.job(JOB, "code.json"))


def test_code_json_forged_or_signed_with_another_key_is_refused(store_url: str, key: bytes) -> None:
    store = Store(store_url)
    cfg = _config(store_url)
    shipping.ship(store, JOB, key, cfg)
    shipping._SHIPPED.clear()
    path = store.job(JOB, "code.json")
    doc = json.loads(store.read_bytes(path))
    # someone with write access to the store points the job at their own wheel
    forged = {**doc, "wheel": f"code/spotnb-0.1.0-{'e' * 64}.whl", "sha256": "e" * 64}
    store.write_bytes(path, json.dumps(forged).encode())
    with pytest.raises(CodeError, match="wrong signature"):
        shipping.code_for_launch(cfg, JOB)
    # the same document signed with another job's key
    from spotnb.core.signing import sign_doc

    body = {k: v for k, v in forged.items() if k != "signature"}
    store.write_bytes(path, json.dumps(sign_doc(new_key(), JOB, "code.json", body)).encode())
    with pytest.raises(CodeError, match="wrong signature"):
        shipping.code_for_launch(cfg, JOB)
    # signed with the job's key (by a bug, say) but naming a path outside code/: refused too
    escape = {**body, "wheel": f"code/../jobs/{JOB}/fn.pkl"}
    store.write_bytes(path, json.dumps(sign_doc(key, JOB, "code.json", escape)).encode())
    with pytest.raises(CodeError, match="damaged"):
        shipping.code_for_launch(cfg, JOB)


def test_a_replaced_or_missing_wheel_is_put_back_or_refused(
    store_url: str, key: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(store_url)
    cfg = _config(store_url)
    ref = shipping.ship(store, JOB, key, cfg)
    assert ref is not None
    path = store.path("code", shipping.build_wheel().store_name)
    good = store.read_bytes(path)
    store.write_bytes(path, good[:-10] + b"x" * 10)  # swapped in the store
    assert shipping.code_for_launch(cfg, JOB) == ref  # this process builds the same: put back
    assert store.read_bytes(path) == good
    store.rm(path)
    assert shipping.code_for_launch(cfg, JOB) == ref and store.read_bytes(path) == good
    # a launcher whose own spotnb is other code cannot put it back: it refuses to launch
    store.write_bytes(path, b"not a wheel")
    other = shipping.Wheel("0.1.0", "0" * 64, (), b"other code")
    monkeypatch.setattr(shipping, "build_wheel", lambda: other)
    with pytest.raises(CodeError, match="replaced or damaged in the store"):
        shipping.code_for_launch(cfg, JOB)
    store.rm(path)
    with pytest.raises(CodeError, match="is gone from the store"):
        shipping.code_for_launch(cfg, JOB)


def test_a_store_this_machine_cannot_write_fails_the_submit_with_the_fix(
    store_url: str, key: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(store_url)

    def refuse(path: str, data: bytes) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(store, "write_bytes", refuse)
    with pytest.raises(
        ConfigError, match=r"Config\.store: cannot put this notebook's spotnb .*spotnb_source"
    ):
        shipping.ship(store, JOB, key, _config(store_url))


def test_a_spotnb_that_is_no_folder_of_files_says_what_to_do(
    store_url: str, key: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spotnb imported from a zip (zipimport, a frozen app): no files to package."""
    monkeypatch.setattr(shipping, "package_dir", lambda: tmp_path / "spotnb.zip" / "spotnb")
    shipping._CACHE.clear()
    with pytest.raises(ConfigError, match=r"Config\.spotnb_source: cannot package .*spotnb_source='index'"):
        shipping.ship(Store(store_url), JOB, key, _config(store_url))


def test_spotnb_source_is_checked_with_the_field_and_the_fix() -> None:
    ok = [
        "store",
        "index",
        "Store",
        "spotnb==0.1.0",
        "spotnb >= 0.1",
        "spotnb[aws] @ git+https://x.org/s.git",
        "https://x.org/dist/spotnb-0.1.0-py3-none-any.whl",
    ]
    for value in ok:
        spot.Config(provider="local", spotnb_source=value)
    bad = {
        "torch==2.13": "names 'torch', not spotnb",
        "./dist/spotnb-0.1.0-py3-none-any.whl": "path on this machine",
        "git+https://x.org/spotnb.git": "spotnb @ git\\+https",
        "https://user:pw@x.org/spotnb-0.1.0-py3-none-any.whl": "carries credentials",
        "": "not a single pip requirement",
        "spotnb\nrm -rf /": "not a single pip requirement",
        "https://x.org/evil.sh": "not of a spotnb wheel",
        "spotnb; sys_platform == 'win32'": "environment marker",
    }
    for value, why in bad.items():
        with pytest.raises(ConfigError, match=rf"Config\.spotnb_source: .*{why}"):
            spot.Config(provider="local", spotnb_source=value)


# -- the boot scripts ---------------------------------------------------------------------------------
def _launch_spec(store_url: str, code: CodeRef | None, **kw: Any) -> LaunchSpec:
    return LaunchSpec(
        job_id=JOB,
        incarnation=1,
        store_url=store_url,
        instance_type="g4dn.xlarge",
        region=None,
        command=["python", "-c", "import spotnb, sys; print('AGENT', spotnb.__file__)"],
        code=code,
        **kw,
    )


def test_dry_run_says_where_the_code_comes_from() -> None:
    """The plan's script names the wheel this process would ship (the launch's own, test_aws
    checks the two are equal) and its summary says so; `index` and a pip spec keep pip."""
    from spotnb.providers.aws.provider import AWSProvider
    from spotnb.views.plan_view import Plan, summary_rows

    cfg = spot.Config(provider="aws", instance_type="g4dn.xlarge", region="us-east-1", store="s3://b/p")
    spec = dataclasses.replace(_launch_spec("s3://b/p", None), job_id="<job-id>")
    plan = AWSProvider(cfg).plan_launch(spec)
    wheel = shipping.build_wheel()
    assert "SPOTNB_WHEEL_URL=s3://b/p/code/" + wheel.store_name in plan["bootstrap"]
    assert f"SPOTNB_WHEEL_SHA256={wheel.sha256}" in plan["bootstrap"]
    assert f"SPOTNB_WHEEL_SIZE={len(wheel.data)}" in plan["bootstrap"]
    assert "SPOTNB_WHEEL_EXTRAS='[aws]'" in plan["bootstrap"]
    assert "pip install --quiet 'spotnb" not in plan["bootstrap"]
    rows = dict(summary_rows(plan))
    assert wheel.store_name in rows["spotnb code"] and "checks its sha256" in rows["spotnb code"]
    assert "spotnb code" in Plan(plan).text()
    assert "deeplearning" in rows["image"]  # the Deep Learning AMI: CUDA and torch
    assert "/opt/pytorch/bin/python" in rows["Python / torch"] and TORCH_SPEC in rows["Python / torch"]
    index = AWSProvider(cfg.model_copy(update={"spotnb_source": "index"})).plan_launch(spec)
    assert "SPOTNB_WHEEL_URL=" not in index["bootstrap"] and "'spotnb[aws]==" in index["bootstrap"]
    assert "package index" in index["code"]
    mine = AWSProvider(cfg.model_copy(update={"spotnb_source": "spotnb @ git+https://x.org/s.git"}))
    text = mine.plan_launch(spec)["bootstrap"]
    assert "'spotnb @ git+https://x.org/s.git'" in text and "SPOTNB_WHEEL_URL=" not in text
    elastic = AWSProvider(cfg.model_copy(update={"instances": 2})).plan_launch(spec)
    assert "SPOTNB_WHEEL_EXTRAS='[aws,elastic]'" in elastic["bootstrap"]  # torchft on each instance


def test_lighthouse_coordinator_carries_its_module_and_no_store_access() -> None:
    """It has no identity to read the store with: its script holds the one module it runs."""
    text = coordinator_script(JOB, min_replicas=1, cloud="aws", ship_lighthouse=True)
    module = text.split("<<'SPOTNB_MODULE'\n", 1)[1].split("\nSPOTNB_MODULE\n", 1)[0]
    compile(module, "lighthouse.py", "exec")
    assert "LighthouseServer" in module and "SPOTNB_WHEEL_URL" not in text and "SPOTNB_JOB_KEY" not in text
    assert "pip install --quiet torchft-nightly==" in text and "spotnb[elastic]" not in text
    assert '"$PY" "$SPOTNB_LIGHTHOUSE" --min-replicas 1' in text
    assert "spotnb[elastic]==" in coordinator_script(JOB, min_replicas=1, cloud="aws")  # index


def test_boot_scripts_do_not_parse_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet makes boot scripts from several threads: the embedded modules were once cut with
    `ast`, whose C conversion keeps its recursion depth per interpreter on Python 3.11, and a
    controller thread died of "SystemError: AST constructor recursion depth mismatch" (seen in
    test_azure_coordinator). Nothing of a boot script may go through `ast.parse`."""
    import ast

    def no_parse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a boot script went through ast.parse")

    monkeypatch.setattr(ast, "parse", no_parse)
    ref = CodeRef("s3://b/p/code/w.whl", "a" * 64, 1, "0.1.0")
    for text in (
        bootstrap_script(_launch_spec("s3://b/p", ref), "aws"),
        coordinator_script(JOB, min_replicas=1, cloud="aws", ship_lighthouse=True),
    ):
        assert len(text.encode()) < 16 * 1024 - 2048  # room left for the job's requirements


# -- the VM side: the real boot script ----------------------------------------------------------------
@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python that has never seen spotnb: a venv without packages or system site-packages."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    uv = shutil.which("uv")
    if uv:
        subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(where)], check=True, timeout=60)
    else:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    return where / "bin" / "python"


def _vm_env(tmp_path: Path, python: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SPOTNB_PYTHON")}
    env.update(
        SPOTNB_LOG=str(tmp_path / "boot.log"),
        SPOTNB_POWEROFF_CMD=f"touch {tmp_path / 'powered-off'}",
        SPOTNB_VENV=str(tmp_path / "vm-venv"),
        SPOTNB_WORKDIR=str(tmp_path / "vm-work"),
        PIP_NO_INDEX="1",  # the VM would reach the index; here every pin is already installed
        **extra,
    )
    if python is not None:
        env["SPOTNB_PYTHON"] = str(python)
    return env


def _boot(tmp_path: Path, script: str, env: dict[str, str]) -> tuple[int, str]:
    path = tmp_path / "boot.sh"
    path.write_text(script)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir(exist_ok=True)
    proc = subprocess.run(["bash", str(path)], env=env, cwd=elsewhere, timeout=240)
    return proc.returncode, (tmp_path / "boot.log").read_text()


@pytest.mark.parametrize("damage", ["tampered", "truncated", "grown", "wrong sha in the script"])
def test_boot_script_refuses_a_wheel_that_is_not_the_jobs(
    tmp_path: Path, store_url: str, key: bytes, bare_python: Path, damage: str
) -> None:
    store = Store(store_url)
    ref = shipping.ship(store, JOB, key, _config(store_url))
    assert ref is not None
    path = store.path("code", ref.url.rsplit("/", 1)[1])
    data = store.read_bytes(path)
    if damage == "tampered":  # same size, other bytes: a wheel someone swapped in
        store.write_bytes(path, data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "truncated":
        store.write_bytes(path, data[: len(data) // 2])
    elif damage == "grown":  # a wheel with something appended (a zip reads from its end)
        store.write_bytes(path, data + b"PK\x05\x06" + bytes(18))
    else:
        ref = CodeRef(ref.url, "f" * 64, ref.size, ref.version)
    script = bootstrap_script(_launch_spec(store_url, ref, job_key=key.hex()), "aws")
    code, log = _boot(tmp_path, script, _vm_env(tmp_path, bare_python))
    assert code == 1 and (tmp_path / "powered-off").exists()
    assert "spotnb code: refused" in log and "not installing it" in log, log
    assert "powering off" in log and "pip install" not in log
    assert not (tmp_path / "vm-venv").exists()  # refused before anything was installed
    assert key.hex() not in log


def test_boot_script_installs_the_shipped_wheel_on_a_python_without_spotnb(
    tmp_path: Path, store_url: str, key: bytes, bare_python: Path
) -> None:
    """The whole install on a "VM" whose Python has no spotnb: fetch, check, venv, pip (no index:
    the pins are this notebook's versions, installed in the base interpreter the VM's venv sees
    as its system site), then the agent's stand-in imports the installed wheel."""
    env = _vm_env(tmp_path, bare_python)
    probe = subprocess.run(
        [str(bare_python), "-c", "import spotnb"], capture_output=True, cwd=tmp_path, env=env, timeout=60
    )
    assert probe.returncode != 0  # this Python has never seen spotnb
    store = Store(store_url)
    ref = shipping.ship(store, JOB, key, _config(store_url))
    assert ref is not None
    script = bootstrap_script(_launch_spec(store_url, ref.with_extras(["aws"]), job_key=key.hex()), "aws")
    code, log = _boot(tmp_path, script, env)
    assert code == 0, log
    assert "checked (sha256" in log and "refused" not in log
    agent = next(line for line in log.splitlines() if line.startswith("AGENT "))
    assert agent.split(" ", 1)[1].startswith(str(tmp_path / "vm-venv")), agent  # the wheel, not a checkout
    from spotnb.core.events import read_all

    booted = [e for e in read_all(store, JOB) if e["kind"] == "bootstrap"]
    assert booted and booted[0]["installed"] == 1
    assert key.hex() not in log


# -- a venv that has never seen spotnb -----------------------------------------------------------------
@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A venv without system site-packages where only the built wheel (with its pinned
    dependencies and the aws extra, from uv's cache or the index) was installed."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (pip install uv): it installs the wheel's pins in a second")
    where = tmp_path_factory.mktemp("wheel-env")
    wheel = shipping.build_wheel()
    path = where / wheel.filename
    path.write_bytes(wheel.data)
    venv = where / "venv"
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    install = [uv, "pip", "install", "-q", "--python", str(python), f"{path}[aws]"]
    if subprocess.run([*install, "--offline"], capture_output=True, timeout=300).returncode != 0:
        done = subprocess.run(install, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"the wheel's pinned dependencies do not install:\n{done.stderr}"
    return python, path


def test_the_wheel_installs_alone_and_rebuilds_itself_identically(
    wheel_venv: tuple[Path, Path], tmp_path: Path
) -> None:
    python, path = wheel_venv
    code = (
        "import hashlib, json, sys, spotnb, spotnb.core.store, spotnb.core.events, spotnb.core.signing, "
        "spotnb.runtime.checkpoint.digest, s3fs\n"
        "from importlib import metadata\n"
        "from spotnb.providers.shipping import build_wheel\n"
        "print(json.dumps({'file': spotnb.__file__, 'sha': build_wheel().sha256,"
        " 'requires': metadata.requires('spotnb')}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["file"].startswith(str(python.parents[1]))  # the installed wheel, not this checkout
    assert not (Path(seen["file"]).parent / "labextension").exists()
    # a spotnb installed as a regular wheel builds the very same wheel (same sha, uploaded once)
    assert seen["sha"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "pydantic==" in " ".join(seen["requires"])


# -- the fetcher ---------------------------------------------------------------------------------------
def test_s3_request_is_signed_as_botocore_signs_it() -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    now = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.timezone.utc)
    cases = [
        ("my-bucket", "pre fix/code/spotnb-0.1.0-ab.whl", "session-token", ""),
        ("my.dotted.bucket", "a/b~c+d=e.whl", "", ""),
        ("bkt", "x/y.whl", "t", "http://127.0.0.1:5000"),
    ]
    for bucket, key, token, endpoint in cases:
        url, headers = code_fetch.s3_request(
            bucket, key, "eu-west-1", ("AKID", "SECRET", token), endpoint, now
        )
        req = AWSRequest(
            method="GET",
            url=url,
            headers={k: v for k, v in headers.items() if k not in ("Authorization", "host")},
        )
        req.context["timestamp"] = headers["x-amz-date"]
        auth = S3SigV4Auth(Credentials("AKID", "SECRET", token or None), "s3", "eu-west-1")
        want = auth.signature(auth.string_to_sign(req, auth.canonical_request(req)), req)
        assert headers["Authorization"].endswith(f"Signature={want}"), (bucket, key)


def test_the_fetcher_reads_with_the_vms_identity_from_metadata_servers() -> None:
    """IMDSv2 credentials (token first), the GCE token, the Azure managed identity's token: each
    from a stand-in metadata server; no credential is needed in the boot script."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str, dict[str, str]]] = []

    class Metadata(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append((self.command, self.path, dict(self.headers)))
            if self.path == "/latest/api/token" and self.command == "PUT":
                body = b"imds-token"
            elif self.headers.get("X-aws-ec2-metadata-token") != "imds-token" and "/latest/" in self.path:
                self.send_response(401)
                self.end_headers()
                return
            elif self.path.endswith("/security-credentials/"):
                body = b"spotnb-role\n"
            elif self.path.endswith("/security-credentials/spotnb-role"):
                body = json.dumps(
                    {"AccessKeyId": "ASIAVM", "SecretAccessKey": "s", "Token": "vm-token"}
                ).encode()
            elif (
                self.path.startswith("/computeMetadata/") and self.headers.get("Metadata-Flavor") == "Google"
            ):
                body = json.dumps({"access_token": "gce-token"}).encode()
            elif self.path.startswith("/metadata/identity/") and self.headers.get("Metadata") == "true":
                body = json.dumps({"access_token": "azure-token"}).encode()
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    old = code_fetch.IMDS, code_fetch.GCE
    code_fetch.IMDS = code_fetch.GCE = base
    try:
        assert code_fetch.aws_credentials({}) == ("ASIAVM", "s", "vm-token")
        url, headers = code_fetch.gcs_request("bkt", "p/code/spotnb-0.1.0-ab.whl", {})
        assert (
            url
            == "https://storage.googleapis.com/storage/v1/b/bkt/o/p%2Fcode%2Fspotnb-0.1.0-ab.whl?alt=media"
        )
        assert headers == {"Authorization": "Bearer gce-token"}
        url, headers = code_fetch.azure_request(
            "cont", "p/code/w.whl", {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_CLIENT_ID": "cid"}
        )
        assert url == "https://acct.blob.core.windows.net/cont/p/code/w.whl"
        assert headers["Authorization"] == "Bearer azure-token"
        assert any(
            "client_id=cid" in p and "resource=https%3A%2F%2Fstorage.azure.com%2F" in p for _, p, _ in seen
        )
    finally:
        code_fetch.IMDS, code_fetch.GCE = old
        server.shutdown()


def test_the_fetcher_reads_s3_through_the_s3_api(s3_store_url: str) -> None:
    """Against moto's S3 (which does not check signatures: test_s3_request_is_signed... does)."""
    from tests.support.clouds_fixtures import CANARIES

    store = Store(s3_store_url)
    store.write_bytes(store.path("code", "w.whl"), b"wheel bytes")
    source = f"{s3_store_url}/code/w.whl"
    assert code_fetch.read(source, 100, dict(os.environ)) == b"wheel bytes"
    code_fetch.check(b"wheel bytes", hashlib.sha256(b"wheel bytes").hexdigest(), 11)
    with pytest.raises(code_fetch.Refused):
        code_fetch.check(b"wheel bytez", hashlib.sha256(b"wheel bytes").hexdigest(), 11)
    # what the fetcher says when it cannot read carries no credential
    env = {
        **os.environ,
        "SPOTNB_WHEEL_URL": f"{s3_store_url}/code/missing.whl",
        "SPOTNB_WHEEL_SHA256": "0" * 64,
        "SPOTNB_WHEEL_SIZE": "1",
    }
    proc = subprocess.run(
        [sys.executable, code_fetch.__file__, str(Path(os.devnull))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "could not read" in proc.stderr
    assert not any(v in proc.stderr for v in CANARIES.values())


# -- the image's torch (issue #25 item 2) ----------------------------------------------------------------
def _image_venv_with_torch(where: Path, version: str = "2.13.0+image") -> Path:
    """A Python like the Deep Learning AMI's /opt/pytorch: a venv (no system site-packages) whose
    own site-packages holds the image's torch (a stand-in module that says which it is)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "torch").mkdir()
    (Path(site) / "torch" / "__init__.py").write_text(
        f"__version__ = '{version}'\nclass version:\n    cuda = '12.8'\n"
    )
    return python


def test_boot_script_uses_the_images_torch_when_the_images_python_is_a_venv(
    tmp_path: Path, store_url: str, key: bytes
) -> None:
    """The AMI keeps torch in a venv: a venv made from that Python with --system-site-packages
    sees the base interpreter's packages, not the image venv's, so its torch was invisible and
    every boot would download GBs of another. The boot script's venv sees the image's torch,
    and installs none."""
    image = _image_venv_with_torch(tmp_path / "image")
    store = Store(store_url)
    ref = shipping.ship(store, JOB, key, _config(store_url))
    assert ref is not None
    spec = _launch_spec(store_url, ref, job_key=key.hex())
    probe = "import torch, spotnb; print('AGENT', torch.__version__, spotnb.__file__)"
    spec = dataclasses.replace(spec, command=["python", "-c", probe])
    code, log = _boot(tmp_path, bootstrap_script(spec, "aws"), _vm_env(tmp_path, image))
    assert code == 0, log
    assert "the image's torch 2.13.0+image CUDA 12.8" in log
    agent = next(line for line in log.splitlines() if line.startswith("AGENT "))
    assert agent.split()[1] == "2.13.0+image", agent  # the image's, not another one
    assert agent.split()[2].startswith(str(tmp_path / "vm-venv")), agent  # spotnb from the wheel
    assert "installing torch" not in log


def _stub_torch_wheel(where: Path) -> Path:
    """A wheel named torch (the index's, which the VM would download, stands in for it)."""
    path = where / "torch-2.13.0+index-py3-none-any.whl"
    info = "torch-2.13.0+index.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("torch/__init__.py", "__version__ = '2.13.0+index'\nclass version:\n    cuda = None\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+index\n")
        wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        z.writestr(f"{info}/WHEEL", wheel)
        z.writestr(f"{info}/RECORD", "")
    return path


def test_boot_script_installs_torch_only_when_the_images_is_outside_spotnbs_bound(
    tmp_path: Path, store_url: str, key: bytes
) -> None:
    """An image whose torch spotnb does not accept (1.13 here; Azure's HPC image has none): the
    boot script says so and installs spotnb's torch bound (the stand-in wheel SPOTNB_TORCH_SPEC
    names) before the job's code runs."""
    image = _image_venv_with_torch(tmp_path / "image", version="1.13.1")
    store = Store(store_url)
    ref = shipping.ship(store, JOB, key, _config(store_url))
    assert ref is not None
    spec = _launch_spec(store_url, ref, job_key=key.hex())
    probe = "import torch; print('AGENT', torch.__version__)"
    spec = dataclasses.replace(spec, command=["python", "-c", probe])
    env = _vm_env(tmp_path, image, SPOTNB_TORCH_SPEC=str(_stub_torch_wheel(tmp_path)))
    code, log = _boot(tmp_path, bootstrap_script(spec, "aws"), env)
    assert code == 0, log
    assert f"no torch spotnb accepts on this image: installing {TORCH_SPEC}" in log
    assert "AGENT 2.13.0+index" in log
