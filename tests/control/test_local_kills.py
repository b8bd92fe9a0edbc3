"""The local market's kills and its zygote under attack: every kill the market makes is
reported as a preemption, however the threads and processes interleave, and a zygote that
dies or stops never costs a job an instance, a preemption or a leaked process.

Real processes, really killed; where an interleaving must be forced, the test holds one of the
market's own threads at the point where the race lies (said so at that spot), and releases it
on an event, never after a sleep."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import spotnb as spot
from spotnb.providers.base import InstanceState, LaunchSpec
from spotnb.providers.local import injector as injector_mod
from spotnb.providers.local.provider import LocalProvider
from spotnb.providers.local.zygote import Forked, Zygote, _stat

pytestmark = pytest.mark.jobs


def _spec(command: list[str], n: int = 1) -> LaunchSpec:
    return LaunchSpec(
        job_id="20261126-000000-abcdef",
        incarnation=n,
        store_url="file:///nowhere",
        instance_type="g4dn.xlarge",
        region=None,
        command=command,
        job_key="00" * 32,
    )


def test_an_instance_dying_before_its_kill_is_recorded_still_reads_as_preempted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The injector signals the group, then writes down the kill; the controller's look in
    between, at a process already dead (an orphan of a dead zygote or a cold instance: their
    end shows at once), must see a preemption, not an instance that exited by itself (a lost
    preemption: a crash retried, a cost and a time not accounted for)."""
    seen_dead = threading.Event()
    real_kill = injector_mod.Kill

    def late_record(*args, **kwargs):  # the injector thread, between killpg and its record:
        seen_dead.wait(30)  # held until the controller's look has found the process gone
        return real_kill(*args, **kwargs)

    monkeypatch.setattr(injector_mod, "Kill", late_record)
    provider = LocalProvider(spot.Config(local_schedule=[0.2], local_alloc_delay=0))
    try:
        instance = provider.launch(_spec([sys.executable, "-c", "import time; time.sleep(120)"]))
        proc = provider._procs[instance.id]
        real_poll = proc.poll

        def watched_poll():
            code = real_poll()
            if code is not None and threading.current_thread() is threading.main_thread():
                seen_dead.set()
            return code

        proc.poll = watched_poll  # type: ignore[method-assign]
        while (status := provider.describe(instance)).state == InstanceState.RUNNING:
            proc.wait(timeout=60)  # the kill ends it; the next look sees it ended
        assert status.state == InstanceState.PREEMPTED, status
        assert seen_dead.is_set()  # the race was really run
    finally:
        provider.close()


_HOOK = """\
import os, signal, time

_fork = os.fork
MODE = ""


def _until(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)  # a file another process makes, not a race waited out


def fork():
    \"\"\"The zygote's fork, recorded. MODE "child_first": the zygote stops once its child has
    claimed the request; "market_first": it stops at once, and its child waits for the market's
    claim; "": it does not stop.\"\"\"
    pid = _fork()
    if pid:
        if MODE == "child_first":
            _until(os.environ["CLAIM"])
        if MODE:
            os.kill(os.getpid(), int(os.environ.get("ZYGOTE_SIGNAL", signal.SIGSTOP)))
    else:
        with open(os.environ["FORKED_PIDS"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        if MODE == "market_first":
            _until(os.environ["CLAIM"])
    return pid


os.fork = fork
if MODE == "at_start":  # before its imports: it never becomes ready
    os.kill(os.getpid(), signal.SIGSTOP)
"""


def _zygote(tmp_path: Path, mode: str, sig: int = signal.SIGSTOP) -> Zygote:
    """A real zygote with `_HOOK` as its sitecustomize: the fault (`sig`), injected in it."""
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(_HOOK.replace('MODE = ""', f"MODE = {mode!r}"))
    env = dict(os.environ, FORKED_PIDS=str(tmp_path / "forked"), CLAIM=str(tmp_path / "claim"))
    env["ZYGOTE_SIGNAL"] = str(int(sig))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "hook"), env.get("PYTHONPATH", "")])
    zygote = Zygote(env, "20261126-000000-abcdef", str(tmp_path / "zygote.log"))
    if mode != "at_start":
        assert zygote.wait_ready(), (tmp_path / "zygote.log").read_text()
    return zygote


def _spawn(zygote: Zygote, tmp_path: Path, claim: str = "claim") -> Forked | None:
    log = str(tmp_path / "instance.log")
    return zygote.spawn(["--help"], dict(zygote.env), log, str(tmp_path / claim))


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 60
    while _stat(pid)[0] not in ("", "Z", "X") and time.monotonic() < deadline:
        time.sleep(0.01)  # the process's end, polled from /proc
    return _stat(pid)[0] in ("", "Z", "X")


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_zygote_stopped_or_killed_between_its_fork_and_its_answer_leaves_no_unknown_instance(
    tmp_path: Path, sig: int
) -> None:
    """The child it forked is the market's instance (adopted: its pid, its end), not a process
    left running beside the cold instance the market would start instead; the zygote is
    ended (a stopped one, by the market) and serves no more."""
    zygote = _zygote(tmp_path, "child_first", sig)
    try:
        child = _spawn(zygote, tmp_path)
        forked = [int(p) for p in (tmp_path / "forked").read_text().split()]
        assert child is not None and forked == [child.pid]
        assert child.wait(timeout=60) is not None  # its end is seen although its parent is gone
        assert "spotnb-agent" in (tmp_path / "instance.log").read_text()  # it ran `agent --help`
        assert zygote.proc.wait(timeout=30) is not None
        assert _spawn(zygote, tmp_path, "claim2") is None
    finally:
        zygote.close()


def test_a_child_the_market_gave_up_on_runs_nothing(tmp_path: Path) -> None:
    """Forked, but claimed by the market first (it started the instance cold): the child ends
    before it becomes an instance (no log, no agent: never two instances for one request)."""
    zygote = _zygote(tmp_path, "market_first")
    try:
        assert _spawn(zygote, tmp_path) is None
        assert (tmp_path / "claim").read_text() == "market"
        (pid,) = (int(p) for p in (tmp_path / "forked").read_text().split())
        assert _gone(pid)
        assert not (tmp_path / "instance.log").exists()
    finally:
        zygote.close()


def test_a_zygote_stopped_before_it_reads_a_request_never_forks_it_later(tmp_path: Path) -> None:
    """No answer, no child: the market starts the instance cold, and the zygote, ended, cannot
    fork the request later (two instances for one)."""
    zygote = _zygote(tmp_path, "")
    os.kill(zygote.proc.pid, signal.SIGSTOP)
    try:
        assert _spawn(zygote, tmp_path) is None
        assert (tmp_path / "claim").read_text() == "market"
        assert zygote.proc.wait(timeout=30) is not None
        assert not (tmp_path / "forked").exists()  # the hook records every fork
    finally:
        zygote.close()


def test_a_zygote_stopped_before_it_is_ready_means_cold_starts_at_once(tmp_path: Path) -> None:
    """Not the ready timeout's two minutes per instance: a stopped zygote is seen, and ended."""
    zygote = _zygote(tmp_path, "at_start")
    try:
        assert _spawn(zygote, tmp_path) is None
        assert zygote.proc.wait(timeout=30) is not None
        assert not (tmp_path / "claim").exists()  # nothing was asked of it
    finally:
        zygote.close()


def test_a_step_kill_that_never_lands_is_said_so(caplog: pytest.LogCaptureFixture) -> None:
    """A kill scheduled at a step the instance never showed the market (it ended first) did not
    happen: the market says so, instead of a job that silently ran without its preemption."""
    provider = LocalProvider(spot.Config(local_schedule=[{"step": 20}], local_alloc_delay=0))
    code = "import os; from spotnb.runtime import beacon as b; "
    code += "b.Beacon(os.environ['SPOTNB_BEACON']).set_step(5)"  # shows step 5, then ends
    try:
        instance = provider.launch(_spec([sys.executable, "-c", code]))
        provider._procs[instance.id].wait(timeout=60)
        provider._injectors[instance.id]._thread.join(timeout=60)
        assert provider.describe(instance).state == InstanceState.EXITED
    finally:
        provider.close()
    said = [r.getMessage() for r in caplog.records if "never landed" in r.getMessage()]
    assert said and "ended at step 5" in said[0], said
