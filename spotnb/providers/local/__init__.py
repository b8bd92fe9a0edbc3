"""The local spot market: instances are processes on this machine, really killed (the provider,
its capacity, its preemption injector, the metadata server a VM would query, and the zygote
that forks instances fast).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LocalProvider"]


def __getattr__(name: str) -> Any:
    """`from spotnb.providers.local import LocalProvider`, as plugins written before the
    re-layout (issue 27) import it, resolved on use: importing the package (the zygote, the
    metadata server on an instance) stays as light as its own modules."""
    if name == "LocalProvider":
        from spotnb.providers.local.provider import LocalProvider

        return LocalProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
