"""Attacks on `spot.run` scripts (issue 13): a script that ignores the notice's SIGTERM, leaves
processes behind, floods its pipes or sends the agent garbage. The agent's real ScriptRunner
and Context on a real store, with real child processes and signals (the runner fixture of
test_script.py)."""

from __future__ import annotations

import time
from pathlib import Path

import cloudpickle
import pytest

from spotnb.runtime.context import Evacuate
from spotnb.runtime.notice import Notice
from spotnb.runtime.script.runner import ScriptFailed
from tests.runtime.script import test_script
from tests.support.jobs import wait_for

pytestmark = pytest.mark.jobs

runner = test_script.runner  # the agent's real ScriptRunner and Context on a real store


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how", ["ignore", "stop"])
def test_a_script_that_ignores_sigterm_is_killed_at_the_deadline_and_preempted(
    runner, monkeypatch, how
) -> None:
    """A notice whose deadline passes without the instance ending (a market that is late): the
    script that ignored its SIGTERM must not train on past it, unseen by the policy; it is
    killed and the instance reported evacuated, so that the job goes on elsewhere."""
    import spotnb.runtime.script.runner as script_mod

    monkeypatch.setattr(script_mod, "PAST_DEADLINE_S", 0.5)
    make, ctx, events = runner
    ctx._receive_notice(Notice(deadline=time.time() + 1, source="gcp", action="TERMINATE"))
    script = make("hostile.py", how)
    with pytest.raises(Evacuate):
        script.run()
    assert script.signalled
    assert events.kinds()[-1] == "evacuated"


def test_a_script_s_leftover_processes_end_with_it(runner, tmp_path: Path) -> None:
    """A process the script started and did not wait for (a data loader's worker, a logger)
    is ended when the script exits: nothing of the job runs on after it."""
    make, _, _ = runner
    pidfile = tmp_path / "child.pid"
    assert cloudpickle.loads(make("hostile.py", "orphan", str(pidfile)).run().pickled) is None
    pid = int(pidfile.read_text())
    wait_for(lambda: not _alive(pid), 30, "the script's child outlived the script")


def test_the_job_key_is_not_in_the_script_s_environment(runner, monkeypatch) -> None:
    """Even where the agent's environment still held it, the script does not inherit it."""
    monkeypatch.setenv("SPOTNB_JOB_KEY", "00" * 32)
    make, _, _ = runner
    seen = cloudpickle.loads(make("hostile.py", "environ").run().pickled)
    assert seen["env"] is False


def test_garbage_on_the_ctx_socket_gets_errors_and_the_agent_serves_on(runner) -> None:
    """Lines that are not JSON, not an object or a call with bad arguments get an error reply
    on the same connection; NaN, a 10 MB string, 2000 calls in a row, a call from a thread and
    one from a forked child are served, and the agent's Context holds their rows."""
    make, ctx, _ = runner
    errors = cloudpickle.loads(make("hostile.py", "garbage").run().pickled)
    assert errors["not json"]["error"]["type"] == "JSONDecodeError"
    assert errors["[1, 2]"]["error"]["type"] == "AttributeError"
    assert "must be a mapping" in errors['{"op": "call", "name": "log", "kwargs": [1]}']["error"]["message"]
    assert errors["nan"] is None and errors["huge"] is None  # the agent's flush turns them into gaps/text
    assert errors["fork_exit"] == 0  # a forked child's ctx.log opens its own connection
    names = {k for row in ctx.rows for k in row}
    assert {"flood", "thread", "forked"} <= names


def test_a_script_flooding_stdout_and_stderr_does_not_block(runner) -> None:
    make, _, _ = runner
    with pytest.raises(ScriptFailed, match="exited with code 2: the end") as err:
        make("hostile.py", "flood").run()
    assert len(err.value.tail) <= 16 * 1024 + 65537


STUBBORN = """
import os, signal, sys, time
import spotnb

if os.environ["SPOTNB_INCARNATION"] == "1":  # hears the notice's SIGTERM, ignores it, trains on
    signal.signal(signal.SIGTERM, lambda signum, frame: print("ignored", flush=True))
    while True:
        with spotnb.ctx().step():
            time.sleep(0.05)
with open(f"/proc/{os.getppid()}/environ", "rb") as f:
    parent = f.read()
entries = [e.decode() for e in parent.split(b"\\0") if e.startswith(b"SPOTNB_JOB_KEY=")]
spotnb.ctx().set_result({"argv": sys.argv, "env": "SPOTNB_JOB_KEY" in os.environ, "parent": entries})
"""


def test_on_the_market_a_stubborn_script_with_an_odd_name_is_preempted_and_relaunched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real processes: the first instance's script ignores the notice's SIGTERM; the market kills
    it at the deadline, which is a preemption (not a failure), and the job is relaunched; the
    second run gets its name (spaces, non-ASCII) and arguments (empty, `--`, non-ASCII) as
    given, and neither it nor its parent's environment holds the job key."""
    import spotnb as spot
    from spotnb.core.home import spotnb_home as spot_home

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my train ü.py").write_text(STUBBORN, encoding="utf-8")
    config = spot.Config(
        local_grace=1.0, notice_poll=0.1, local_alloc_delay=0, local_schedule=[{"step": 2, "notice": True}]
    )
    args = ["", "--", "ü b", "-x"]
    job = spot.run("my train ü.py", args, config)
    result = job.result(timeout=120)
    assert result["argv"][1:] == args and result["argv"][0].endswith("my train ü.py")
    key = (spot_home() / "keys" / f"{job.id}.key").read_text().strip()
    assert result["env"] is False
    assert len(key) >= 64 and not any(key in entry for entry in result["parent"]), result["parent"]
    kinds = [e["kind"] for e in job.events if e["incarnation"] == 1]
    assert "notice" in kinds and "preempted" in kinds and "error" not in kinds


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: script\n"),
        (["nope.py"], "spotnb run: script: 'nope.py' does not exist"),
        (["train.py", "--set", "noequals"], "--set 'noequals': expected FIELD=VALUE"),
        (["train.py", "--set", "local_grace=abc"], "Config.local_grace: invalid duration 'abc'"),
    ],
)
def test_the_cli_refuses_bad_input_before_launching(tmp_path: Path, argv: list[str], message: str) -> None:
    import subprocess
    import sys

    from spotnb.control.jobdb import JobDB

    (tmp_path / "train.py").write_text("print('hi')\n")
    done = subprocess.run(
        [sys.executable, "-m", "spotnb.cli", "run", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert JobDB().jobs() == []
