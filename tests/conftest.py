"""Shared fixtures: every test gets its own SPOTNB_HOME (job DB, default store, logs)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import spotnb as spot

if TYPE_CHECKING:
    from tests.support.widget_helpers import FakeClock

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


# -- the widget tests' recording comm (tests/support/widget_helpers.py) ----------------------------------
@pytest.fixture
def clock() -> FakeClock:
    from tests.support.widget_helpers import FakeClock

    return FakeClock()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> list[tuple[float, str, dict[str, Any]]]:
    """Every comm message widgets send during the test: (clock, comm id, data)."""
    import comm

    from tests.support.widget_helpers import RecordingComm

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


# -- jobs on the local market: the uninterrupted reference run, a real checkpointer ------------
SHIP = ["tests.support.jobfns"]


def _losses(job: spot.Job) -> list[tuple[int, float]]:
    return job.metrics["loss"]


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[tuple[int, float]]]:
    """The uninterrupted run, on the same market with no preemption."""
    from tests.support import jobfns

    home = tmp_path_factory.mktemp("ref-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOTNB_HOME", str(home))
    try:
        job = spot.train(jobfns.seeded_mlp, spot.Config(checkpoint="static:20", ship_modules=SHIP))
        result = job.result(timeout=180)
        assert job.breakdown().preemptions == 0
        return result, _losses(job)
    finally:
        mp.undo()


@pytest.fixture
def ckpt(store_url: str):
    """A real checkpointer on a real directory store, with its events recorded."""
    from spotnb.core.store import Store
    from spotnb.runtime.checkpoint.checkpointer import Checkpointer
    from tests.support.jobs import Recorder

    rec = Recorder()
    c = Checkpointer(Store(store_url), "job", 1, rec, keep_last=2)
    yield c, rec
    c.close()
