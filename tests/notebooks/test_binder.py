"""binder/ as repo2docker runs it (tests/support/binder_env.py builds the env: runtime.txt's Python, a
fresh venv, `pip install -r binder/requirements.txt`, binder/postBuild; binder/start at launch):
JupyterLab sees spotnb's extensions, every tutorial's imports resolve, torch is the pinned CPU
build, and an index that cannot be reached from here neither fails nor stalls the install."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.binder_env import (
    BINDER,
    ROOT,
    binder_environ,
    binder_python,
    index_urls,
    pip_environ,
    unreachable,
)

# the first test builds the env when no cached one fits (about 2 minutes here)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def python() -> Path:
    return binder_python()


def run(
    python: Path, *cmd: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 300
) -> str:
    """`cmd` through binder/start (from the repository root), as a Binder session runs it."""
    proc = subprocess.run(
        [str(BINDER / "start"), *cmd],
        cwd=cwd,
        env=binder_environ(python) if env is None else env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{out}"
    return out


def test_labextensions_enabled(python: Path) -> None:
    out = run(python, "jupyter", "labextension", "list")
    # the listing is grouped under the folders it read: each extension must be the env's own
    env_share = str(python.parent.parent / "share" / "jupyter" / "labextensions")
    folder, found = None, {}
    for line in out.splitlines():
        if line.strip().startswith("/"):
            folder = line.strip()
        m = re.match(r"\s+(\S+) v\S+ +(.*)", line)
        if m:
            found[m.group(1)] = (folder, m.group(2))
    for name in ("spotnb", "@jupyter-widgets/jupyterlab-manager", "anywidget"):
        assert name in found, f"{name} not listed:\n{out}"
        where, status = found[name]
        assert re.match(r"enabled\s+OK\b", status), f"{name}: {status!r}\n{out}"
        assert where == env_share, f"{name} listed from {where}, not the env's {env_share}"


def test_server_extension_enabled(python: Path) -> None:
    out = run(python, "jupyter", "server", "extension", "list")
    assert re.search(r"spotnb\.views\.server\s+enabled", out), out
    assert re.search(r"spotnb\.views\.server\s+OK", out), out


def test_start_sets_fast_mode(python: Path) -> None:
    probe = "import os, sys; print(os.environ.get('SPOTNB_FAST'), sys.prefix)"
    env = binder_environ(python)
    env.pop("SPOTNB_FAST", None)
    fast, prefix = run(python, "python", "-c", probe, env=env).split()
    assert (fast, Path(prefix)) == ("1", python.parent.parent)
    env["SPOTNB_FAST"] = "0"  # a session that asks for the long versions keeps them
    assert run(python, "python", "-c", probe, env=env).split()[0] == "0"


def tutorial_code() -> dict[str, list[str]]:
    """Each tutorial's Python: its code cells, and the scripts its `%%writefile NAME.py` cells
    write (other cell magics, line magics and shell escapes left out)."""
    code: dict[str, list[str]] = {}
    for path in NOTEBOOKS:
        parts = []
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            first, _, body = src.partition("\n")
            if first.startswith("%%"):
                if not re.match(r"%%writefile\s+(-a\s+)?\S+\.py\s*$", first):
                    continue
                src = body
            parts.append("\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))))
        code[path.name] = parts
    return code


def tutorial_imports() -> dict[str, set[str]]:
    """Top-level module names each tutorial imports, anywhere in its code (inside functions
    too: the training functions run in the same env on the local market)."""
    found: dict[str, set[str]] = {}
    for name, cells in tutorial_code().items():
        mods = found.setdefault(name, set())
        for cell in cells:
            for node in ast.walk(ast.parse(cell, filename=name)):
                if isinstance(node, ast.Import):
                    mods.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    mods.add(node.module.split(".")[0])
    return found


def test_tutorial_imports_are_found() -> None:
    """The parser sees what the tutorials are known to need (a check on the check)."""
    found = tutorial_imports()
    assert {"spotnb", "torch"} <= set.union(*found.values())
    assert "transformers" in found["06-hugging-face.ipynb"]
    assert "lightning" in found["07-lightning.ipynb"]


def test_every_tutorial_import_resolves(python: Path) -> None:
    found = tutorial_imports()
    modules = sorted(set.union(*found.values()))
    # what the tutorials reach through spotnb: the providers they name (03's dry runs import the
    # cloud SDKs) and torchft for a job on several instances (04)
    text = "\n".join(cell for cells in tutorial_code().values() for cell in cells)
    providers = sorted(set(re.findall(r"provider=[\"'](\w+)[\"']", text)) | {"local"})
    several = bool(re.search(r"instances=([2-9]|\d\d)", text))
    probe = (
        "import importlib, json, sys\n"
        "from spotnb.settings.registry import get_provider_class\n"
        "bad = {}\n"
        "for m in json.loads(sys.argv[1]):\n"
        "    try: importlib.import_module(m)\n"
        "    except Exception as e: bad[m] = repr(e)\n"
        "for p in json.loads(sys.argv[2]):\n"
        "    try: get_provider_class(p)\n"
        "    except Exception as e: bad['provider ' + p] = repr(e)\n"
        "print(json.dumps(bad))\n"
    )
    extra = ["torchft"] if several else []
    # from the tutorials' folder, as their kernels run: spotnb from the env, not from the cwd
    args = json.dumps(modules + extra), json.dumps(providers)
    out = run(python, "python", "-c", probe, *args, cwd=ROOT / "notebooks")
    bad = json.loads(out.strip().splitlines()[-1])
    need = {m: sorted(n for n, mods in found.items() if m in mods) for m in bad}
    assert not bad, f"not importable in the Binder env: {bad} (needed by {need})"
    assert {"aws", "azure", "gcp"} <= set(providers), providers  # 03's dry runs were seen


def test_torch_is_the_pinned_cpu_build(python: Path) -> None:
    out = run(python, "python", "-c", "import torch; print(torch.__version__, torch.version.cuda)")
    version, cuda = out.split()[-2:]
    release = tuple(int(x) for x in version.split("+")[0].split(".")[:3])
    assert (2, 1) <= release <= (2, 14, 1), version  # pyproject.toml: torch>=2.1,<=2.14.1
    assert cuda == "None", f"torch {version} is a CUDA build ({cuda})"


def test_unreachable_index_neither_fails_nor_stalls(python: Path, tmp_path: Path) -> None:
    """pip looks every package up in every index binder/requirements.txt names; one that is
    unreachable here (PyTorch's CPU index: only PyPI is) must cost a failed lookup, not 5
    retries with back-off (~8 s a package, ~20 min for the whole env). Resolve the file's own
    requirements afresh, as the build does, and time it."""
    text = (BINDER / "requirements.txt").read_text()
    lines = [line.split(" #")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    reqs = [line for line in lines if not line.startswith("-")]
    assert any(r.startswith("torch") for r in reqs)
    options = [line.replace("../", str(ROOT) + "/") for line in lines if line.startswith(("-c", "--"))]
    req_file = tmp_path / "requirements.txt"
    req_file.write_text("\n".join(options + reqs) + "\n")
    report = tmp_path / "report.json"
    cmd = [str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps"]
    cmd += ["--report", str(report), "-r", str(req_file)]
    dead = unreachable(index_urls())
    started = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=pip_environ(python, dead=dead), capture_output=True, text=True, timeout=300
    )
    took = time.monotonic() - started
    print(
        f"resolving {len(reqs)} requirements took {took:.1f} s; unreachable: {dead or 'none'}",
        file=sys.stderr,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < 5 * len(reqs), f"{took:.0f} s for {len(reqs)} requirements (unreachable: {dead})"
    chosen = {i["metadata"]["name"]: i for i in json.loads(report.read_text())["install"]}
    torch = chosen["torch"]
    assert torch["metadata"]["version"] == "2.13.0+cpu", torch["metadata"]["version"]
    if dead:  # here, the CPU wheel pip's own sources hold
        assert not torch["download_info"]["url"].startswith("https://download.pytorch.org"), torch


def test_postbuild_fails_loudly_without_node(python: Path) -> None:
    """Without node and npm on PATH, postBuild stops the build (non-zero) with a message that
    says why, instead of leaving the tutorials without their panel."""
    env = binder_environ(python)
    env["PATH"] = str(python.parent)  # the env's bin only: no node, no npm
    proc = subprocess.run(
        [str(BINDER / "postBuild")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "binder/postBuild" in proc.stderr and "node" in proc.stderr and "npm" in proc.stderr, proc.stderr
