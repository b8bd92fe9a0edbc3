"""Jupyter discovery hooks, re-exported lazily by `spotnb/__init__.py` so that
`jupyter labextension develop .` and `jupyter server extension enable spotnb` find them
without importing anything heavy."""

from __future__ import annotations

__all__ = ["_jupyter_labextension_paths", "_jupyter_server_extension_points"]

LABEXTENSION_NAME = "spotnb"  # the "name" in extension/package.json


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": LABEXTENSION_NAME}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "spotnb.views.server"}]
