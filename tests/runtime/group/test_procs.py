"""Several processes per instance (`Config.procs_per_instance`): real agent processes on the
local market, each starting its other ranks as real child processes, training over gloo
inside the instance and through a real torchft lighthouse across instances. Processes are
really killed (the market SIGKILLs an instance's process group; a test SIGKILLs one child).

`procfns.group_dp` splits each step's global batch over (replica, local rank) with every
value a multiple of 1/8, so the weights say to the bit whether each step was applied exactly
once; every rank saves its final weights, so all ranks can be compared with `torch.equal`.
"""

from __future__ import annotations

import functools
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

import spotnb as spot
from spotnb.errors import ConfigError
from spotnb.market.gpus import gpu_count
from tests.support import procfns
from tests.support.jobs import wait_for, wait_progress

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")
torch = pytest.importorskip("torch")

SHIP = ["tests.support.procfns"]


def _by(job: spot.Job, kind: str, n: int | None = None) -> list[Any]:
    return [e for e in job.events if e["kind"] == kind and (n is None or e["incarnation"] == n)]


def _slots(job: spot.Job) -> dict[int, int]:
    return {e["incarnation"]: e["slot"] for e in _by(job, "allocating")}


def _config(**kw: Any) -> spot.Config:
    kw.setdefault("procs_per_instance", 2)
    return spot.Config(ship_modules=SHIP, local_alloc_delay=0.1, **kw)


def _final_weights(out: Path) -> dict[str, Any]:
    """`<incarnation>-<local rank>` -> that rank's final weights."""
    return {p.stem: torch.load(p) for p in sorted(out.glob("*.pt"))}


def _children(job_id: str) -> list[psutil.Process]:
    """The ranks other than 0 of the job's instances (rank 0 is the agent)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "spotnb.runtime.group.local_rank" in cmd and job_id in cmd:
            found.append(p)
    return found


def test_one_instance_with_two_processes_trains_as_ddp(tmp_path: Path) -> None:
    """instances=1, procs_per_instance=2: plain data parallel over two local processes. Rank 1
    starts from other weights than rank 0 (replicate gives it rank 0's), each rank trains on
    half of every batch, and both end with the weights of the whole batch applied once."""
    steps = 40
    job = spot.train(functools.partial(procfns.group_dp, steps=steps, out=str(tmp_path)), _config())
    result = job.result(timeout=120)
    expected = torch.tensor([procfns.expected(steps)], dtype=torch.float64)
    assert result["ranks"] == 2 and result["weights"] == procfns.expected(steps)
    finals = _final_weights(tmp_path)
    assert sorted(finals) == ["1-0", "1-1"]
    assert all(torch.equal(w, expected) for w in finals.values())
    # rank 0 speaks for the group: one metric row per step, not two
    rows = [r for e in _by(job, "metrics") for r in e["rows"] if "loss" in r]
    assert sorted(Counter(r["step"] for r in rows).values()) == [1] * steps


def test_a_preempted_group_is_replaced_and_heals_from_its_peer(tmp_path: Path) -> None:
    """instances=2 × procs=2; the market kills one instance's process group mid-run. The other
    group trains on in the same incarnation (min_instances=2: it waits for the replacement),
    the replacement's two ranks heal from the peer's two ranks (no store restore), and all
    four ranks at the end hold the same weights: every step applied exactly once."""
    steps = 60
    job = spot.train(
        functools.partial(procfns.group_dp, steps=steps, out=str(tmp_path)),
        _config(instances=2, min_instances=2, local_schedule=[{"instance": 1, "step": 10}]),
    )
    result = job.result(timeout=120)
    assert result["weights"] == procfns.expected(steps)
    slots = _slots(job)
    (killed,) = _by(job, "preempted")
    assert slots[killed["incarnation"]] == 1 and killed["how"] == "preempted"
    (survivor,) = [n for n, k in slots.items() if k == 0]  # never replaced
    assert [e["reason"] for e in _by(job, "exited", survivor)] == ["done"]
    assert not _by(job, "resumed", survivor)
    (replacement,) = [n for n, k in slots.items() if k == 1 and n != killed["incarnation"]]
    quorums = _by(job, "quorum", replacement)
    assert quorums and quorums[0]["healed"] and quorums[0]["step"] >= 10
    assert not _by(job, "resumed", replacement)  # healed from the peer, not the store
    finals = _final_weights(tmp_path)
    assert sorted(finals) == sorted(f"{n}-{r}" for n in (survivor, replacement) for r in (0, 1))
    expected = torch.tensor([procfns.expected(steps)], dtype=torch.float64)
    assert all(torch.equal(w, expected) for w in finals.values())


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_lost_child_takes_its_group_down_and_the_job_recovers(
    tmp_path: Path, sig: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 alone is SIGKILLed (an OOM kill, say) or frozen (SIGSTOP, never continued):
    rank 0 must not hang in its all-reduce nor report a user error; the instance ends as
    lost, and the next one restores the store's checkpoint on both ranks and finishes
    exactly."""
    monkeypatch.setenv("SPOTNB_GROUP_STOP_GRACE", "1")  # a frozen rank is given up after 1 s
    steps = 80
    job = spot.train(
        functools.partial(procfns.group_dp, steps=steps, out=str(tmp_path), step_delay=0.05),
        _config(checkpoint="static:5"),
    )
    wait_progress(job, 15)
    (child,) = _children(job.id)
    os.kill(child.pid, sig)
    result = job.result(timeout=120)
    assert result["weights"] == procfns.expected(steps)
    (lost,) = _by(job, "preempted", 1)
    assert lost["how"] == "lost"
    (warning,) = [w for w in _by(job, "warning", 1) if "local rank 1" in w["message"]]
    assert ("killed by signal 9" if sig == signal.SIGKILL else "stopped (SIGSTOP)") in warning["message"]
    assert not _by(job, "error")
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
    (resumed,) = _by(job, "resumed", 2)
    assert resumed["from_step"] >= 10
    finals = _final_weights(tmp_path)
    assert sorted(finals) == ["2-0", "2-1"]
    expected = torch.tensor([procfns.expected(steps)], dtype=torch.float64)
    assert all(torch.equal(w, expected) for w in finals.values())


def test_a_noticed_group_leaves_after_its_step_and_no_step_fails(tmp_path: Path) -> None:
    """A notice reaches rank 0 of one instance; its other rank learns it inside the next
    all-reduce, so the whole group leaves at the same step boundary: the instance ends
    evacuated, saves nothing (the peer holds the state), and no step is redone anywhere."""
    steps = 80
    job = spot.train(
        functools.partial(procfns.group_dp, steps=steps, out=str(tmp_path), step_delay=0.05),
        _config(
            instances=2,
            local_schedule=[{"instance": 1, "step": 15, "notice": True}],
            local_grace=10.0,
            notice_poll=0.1,
        ),
    )
    result = job.result(timeout=120)
    assert result["weights"] == procfns.expected(steps)
    slots = _slots(job)
    (noticed,) = [n for n in slots if _by(job, "notice", n)]
    (preempted,) = _by(job, "preempted", noticed)
    assert preempted["how"] == "evacuated"
    assert not _by(job, "checkpoint", noticed)
    assert not _by(job, "warning", noticed)  # no rank was lost on the way out
    for n in slots:
        rows = [r for e in _by(job, "metrics", n) for r in e["rows"] if "loss" in r]
        counts = Counter(r["step"] for r in rows)
        assert not counts or max(counts.values()) == 1, f"incarnation {n} redid a step"
    # both ranks of the noticed group left with it: no process of the job is left behind
    wait_for(lambda: not _children(job.id), 10, "a rank outlived its group")


def test_a_notice_on_one_instance_saves_once_and_both_ranks_resume_from_it(tmp_path: Path) -> None:
    """instances=1: the notice reaches rank 0, which takes the emergency checkpoint alone while
    rank 1 waits for its word; both leave at that step, and the next instance restores the
    checkpoint on both ranks and ends exactly."""
    steps = 60
    job = spot.train(
        functools.partial(procfns.group_dp, steps=steps, out=str(tmp_path), step_delay=0.05),
        _config(
            local_schedule=[{"instance": 0, "step": 15, "notice": True}], local_grace=10.0, notice_poll=0.1
        ),
    )
    result = job.result(timeout=120)
    assert result["weights"] == procfns.expected(steps)
    (preempted,) = _by(job, "preempted", 1)
    assert preempted["how"] == "evacuated"
    (saved,) = [c for c in _by(job, "checkpoint", 1) if c["save_kind"] == "emergency"]  # one rank saves
    (evacuated,) = _by(job, "evacuated", 1)
    assert evacuated["step"] == saved["step"] >= 15
    (resumed,) = _by(job, "resumed", 2)
    assert resumed["from_step"] == saved["step"]
    assert not [w for w in _by(job, "warning") if "local rank" in w["message"]]
    finals = _final_weights(tmp_path)
    assert sorted(finals) == ["2-0", "2-1"]
    expected = torch.tensor([procfns.expected(steps)], dtype=torch.float64)
    assert all(torch.equal(w, expected) for w in finals.values())


def test_a_notice_too_short_to_save_keeps_the_group_training_together(tmp_path: Path) -> None:
    """Rank 0 decides not to attempt an emergency save that cannot finish (a slow upload, a
    0.5 s notice): rank 1 hears that word at the same boundary and both train on until the
    market kills them; the next instance resumes from the last periodic checkpoint."""
    steps = 60
    job = spot.train(
        functools.partial(procfns.group_dp, steps=steps, out=str(tmp_path), step_delay=0.05),
        _config(
            local_schedule=[{"instance": 0, "step": 40, "notice": True}],
            local_grace=0.5,
            notice_poll=0.1,
            checkpoint="static:10",
            local_upload_bps=8000,  # ~2 s for the ~15 kB checkpoint: it cannot fit in 0.5 s
        ),
    )
    result = job.result(timeout=120)
    assert result["weights"] == procfns.expected(steps)
    assert _by(job, "emergency_skipped", 1)
    (preempted,) = _by(job, "preempted", 1)
    assert preempted["how"] == "preempted"  # trained on until the kill, no rank lost before
    assert not [w for w in _by(job, "warning") if "local rank" in w["message"]]
    # the group trained on instead of leaving (no evacuation); how far it got before the kill
    # depends on the machine's load (0.5 s of grace), so that is not asserted
    assert not _by(job, "evacuated", 1)
    finals = _final_weights(tmp_path)
    expected = torch.tensor([procfns.expected(steps)], dtype=torch.float64)
    assert all(torch.equal(w, expected) for w in finals.values()) and len(finals) == 2


def test_an_exception_in_another_rank_fails_the_job_with_its_traceback(tmp_path: Path) -> None:
    job = spot.train(functools.partial(procfns.group_dp, steps=30, out=str(tmp_path), fail=5), _config())
    with pytest.raises(spot.JobFailed) as err:
        job.result(timeout=120)
    assert "local rank 1 of 2: ValueError: rank 1 cannot go on at step 5" in str(err.value)
    (error,) = _by(job, "error")
    assert error["exc_type"] == "ValueError" and "procfns.py" in error["traceback"]
    assert not _by(job, "preempted")  # a user error, not a lost instance


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"procs_per_instance": 0}, "Config.procs_per_instance"),
        ({"procs_per_instance": True}, "whole number"),
        (
            {"provider": "aws", "instance_type": "g5.12xlarge", "procs_per_instance": 8},
            "procs_per_instance=8 is more than the 4 GPUs of instance_type='g5.12xlarge'",
        ),
        (
            {"provider": "gcp", "instance_type": "a2-highgpu-2g", "procs_per_instance": 4},
            "set procs_per_instance=2",
        ),
        ({"instances": 2, "procs_per_instance": 2, "sync": "local_sgd:4"}, "sync='ddp' only"),
    ],
)
def test_bad_procs_per_instance_is_refused_before_anything_launches(fields: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("[", r"\[")):
        spot.Config(**fields)


def test_procs_up_to_the_gpus_and_on_unknown_types_are_accepted() -> None:
    assert gpu_count("g5.12xlarge") == 4 and gpu_count("aws/p3.2xlarge") == 1
    assert gpu_count("a3-highgpu-8g") == 8 and gpu_count("m5.large") is None
    assert (
        spot.Config(provider="aws", instance_type="g5.12xlarge", procs_per_instance=4).procs_per_instance == 4
    )
    # the type's GPUs are unknown: nothing to check against (the VM's count is the default)
    assert (
        spot.Config(provider="aws", instance_type="x9.huge", procs_per_instance=16).procs_per_instance == 16
    )
