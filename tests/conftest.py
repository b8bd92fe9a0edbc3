"""Shared fixtures: every test gets its own SPOTNB_HOME (job DB, default store, logs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def spotnb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "spotnb-home"
    home.mkdir()
    monkeypatch.setenv("SPOTNB_HOME", str(home))
    return home


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return (tmp_path / "store").as_uri()
