"""The local market's preemptions: a notice `grace` seconds ahead, then SIGKILL of the whole
process group. Lifetimes come from a PreemptionProcess (exponential, trace) or a schedule;
schedule entries may also trigger on a step and a checkpoint phase read from the beacon."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spotnb.runtime.beacon import Phase, read_beacon

if TYPE_CHECKING:
    from spotnb.providers.local.zygote import Forked

__all__ = ["Kill", "Injector"]

log = logging.getLogger(__name__)

_PHASES = {
    "step": None,
    "save": {Phase.SNAPSHOT, Phase.SAVE},
    "upload": {Phase.UPLOAD},
    "commit": {Phase.COMMIT},
    "restore": {Phase.RESTORE},
}


@dataclass
class Kill:
    """What happened at a kill (the market's own record, for the `preempted` event)."""

    at: float
    step: int
    phase: str
    noticed: bool
    reason: str = "preempted"
    extra: dict[str, Any] = field(default_factory=dict)


class Injector:
    """Watches one instance process and kills it as scheduled."""

    def __init__(
        self,
        proc: subprocess.Popen | Forked,
        beacon_path: str,
        *,
        kill_at: float = math.inf,
        grace: float = 0.0,
        trigger: dict[str, Any] | None = None,
        notify: Callable[[float], None] | None = None,
    ) -> None:
        self.proc, self.beacon_path = proc, beacon_path
        self.kill_at, self.grace, self.trigger, self.notify = kill_at, grace, trigger, notify
        self.kill: Kill | None = None
        self.noticed = False
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotnb-injector", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def settled(self) -> Kill | None:
        """The market's kill, for a process seen to have ended: a kill under way (the group
        signalled, its record not yet written: the process can die in between) is waited for,
        so an instance the market killed never reads as one that exited on its own."""
        with self._lock:
            return self.kill

    def kill_now(self, reason: str = "preempted") -> Kill | None:
        """SIGKILL the process group (idempotent); records where the process was."""
        with self._lock:
            if self.kill is not None or self.proc.poll() is not None:
                return self.kill
            step, phase = read_beacon(self.beacon_path)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return None
            self.kill = Kill(
                at=time.time(), step=step, phase=phase.name.lower(), noticed=self.noticed, reason=reason
            )
        self.proc.wait()
        return self.kill

    def _wait_stopped(self, timeout: float = 1.0) -> None:
        """Until every thread of the process is stopped (a SIGSTOP takes effect when the kernel
        next handles the target, which on another core may be after `kill()` returned: until
        then its writer thread can still move the beacon on)."""
        deadline = time.monotonic() + timeout
        task_dir = f"/proc/{self.proc.pid}/task"
        while time.monotonic() < deadline:
            try:
                states = []
                for tid in os.listdir(task_dir):
                    with open(f"{task_dir}/{tid}/stat", encoding="ascii", errors="replace") as f:
                        states.append(f.read().rsplit(")", 1)[-1].split()[0])
            except OSError:
                return  # gone, or no /proc here: nothing more to wait for
            if all(state in ("T", "t", "Z", "X") for state in states):
                return
            time.sleep(0.0002)

    def _signal(self, sig: int) -> bool:
        try:
            os.killpg(self.proc.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _run(self) -> None:
        if self.trigger is not None:
            return self._watch_trigger()
        while not self._cancel.is_set() and self.proc.poll() is None:
            now = time.time()
            notice_at = self.kill_at - self.grace  # kill_at may be moved by LocalProvider.inject
            if not self.noticed and now >= notice_at and math.isfinite(self.kill_at):
                self.noticed = True
                if self.notify:
                    self.notify(self.kill_at)
            if now >= self.kill_at:
                self.kill_now()
                return
            wait = (notice_at if not self.noticed else self.kill_at) - now
            self._cancel.wait(min(max(wait, 0.0), 0.25))

    def _watch_trigger(self) -> None:
        """At the first moment the beacon shows the step and phase: kill at once, or (with
        `notice`) publish the notice and kill `grace` seconds later."""
        assert self.trigger is not None
        target, phases = self.trigger["step"], _PHASES[self.trigger.get("phase", "step")]
        while not self._cancel.is_set() and self.proc.poll() is None:
            step, phase = read_beacon(self.beacon_path)
            if step >= target and (phases is None or phase in phases):
                if not self.trigger.get("notice"):
                    # freeze the process, then look again: on a busy machine this thread may run
                    # late, and a kill meant for a phase must not land after the phase has ended
                    if not self._signal(signal.SIGSTOP):
                        return
                    self._wait_stopped()  # kill() returns before the other core has stopped it
                    step, phase = read_beacon(self.beacon_path)
                    if phases is None or phase in phases:
                        self.kill_now()
                        return
                    self._signal(signal.SIGCONT)  # it moved on: wait for the phase again
                    continue
                self.kill_at = time.time() + self.grace
                self.trigger = None
                return self._run()  # the timed path: notice now, kill at kill_at
            time.sleep(0.0005)
        if not self._cancel.is_set() and self.kill is None:
            step, phase = read_beacon(self.beacon_path)
            log.warning(
                "the local market's kill scheduled at %s never landed: the instance ended at step "
                "%d (%s) first%s",
                self.trigger,
                step,
                phase.name.lower(),
                ", its steps faster than the market's look at them (about 1 ms)" if step >= target else "",
            )
