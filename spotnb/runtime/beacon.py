"""A tiny shared-memory progress beacon: the current step and checkpoint phase.

The training thread writes one integer per step (tens of nanoseconds), so a supervisor on the
same machine (the local market's injector) can see where a process is at the instant it kills
it, and tests can land a kill *during* a save or an upload. Disabled (a no-op) unless the
`SPOTNB_BEACON` environment variable names a file.
"""

from __future__ import annotations

import mmap
import os
from enum import IntEnum

__all__ = ["Phase", "Beacon", "read_beacon", "BEACON_SIZE"]

BEACON_SIZE = 32


class Phase(IntEnum):
    IDLE = 0
    RESTORE = 1
    SNAPSHOT = 2  # blocking copy of the state into RAM
    SAVE = 3  # serialising to the local spool
    UPLOAD = 4  # copying to the store
    COMMIT = 5  # writing the manifest


class Beacon:
    def __init__(self, path: str | None) -> None:
        self.enabled = bool(path)
        if path:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(fd, BEACON_SIZE)
            self._mm = mmap.mmap(fd, BEACON_SIZE)
            os.close(fd)
            self.slots = memoryview(self._mm).cast("q")
        else:
            self.slots = [0, 0, 0, 0]  # type: ignore[assignment]

    def set_step(self, step: int) -> None:
        self.slots[0] = step

    def set_phase(self, phase: Phase) -> None:
        """The checkpoint writer's phase (its own thread)."""
        self.slots[1] = int(phase)

    def set_snapshot(self, active: bool) -> None:
        """The training thread's blocking copy, in a slot of its own so that it never
        overwrites what the writer thread is doing at the same time."""
        self.slots[2] = int(active)


def read_beacon(path: str) -> tuple[int, Phase]:
    """(step, phase) as last written; (0, IDLE) if the file is absent or empty."""
    try:
        with open(path, "rb") as f:
            data = f.read(24)
    except FileNotFoundError:
        return 0, Phase.IDLE
    if len(data) < 24:
        return 0, Phase.IDLE
    step = int.from_bytes(data[:8], "little", signed=True)
    if int.from_bytes(data[16:24], "little"):
        return step, Phase.SNAPSHOT
    return step, Phase(int.from_bytes(data[8:16], "little"))
