"""How an incarnation ended, decided from what the controller observed of it.

The controller sees three things of an instance that stopped running: what its provider says
(`InstanceStatus`: exited, preempted, terminated, an exit code), which kinds of event its agent
wrote (`ready`, `notice`, `moving`, `evacuated`, `done`, `error`, …) and, on a cloud whose
VMs end themselves, the exit code its boot script reported for the agent. `classify` turns
them into an `Ending`: the `Outcome` (`spotnb.core.protocol`) the job's next step depends on
(`Outcome.is_preemption`: relaunch; `FAILURES`: retry within `Config.max_retries`; `DONE`:
succeed), its exit code and what the provider knows. It is a pure function (no store, no
provider, no clock), so its table is pinned by unit tests (tests/control/test_outcome.py);
both the one-instance `Controller` and the `FleetController` call it.

The record is called `Ending`, not `Outcome`: `Outcome` is the protocol's enum of reasons,
which `Ending.reason` holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from spotnb.core import protocol as ev
from spotnb.core.protocol import Outcome
from spotnb.providers.base import InstanceState, InstanceStatus

__all__ = ["FAILURES", "Ending", "classify", "ending_of_event", "reason_of", "stalled_run"]

#: the reasons that count against `Config.max_retries` (the others relaunch, or end the job)
FAILURES = (Outcome.USER_ERROR, Outcome.CRASHED)


class Ending:
    """How an incarnation ended (`reason`), its exit code and what the provider knows."""

    def __init__(
        self, reason: Outcome, code: int | None = None, detail: dict[str, Any] | None = None
    ) -> None:
        self.reason, self.code, self.detail = reason, code, detail or {}

    def __repr__(self) -> str:
        return f"Ending({self.reason.value!r}, code={self.code!r}, detail={self.detail!r})"


def reason_of(value: object, default: Outcome) -> Outcome:
    """An Outcome from a logged value (a newer writer's unknown reason counts as `default`)."""
    return value if isinstance(value, Outcome) else default


def ending_of_event(end: Any) -> Ending:
    """The Ending a logged `preempted` or `exited` event records (a controller restart reads
    how the last incarnation ended from the log, as its predecessor decided it)."""
    if isinstance(end, ev.Preempted):
        return Ending(reason_of(end.how, Outcome.PREEMPTED))
    return Ending(reason_of(end.get("reason"), Outcome.CRASHED), end.get("code"))


def _left_at(detail: dict[str, Any], kinds: Set[str], evacuated_step: int | None) -> dict[str, Any]:
    """What the `preempted` event of an instance that left by itself after a notice says:
    the market's own kill record where it has one (`detail`), else the step of the
    instance's `evacuated` and that it was noticed. Without them the event read "step
    None" (drawn at step 0) whenever the instance left before the market's kill, which is
    how a notice usually ends (on a cloud, always: it records no step)."""
    out = dict(detail)
    if out.get("step") is None and evacuated_step is not None:
        out["step"] = evacuated_step
    if out.get("noticed") is None:
        out["noticed"] = "notice" in kinds
    return out


def classify(
    status: InstanceStatus,
    kinds: Set[str],
    *,
    agent_exit: int | None = None,
    stopping: bool = False,
    log: str = "",
    evacuated_step: int | None = None,
) -> Ending:
    """How an incarnation ended: `status` is what its provider says, `kinds` the kinds of
    event it wrote, `agent_exit` the exit code its boot script reported for the agent (None:
    none reported; read only for a preempted status), `stopping` whether the job is being
    stopped, `log` its instance log (named in a crash), `evacuated_step` the step of its
    `evacuated` event, if any."""
    if status.state == InstanceState.PREEMPTED:
        from spotnb.runtime.agent import EXIT_EVACUATED

        if agent_exit is not None and agent_exit != EXIT_EVACUATED and agent_exit < 128:
            # its boot script said the agent exited by itself, then the VM ended itself (an
            # Azure VM deallocates itself: a Stopped one is still billed), which its cloud
            # cannot tell from an eviction: how the agent ended decides, as for an exit. (An
            # agent that left after a notice, or that a signal ended, was evicted.)
            status = InstanceStatus(InstanceState.EXITED, agent_exit, status.detail)
    # saved and left because it was asked to move (a notice first makes it a preemption)
    if "done" not in kinds and {"moving", "evacuated"} <= kinds and "notice" not in kinds:
        return Ending(Outcome.MOVED, status.exit_code)
    from spotnb.runtime.agent import EXIT_GAVE_UP

    if status.exit_code == EXIT_GAVE_UP and not kinds & {"ready", "done", "error"}:
        # a replacement (a move's new instance, above all: a move waits for a step
        # boundary, or a failed move save for the next planned one) that gave up waiting
        # for the instance before it: it ran none of the job; the next one restores
        return Ending(Outcome.NOT_NEEDED, status.exit_code, {"why": "it gave up waiting"})
    if status.state == InstanceState.PREEMPTED:
        if "done" in kinds:
            return Ending(Outcome.DONE, status.exit_code)
        if "evacuated" in kinds:
            return Ending(Outcome.EVACUATED, status.exit_code, _left_at(status.detail, kinds, evacuated_step))
        return Ending(Outcome.PREEMPTED, status.exit_code, status.detail)
    if "done" in kinds:
        return Ending(Outcome.DONE, status.exit_code)
    if "evacuated" in kinds:
        return Ending(Outcome.EVACUATED, status.exit_code, _left_at({}, kinds, evacuated_step))
    if "error" in kinds:
        return Ending(Outcome.USER_ERROR, status.exit_code)
    from spotnb.runtime.group.local import EXIT_GROUP_LOST

    if status.exit_code == EXIT_GROUP_LOST:  # a process of its replica group died: the
        # instance is lost to the job as a whole (Config.procs_per_instance), not failed
        return Ending(Outcome.LOST, status.exit_code, {"why": "a process of its group died"})
    if status.state == InstanceState.TERMINATED:
        return Ending(Outcome.STOPPED if stopping else Outcome.LOST, status.exit_code)
    return Ending(Outcome.CRASHED, status.exit_code, {"log": log})


def stalled_run(incs: Mapping[int, Any], n: int) -> int:
    """How many instances in a row, up to incarnation `n`, ended without committing a
    checkpoint (`incs`: the job state's incarnations): each relaunch of those starts over
    from the same step."""
    saved = {m for m, inc in incs.items() if "checkpoint" in inc.kinds}
    ran = sorted(m for m, inc in incs.items() if "allocated" in inc.kinds and m <= n)
    count = 0
    for m in reversed(ran):
        if m in saved:
            break
        count += 1
    return count
