"""`compare`: several policies on one scenario, as a table and a stacked-bar breakdown.

Every policy is simulated with the same seed, so each run faces the same preemption draws
(common random numbers): differences between rows are the policies', not luck's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spotnb.sim.bounds import PLAN_EVENTS, Budget, NoProgress, TooMuchWork, fitting_steps
from spotnb.sim.engine import METRICS, SimResult, check_progress, estimate_events, simulate
from spotnb.sim.scenario import Scenario

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import plotly.graph_objects as go

__all__ = ["compare", "on_demand_result", "BREAKDOWN", "ON_DEMAND", "run_policies"]

#: The wall-time buckets, stacked in this order.
BREAKDOWN = ("compute", "recompute", "save", "alloc", "prep")
ON_DEMAND = "on-demand"


def on_demand_result(scenario: Scenario) -> SimResult:
    """The baseline: the same compute on an on-demand VM, never preempted, never saved."""
    work = scenario.work
    mean = {k: 0.0 for k in METRICS}
    mean.update(
        compute=work,
        total=work,
        cost=work * scenario.on_demand_price / 3600.0,
        on_demand_cost=work * scenario.on_demand_price / 3600.0,
    )
    return SimResult(ON_DEMAND, 1, 0, mean, {k: 0.0 for k in METRICS})


def run_policies(
    scenario: Scenario,
    policies: Sequence[Any],
    runs: int = 100,
    seed: int = 0,
    *,
    max_events: int = PLAN_EVENTS,
) -> list[SimResult]:
    """A result per policy (a name, "on-demand", or a Policy), in order. Bounded as `spotnb
    plan` is (`spotnb.sim.bounds`): all of them take at most `max_events` events, refused up
    front (`TooMuchWork`) where the estimate is past it; a policy whose job cannot finish is a
    result with its `verdict` (NaN figures); when none can, `NoProgress` says why."""
    from spotnb.policy import resolve_policy

    spot = [p for p in policies if not (isinstance(p, str) and p.strip().lower() == ON_DEMAND)]
    if spot:
        check_progress(scenario)  # the scenario's own verdict, once
        estimate = runs * sum(estimate_events(scenario, resolve_policy(p)) for p in spot)
        if estimate > max_events:
            raise TooMuchWork(
                f"steps: simulating {len(spot)} polic{'y' if len(spot) == 1 else 'ies'} x {runs} run(s) "
                f"of {scenario.steps:,} steps takes about {estimate:.2g} events (saves and "
                f"preemptions), past the limit of {max_events:,}; lower steps to about "
                f"{fitting_steps(scenario.steps, estimate, max_events)} (a shorter job has the same "
                "rates), or the runs, or the policies"
            )
    budget = Budget(max_events, "the simulation")
    results, stuck = [], []
    for pol in policies:
        if isinstance(pol, str) and pol.strip().lower() == ON_DEMAND:
            results.append(on_demand_result(scenario))
            continue
        try:
            results.append(simulate(scenario, pol, runs=runs, seed=seed, max_events=budget))
        except NoProgress as exc:
            name = pol if isinstance(pol, str) else repr(resolve_policy(pol))
            nan = {k: math.nan for k in METRICS}
            results.append(SimResult(name, runs, seed, nan, dict(nan), verdict=str(exc)))
            stuck.append(str(exc))
    if spot and len(stuck) == len(spot):
        raise NoProgress(stuck[0])
    return results


def compare(
    scenario: Scenario,
    policies: Sequence[Any],
    runs: int = 100,
    seed: int = 0,
) -> tuple[pd.DataFrame, go.Figure]:
    """Table (rows = policies plus "on-demand", columns = mean figures, `<name>_std` for the
    spread) and a plotly stacked bar of the wall-time breakdown in hours."""
    import pandas as pd
    import plotly.graph_objects as go

    names = [p for p in policies if not (isinstance(p, str) and p.strip().lower() == ON_DEMAND)]
    results = run_policies(scenario, names, runs, seed) + [on_demand_result(scenario)]
    rows = {}
    for res in results:
        row: dict[str, float] = dict(res.mean)
        row.update({f"{k}_std": v for k, v in res.std.items()})
        rows[res.policy] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "policy"
    columns = list(METRICS) + [f"{k}_std" for k in METRICS]
    table = table[columns]

    fig = go.Figure()
    for part in BREAKDOWN:
        fig.add_trace(
            go.Bar(
                name=part,
                x=list(table.index),
                y=list(table[part] / 3600.0),
                hovertemplate="%{x}<br>" + part + ": %{y:.2f} h<extra></extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=list(table.index),
            y=list(table["total"] / 3600.0),
            mode="text",
            text=[f"${c:,.0f}" if math.isfinite(c) else "no progress" for c in table["cost"]],
            textposition="top center",
            showlegend=False,
            hoverinfo="skip",
        )
    )
    title = scenario.name or "scenario"
    fig.update_layout(
        barmode="stack",
        yaxis_title="wall time (h)",
        title=f"{title}: {runs} runs, seed {seed} (labels: cost)",
        legend_title_text="time spent on",
    )
    return table, fig
