"""The base of every provider's settings, and the constants both settings and providers read.

A provider is two things: its `Provider` class (which imports a cloud SDK, so it is loaded only
when a job runs there) and its *settings*: a pydantic model whose fields all carry the
provider's prefix (`aws_image_id`, `local_mttp`, …). `spot.Config` is composed from every
registered provider's settings (see `spotnb.settings.config`), so a settings module must import
no SDK. This module sits at the bottom of `spotnb.settings` (it imports nothing of spotnb), so
that the settings models, the registry (`spotnb.settings.registry`) and the providers can all
read it without a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "ProviderSettings",
    "NOTICE_GRACE",
    "LIGHTHOUSE_PORT",
    "COORDINATOR_IDLE_MINUTES",
    "no_bool",
]

#: Seconds between a cloud's preemption notice and the kill (docs/dev/notices.md, "Cloud notices": EC2's
#: two-minute warning, Azure Scheduled Events' 30 s minimum, GCP's 30 s ACPI soft-off).
NOTICE_GRACE = {"aws": 120.0, "azure": 30.0, "gcp": 30.0}
#: The port a cloud coordinator's lighthouse listens on (fixed, so a replaced coordinator at the
#: same address serves the replicas that already know it); each cloud's `*_coordinator_port`.
LIGHTHOUSE_PORT = 29510
#: Minutes without any replica after which a cloud coordinator powers itself off (a guard
#: against a leak when no controller is left to end it); each cloud's `*_coordinator_idle_minutes`.
COORDINATOR_IDLE_MINUTES = 60


class ProviderSettings(BaseModel):
    """Base of a provider's settings. Every field starts with `prefix`; methods a settings
    class adds carry the prefix too (they become methods of `spot.Config`, beside every other
    provider's). Override the class methods to take part in whole-Config checks."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    prefix: ClassVar[str] = ""

    @classmethod
    def check_config(cls, config: Config) -> None:
        """Raise ValueError for a Config this provider cannot run (called only when
        `config.provider` is this provider, after every field validated)."""

    @classmethod
    def market_priors(cls, config: Config, zone: str | None = None) -> dict[str, float]:
        """Prior mean time to preemption (`prior_mttp`) and restart time (`prior_restart`),
        seconds, before the job DB has measured this market (`zone`: one of the job's
        candidate regions, else the job's own); {} for spotnb's defaults."""
        return {}


def no_bool(v: Any) -> Any:
    """A bool where a count belongs is a slip (True would silently mean 1): refuse it."""
    if isinstance(v, bool):
        raise ValueError(f"got {v!r}; give a whole number")
    return v
