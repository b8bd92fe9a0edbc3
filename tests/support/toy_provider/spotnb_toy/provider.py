"""The toy market's instances: the local market's real processes under another name."""

from __future__ import annotations

from spotnb.providers.local.provider import LocalProvider


class ToyProvider(LocalProvider):
    name = "toy"
