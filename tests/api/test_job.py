"""The Job handle, attach from another process, the ledger, stop and the limits."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

import spotnb as spot
from spotnb.core.ledger import CATEGORIES
from spotnb.market.prices import lookup_price
from tests.support import jobfns

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOTNB_HOME", str(home))
    # 6 s of steps: the job's fixed costs (its controller's start, its end) stay a small part
    # of it now that replacements start warm (a 3 s job ran 9 s in all; 15 % went unattributed)
    fn = functools.partial(jobfns.slow_steps, steps=300, step_time=0.02)
    config = spot.Config(
        name="ledger",
        ship_modules=SHIP,
        save_every=40,
        local_grace=0.5,
        local_schedule=[2.2, {"step": 250, "phase": "step"}],
        notice_poll=0.1,
    )
    job = spot.train(fn, config)
    job.result(timeout=120)
    yield job, home
    mp.undo()


def test_attach_from_a_fresh_process_shows_the_full_history(finished_job) -> None:
    job, home = finished_job
    code = (
        f"import json, spotnb; j = spotnb.attach({job.id!r}); j.wait(30); "
        "print(json.dumps({'status': j.status, 'events': [e.to_json() for e in j.events], "
        "'result': j.result()}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "SPOTNB_HOME": str(home)},
    )
    seen = json.loads(out.stdout)
    assert seen["status"] == "succeeded" and seen["result"] == 300
    key = lambda e: (e["t"], e["kind"], e["incarnation"])  # noqa: E731
    assert sorted(map(key, seen["events"])) == sorted(map(key, job.events))
    listed = subprocess.run(
        [sys.executable, "-m", "spotnb.cli", "jobs"],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "SPOTNB_HOME": str(home)},
    )
    assert job.id in listed.stdout and "succeeded" in listed.stdout


def test_breakdown_adds_up_and_is_priced_from_the_table(finished_job) -> None:
    job, _ = finished_job
    b = job.breakdown()
    assert b.preemptions == 2 and b.incarnations == 3
    assert sum(getattr(b, c) for c in CATEGORIES) == pytest.approx(b.total, rel=1e-6)
    assert b.other < 0.15 * b.total  # nearly everything is attributed
    assert 300 * 0.02 <= b.compute < b.total  # at least the steps' own sleep
    assert b.recompute > 0 and b.alloc > 0 and b.prep > 0
    price = lookup_price("g4dn.xlarge")
    assert (b.spot_price, b.on_demand_price) == (price.spot, price.on_demand)
    billed = 0.0
    allocated = {e["incarnation"]: e["t"] for e in job.events if e["kind"] == "allocated"}
    ended = {e["incarnation"]: e["t"] for e in job.events if e["kind"] in ("preempted", "exited")}
    for n, t in allocated.items():
        billed += ended[n] - t
    assert b.spot_cost == pytest.approx(billed / 3600 * price.spot)
    assert b.on_demand_cost == pytest.approx(b.compute / 3600 * price.on_demand)
    assert b.spot_cost > 0 and b.savings == pytest.approx(1 - b.spot_cost / b.on_demand_cost)


def test_metrics_and_repr(finished_job) -> None:
    job, _ = finished_job
    steps = [s for s, _ in job.metrics["step_value"]]
    assert set(steps) == set(range(300))
    assert "succeeded" in repr(job) and job.id in job._repr_html_()
    frame = job.metrics_frame()
    assert {"step", "step_value", "incarnation"} <= set(frame.columns)


def test_stop_ends_the_job_and_its_instance() -> None:
    fn = functools.partial(jobfns.slow_steps, steps=100000, step_time=0.01)
    job = spot.train(fn, spot.Config(ship_modules=SHIP))
    job.add_sink(_WaitFor("ready"))
    assert _WaitFor.seen.wait(60)
    job.stop(timeout=60)
    assert job.status == "stopped"
    with pytest.raises(spot.JobStopped):
        job.result(timeout=1)
    exited = [e for e in job.events if e["kind"] == "exited"]
    assert exited and exited[-1]["reason"] == "stopped"


def test_max_preemptions_stops_the_job() -> None:
    fn = functools.partial(jobfns.slow_steps, steps=100000, step_time=0.01)
    job = spot.train(
        fn, spot.Config(ship_modules=SHIP, max_preemptions=1, local_schedule=[{"step": 5}, {"step": 5}])
    )
    with pytest.raises(spot.JobStopped, match="max_preemptions=1"):
        job.result(timeout=120)
    assert job.breakdown().preemptions == 2


def test_capacity_failures_are_retried_with_events() -> None:
    fn = functools.partial(jobfns.slow_steps, steps=5, step_time=0.0)
    job = spot.train(
        fn, spot.Config(ship_modules=SHIP, local_capacity_failure=0.6, local_seed=3, local_alloc_delay=0.01)
    )
    assert job.result(timeout=120) == 5
    failed = [e for e in job.events if e["kind"] == "alloc_failed"]
    assert failed and "InsufficientInstanceCapacity" in failed[0]["reason"]
    attempts = [e["attempt"] for e in job.events if e["kind"] == "allocating"]
    assert attempts == list(range(1, len(failed) + 2))


class _WaitFor:
    import threading

    seen = threading.Event()

    def __init__(self, kind: str) -> None:
        self.kind = kind
        _WaitFor.seen.clear()

    def on_events(self, events: list[dict]) -> None:
        if any(e["kind"] == self.kind for e in events):
            _WaitFor.seen.set()
