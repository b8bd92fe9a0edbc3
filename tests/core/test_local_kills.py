"""The local market's kills and its zygote under attack: every kill the market makes is
reported as a preemption, however the threads and processes interleave, and a zygote that
dies or stops never costs a job an instance, a preemption or a leaked process.

Real processes, really killed; where an interleaving must be forced, the test holds one of the
market's own threads at the point where the race lies (said so at that spot), and releases it
on an event, never after a sleep."""

from __future__ import annotations

import sys
import threading

import pytest

import spotnb as spot
from spotnb.providers.base import InstanceState, LaunchSpec
from spotnb.providers.local import LocalProvider
from spotnb.providers.local import injector as injector_mod


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
