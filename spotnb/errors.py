"""Exceptions a user can catch. Kept in one small module so every side can import it."""

from __future__ import annotations

__all__ = [
    "SpotnbError",
    "ConfigError",
    "JobFailed",
    "JobStopped",
    "SpotnbWarning",
    "ProviderUnavailable",
    "CapacityError",
    "CheckpointError",
]


class SpotnbError(Exception):
    """Base of every error spotnb raises on purpose."""


class SpotnbWarning(UserWarning):
    """Warnings spotnb emits (the test suite turns them into errors)."""


class ConfigError(SpotnbError, ValueError):
    """Bad input, raised before any instance is launched. The message names the field and the fix."""


class JobFailed(SpotnbError):
    """The user's function raised on the instance; `remote_traceback` holds the remote text."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(
            f"{message}\n\nRemote traceback:\n{remote_traceback}" if remote_traceback else message
        )
        self.remote_traceback = remote_traceback


class JobStopped(SpotnbError):
    """The job was stopped (by `job.stop()`, max_cost or max_preemptions) before it finished."""


class ProviderUnavailable(SpotnbError, ImportError):
    """A provider's optional dependencies are not installed; the message gives the pip command."""


class CapacityError(SpotnbError):
    """The provider has no capacity for the request right now (retry later or elsewhere)."""


class CheckpointError(SpotnbError):
    """No checkpoint of a job can be read (`job.checkpoint`, `spot.load_checkpoint`): none yet,
    none of the step asked for, or none that verifies. The message names the step, the reason
    and what to do."""
