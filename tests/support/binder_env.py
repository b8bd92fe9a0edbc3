"""The Binder environment, built here the way repo2docker builds it from binder/.

    from tests.support.binder_env import binder_python, binder_environ

    python = binder_python()  # Path to <env>/bin/python, built on first use, then reused
    subprocess.run(["binder/start", "python", "-c", "..."], cwd=ROOT, env=binder_environ(python))

`binder_python()` returns the `python` of a virtualenv in which repo2docker's steps for this
repository ran, in its order, from the repository root (ROOT):

1. `binder/runtime.txt` picks the interpreter: this one when its major.minor matches, else
   `pythonX.Y` from PATH (no match raises BinderBuildError).
2. `python -m venv` (no system site-packages), then
   `pip install -r binder/requirements.txt` with the env's pip (no `--no-cache-dir`, unlike
   repo2docker, so that a warm pip cache is used). `-e .` there installs spotnb editable from
   this checkout: the env runs the working tree's Python code, whatever was installed before.
3. `binder/postBuild` (by its shebang), with the env's bin first on PATH.

At launch repo2docker runs every command through `binder/start`; do the same with
`binder_environ(python)` (the env's bin first on PATH, VIRTUAL_ENV set, PYTHONPATH/PYTHONHOME
dropped), e.g. `binder/start jupyter execute NOTEBOOK` or `binder/start python -m ...`: the
kernels it starts are the env's (ipykernel, nbclient and nbconvert come with jupyterlab).

The env lives in `~/.cache/spotnb/binder-env/<key>/` ($XDG_CACHE_HOME if set), where the key is
a hash of binder/*, constraints.txt, pyproject.toml, what postBuild builds from (the extension's
sources, scripts/setup.d/50-labextension.sh), this checkout's path and the interpreter's
version: a change to any of them builds a new env, otherwise a later run (another pytest
process, another xdist worker) reuses it. A `filelock.FileLock` beside it makes concurrent
callers wait for one build. A build that fails raises BinderBuildError with the tail of its log
(`<env>/binder-build.log`) and is redone on the next call. Envs of other keys not used for two
days are removed.

Differences from repo2docker, all of this machine's making: the env is a venv of the local
CPython, not repo2docker's conda env; postBuild builds the extension in this checkout (as
repo2docker builds it in its copy); and where an index named in binder/requirements.txt
(PyTorch's CPU index) cannot be reached, pip runs with no retries (`pip_environ`), so that each
package costs one failed lookup instead of ~8 s of retries with back-off.

Run `python tests/support/binder_env.py` to build (or find) the env and print where and how long.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO
BINDER = ROOT / "binder"

# what the env's key hashes, besides binder/* (relative to ROOT; folders are walked)
_KEYED = [
    "constraints.txt",
    "pyproject.toml",
    "scripts/setup.d/50-labextension.sh",
    "extension/package.json",
    "extension/package-lock.json",
    "extension/install.json",
    "extension/tsconfig.json",
    "extension/src",
    "extension/style",
]
_MARKER = ".binder-build.json"  # written last: the env is complete
_LOG = "binder-build.log"
_PIP_TIMEOUT_S = 1800  # a whole `pip install -r` (cold: torch, jupyterlab, the cloud SDKs)
_POSTBUILD_TIMEOUT_S = 900  # npm install on a fresh checkout, tsc, jupyter-builder
_LOCK_TIMEOUT_S = _PIP_TIMEOUT_S + _POSTBUILD_TIMEOUT_S + 300
_UNUSED_S = 2 * 86400  # other keys' envs unused this long are removed


class BinderBuildError(RuntimeError):
    """A step of the Binder build failed (the message has the step and its log's tail)."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spotnb" / "binder-env"


def binder_python() -> Path:
    """The python of the Binder env, built (once, under a lock) if it is not there yet."""
    from filelock import FileLock

    base = _base_python()
    key = env_key(base)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    env = root / key
    python = env / "bin" / "python"
    with FileLock(str(root / f"{key}.lock"), timeout=_LOCK_TIMEOUT_S):
        marker = env / _MARKER
        if marker.is_file() and python.exists():
            info = json.loads(marker.read_text())
            os.utime(marker)  # used now: not pruned
            _say(f"reusing {env} (built in {info['seconds']:.0f} s: {_steps(info)})")
            return python
        info = _build(base, env)
        marker.write_text(json.dumps(info, indent=1))
    _say(f"built {env} in {info['seconds']:.0f} s ({_steps(info)})")
    _prune(root, keep=key)
    return python


def build_info(python: Path) -> dict:
    """What the build of `python`'s env recorded: seconds in all and per step, pip's settings."""
    return json.loads((python.parent.parent / _MARKER).read_text())


def binder_environ(python: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) as a shell in the env sees it: its bin first on PATH."""
    env = dict(os.environ if base is None else base)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX"):
        env.pop(name, None)
    prefix = python.parent.parent
    env["PATH"] = os.pathsep.join(filter(None, [str(prefix / "bin"), env.get("PATH")]))
    env["VIRTUAL_ENV"] = str(prefix)
    return env


def index_urls(requirements: Path | None = None) -> list[str]:
    """The http(s) index and find-links URLs that a requirements file names."""
    path = requirements or BINDER / "requirements.txt"
    urls = []
    for line in path.read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        m = re.match(r"(--extra-index-url|--index-url|-i|--find-links|-f)[ =]\s*(\S+)", line)
        if m and m.group(2).startswith(("http://", "https://")):
            urls.append(m.group(2))
    return urls


def unreachable(urls: list[str], timeout: float = 5.0) -> list[str]:
    """Those of `urls` that answer nothing at all (an HTTP error is an answer)."""
    dead = []
    for url in urls:
        try:
            urllib.request.urlopen(url, timeout=timeout).close()
        except urllib.error.HTTPError:
            pass
        except Exception:
            dead.append(url)
    return dead


def pip_environ(
    python: Path, base: dict[str, str] | None = None, dead: list[str] | None = None
) -> dict[str, str]:
    """binder_environ for pip: with no retries (and a 30 s timeout) when an index that
    binder/requirements.txt names cannot be reached from here (`dead`; default: probed now),
    as only PyPI may be: pip looks every package up in every index, and its 5 retries with
    back-off cost ~8 s a package."""
    env = binder_environ(python, base)
    if unreachable(index_urls()) if dead is None else dead:
        env.update(PIP_RETRIES="0", PIP_TIMEOUT="30", PIP_DEFAULT_TIMEOUT="30")
    return env


def env_key(base_python: str | Path) -> str:
    h = hashlib.sha256()
    h.update(f"root={ROOT}\n".encode())
    version = subprocess.run(
        [str(base_python), "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    h.update(f"python={version}\n".encode())
    files = sorted(p for p in BINDER.rglob("*") if p.is_file())
    for rel in _KEYED:
        p = ROOT / rel
        files += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p] if p.exists() else []
    for p in files:
        h.update(f"{p.relative_to(ROOT)} {os.access(p, os.X_OK)}\n".encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def _base_python() -> str:
    runtime = BINDER / "runtime.txt"
    want = runtime.read_text().strip() if runtime.exists() else ""
    m = re.fullmatch(r"python-(\d+)\.(\d+)(?:\.\d+)?", want)
    if not m or (int(m.group(1)), int(m.group(2))) == sys.version_info[:2]:
        return sys.executable
    found = shutil.which(f"python{m.group(1)}.{m.group(2)}")
    if not found:
        raise BinderBuildError(
            f"binder/runtime.txt asks for {want}, and python{m.group(1)}.{m.group(2)} is not on PATH"
        )
    return found


def _build(base: str, env: Path) -> dict:
    if env.exists():  # a build that did not finish
        shutil.rmtree(env)
    started = time.monotonic()
    steps: dict[str, float] = {}
    _run(steps, "python -m venv", [base, "-m", "venv", str(env)], env=None, log=None, timeout=300)
    log = env / _LOG
    python = env / "bin" / "python"
    dead = unreachable(index_urls())
    pip_env = pip_environ(python, dead=dead)
    retries = pip_env.get("PIP_RETRIES")
    if dead:
        _say(f"{', '.join(dead)} unreachable from here: pip runs with PIP_RETRIES={retries}")
    _run(
        steps,
        "pip install -r binder/requirements.txt",
        [str(python), "-m", "pip", "install", "-r", "binder/requirements.txt"],
        env=pip_env,
        log=log,
        timeout=_PIP_TIMEOUT_S,
    )
    post = BINDER / "postBuild"
    if post.exists():
        if not os.access(post, os.X_OK):
            raise BinderBuildError("binder/postBuild is not executable (git update-index --chmod=+x)")
        _run(
            steps,
            "binder/postBuild",
            [str(post)],
            env=binder_environ(python),
            log=log,
            timeout=_POSTBUILD_TIMEOUT_S,
        )
    return {
        "seconds": round(time.monotonic() - started, 1),
        "steps": steps,
        "pip_retries": retries,
        "root": str(ROOT),
        "built": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _run(steps: dict[str, float], name: str, cmd: list[str], env, log: Path | None, timeout: float) -> None:
    started = time.monotonic()
    try:
        if log is None:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            out = proc.stdout + proc.stderr
        else:
            with log.open("a") as f:
                f.write(f"\n$ {' '.join(cmd)}\n")
                f.flush()
                proc = subprocess.run(
                    cmd,
                    cwd=ROOT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                )
            out = log.read_text()
    except subprocess.TimeoutExpired:
        raise BinderBuildError(f"binder env: {name} ran past {timeout} s (log: {log})") from None
    steps[name] = round(time.monotonic() - started, 1)
    if proc.returncode != 0:
        tail = "\n".join(out.splitlines()[-60:])
        raise BinderBuildError(f"binder env: {name} failed (exit {proc.returncode}; log: {log}):\n{tail}")


def _prune(root: Path, keep: str) -> None:
    from filelock import FileLock, Timeout

    now = time.time()
    for marker in root.glob(f"*/{_MARKER}"):
        env = marker.parent
        if env.name == keep or now - marker.stat().st_mtime < _UNUSED_S:
            continue
        try:
            with FileLock(str(root / f"{env.name}.lock"), timeout=0):
                shutil.rmtree(env, ignore_errors=True)
        except Timeout:
            pass


def _steps(info: dict) -> str:
    return ", ".join(f"{k}: {v:.0f} s" for k, v in info["steps"].items())


def _say(msg: str) -> None:
    print(f"binder env: {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    py = binder_python()
    print(py)
    print(json.dumps(build_info(py), indent=1))
