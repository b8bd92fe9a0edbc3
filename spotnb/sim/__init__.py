"""Offline simulator of a training job on spot VMs: compare checkpoint policies in seconds.

    from spotnb.sim import Scenario, simulate, compare
    sc = Scenario(steps=100_000, step_time=0.5, save_time=20, backup_time=30,
                  alloc_time=(86, 243), prep_time=60, grace=30, mttp=3 * 3600,
                  spot_price=2.3, on_demand_price=6.2)
    simulate(sc, "adaptive", runs=1000).mean["total"]
    table, figure = compare(sc, ["static:2000", "daly", "adaptive", "hedged"])

Pure at import (pandas and plotly are imported by `compare` only).
"""

from __future__ import annotations

from spotnb.sim.compare import compare, on_demand_result
from spotnb.sim.engine import METRICS, SimResult, simulate, simulate_run
from spotnb.sim.examples import example_path, example_scenario, example_scenarios
from spotnb.sim.scenario import Scenario

__all__ = [
    "Scenario",
    "simulate",
    "simulate_run",
    "compare",
    "on_demand_result",
    "SimResult",
    "METRICS",
    "example_scenario",
    "example_scenarios",
    "example_path",
]
