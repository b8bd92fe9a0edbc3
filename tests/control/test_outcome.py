"""`spotnb.control.outcome.classify`: how an incarnation ended, from what the controller saw.

Each case is one the controllers meet on a real market: the provider's word on the instance,
the kinds of event its agent wrote, and (Azure) the agent's exit code its boot script reported.
The table decides whether the job relaunches, retries or ends, so it is pinned here without a
market, a store or a clock.
"""

from __future__ import annotations

import pytest

from spotnb.control.outcome import FAILURES, Ending, classify, ending_of_event, reason_of, stalled_run
from spotnb.core import protocol as ev
from spotnb.core.protocol import Outcome
from spotnb.providers.base import InstanceState, InstanceStatus
from spotnb.runtime.agent import EXIT_EVACUATED, EXIT_GAVE_UP, EXIT_USER_ERROR
from spotnb.runtime.group.local import EXIT_GROUP_LOST

EXITED, PREEMPTED, TERMINATED = InstanceState.EXITED, InstanceState.PREEMPTED, InstanceState.TERMINATED


@pytest.mark.parametrize(
    ("state", "code", "kinds", "reason"),
    [
        # the function returned: done, whether the instance exited or the market took it after
        (EXITED, 0, {"ready", "done"}, Outcome.DONE),
        (PREEMPTED, None, {"ready", "done"}, Outcome.DONE),
        # the market took it without a notice, or after one the agent could not act on
        (PREEMPTED, None, {"ready"}, Outcome.PREEMPTED),
        (PREEMPTED, None, {"ready", "notice"}, Outcome.PREEMPTED),
        # it saved and left after a notice, before or after the market's kill
        (PREEMPTED, None, {"ready", "notice", "evacuated"}, Outcome.EVACUATED),
        (EXITED, EXIT_EVACUATED, {"ready", "notice", "evacuated"}, Outcome.EVACUATED),
        # it was asked to move, saved and left: a move, not a preemption ...
        (EXITED, EXIT_EVACUATED, {"ready", "moving", "evacuated"}, Outcome.MOVED),
        # ... unless a notice came first (it was leaving anyway)
        (EXITED, EXIT_EVACUATED, {"ready", "moving", "notice", "evacuated"}, Outcome.EVACUATED),
        # the function raised
        (EXITED, EXIT_USER_ERROR, {"ready", "error"}, Outcome.USER_ERROR),
        # a replacement that gave up waiting for the instance before it ran none of the job
        (EXITED, EXIT_GAVE_UP, set(), Outcome.NOT_NEEDED),
        (EXITED, EXIT_GAVE_UP, {"ready"}, Outcome.CRASHED),  # it had run: a crash, not a no-op
        # a process of its replica group died: the instance is lost to the job
        (EXITED, EXIT_GROUP_LOST, {"ready"}, Outcome.LOST),
        # ended by someone else while the job was not stopping: lost
        (TERMINATED, None, {"ready"}, Outcome.LOST),
        # the process died without a word (the OOM killer, a segfault)
        (EXITED, 137, {"ready"}, Outcome.CRASHED),
        (EXITED, None, set(), Outcome.CRASHED),
    ],
)
def test_classify_table(state: InstanceState, code: int | None, kinds: set[str], reason: Outcome) -> None:
    assert classify(InstanceStatus(state, code), kinds).reason == reason


def test_a_terminated_instance_of_a_job_being_stopped_was_stopped_not_lost() -> None:
    status = InstanceStatus(TERMINATED)
    assert classify(status, {"ready"}, stopping=True).reason == Outcome.STOPPED
    assert classify(status, {"ready"}, stopping=False).reason == Outcome.LOST
    # what the agent said still decides first
    assert classify(status, {"ready", "done"}, stopping=True).reason == Outcome.DONE


def test_a_vm_that_ended_itself_after_its_agent_exited_is_classified_by_the_agent_s_exit() -> None:
    """An Azure VM deallocates itself after its agent exits; its cloud reports an eviction.
    The agent's reported exit decides, except for an agent that left after a notice or that a
    signal ended (128+): those were evicted."""
    evicted = InstanceStatus(PREEMPTED, detail={"azure": ["PowerState/deallocated"]})
    out = classify(evicted, {"ready", "error"}, agent_exit=EXIT_USER_ERROR)
    assert (out.reason, out.code) == (Outcome.USER_ERROR, EXIT_USER_ERROR)
    assert classify(evicted, {"ready"}, agent_exit=0).reason == Outcome.CRASHED
    assert classify(evicted, {"ready"}, agent_exit=143).reason == Outcome.PREEMPTED
    assert classify(evicted, {"ready"}, agent_exit=None).reason == Outcome.PREEMPTED
    evacuated = classify(evicted, {"ready", "notice", "evacuated"}, agent_exit=EXIT_EVACUATED)
    assert evacuated.reason == Outcome.EVACUATED


def test_an_evacuation_says_where_it_left_and_that_it_was_noticed() -> None:
    """The market's kill record wins; without it, the step of the agent's `evacuated`."""
    kinds = {"ready", "notice", "evacuated"}
    own = classify(InstanceStatus(PREEMPTED, detail={"step": 40, "at": 5.0}), kinds, evacuated_step=37)
    assert own.detail == {"step": 40, "at": 5.0, "noticed": True}
    left = classify(InstanceStatus(PREEMPTED), kinds, evacuated_step=37)
    assert left.detail == {"step": 37, "noticed": True}
    exited = classify(InstanceStatus(EXITED, EXIT_EVACUATED), {"ready", "evacuated"}, evacuated_step=12)
    assert exited.detail == {"step": 12, "noticed": False}


def test_a_plain_preemption_keeps_the_provider_s_detail_and_a_crash_names_its_log() -> None:
    detail = {"phase": "training", "step": 9}
    assert classify(InstanceStatus(PREEMPTED, detail=detail), {"ready"}).detail == detail
    crash = classify(InstanceStatus(EXITED, 139), {"ready"}, log="/logs/inc-0002.log")
    assert (crash.reason, crash.code, crash.detail) == (Outcome.CRASHED, 139, {"log": "/logs/inc-0002.log"})


def test_failures_are_the_reasons_that_spend_retries() -> None:
    assert set(FAILURES) == {Outcome.USER_ERROR, Outcome.CRASHED}
    assert not any(r.is_preemption for r in FAILURES)


def test_a_logged_end_reads_back_as_its_predecessor_decided_it() -> None:
    """A controller restart reads the last incarnation's end from the log; a reason it does not
    know (a newer writer's) counts as a preemption or a crash."""
    pre = ending_of_event(ev.Preempted(instance_id="i", lifetime_s=60.0, how=Outcome.EVACUATED))
    assert pre.reason == Outcome.EVACUATED
    exited = ending_of_event(ev.Exited(instance_id="i", reason=Outcome.USER_ERROR, code=1))
    assert (exited.reason, exited.code) == (Outcome.USER_ERROR, 1)
    assert reason_of("teleported", Outcome.CRASHED) == Outcome.CRASHED
    assert reason_of(Outcome.DONE, Outcome.CRASHED) == Outcome.DONE
    assert isinstance(pre, Ending)


def test_a_stalled_run_counts_the_instances_since_the_last_that_committed_a_checkpoint() -> None:
    """Incarnations that never got an instance do not count; one that saved ends the run."""
    from types import SimpleNamespace

    def inc(*kinds: str) -> SimpleNamespace:
        return SimpleNamespace(kinds=set(kinds))

    incs = {
        1: inc("allocated", "checkpoint"),
        2: inc("allocated"),
        3: inc("allocating"),  # refused everywhere: no instance ran
        4: inc("allocated"),
        5: inc("allocated"),
    }
    assert stalled_run(incs, 5) == 3
    assert stalled_run(incs, 4) == 2
    assert stalled_run(incs, 1) == 0
    assert stalled_run({}, 3) == 0
