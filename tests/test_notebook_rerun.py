"""A tutorial runs again from the same folder: 08 writes scripts and checkpoint folders, and a
`ckpt/` left next to the notebook made its second run resume at the end and fail. It works in a
temporary folder, so the notebook's folder stays as it was and the second run passes too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(path: Path, folder: Path) -> list[dict]:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    resources = {"metadata": {"path": str(folder)}}
    NotebookClient(nb, timeout=600, kernel_name="python3", resources=resources).execute()
    return [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]


def test_the_scripts_tutorial_runs_twice_from_the_same_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOTNB_FAST", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    folder = tmp_path / "notebooks"  # (tmp_path holds the test's SPOTNB_HOME)
    folder.mkdir()
    for attempt in (1, 2):
        assert not _run(ROOT / "notebooks" / "08-scripts.ipynb", folder), f"run {attempt} failed"
        assert not list(folder.iterdir()), f"run {attempt} wrote next to the notebook"
