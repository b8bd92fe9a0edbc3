"""Example scenarios shipped with the package (`spotnb/sim/scenarios/*.yaml`)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from spotnb.sim.scenario import Scenario

__all__ = ["example_scenarios", "example_scenario", "example_path"]


def _dir() -> Path:
    return Path(str(resources.files("spotnb.sim").joinpath("scenarios")))


def example_scenarios() -> list[str]:
    return sorted(p.stem for p in _dir().glob("*.yaml"))


def example_path(name: str) -> Path:
    path = _dir() / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"no example scenario {name!r}; choose one of {example_scenarios()}")
    return path


def example_scenario(name: str) -> Scenario:
    """A bundled scenario by name, e.g. "gpu-azure" (see `example_scenarios()`)."""
    return Scenario.load(example_path(name))
