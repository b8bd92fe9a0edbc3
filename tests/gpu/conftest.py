"""The GPU suite (`pytest -m gpu`, `scripts/gpu-check.sh`): every test here is marked `gpu` and
skipped where CUDA is not available. `SPOTNB_GPU_REPORT`, when set, names a file the tests
append their measured figures to (one JSON object per line), for gpu-check's summary."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu-check.sh on a GPU machine)")
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


@pytest.fixture
def report() -> Any:
    """`report(name, **figures)`: a figure for gpu-check's summary (ignored when not collected)."""

    def write(name: str, **figures: Any) -> None:
        path = os.environ.get("SPOTNB_GPU_REPORT")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"name": name, **figures}) + "\n")

    return write
