"""A torchrun DDP script on several instances (`spot.run(script, config=Config(instances=2))`):
real agents on the local market, each running torch's elastic launcher with the rendezvous in
the job's coordinator (a process of the market), real gloo workers, a real SIGKILL. Nothing is
mocked.

`tests/support/scripts/ddp_train.py` makes every value a multiple of 1/8, so its final weights say
to the bit whether each step was applied exactly once from the checkpoint it resumed from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import spotnb as spot
from spotnb.control.jobdb import JobDB
from spotnb.errors import ConfigError
from tests.support.paths import SCRIPTS

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")

SCRIPTS = SCRIPTS


def _by(job: spot.Job, kind: str, n: int | None = None) -> list[Any]:
    return [e for e in job.events if e["kind"] == kind and (n is None or e["incarnation"] == n)]


def _expected(steps: int) -> list[float]:
    return [sum((s % 7) + i + 1 for s in range(steps)) / 8 for i in range(8)]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    shutil.copy(SCRIPTS / "ddp_train.py", tmp_path / "ddp_train.py")
    return tmp_path


def test_a_lost_instance_the_group_resumes_from_the_checkpoint_and_the_replacement_joins(here: Path) -> None:
    """Instance 1 is killed without notice at step 13: the survivor's workers restart in a
    group of one from the newest checkpoint (step 10: nothing lost beyond it), the controller
    refills the slot, the replacement joins at the next restart, and the job ends with the
    weights of a calm run, on which both ranks agree."""
    steps = 30
    config = spot.Config(instances=2, local_alloc_delay=0.1, local_schedule=[{"instance": 1, "step": 13}])
    job = spot.run("ddp_train.py", [str(steps), "ckpt", "5", "0.02"], config, detach=False)
    result = job.result(timeout=150)
    assert result["weights"] == _expected(steps) and result["agree"] and result["world"] == 2
    (killed,) = _by(job, "preempted")
    assert killed["incarnation"] == 2 and killed["how"] == "preempted"
    checkpoints = _by(job, "checkpoint")
    resumed = [r for r in _by(job, "resumed") if r["t"] > killed["t"]]
    assert resumed
    for r in resumed:  # every round starts from the newest checkpoint committed before it
        assert r["from_step"] == max(c["step"] for c in checkpoints if c["t"] < r["t"]), r
    assert resumed[0]["from_step"] >= 10  # the kill came at step 13, after the save of step 10
    replacement = max(e["incarnation"] for e in _by(job, "allocated"))
    assert replacement == 3 and any(r["incarnation"] == 3 for r in resumed)  # it joined a round
    # the feed tells the survivor's restart (same instance, a later round) from a relaunch
    from spotnb.views.widget.text import event_text

    first_of_3 = next(r for r in resumed if r["incarnation"] == 3)
    assert first_of_3["group_round"] == 1 and "relaunched" in event_text(first_of_3)
    of_1 = [r for r in resumed if r["incarnation"] == 1]
    assert of_1 and all(r["group_round"] > 1 and "group restarted" in event_text(r) for r in of_1)
    # the survivor's torchrun started its workers again (a new round), it never was replaced
    survivor = _logs(job, 1)
    assert len(re.findall(r"round \w+ starts", survivor)) >= 2 and "Connection closed by peer" in survivor
    assert {e["incarnation"] for e in _by(job, "done")} == {1, 3}
    saved = [c["step"] for c in checkpoints]
    assert len(saved) == len(set(saved))  # one writer (rank 0), and no round went back
    # the policy plans for the group rolling back whenever any instance is lost
    market = json.loads(job.store.read_bytes(job.store.job(job.id, "incarnations", "0003.json")))["market"]
    assert market["mttp"] == pytest.approx(market["instance_mttp"] / 2)


def test_a_notice_on_an_instance_without_rank_0_makes_rank_0_save_before_it_leaves(here: Path) -> None:
    """A notice on the instance that does not hold rank 0: the group is told through the
    coordinator, rank 0 (on the other instance) saves at its next step, the noticed instance
    leaves as soon as that checkpoint is committed (well before its deadline, as evacuated),
    and the next rounds resume from it: nothing done before the notice is redone."""
    steps = 40
    config = spot.Config(instances=2, local_alloc_delay=0.1, local_grace=10.0, notice_poll=0.1)
    job = spot.run("ddp_train.py", [str(steps), "ckpt", "100", "0.05"], config, detach=False)
    deadline = time.monotonic() + 120
    while not _by(job, "progress") or max(p["step"] for p in _by(job, "progress")) < 5:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.05)
    live = {r["incarnation"] for r in _by(job, "ready")}
    writer = _rank0(job)
    (other,) = [s for s in job.driver.slots if s.n in live - {writer}]
    job.driver.provider.inject(other.instance, grace=10.0)
    result = job.result(timeout=150)
    assert result["weights"] == _expected(steps) and result["agree"] and result["world"] == 2
    (notice,) = _by(job, "notice")
    assert notice["incarnation"] == other.n
    (left,) = _by(job, "preempted", other.n)
    assert left["how"] == "evacuated"
    (saved,) = [c for c in _by(job, "checkpoint") if notice["t"] < c["t"] < left["t"]]
    assert saved["incarnation"] == writer and saved["save_kind"] == "insurance"
    assert left["t"] < notice["deadline"] - 2.5  # it left once the checkpoint was in
    resumed = [r for r in _by(job, "resumed") if r["t"] > left["t"]]
    assert resumed and all(r["from_step"] == saved["step"] for r in resumed)


def _rank0(job: spot.Job) -> int:
    """The incarnation whose workers hold rank 0 (its instance log says so)."""
    deadline = time.monotonic() + 60
    while True:
        for n in {r["incarnation"] for r in _by(job, "ready")}:
            if re.search(r"rank 0 of 2: round", _logs(job, n)):
                return n
        assert time.monotonic() < deadline, "no rank 0 in the logs"
        time.sleep(0.1)


def test_the_coordinator_dies_mid_run_and_the_group_goes_on_from_the_checkpoint(here: Path) -> None:
    """The job's coordinator (the rendezvous store's host) is killed after step 5 was saved:
    the market starts it again (an empty store, a new epoch), torchrun on every instance loses
    its rendezvous and is started again by its agent in a fresh one, the workers restore the
    newest checkpoint, and the job ends with a calm run's weights, on the same instances."""
    steps = 30
    job = spot.run(
        "ddp_train.py",
        [str(steps), "ckpt", "5", "0.1"],
        spot.Config(instances=2, local_alloc_delay=0.1),
        detach=False,  # the market (and its coordinator) in this process: ~5 s less per test
    )
    deadline = time.monotonic() + 120
    while not any(c["step"] >= 5 for c in _by(job, "checkpoint")):
        assert time.monotonic() < deadline, "no checkpoint of step 5"
        time.sleep(0.1)
    (pid,) = _coordinator(job.id)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    result = job.result(timeout=150)
    assert result["weights"] == _expected(steps) and result["agree"] and result["world"] == 2
    lost = [w for w in _by(job, "warning") if "lost its rendezvous" in w["message"]]
    assert {w["incarnation"] for w in lost} == {1, 2}
    checkpoints = _by(job, "checkpoint")
    resumed = [r for r in _by(job, "resumed") if r["t"] > killed_at]
    assert {r["incarnation"] for r in resumed} == {1, 2}
    for r in resumed:
        assert r["from_step"] == max(c["step"] for c in checkpoints if c["t"] < r["t"]) >= 5, r
    assert max(r["from_step"] for r in resumed) < steps  # it came mid-run
    assert len(_by(job, "allocated")) == 2 and not _by(job, "preempted")  # no instance was lost


def _coordinator(job_id: str) -> list[int]:
    """The pid of the job's coordinator process on the local market (by its command line)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"spotnb.runtime.group.lighthouse" in argv and job_id.encode() in argv:
            found.append(int(name))
    return found


@pytest.mark.parametrize("rank", [0, 1])
def test_a_script_that_fails_ends_the_job_failed_with_its_error_not_a_restart_loop(
    here: Path, rank: int
) -> None:
    """Rank `rank` raises at step 5: the job fails with the script's exception and traceback,
    once; torchrun does not start the script again and no instance is relaunched (the other
    rank only sees its peer vanish, which is not a failure of its own)."""
    config = spot.Config(instances=2, local_alloc_delay=0.1)
    job = spot.run("ddp_train.py", ["30", "ckpt", "5", "0.02", f"bug{rank}"], config, detach=False)
    with pytest.raises(spot.JobFailed, match=r"a bug in the script at step 5"):
        job.result(timeout=120)
    (error,) = _by(job, "error")
    assert error["exc_type"] == "ValueError" and f"failed on rank {rank}:" in error["message"]
    assert 'ddp_train.py", line' in error["traceback"]
    assert len(_by(job, "allocated")) == 2  # nothing relaunched (max_retries=0)
    assert _logs(job).count(f"rank {rank} of 2: round") == 1  # the failing rank ran once


def _logs(job: spot.Job, n: int | None = None) -> str:
    """The instance logs of the job (of incarnation n)."""
    from spotnb.core.home import spotnb_home

    pattern = f"{n:04d}-*.log" if n is not None else "0*.log"
    return "".join(p.read_text(errors="replace") for p in (spotnb_home() / "logs" / job.id).glob(pattern))


@pytest.mark.parametrize(
    ("args", "overrides", "message"),
    [
        (["--nnodes=2", "10"], {"instances": 2}, r"args\[0\]: '--nnodes=2' is an option of torchrun"),
        (["10", "--nproc-per-node", "2"], {"instances": 2}, r"args\[1\]: '--nproc-per-node' is an option"),
        (["10"], {"instances": 2, "sync": "local_sgd:5"}, r"Config\.sync: 'local_sgd:5' .* remove sync"),
        (["10"], {"instances": 2, "min_instances": 3}, r"min_instances=3 is more than instances=2"),
        # one instance runs `python script`: several processes there would be silently one
        (["10"], {"procs_per_instance": 2}, r"procs_per_instance=2: a script on one instance"),
    ],
)
def test_conflicting_torchrun_settings_are_refused_before_anything_is_written(
    here: Path, args: list[str], overrides: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        spot.run("ddp_train.py", args, **overrides)
    assert JobDB().jobs() == []


def test_torchrun_itself_as_the_script_is_refused(here: Path) -> None:
    (here / "torchrun").write_text("")
    with pytest.raises(ConfigError, match=r"script: 'torchrun' is not a \.py file"):
        spot.run("torchrun", ["--nnodes=2", "ddp_train.py"], instances=2)
    assert JobDB().jobs() == []


def test_what_a_lost_peer_raises_is_told_from_a_bug() -> None:
    """The worker wrapper lets torchrun restart the workers only for a lost peer's errors; any
    other exception fails the job (the texts are the ones gloo and c10d raise)."""
    from torch.distributed import DistNetworkError

    from spotnb.runtime.group.torchrun_worker import is_collective_error

    lost = "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:31439"
    assert is_collective_error(RuntimeError(lost))
    assert is_collective_error(DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed."))
    assert is_collective_error(ConnectionResetError(104, "Connection reset by peer"))
    assert not is_collective_error(ValueError("a bug in the script at step 5"))
    assert not is_collective_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 3x1)"))
    assert not is_collective_error(KeyError("gloo"))


def test_the_rendezvous_is_beside_the_lighthouse() -> None:
    from spotnb.runtime.group.lighthouse import rendezvous_endpoint

    assert rendezvous_endpoint("http://10.0.0.7:29510") == "10.0.0.7:29511"
    assert rendezvous_endpoint("http://[fd00::7]:29510/") == "[fd00::7]:29511"
