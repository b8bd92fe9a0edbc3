"""Diagnostics of one job, from the `spotnb` logger to whoever shows that job.

spotnb reports through `logging` (never `print`, outside the CLI); a record about a job carries
its id (`extra={"job_id": ...}`; the controller's records all do, through a LoggerAdapter). A
view attaches a `JobLogHandler` for its job and gets that job's warnings and errors, as they
are logged, in the thread that logs them — the widget turns each into a `warning` line of its
feed. Records of other jobs, and records below WARNING, pass by.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["JobLogHandler", "attach", "detach", "ROOT"]

#: the logger every spotnb module logs under (`spotnb.control.controller`, `spotnb.core.events`, …)
ROOT = "spotnb"


class JobLogHandler(logging.Handler):
    """Calls `callback(record)` for each WARNING+ record about `job_id`. A callback that
    raises is reported once through `handleError` and never stops the logging code."""

    def __init__(
        self, job_id: str, callback: Callable[[logging.LogRecord], None], level: int = logging.WARNING
    ) -> None:
        super().__init__(level)
        self.job_id = job_id
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "job_id", None) != self.job_id:
            return
        try:
            self.callback(record)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


def attach(job_id: str, callback: Callable[[logging.LogRecord], None]) -> JobLogHandler:
    """Start sending `job_id`'s warnings to `callback`; `detach(handler)` stops it."""
    handler = JobLogHandler(job_id, callback)
    logging.getLogger(ROOT).addHandler(handler)
    return handler


def detach(handler: JobLogHandler) -> None:
    logging.getLogger(ROOT).removeHandler(handler)
