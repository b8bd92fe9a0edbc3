"""A real JupyterLab for the browser tests: started on 127.0.0.1 with a token over a folder of
notebooks, from a chosen Python (the test's own, or a virtualenv made as a user makes one), and
driven by headless Chromium through Playwright.

Every wait is on a condition (the server's API answering, a predicate in the page), never a
sleep; the only fixed pause is the readiness probe's polling interval.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from tests.views.test_server_ext import stop_process

ROOT = REPO
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

__all__ = [
    "BROWSER_MARKS",
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "ROOT",
    "all_cells_ran",
    "MATHJAX_NODES",
    "make_readme_env",
    "output_problems",
    "readme_install_commands",
    "readme_python",
    "run_all",
    "wait_all_ran",
    "free_port",
    "notebook_outputs",
    "open_notebook",
    "run_lab",
    "save_notebook",
]


#: the marks of a test module that drives headless Chromium (skipped where it is missing,
#: outside CI; CI installs it: scripts/setup.d/40-browser.sh)
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
        reason=f"{CHROMIUM} not installed (CI installs it: scripts/setup.d/40-browser.sh)",
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def run_lab(
    tmp_path: Path,
    notebooks: list[str],
    python: str | None = None,
    checkout: bool = True,
    env: dict[str, str] | None = None,
) -> Iterator[dict[str, Any]]:
    """JupyterLab serving a temp folder holding copies of `notebooks` (names in notebooks/).

    `python`: the interpreter that runs JupyterLab and its kernels (default: the test's).
    `checkout`: put this checkout first on the kernels' PYTHONPATH and its build of the
    extension first on the labextensions path (the code under test, whatever is installed);
    False for an environment that must stand on what its own install put there.
    Yields {"url", "token", "dir", "tmp"}."""
    work = tmp_path / "lab"
    work.mkdir()
    for name in notebooks:
        shutil.copy(ROOT / "notebooks" / name, work)
    settings = tmp_path / "lab-settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    port, token = free_port(), os.urandom(12).hex()
    base = {**os.environ, **(env or {})}
    extra: dict[str, str] = {}
    if checkout:
        # this checkout's own build of the extension (`cd extension && npm run build` writes it
        # to spotnb/labextension) comes first on the labextensions path, so the test checks the
        # extension of the code under test, not whatever copy is installed in sys.prefix
        jupyter_path = [base.get("JUPYTER_PATH", "")]
        build = ROOT / "spotnb" / "labextension"
        if (build / "package.json").exists():
            share = tmp_path / "jupyter-share"
            (share / "labextensions").mkdir(parents=True)
            (share / "labextensions" / "spotnb").symlink_to(build, target_is_directory=True)
            jupyter_path.insert(0, str(share))
        extra["JUPYTER_PATH"] = os.pathsep.join(filter(None, jupyter_path))
        extra["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))
    else:
        # nothing of the test's environment leaks into the user's: no path of this checkout
        for key in ("PYTHONPATH", "JUPYTER_PATH", "VIRTUAL_ENV"):
            base.pop(key, None)
    full_env = {
        **base,
        **extra,
        "SPOTNB_FAST": base.get("SPOTNB_FAST", "1"),
        "SPOTNB_HOME": str(tmp_path / "spotnb-home"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
    }
    if python is not None:
        # the environment's own executables (jupyter, pip, spotnb) come first, as once activated
        full_env["PATH"] = os.pathsep.join([str(Path(python).parent), base.get("PATH", "")])
    log = open(tmp_path / "jupyterlab.log", "wb")  # noqa: SIM115 - JupyterLab writes it until teardown
    proc = subprocess.Popen(
        [
            python or sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={work}",
            "--LabApp.expose_app_in_browser=True",
            *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        ],
        cwd=work,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while True:  # the server is up when its API answers (or the test fails with its log)
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError(
                    f"JupyterLab did not start:\n{(tmp_path / 'jupyterlab.log').read_text()[-3000:]}"
                )
            time.sleep(0.2)  # polling interval of a readiness probe, not a race-hiding sleep
        yield {"url": url, "token": token, "dir": work, "tmp": tmp_path}
    finally:
        stop_process(proc)
        log.close()


def open_notebook(page: Any, lab: dict[str, Any], name: str, min_cells: int = 1) -> None:
    """Open notebook `name` and wait until its kernel is idle and its cells are drawn."""
    page.goto(f"{lab['url']}/lab/tree/{name}?token={lab['token']}")
    page.wait_for_function(
        f"""() => {{
        const app = window.jupyterapp; const w = app && app.shell.currentWidget;
        const k = w && w.sessionContext && w.sessionContext.session
                  && w.sessionContext.session.kernel;
        return !!(k && k.status === 'idle' && w.content && w.content.widgets.length >= {min_cells});
    }}""",
        timeout=90_000,
    )


#: every code cell of the open notebook has run (an execution count, no pending run) and the
#: kernel is idle
_ALL_RAN = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext.session && w.sessionContext.session.kernel;
  if (!k || k.status !== 'idle') return false;
  return w.content.widgets.every(c => c.model.type !== 'code'
      || (c.model.executionCount !== null && c.model.executionState !== 'running'));
}"""


def run_all(page: Any) -> None:
    """Start "run all" (without awaiting it: its promise resolves only when all cells ran) and
    wait until the run has begun (a cell queued or running, or one with a count)."""
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.wait_for_function(
        """() => { const w = window.jupyterapp.shell.currentWidget;
          const k = w.sessionContext.session.kernel;
          return k.status === 'busy' || w.content.widgets.some(
              c => c.model.type === 'code' && c.model.executionCount !== null); }""",
        timeout=60_000,
    )


def wait_all_ran(page: Any, timeout_s: float) -> None:
    """Wait until every code cell of the open notebook ran and its kernel is idle."""
    page.wait_for_function(_ALL_RAN, timeout=timeout_s * 1000, polling=500)


def all_cells_ran(page: Any, timeout_s: float) -> None:
    """Run all cells of the open notebook and wait until every one ran."""
    run_all(page)
    wait_all_ran(page, timeout_s)


#: what a tutorial's outputs must never show: a Python traceback, a missing module
PROBLEMS = ("Traceback (most recent call last)", "ModuleNotFoundError")


def output_problems(path: Path) -> list[str]:
    """The saved notebook's error outputs and stderr/stdout lines that read as failures."""
    found = []
    for o in notebook_outputs(path):
        if o.get("output_type") == "error":
            found.append(f"cell {o['cell']}: {o.get('ename')}: {o.get('evalue')}")
        text = o.get("text") or "".join(str(v) for v in (o.get("data") or {}).values())
        if isinstance(text, list):
            text = "".join(text)
        for marker in PROBLEMS:
            if marker in text:
                found.append(f"cell {o['cell']}: {marker} in {o.get('output_type')}: {text[-600:]}")
    return found


#: MathJax's rendered elements in the notebook (a `$…$` typeset as maths)
MATHJAX_NODES = "() => document.querySelectorAll('.jp-Notebook mjx-container, .jp-Notebook .MathJax').length"


def save_notebook(page: Any) -> None:
    """Save the open notebook (its outputs land on disk) and wait until it is clean."""
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return !!(w && w.context && !w.context.model.dirty); }",
        timeout=30_000,
    )


def notebook_outputs(path: Path) -> list[dict[str, Any]]:
    """Every output of every code cell of the saved notebook at `path`, with its cell index."""
    nb = json.loads(path.read_text())
    return [
        {**o, "cell": i}
        for i, c in enumerate(nb["cells"])
        if c.get("cell_type") == "code"
        for o in c.get("outputs", [])
    ]


def readme_install_commands(readme: Path = ROOT / "README.md") -> list[str]:
    """The install commands of README's first command line (what precedes its `spotnb demo`),
    e.g. ["pip install torch==2.13.0", "pip install -e ."]: the test installs what the README
    tells a user to, so a change there is a change here."""
    text = readme.read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    first = block.strip().splitlines()[0].split("#", 1)[0]
    commands = [c.strip() for c in first.split("&&")]
    installs = [c for c in commands if c.startswith("pip install")]
    if not installs:
        raise AssertionError(f"README's first command installs nothing: {first!r}")
    return installs


def readme_python(extra: tuple[str, ...] = ("jupyterlab",)) -> Path:
    """The python of a virtualenv made as README says (`make_readme_env`), plus `extra`, built
    once under a lock and reused while README's install line, pyproject.toml and this checkout
    stay the same (spotnb is installed editable, so the code under test is the checkout's).
    Kept under ~/.cache/spotnb/readme-env/<key>; scripts/setup.sh builds it ahead of the
    tests."""
    import hashlib

    from filelock import FileLock

    parts = [
        sys.version,
        str(ROOT),
        *readme_install_commands(),
        *extra,
        (ROOT / "pyproject.toml").read_text(),
    ]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spotnb" / "readme-env"
    base.mkdir(parents=True, exist_ok=True)
    env = base / key
    with FileLock(str(base / f"{key}.lock"), timeout=1800):
        done = env / "spotnb-readme-env.done"
        if not done.exists():
            make_readme_env(env, list(extra))
            done.write_text(" && ".join(readme_install_commands()) + "\n")
        done.touch()  # used now
        for old in base.iterdir():  # envs of other keys unused for a day (an older pyproject)
            marker = old / "spotnb-readme-env.done"
            if old.name != key and (not marker.exists() or time.time() - marker.stat().st_mtime > 86400):
                shutil.rmtree(old, ignore_errors=True)
    return env / "bin" / "python"


def make_readme_env(where: Path, extra: list[str]) -> Path:
    """A fresh virtualenv (no system site packages, no constraints, no set-up script) holding
    what README's first command installs, then `extra` (pip arguments, e.g. the JupyterLab
    README tells notebook users to add). Returns its Python."""
    import venv

    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    python = where / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_CONSTRAINT", "VIRTUAL_ENV")}
    steps = [c.split()[2:] for c in readme_install_commands()] + [extra]
    for args in steps:
        out = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if out.returncode:
            tail = out.stdout[-2000:] + out.stderr[-3000:]
            raise RuntimeError(f"pip install {' '.join(args)} failed:\n{tail}")
    return python
