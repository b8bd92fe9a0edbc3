"""Hostile runs of a script on several instances (`spot.run(script, config=Config(instances=2))`):
real agents on the local market, real torchrun and gloo workers, nothing mocked. Each test is
an attack that found a defect (or guards against one): a script whose own setup can never
work must fail the job once instead of feeding torchrun's restart loop; the job key never
reaches a worker's environment or command line; nothing of the job is left running or lying
in the temporary folder once it is done.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import psutil
import pytest

import spotnb as spot
from spotnb.core.signing import load_key
from tests.support.jobs import wait_for
from tests.support.paths import SCRIPTS

pytestmark = [pytest.mark.jobs, pytest.mark.elastic]

pytest.importorskip("torchft", reason="spotnb[elastic] is installed by scripts/setup.sh")

# every rank writes its pid, then waits for the test's "go" file (so the test can look at the
# running processes), and rank 0 sets the arguments it got as the result
PROBE = """
import os, sys, time
import torch.distributed as dist
import spotnb

ctx = spotnb.ctx()
dist.init_process_group("gloo")
rank = dist.get_rank()
with open(f"pid-{rank}.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(f"pid-{rank}.tmp", f"pid-{rank}")
while not os.path.exists("go"):
    time.sleep(0.05)
dist.barrier()
ctx.set_result({"argv": sys.argv[1:], "world": dist.get_world_size()})
dist.destroy_process_group()
"""

# a script written for GPUs run on CPU instances: its own init can never succeed
NCCL = """
import torch.distributed as dist
import spotnb

spotnb.ctx()
dist.init_process_group("nccl")
"""


# the script's own data server is down: ConnectionRefusedError, every round, before any step
REFUSED = """
import socket
import torch.distributed as dist
import spotnb

ctx = spotnb.ctx()
dist.init_process_group("gloo")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
socket.create_connection(("127.0.0.1", port))  # nothing listens there
for step in ctx.steps(10):
    pass
"""


def _by(job: spot.Job, kind: str) -> list[dict]:
    return [e for e in job.events if e["kind"] == kind]


def test_a_backend_this_instance_lacks_fails_the_job_once_not_a_restart_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script asks for NCCL on CPU instances: torch raises "Distributed package doesn't
    have NCCL built in", which names NCCL but is no lost peer. The job fails with it at once;
    torchrun does not start the script again (it would, up to its generous restart limit)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nccl_train.py").write_text(NCCL)
    job = spot.run("nccl_train.py", [], spot.Config(instances=2, local_alloc_delay=0.1), detach=False)
    with pytest.raises(spot.JobFailed, match=r"NCCL built in"):
        job.result(timeout=40)
    errors = _by(job, "error")  # both instances' workers fail alike: one or two say so
    assert errors and all(e["exc_type"] == "RuntimeError" and "on rank" in e["message"] for e in errors)
    assert len(_by(job, "allocated")) == 2  # nothing relaunched


def test_rounds_that_never_reach_a_step_end_the_job_with_the_error_not_an_endless_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's own connection fails in every round before its first step (its data
    server is down): a ConnectionRefusedError looks like a lost peer, so torchrun starts a new
    round each time. After `SPOTNB_STUCK_ROUNDS` rounds in a row without a step or a
    checkpoint the job fails, saying so, with the script's error: not 1000 rounds per
    torchrun, started again 5 times."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPOTNB_STUCK_ROUNDS", "3")
    (tmp_path / "refused.py").write_text(REFUSED)
    job = spot.run("refused.py", [], spot.Config(instances=2, local_alloc_delay=0.1), detach=False)
    with pytest.raises(spot.JobFailed, match=r"3 rendezvous rounds in a row"):
        job.result(timeout=40)
    error = _by(job, "error")[0]  # each instance may say so
    assert "ConnectionRefusedError" in error["traceback"]
    assert len(_by(job, "allocated")) == 2  # nothing relaunched


def _processes_with(needle: bytes) -> list[int]:
    """Pids whose environment or command line holds `needle` (those this user can read)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        for what in ("environ", "cmdline"):
            try:
                with open(f"/proc/{name}/{what}", "rb") as f:
                    if needle in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def _lineage(proc: psutil.Process) -> set[int]:
    """`proc` and its ancestors up to (not including) this test's process: the worker, its
    torchrun, its agent."""
    found = set()
    while proc is not None and proc.pid not in (os.getpid(), 1):
        found.add(proc.pid)
        proc = proc.parent()
    return found


def test_no_key_reaches_the_workers_and_nothing_is_left_once_the_job_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the workers run, the job key is in no process's environment or command line
    (agents, torchrun, workers) nor in the instance logs; the script gets its arguments as
    given; once the job is done no process of it is left, and no file of its rendezvous rounds
    in the temporary folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "probe.py").write_text(PROBE)
    args = ["a b", "--", "-x", "=1"]
    job = spot.run("probe.py", args, spot.Config(instances=2, local_alloc_delay=0.1), detach=False)
    wait_for(lambda: (tmp_path / "pid-0").exists() and (tmp_path / "pid-1").exists(), 60, "no workers")
    workers = [psutil.Process(int((tmp_path / f"pid-{r}").read_text())) for r in (0, 1)]
    ours = {p for w in workers for p in _lineage(w)}
    key = load_key(job.id)
    assert key is not None
    assert not (set(_processes_with(key.hex().encode())) | set(_processes_with(key))) & ours
    assert not _processes_with(key.hex().encode())
    (tmp_path / "go").write_text("")
    result = job.result(timeout=40)
    assert result == {"argv": args, "world": 2}
    wait_for(lambda: not any(psutil.pid_exists(p) for p in ours), 30, f"leftover processes {ours}")
    assert not [n for n in os.listdir(tempfile.gettempdir()) if job.id in n]
    from spotnb.core.home import spotnb_home

    logs = "".join(p.read_text(errors="replace") for p in (spotnb_home() / "logs" / job.id).glob("*.log"))
    assert "round" in logs and key.hex() not in logs  # the instance logs never print the key


def _worker(job_id: str, rank: int) -> int | None:
    """The pid of the job's torchrun worker of global rank `rank` (from its environment)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if b"spotnb.runtime.group.torchrun_worker" not in f.read():
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"SPOTNB_JOB_ID={job_id}".encode() in env and f"RANK={rank}".encode() in env:
            return int(name)
    return None


@pytest.mark.parametrize("who", ["worker", "torchrun"])
def test_a_frozen_worker_is_given_up_and_the_group_goes_on_from_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, who: str
) -> None:
    """Rank 1's worker (or the torchrun that runs it) is stopped (SIGSTOP, never continued)
    mid-run: its peers would wait in their all-reduce for the script's whole collective
    timeout (30 min by default). Its agent gives it up after `SPOTNB_GROUP_STOP_GRACE`
    (SIGKILL), a new round starts (with torchrun started again), and the job ends with a calm
    run's weights."""
    import shutil

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPOTNB_GROUP_STOP_GRACE", "1")
    shutil.copy(SCRIPTS / "ddp_train.py", tmp_path / "ddp_train.py")
    steps = 60
    job = spot.run(
        "ddp_train.py",
        [str(steps), "ckpt", "5", "0.05"],
        spot.Config(instances=2, local_alloc_delay=0.1),
        detach=False,
    )
    wait_for(lambda: any(c["step"] >= 5 for c in _by(job, "checkpoint")), 60, "no checkpoint of step 5")
    pid = _worker(job.id, 1)
    assert pid is not None
    if who == "torchrun":
        pid = psutil.Process(pid).ppid()
        assert b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
    os.kill(pid, signal.SIGSTOP)
    result = job.result(timeout=40)
    expected = [sum((s % 7) + i + 1 for s in range(steps)) / 8 for i in range(8)]
    assert result["weights"] == expected and result["agree"]
    assert any("stopped" in w["message"] for w in _by(job, "warning"))


WAIT = """
import os, time
import spotnb

spotnb.ctx()
with open("pid.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace("pid.tmp", "pid")
while not os.path.exists("go"):
    time.sleep(0.05)
"""


def test_a_stopped_script_job_leaves_no_scratch_folder_once_another_script_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Job.stop` SIGKILLs the instance's process group: its agent cannot remove the folder
    of the script's socket and files. The next script started on the machine removes such
    folders of dead agents, so /tmp does not fill with one per stopped or preempted job."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wait.py").write_text(WAIT)
    job = spot.run("wait.py", [], spot.Config(local_alloc_delay=0.1), detach=False)
    wait_for(lambda: (tmp_path / "pid").exists(), 30, "the script did not start")
    env = Path(f"/proc/{(tmp_path / 'pid').read_text()}/environ").read_bytes().split(b"\0")
    (sock,) = [v.split(b"=", 1)[1].decode() for v in env if v.startswith(b"SPOTNB_CTX_SOCKET=")]
    scratch = os.path.dirname(sock)
    assert os.path.isdir(scratch)
    job.stop(timeout=30)
    (tmp_path / "go").write_text("")
    again = spot.run("wait.py", [], spot.Config(local_alloc_delay=0.1), detach=False)
    assert again.result(timeout=30) is None
    assert not os.path.exists(scratch)
