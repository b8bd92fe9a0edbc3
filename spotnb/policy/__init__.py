"""Checkpoint policies: when to save so a spot job finishes early and cheaply.

Policies are chosen by name in `Config(checkpoint=...)` or passed as objects. Names:
`static:N`, `adaptive` (and those registered in `_FACTORIES`).
"""
from __future__ import annotations

from typing import Any, Callable

from spotnb.policy.base import Observation, Plan, Policy, SaveKind, emergency_feasible
from spotnb.policy.static import Adaptive, Static, daly_interval

__all__ = ["Observation", "Plan", "Policy", "SaveKind", "Static", "Adaptive", "daly_interval",
           "emergency_feasible", "resolve_policy", "policy_names"]

_FACTORIES: dict[str, Callable[[str | None], Policy]] = {
    "static": lambda arg: Static(int(arg)) if arg else _need_arg("static", "static:100"),
    "adaptive": lambda arg: Adaptive(),
}


def _need_arg(name: str, example: str) -> Policy:
    raise ValueError(f"policy {name!r} needs an argument, e.g. {example!r}")


def policy_names() -> list[str]:
    return sorted(_FACTORIES)


def resolve_policy(spec: Any) -> Policy:
    """A Policy from a name such as "adaptive" or "static:50", or the object itself."""
    if isinstance(spec, Policy):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"checkpoint policy must be a name or a Policy, got {type(spec).__name__}")
    name, _, arg = spec.strip().lower().partition(":")
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown checkpoint policy {spec!r}; choose one of {policy_names()} "
                         "(static takes a step count: 'static:100')")
    try:
        return factory(arg or None)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad checkpoint policy {spec!r}: {exc}") from None
