"""Where provider plugins written before the re-layout import the plugin API from.

A third-party provider registers a `ProviderInfo` in the `spotnb.providers` entry-point group;
until issue 27 its package imported `ProviderInfo` and `ProviderSettings` from here. They now
live in `spotnb.settings.registry` and `spotnb.settings.base` (settings import no provider, so
`Config` composes every provider's settings without an import circle). A plugin whose import
fails is left out with only a logged warning, and its user would read "unknown provider" after
upgrading spotnb: so this path keeps answering, with the same objects.
"""

from __future__ import annotations

from spotnb.settings.base import (
    COORDINATOR_IDLE_MINUTES,
    LIGHTHOUSE_PORT,
    NOTICE_GRACE,
    ProviderSettings,
    no_bool,
)
from spotnb.settings.registry import ProviderInfo

__all__ = [
    "ProviderSettings",
    "ProviderInfo",
    "NOTICE_GRACE",
    "LIGHTHOUSE_PORT",
    "COORDINATOR_IDLE_MINUTES",
    "no_bool",
]
