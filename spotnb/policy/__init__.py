"""Checkpoint policies: when to save so a spot job finishes early and cheaply.

Policies are chosen by name in `Config(checkpoint=...)` or passed as objects. Names:
`static:N` (every N steps, plus emergency saves), `periodic:N` (every N steps and nothing else:
the periodic baseline of ARCHITECTURE.md), `young`, `daly`, `daly2`, `adaptive`, `hedged`
(see `policy_names()`).
Pure: importing this package pulls in no torch, pandas or plotly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from spotnb.policy.base import Observation, Plan, Policy, SaveKind, emergency_feasible, steps_for
from spotnb.policy.hedged import Hedged, unprotected_fraction
from spotnb.policy.intervals import daly2_interval, daly_interval, expected_total, young_interval
from spotnb.policy.periodic import Daly, Young
from spotnb.policy.static import Adaptive, Periodic, Static

__all__ = [
    "Observation",
    "Plan",
    "Policy",
    "SaveKind",
    "Static",
    "Periodic",
    "Adaptive",
    "Young",
    "Daly",
    "Hedged",
    "daly_interval",
    "daly2_interval",
    "young_interval",
    "expected_total",
    "unprotected_fraction",
    "emergency_feasible",
    "steps_for",
    "resolve_policy",
    "policy_names",
    "FACTORIES",
]


def _need_arg(name: str, example: str) -> Policy:
    raise ValueError(f"policy {name!r} needs an argument, e.g. {example!r}")


def _no_arg(name: str, make: Callable[[], Policy]) -> Callable[[str | None], Policy]:
    def factory(arg: str | None) -> Policy:
        if arg:
            raise ValueError(f"policy {name!r} takes no argument")
        return make()

    return factory


_FACTORIES: dict[str, Callable[[str | None], Policy]] = {
    "static": lambda arg: Static(int(arg)) if arg else _need_arg("static", "static:100"),
    "periodic": lambda arg: Periodic(int(arg)) if arg else _need_arg("periodic", "periodic:100"),
    "young": _no_arg("young", Young),
    "daly": _no_arg("daly", Daly),
    "daly2": _no_arg("daly2", lambda: Daly(order=2)),
    "adaptive": _no_arg("adaptive", Adaptive),
    "hedged": _no_arg("hedged", Hedged),
}
FACTORIES: Mapping[str, Callable[[str | None], Policy]] = MappingProxyType(_FACTORIES)


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
        raise ValueError(
            f"unknown checkpoint policy {spec!r}; choose one of {policy_names()} "
            "(static and periodic take a step count: 'static:100', 'periodic:50')"
        )
    try:
        return factory(arg or None)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad checkpoint policy {spec!r}: {exc}") from None
