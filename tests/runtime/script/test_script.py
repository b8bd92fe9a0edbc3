"""`spot.run("train.py", args=[...])` and `spotnb run`: an existing training script gets what a
function gets. On the local market (real processes, really killed): a script that keeps its own
checkpoint folder is preempted, gets SIGTERM and the notice file, saves, is relaunched, resumes
and ends with a calm run's result; a failing script fails the job through the CLI. In this
process: the agent's real ScriptRunner and Context on a real store, with real child processes
and signals, for how each kind of ending is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

import spotnb as spot
from spotnb.control.jobdb import JobDB
from spotnb.core.spec import ScriptSpec
from spotnb.core.store import Store
from spotnb.errors import ConfigError
from spotnb.policy import resolve_policy
from spotnb.runtime.beacon import Beacon
from spotnb.runtime.checkpoint.checkpointer import Checkpointer
from spotnb.runtime.context import Context, Evacuate
from spotnb.runtime.notice import Notice
from spotnb.runtime.script.runner import ScriptFailed, ScriptRunner
from tests.support.jobs import wait_for
from tests.support.paths import SCRIPTS

pytestmark = pytest.mark.jobs

SCRIPTS = SCRIPTS


def _by(job: spot.Job, kind: str, incarnation: int | None = None) -> list[dict]:
    return [e for e in job.events if e["kind"] == kind and incarnation in (None, e["incarnation"])]


# -- on the local market -------------------------------------------------------------------------
def test_a_preempted_script_resumes_from_its_backup_and_ends_like_a_calm_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notice comes at step 30: the script gets SIGTERM after the notice file appeared,
    saves `ckpt/`, backs it up (the emergency checkpoint) and is ended; the next instance gets
    `ckpt/` back before the script starts, the script resumes from its own file, and the total
    equals that of the same script run plainly, without spotnb."""
    monkeypatch.chdir(tmp_path)
    script = SCRIPTS / "resumable.py"  # outside the working directory: shipped to its top
    calm = subprocess.run(
        [sys.executable, str(script), "60", "calm"], capture_output=True, text=True, check=True
    )
    config = spot.Config(
        local_grace=10.0, notice_poll=0.1, local_alloc_delay=0, local_schedule=[{"step": 30, "notice": True}]
    )
    job = spot.run(str(script), ["60", "ckpt"], config)
    result = job.result(timeout=120)
    assert {k: result[k] for k in ("total", "steps")} == json.loads(calm.stdout)
    (notice,) = _by(job, "notice", 1)
    (got,) = result["notices"]  # what the script's SIGTERM handler read from the notice file
    assert got["step"] >= 30 and 0 < got["time_left"] <= 10.0
    (emergency,) = [e for e in _by(job, "checkpoint", 1) if e["save_kind"] == "emergency"]
    assert emergency["t"] < notice["deadline"]
    (preempted,) = _by(job, "preempted", 1)
    assert preempted["how"] == "evacuated"
    (evacuated,) = _by(job, "evacuated", 1)  # the step it left at, not None (drawn at step 0)
    assert preempted["step"] == evacuated["step"] and preempted["noticed"] is True
    (resumed,) = _by(job, "resumed", 2)
    assert resumed["save_kind"] == "emergency"
    assert result["resumed_from"] == got["step"]  # from the emergency save, nothing redone
    assert job.metrics["loss"] and job.name == "resumable.py"
    assert (tmp_path / "resumable.py").read_bytes() == script.read_bytes()  # what was shipped


def test_the_cli_runs_a_script_follows_it_and_fails_with_its_error(tmp_path: Path) -> None:
    """`spotnb run failing.py -- args`: the arguments arrive as given (a `--` among them), the
    job fails with the script's exception, not a relaunch, and the command exits 1 after
    printing the job's events and the script's traceback."""
    (tmp_path / "failing.py").write_bytes((SCRIPTS / "failing.py").read_bytes())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spotnb.cli",
            "run",
            "failing.py",
            "--set",
            "local_alloc_delay=0",
            "--",
            "--lr",
            "two words",
            "--",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    wanted = "ValueError: bad arguments ['--lr', 'two words', '--']"
    assert wanted in done.stderr and "Traceback" in done.stderr, done.stderr
    assert "failed" in done.stdout.splitlines()[-1], done.stdout
    (row,) = JobDB().jobs()
    job = spot.attach(row["id"])
    (error,) = _by(job, "error")
    assert error["exc_type"] == "ValueError" and wanted in error["message"]
    assert "starting" not in error["traceback"]  # stdout is the instance log's, not the error's
    assert len(_by(job, "allocated")) == 1  # a failure is not relaunched (max_retries=0)
    with pytest.raises(spot.JobFailed, match="bad arguments"):
        job.result(timeout=10)
    with pytest.raises(ConfigError, match="runs the script 'failing.py'; resume it without fn"):
        spot.resume(job.id, fn=lambda ctx: None)


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("script", "args", "overrides", "message"),
    [
        ("nope.py", None, {}, r"script: 'nope.py' does not exist"),
        ("train.txt", None, {}, r"script: 'train.txt' is not a \.py file"),
        ("folder", None, {}, r"script: 'folder' is a folder"),
        ("train.py", "--lr 0.1", {}, r"args: expected a list of str, got the string .*shlex\.split"),
        ("train.py", ["--epochs", 3], {}, r"args\[1\]: expected a str, got int 3"),
        ("train.py", ["--nnodes=2"], {"instances": 2}, r"args\[0\]: '--nnodes=2' is an option of torchrun"),
        ("train.py", None, {"files": ["missing.csv"]}, r"Config\.files\[0\]: 'missing\.csv' does not exist"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, args: object, overrides: dict, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "train.txt").write_text("")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match=message):
        spot.run(script, args, **overrides)  # type: ignore[arg-type]
    assert JobDB().jobs() == []


def test_spotnb_ctx_outside_a_job_says_where_it_works() -> None:
    with pytest.raises(spot.SpotnbError, match=r"only available inside a spotnb job.*spot\.run"):
        spot.ctx()


# -- the agent's runner, in this process -------------------------------------------------------
class Events(list):
    def __call__(self, event) -> None:
        self.append((event.kind, event.to_json()))

    def kinds(self) -> list[str]:
        return [k for k, _ in self]


@pytest.fixture
def runner(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A real Context and Checkpointer on a real store, and a ScriptRunner for a script."""
    monkeypatch.chdir(tmp_path)
    events = Events()
    ckpt = Checkpointer(Store(store_url), "job", 1, events, Beacon(None), keep_last=2)
    ctx = Context(
        job_id="job",
        incarnation=1,
        checkpointer=ckpt,
        policy=resolve_policy("static:1000"),
        emit=events,
        flush=lambda: None,
        beacon=Beacon(None),
        market={"mttp": 3600.0, "restart": 60.0, "grace": 30.0},
    )

    def make(name: str, *args: str) -> ScriptRunner:
        return ScriptRunner(
            ctx, ScriptSpec(path=str(SCRIPTS / name), args=list(args)), events, job_id="job", incarnation=1
        )

    yield make, ctx, events
    ckpt.close()


def test_the_script_s_ctx_calls_reach_the_context_with_their_errors(runner) -> None:
    make, ctx, events = runner
    result = cloudpickle.loads(make("api.py", "result").run().pickled)
    assert result["argv"] == ["result"] and result["step"] == 0
    errors = result["errors"]
    assert errors["backup"].startswith("FileNotFoundError: ctx.backup('no/such/folder')")
    assert errors["log"].startswith("ValueError: ctx.log(step=...)")
    assert errors["track"].startswith("AttributeError: ctx.track() is not available in a script")
    assert "no attribute 'no_such_method'" in errors["missing"]
    assert [(r["loss"], r["ready"]) for r in ctx.rows] == [(0.5, 1)]
    assert "ready" in events.kinds()


def test_a_script_is_ready_at_its_first_step_so_its_start_up_is_preparation(runner) -> None:
    """`ready` means the first step is about to run (as for a function): a script's start-up
    (its interpreter, `import torch`, its own checkpoint loaded) comes before it, so the ledger
    counts it as preparation, not as training time that no step accounts for ("other")."""
    make, ctx, events = runner
    result = cloudpickle.loads(make("slow_start.py", "0.5").run().pickled)
    (ready,) = [f for k, f in events if k == "ready"]
    assert ctx._started + ready["prep_s"] >= result["first_step"]


def test_a_script_that_never_reaches_spotnb_is_said_ready_after_a_while(
    runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that never calls spotnb.ctx() marks no step: it is said ready (the job reads
    running) once it has run `PLAIN_READY_S` without reaching spotnb, not never."""
    import spotnb.runtime.script.runner as script_mod

    monkeypatch.setattr(script_mod, "PLAIN_READY_S", 0.3)
    make, ctx, events = runner
    make("no_ctx.py", "1.5").run()
    (ready,) = [f for k, f in events if k == "ready"]
    assert 0.3 <= ready["prep_s"] < 1.5


@pytest.mark.parametrize(
    ("how", "expected"),
    [("exit0", None), ("sigkill", "api.py was killed by SIGKILL")],
)
def test_how_a_script_s_exit_is_read(runner, how: str, expected: str | None) -> None:
    """`os._exit(0)` is success (the result is None); a kill without a notice (the OOM killer)
    is a failure that says which signal."""
    make, _, _ = runner
    if expected is None:
        assert cloudpickle.loads(make("api.py", how).run().pickled) is None
    else:
        with pytest.raises(ScriptFailed, match=expected):
            make("api.py", how).run()


def test_a_script_without_a_sigterm_handler_that_uses_ctx_is_not_signalled(runner, tmp_path: Path) -> None:
    """SIGTERM would kill it before it saves: it hears of the notice from ctx.should_save() at
    its next step, and its backup then is the emergency checkpoint, after which it is ended."""
    make, ctx, events = runner
    script = make("polls.py", "out")

    def notice_once_it_runs() -> None:
        wait_for(lambda: len(ctx.rows) > 0, 60, "the script never logged")
        ctx._receive_notice(Notice(deadline=time.time() + 30, source="aws", action="terminate"))

    threading.Thread(target=notice_once_it_runs, daemon=True).start()
    with pytest.raises(Evacuate):
        script.run()
    assert not script.signalled
    kinds = events.kinds()
    assert kinds.index("evacuating") < kinds.index("checkpoint") < kinds.index("evacuated")
    (ckpt,) = [f for k, f in events if k == "checkpoint"]
    assert ckpt["save_kind"] == "emergency"
    assert int((tmp_path / "out" / "state.txt").read_text()) == ckpt["step"]


def test_a_plain_script_killed_by_the_notice_s_sigterm_is_preempted_not_failed(runner) -> None:
    """No handler, no ctx: SIGTERM ends it, as SLURM's would. That is a preemption: the
    instance is reported evacuated (here the deadline has passed; before it, the agent waits
    for the market's kill) and the job goes on from its last backup."""
    make, ctx, events = runner
    ctx._receive_notice(Notice(deadline=time.time() - 60, source="gcp", action="TERMINATE"))
    script = make("plain.py")
    with pytest.raises(Evacuate):
        script.run()
    assert script.signalled
    warning = next(f for k, f in events if k == "warning")
    assert "after the preemption notice (exit code -15)" in warning["message"]
    assert events.kinds()[-1] == "evacuated"
    assert os.environ.get("SPOTNB_CTX_SOCKET") is None  # the runner's plumbing is the child's only


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X")  # a zombie no one reaps
    except FileNotFoundError:
        return True


def test_the_script_dies_with_its_agent() -> None:
    """A script whose agent died (killed alone, crashed) must not train on unseen on a paid
    instance: it is started so that the kernel ends it with its parent."""
    from spotnb.runtime.script.runner import _BOOT

    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid()), sys.argv[2]])\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(600)\n",
            _BOOT,
            str(SCRIPTS / "plain.py"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert agent.stdout is not None
    script = int(agent.stdout.readline())
    assert agent.stdout.readline().strip() == "started"  # the script itself runs (after exec)
    agent.kill()
    agent.wait()
    wait_for(lambda: _dead(script), 30, "the script outlived its agent")


def test_a_handler_installed_after_the_notice_still_gets_its_sigterm(runner, tmp_path: Path) -> None:
    """The notice file appears first (with the deadline); the script, which uses ctx and had no
    handler yet, installs one on seeing it, and is signalled then."""
    make, ctx, events = runner
    script = make("late_handler.py", "out")
    deadline = time.time() + 30

    def notice_once_it_runs() -> None:
        wait_for(lambda: len(ctx.rows) > 0, 60, "the script never logged")
        ctx._receive_notice(Notice(deadline=deadline, source="azure", action="Preempt"))

    threading.Thread(target=notice_once_it_runs, daemon=True).start()
    with pytest.raises(Evacuate):
        script.run()
    assert script.signalled
    seen = json.loads((tmp_path / "out" / "notice.json").read_text())
    assert seen["deadline"] == deadline and seen["source"] == "azure" and 0 < seen["time_left"] <= 30
    assert [f["save_kind"] for k, f in events if k == "checkpoint"] == ["emergency"]


def test_a_chatty_scripts_instance_log_is_capped_and_ends_with_its_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spotnb_home: Path
) -> None:
    """300 MB of a script's stdout made a 310 MB instance log (issue #29 item 9): its stdout
    now reaches the log through the agent, which rotates it past half of SPOTNB_LOG_MAX (here
    1 MB; 50 MB by default) into `<log>.1`. The log's path, the one events name, ends with the
    script's last lines, from both streams."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPOTNB_LOG_MAX", "1000000")
    job = spot.run(str(SCRIPTS / "chatty.py"), ["5"], spot.Config(local_alloc_delay=0))
    job.result(timeout=120)
    (log,) = (spotnb_home / "logs" / job.id).glob("0001-*.log")
    older = log.with_name(log.name + ".1")
    newest = log.read_text()
    assert log.stat().st_size + older.stat().st_size < 1_000_000 + 2 * 256 * 1024  # 5 MB printed
    assert newest.startswith("[spotnb ") and f"{log.name}.1" in newest.splitlines()[0]
    assert "the last line: " in newest and "stderr's last line" in newest
