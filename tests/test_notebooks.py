"""Every tutorial in notebooks/ executes top to bottom (nbclient, fast mode) and is committed
without outputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("SPOTNB_FAST", "1")
    # the kernel imports spotnb from this checkout, whatever is installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    figures = [
        o["data"]["application/vnd.plotly.v1+json"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
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
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
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
