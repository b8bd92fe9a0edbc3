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
    "QuotaError",
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


class QuotaError(SpotnbError):
    """The account's quota refuses the request (a new account's zero GPU spot quota, most
    often): unlike a `CapacityError` no retry can succeed until the quota is raised, so the
    controller stops asking where it applies and ends the job (failed) when it applies
    everywhere. The message names the quota, its current value where known, and how to raise it.

    `region`: where the quota applies (a cloud region; None with `scope="global"`: every region
    of the cloud); `limit`: its current value (None: unknown); `fix`: how to raise it."""

    def __init__(
        self,
        message: str,
        *,
        cloud: str,
        quota: str,
        region: str | None = None,
        limit: float | None = None,
        scope: str = "region",
        fix: str = "",
    ) -> None:
        super().__init__(message)
        self.cloud, self.quota, self.region, self.limit = cloud, quota, region, limit
        self.scope, self.fix = scope, fix

    def covers(self, candidate: str | None) -> bool:
        """Whether this quota refuses `candidate` too (a region or zone as Config.regions names
        it: "us-east-1b", "us-central1-a", "eastus", "aws/us-east-1b"): the same region, or any
        of this cloud's with a global quota."""
        if candidate is None:
            return True
        cloud, _, place = candidate.rpartition("/")
        if cloud and cloud != self.cloud:
            return False
        if self.scope == "global" or self.region is None:
            return True
        if place == self.region:
            return True
        rest = place[len(self.region) :] if place.startswith(self.region) else None
        return rest is not None and len(rest.lstrip("-")) == 1 and rest.lstrip("-").isalpha()


class CheckpointError(SpotnbError):
    """No checkpoint of a job can be read (`job.checkpoint`, `spot.load_checkpoint`): none yet,
    none of the step asked for, or none that verifies. The message names the step, the reason
    and what to do."""
