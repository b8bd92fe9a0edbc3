"""Shared fixtures: every test gets its own SPOTNB_HOME (job DB, default store, logs)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.widget_helpers import FakeClock

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


# -- the widget tests' recording comm (tests/widget_helpers.py) ----------------------------------
@pytest.fixture
def clock() -> FakeClock:
    from tests.widget_helpers import FakeClock

    return FakeClock()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> list[tuple[float, str, dict[str, Any]]]:
    """Every comm message widgets send during the test: (clock, comm id, data)."""
    import comm

    from tests.widget_helpers import RecordingComm

    log: list[tuple[float, str, dict[str, Any]]] = []
    monkeypatch.setattr(comm, "create_comm", lambda **kw: RecordingComm(clock, log, **kw))
    return log


# -- the slowest tests first (tests/slowest.txt) ------------------------------------------------
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start the known slow tests first, longest first: pytest-xdist hands tests out in this
    order, so its two workers share the long ones and the run ends on short ones (a 50 s test
    dealt last keeps one worker busy while the other idles). Ties keep their collected order."""
    listed = ROOT / "tests" / "slowest.txt"
    lines = [s.strip() for s in listed.read_text().splitlines() if s.strip() and not s.startswith("#")]
    rank = {nodeid: i for i, nodeid in enumerate(lines)}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))
