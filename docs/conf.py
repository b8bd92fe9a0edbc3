"""Sphinx configuration of spotnb's docs (built by `bash scripts/docs.sh`, warnings as errors).

MyST-NB reads the Markdown pages and the tutorials; the tutorials are committed without outputs
(tests/notebooks/test_notebooks.py), so the build executes them, cached by their code in
`docs/_build/.jupyter_cache` (a tutorial whose code did not change is not run again). The
Config reference is generated from the pydantic fields' descriptions (`_ext/spotnb_config.py`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # the checkout's spotnb, whatever the editable install points at
sys.path.insert(0, str(DOCS / "_ext"))

import spotnb  # noqa: E402

project = "spotnb"
author = "spotnb contributors"
release = version = spotnb.__version__
copyright = "spotnb contributors"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "spotnb_config",
]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**/.ipynb_checkpoints"]
# the tutorials live in notebooks/ (Binder opens them there); docs/tutorials is a link to it

html_theme = "furo"
html_title = f"spotnb {version}"
html_static_path: list[str] = []

# MyST: headings get anchors for cross-page links ([text](page.md#anchor)), tables, $ is not maths
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# MyST-NB: execute each tutorial once per change of its code, in a temporary folder (they write
# checkpoints next to themselves otherwise), fail the build when a cell raises
nb_execution_mode = os.environ.get("SPOTNB_DOCS_EXECUTE", "cache")
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache")
nb_execution_in_temp = True
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True

# autodoc: the public surface, in source order, with type hints in the description
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
