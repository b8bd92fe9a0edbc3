"""How the replicas agree (`Config.sync`): local SGD and DiLoCo windows, and `auto` switching
behind a slow link. Real agent processes on the local market, a real torchft lighthouse, gloo.

`jobfns.exact_dp`'s loss is linear in the weights, so local SGD over any window gives the same
weights as ddp, to the bit: its final weights still say whether every step's global batch was
applied exactly once (a failed window half-applied or applied twice would show).
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest

import spotnb as spot
from spotnb.core.sync import SAMPLES, SWITCH_DOWN, SWITCH_UP, choose_sync, parse_sync
from tests.runtime.group.test_elastic import _by, _config, _finals, _rows, _slots
from tests.support import jobfns

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")


def _step_counts(job: spot.Job, n: int) -> Counter[int]:
    return Counter(r["step"] for r in _rows(job)[n] if "loss" in r)


def test_local_sgd_redoes_a_window_a_kill_broke_and_applies_it_once() -> None:
    steps, every = 90, 10
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.03),
        _config(sync=f"local_sgd:{every}", local_schedule=[{"instance": 1, "step": 25}]),
    )
    result = job.result(timeout=240)
    assert result["weights"] == jobfns.exact_dp_expected(steps)
    slots = _slots(job)
    (killed,) = _by(job, "preempted")
    survivors = [n for n, k in slots.items() if k != 1 and n != killed["incarnation"] and n <= 3]
    assert len(survivors) == 2
    for n in survivors:
        assert not _by(job, "resumed", n)  # no survivor read the store
        # the quorum is asked once per window: at window starts only
        assert all(q["step"] % every == 0 for q in _by(job, "quorum", n))
        # the window the kill broke (steps 20..29) was trained again; no other step was
        counts = _step_counts(job, n)
        redone = sorted(s for s, c in counts.items() if c > 1)
        assert redone and set(redone) <= set(range(20, 30)) and max(counts.values()) == 2
    finals = _finals(job)
    assert len(set(finals.values())) == 1  # every replica ended on the same weights
    b = job.breakdown()
    assert b.recompute > 0  # the broken window's work is counted as lost, not as compute


@pytest.mark.parametrize("sync", ["ddp", "local_sgd:5"])
def test_batchnorm_statistics_agree_across_replicas(sync: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each replica normalises only its share of the batch; the running statistics a model
    evaluates with must still be the same on every replica at the end (averaged with the
    gradients each step, or with the weights at each window's end), or the model a job
    returns depends on which replica wrote it."""
    # both replicas must train: the first quorum waits for both however slowly the second
    # starts (a clean-clone run under load started it > 5 s late, COLD_START_WAIT's default,
    # and the first replica trained the 30 steps alone)
    monkeypatch.setenv("SPOTNB_COLD_START_WAIT", "120")
    job = spot.train(functools.partial(jobfns.batchnorm_dp, steps=30), _config(instances=2, sync=sync))
    job.result(timeout=240)
    rows = _rows(job)
    buffers = {n: r["buffers"] for n, rs in rows.items() for r in rs if "buffers" in r}
    assert len(buffers) == 2
    assert len(set(buffers.values())) == 1, f"the replicas' BatchNorm statistics differ: {buffers}"
    assert len(set(_finals(job).values())) == 1


def test_diloco_replicas_agree_and_a_noticed_replica_finishes_its_window_first() -> None:
    steps, every = 64, 8
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.03),
        _config(
            instances=2,
            sync=f"diloco:{every}",
            local_schedule=[{"instance": 1, "step": 12, "notice": True}],
            local_grace=15.0,
            notice_poll=0.1,
        ),
    )
    result = job.result(timeout=240)
    # DiLoCo's outer Nesterov step moves the weights further than the plain sum would
    assert result["weights"] != jobfns.exact_dp_expected(steps)
    assert all(w > 0 for w in result["weights"])
    slots = _slots(job)
    (noticed,) = [n for n in slots if _by(job, "notice", n)]
    (left,) = _by(job, "evacuated", noticed)
    assert left["step"] % every == 0  # it stayed to the end of its window
    assert _by(job, "preempted", noticed)[0]["how"] == "evacuated"
    for n in _rows(job):  # no failed window anywhere
        assert max(_step_counts(job, n).values(), default=1) == 1
    finals = _finals(job)
    assert len(set(finals.values())) == 1, f"replicas disagree: {finals}, events {_by(job, 'quorum')}"


def test_auto_leaves_ddp_behind_a_slow_link_without_a_restart() -> None:
    steps = 60
    job = spot.train(
        functools.partial(jobfns.exact_dp, steps=steps, step_delay=0.01),
        _config(instances=2, sync="auto", local_link_delay={1: 0.2}),
    )
    result = job.result(timeout=240)
    assert result["weights"] == jobfns.exact_dp_expected(steps)  # exact across the switch
    (switch,) = _by(job, "sync")
    assert switch["was"] == "ddp" and switch["sync"] == "local_sgd" and switch["every"] >= 2
    assert switch["comm_s"] > SWITCH_UP * switch["compute_s"]
    assert SAMPLES <= switch["step"] < steps
    # the same two processes before and after: nothing restarted
    assert len(_slots(job)) == 2 and not _by(job, "preempted")
    # after the switch the replicas met once per window, not once per step
    for n in _slots(job):
        later = [q for q in _by(job, "quorum", n) if q["step"] > switch["step"]]
        assert len(later) <= (steps - switch["step"]) // switch["every"] + 1


@pytest.mark.parametrize(
    "mode, every, compute, comm, expect",
    [
        ("ddp", 1, 0.10, 0.01, ("ddp", 1)),  # cheap all-reduce: stay
        ("ddp", 1, 0.10, 0.20, ("local_sgd", 20)),  # 2x the step: K so sync is ~10 % of a window
        ("ddp", 1, 0.01, 5.0, ("local_sgd", 64)),  # K is capped
        ("local_sgd", 3, 0.10, 0.03, ("local_sgd", 3)),  # between the thresholds: no flapping
        ("local_sgd", 20, 0.10, 0.01, ("ddp", 1)),  # the slow link is gone: back to ddp
        ("local_sgd", 4, 0.10, 0.20, ("local_sgd", 20)),  # the link got much slower: re-tune K
    ],
)
def test_auto_rule(mode: str, every: int, compute: float, comm: float, expect: tuple[str, int]) -> None:
    assert SWITCH_DOWN < SWITCH_UP
    assert choose_sync(mode, every, [(compute, comm)] * SAMPLES) == expect
    assert choose_sync(mode, every, [(compute, comm)] * (SAMPLES - 1)) == (mode, every)  # too few


def test_one_slow_step_does_not_switch() -> None:
    samples: list[Any] = [(0.1, 0.01), (0.1, 0.01), (0.1, 3.0)]
    assert choose_sync("ddp", 1, samples) == ("ddp", 1)


def test_sync_strings() -> None:
    assert str(parse_sync("auto")) == "auto" and str(parse_sync(" diloco : 8 ")) == "diloco:8"
