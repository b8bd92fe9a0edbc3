"""How much a simulation may take, and when a simulated job can never finish: one set of rules
for `spotnb plan` (`sim.fleet`) and `spotnb simulate` (`sim.engine`, `sim.batch`).

A scenario whose instances die before they can start or finish a step (an MTTP of 0.001 s
with a 60 s allocation) never ends, and one of 10**13 steps takes for ever: the first grew
to 7.2 GB in five minutes. So the work is counted in events (a kill, an allocation, a save:
what the simulators loop over; a microsecond or so each) and bounded, per run (`MAX_EVENTS`)
and per command (`PLAN_EVENTS`), refused up front where an estimate already says so
(`TooMuchWork`, naming the step count that fits), and a job that cannot progress is a
`NoProgress` verdict: up front from the MTTP (`check_hopeless`), else after `STALL_EVENTS`
events in a row without progress. Both are ValueErrors, which the commands print (exit 2).
"""

from __future__ import annotations

import math

from spotnb.market.preempt import Exponential, Piecewise, PreemptionProcess

__all__ = [
    "MAX_EVENTS",
    "PLAN_EVENTS",
    "STALL_EVENTS",
    "HOPELESS",
    "NoProgress",
    "TooMuchWork",
    "Budget",
    "best_mttp",
    "check_hopeless",
    "fitting_steps",
]

#: Most events (kills, allocations, joins, cold starts, saves) one simulated run may take: about
#: a few seconds of this machine's time.
MAX_EVENTS = 1_000_000
#: Most events one command (a whole plan, every policy of a `simulate`) may take.
PLAN_EVENTS = 20_000_000
#: Events in a row without a new high of the job's progress after which a run is stuck.
STALL_EVENTS = 20_000
#: An instance whose expected lifetime is this many times shorter than what it must live
#: through to make progress (its start, one step) practically never makes any: e^-20 ≈ 2e-9.
HOPELESS = 20.0


class NoProgress(ValueError):
    """The simulated job can never finish: the verdict says why."""


class TooMuchWork(ValueError):
    """Simulating this would take too long: the message names the limit and what to lower."""


class Budget:
    """The events left to one command, spent run by run (`what` names the command)."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit, self.left, self.what = int(limit), int(limit), what

    def cap(self) -> int:
        """The most events the next run may take."""
        return max(0, min(MAX_EVENTS, self.left))

    def spend(self, n: int) -> None:
        self.left -= int(n)

    def exceeded(self, where: str) -> TooMuchWork:
        return TooMuchWork(
            f"{self.what} took more than its limit of {self.limit:,} events and was stopped at "
            f"{where}; lower steps (a shorter job has the same rates) or the runs"
        )


def best_mttp(process: PreemptionProcess) -> float:
    """The longest MTTP `process` has in any phase (inf: never preempted, or unknown: a
    trace's quiet spells, which only a run can tell)."""
    if isinstance(process, Exponential):
        return float(process.mttp)
    if isinstance(process, Piecewise):
        return max(process.mttps)
    return math.inf


def check_hopeless(
    *, steps: int, rate: float, mttp: float, start: float, start_words: str, step: float, who: str
) -> None:
    """`NoProgress`, before anything runs, when `who` (an instance, the VM) dies long before it
    could progress: its best MTTP is `HOPELESS` times shorter than the `start` it must live
    through once allocated (`start_words` says what it is made of) or than one `step`. Not
    when the job could end before the first preemption (`steps / rate` seconds at full speed)."""
    m = mttp
    if not math.isfinite(m) or steps / rate < m:
        return  # no preemptions, or the first instances may well finish the job
    if start > HOPELESS * m:
        raise NoProgress(
            f"no progress: every {who} is preempted before it is ready to train (MTTP {m:g} s "
            f"< the {start:g} s it needs to start once allocated: {start_words}); raise mttp or "
            "shorten prep_time"
        )
    if step > HOPELESS * m:
        raise NoProgress(
            f"no progress: every {who} is preempted before it finishes a step (MTTP {m:g} s "
            f"< a step of {step:g} s, and a kill undoes the step in flight); raise mttp or "
            "shorten step_time"
        )


def fitting_steps(steps: int, estimate: float, limit: float) -> str:
    """The step count whose simulation would fit `limit` events, rounded down, for a message."""
    fit = max(1, int(steps * limit / max(estimate, 1.0)))
    digits = len(str(fit)) - 2
    return f"{(fit // 10**digits) * 10**digits if digits > 0 else fit:,}"
