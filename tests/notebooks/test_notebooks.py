"""Every tutorial in notebooks/ runs top to bottom in the Binder environment (tests/support/binder_env.py
builds it as repo2docker does from binder/), twice in a row from the same fresh folder, and is
committed without outputs.

Each run is a new kernel (nbclient, fast mode) of the env's own Python, started through
binder/start with the environment a Binder session gives it: the tutorials must work where a
user runs them, not only with the test's interpreter and packages. The second run must pass
too, and nothing may be left next to the notebook: tutorials work in temporary folders (a
checkpoint folder left there once made 08's second run resume at its end and fail)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.binder_env import BINDER, ROOT, binder_environ, binder_python
from tests.support.browser_lab import CHROMIUM

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: tutorials that tests/notebooks/test_browser_tutorials.py runs twice in a row in the Binder env's own
#: JupyterLab, cell by cell as a user does (where Chromium is there to drive it): not run a
#: third time here
IN_THE_BROWSER = {"04-many-instances.ipynb", "05-zones-and-migration.ipynb"}
RUN_HERE = [p for p in NOTEBOOKS if p.name not in IN_THE_BROWSER or not Path(CHROMIUM).exists()]
KERNEL = "spotnb-binder"
RUNS = 2
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# appended to each run: which interpreter and which spotnb the kernel ran
PROBE = "import sys, spotnb\nprint(sys.prefix)\nprint(spotnb.__file__)"

# the first test builds the Binder env when no cached one fits (83 s here, warm pip cache)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def python() -> Path:
    return binder_python()


def _run(path: Path, folder: Path, env: dict[str, str]) -> tuple[list, Path, Path]:
    """Execute `path` once in a new kernel whose working directory is `folder`: its cells, with
    their outputs, after a last cell that checks which Python ran them."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(
        nb, timeout=600, kernel_name=KERNEL, resources={"metadata": {"path": str(folder)}}
    )
    try:
        client.execute(env=env)
    except CellExecutionError as e:
        raise AssertionError(ANSI.sub("", str(e))) from None
    probe = nb.cells.pop()
    prefix, spotnb_file = "".join(o.get("text", "") for o in probe.outputs).split()
    return nb.cells, Path(prefix), Path(spotnb_file)


@pytest.mark.parametrize("path", RUN_HERE, ids=[p.name for p in RUN_HERE])
def test_notebook_runs(path: Path, python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernel's environment is a Binder session's (binder_environ: the env's bin first on PATH,
    # no PYTHONPATH), in fast mode as binder/start sets it, with the test's SPOTNB_HOME (conftest)
    env = binder_environ(python)
    env["SPOTNB_FAST"] = "1"
    # a kernelspec for the env's Python, launched through binder/start as repo2docker launches
    # everything; jupyter_client finds it on JUPYTER_PATH (read when the client is made)
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [str(BINDER / "start"), str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "spotnb (Binder env)", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    folder = tmp_path / "notebook"  # holds only what the tutorial leaves (tmp_path holds more)
    folder.mkdir()
    for run in range(1, RUNS + 1):
        try:
            cells, prefix, spotnb_file = _run(path, folder, env)
        except AssertionError as e:
            raise AssertionError(f"{path.name}, run {run} of {RUNS}:\n{e}") from None
        # the env's interpreter ran it, with spotnb from this checkout (installed editable)
        assert prefix == python.parent.parent, f"run {run}: the kernel's sys.prefix is {prefix}"
        assert spotnb_file.is_relative_to(ROOT / "spotnb"), f"run {run}: spotnb from {spotnb_file}"
        errors = [
            "\n".join(ANSI.sub("", line) for line in o.get("traceback", []))
            or f"{o.get('ename')}: {o.get('evalue')}"
            for c in cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
            if o.get("output_type") == "error"
        ]
        assert not errors, f"{path.name}, run {run} of {RUNS}:\n" + "\n\n".join(errors)
        left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
        assert not left, f"{path.name}, run {run} of {RUNS}, left next to the notebook: {left}"
    # what each tutorial shows, as its second run showed it
    outputs = [o for c in cells if c.cell_type == "code" for o in c.get("outputs", [])]
    figures = [
        o["data"]["application/vnd.plotly.v1+json"]
        for o in outputs
        if "application/vnd.plotly.v1+json" in o.get("data", {})
    ]
    problems = [p for fig in figures for p in _annotation_problems(fig)]
    assert not problems, problems
    if path.name.startswith("02"):
        # the policy charts: labelled bars whose labels are not clipped, axes titled with units
        for fig in figures:
            texts = [t for t in fig.get("data", []) if t.get("text")]
            assert all(t.get("cliponaxis") is False for t in texts), [t.get("name") for t in texts]
            layout = fig.get("layout", {})
            title = (layout.get("yaxis", {}).get("title") or {}).get("text", "")
            assert "(" in title and ")" in title, f"y axis without a unit: {title!r}"
        assert sum(1 for fig in figures for t in fig.get("data", []) if t.get("mode") == "text") >= 3
    if path.name.startswith("03"):
        # the dry run is shown once, readably: a summary with the raw requests behind a
        # disclosure, not ~180 lines of escaped JSON followed by the boot script again
        pages = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
        assert any("<details>" in p and "ec2.run_instances" in p for p in pages)
        streams = [o.get("text", "") for o in outputs if o.get("output_type") == "stream"]
        assert all(len(t.splitlines()) < 40 for t in streams), [len(t.splitlines()) for t in streams]
        assert any("approximate" in t and "dated" in t for t in streams)


def _annotation_problems(fig: dict) -> list[str]:
    """Annotations placed outside the data they label. Plotly takes an annotation's x on a log
    axis as log10(x) (a vline's label at x=12 on a log axis lands at 10^12), so check in the
    axis's own units, with a margin of the data's span."""
    import math

    layout, out = fig.get("layout", {}), []
    for ann in layout.get("annotations", []):
        ref = ann.get("xref", "x")
        if not isinstance(ann.get("x"), (int, float)) or not ref.startswith("x") or "domain" in ref:
            continue
        axis = layout.get("xaxis" + ref[1:], {})
        xs = [
            float(v)
            for t in fig.get("data", [])
            if t.get("xaxis", "x") == ref
            for v in (t.get("x") or [])
            if isinstance(v, (int, float))
        ]
        if axis.get("type") == "log":
            xs = [math.log10(v) for v in xs if v > 0]
        if not xs:
            continue
        lo, hi = min(xs), max(xs)
        margin = max(hi - lo, 1.0)
        if not lo - margin <= ann["x"] <= hi + margin:
            out.append(f"annotation {ann.get('text')!r} at x={ann['x']} outside [{lo:.3g}, {hi:.3g}] ({ref})")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


def test_there_are_tutorials() -> None:
    assert any(p.name.startswith("01-quickstart") for p in NOTEBOOKS)
