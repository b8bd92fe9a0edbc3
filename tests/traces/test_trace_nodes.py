"""A multi-node availability trace replayed as node counts on the local market: the job's
instances follow the trace's count, the survivors train on, and the job ends exact."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

import spotnb as spot
from spotnb.providers.local.capacity import NodeCounts
from spotnb.traces import load_trace
from tests.runtime.group.test_elastic import _by, _config, _slots
from tests.support import jobfns

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")

# Parcae's format (time_ms, available nodes): 4 nodes, half of them gone from 5 s to 10 s
WAVE = "0,4\n5000,2\n10000,4\n600000,4\n"


def test_node_counts_scale_the_trace_to_the_job(tmp_path: Path) -> None:
    path = tmp_path / "wave.csv"
    path.write_text(WAVE)
    nodes = NodeCounts(load_trace(path), instances=2, speed=2.0)
    assert [nodes.capacity(t) for t in (0, 2.4, 2.6, 4.9, 5.1)] == [2, 2, 1, 1, 2]


def test_a_wave_in_the_trace_takes_an_instance_away_and_gives_it_back(tmp_path: Path) -> None:
    path = tmp_path / "wave.csv"
    path.write_text(WAVE)
    steps = 300
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.05),
        _config(instances=2, local_trace=str(path)),
    )
    result = job.result(timeout=300)
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    killed = _by(job, "preempted")
    assert len(killed) == 1  # the wave took one of the two
    refused = [e for e in _by(job, "alloc_failed") if "room for 1" in (e.get("reason") or "")]
    assert refused  # while the trace had one node for the job, no replacement was given
    slots = _slots(job)
    assert len(slots) == 3 and not _by(job, "resumed")  # the replacement healed from its peer
    (replacement,) = [n for n in slots if n > 2]
    (allocated,) = _by(job, "allocated", replacement)
    # the replacement came only after the wave: 10 s of market time after the first launch
    first = min(e["t"] for e in _by(job, "launched"))
    assert allocated["t"] - first >= 10.0 - 0.5
