"""Preemption-rate forecasts on the bundled traces (plain script; prints, asserts nothing).

    python benchmarks/bench_forecast.py            # forecast error, then the simulated gain
    python benchmarks/bench_forecast.py --no-sim   # forecast error only
    python benchmarks/bench_forecast.py --arma     # also ARMA(1,1) (SARIMAX; slower)

1. Rolling origin: every 10 minutes after a 2 h warm-up, each forecaster predicts the mean
   preemption rate (per instance-hour) of the next H hours from the bins before the origin;
   the table gives the mean absolute error against the realised rate, and its ratio to the
   naive forecaster's (the censored rate of the whole history so far, what spotnb uses).
2. Simulated gain: `Adaptive` (insurance every sqrt(2δ(MTTP+R))) reads its MTTP from each
   forecaster at the job's current trace time (`forecast_hazard`), on the trace's replay
   starting 3 h in, with a 30 s notice (GCP/Azure: insurance saves matter) and a 4 h job; total
   time and cost against the naive MTTP, same seed for all. "oracle" is the whole trace's MTTP
   (what `spotnb.sim` gives a policy by default: it knows the future).

Needs statsmodels (`pip install 'spotnb[forecast]'`).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from spotnb.market.forecast import (
    Forecaster,
    LastWindow,
    NaiveRate,
    StatsmodelsRate,
    bin_trace,
    forecast_hazard,
    rolling_evaluation,
)
from spotnb.policy import Adaptive
from spotnb.sim import Scenario, simulate
from spotnb.traces import bundled_traces, load_trace

WIDTH = 600.0
WARMUP = 2 * 3600.0


def forecasters() -> list[Forecaster]:
    models = [NaiveRate(), LastWindow(6), LastWindow(18), StatsmodelsRate("ets")]
    if "--arma" in sys.argv:  # ~0.1 s a fit: about 3 minutes more here
        models.append(StatsmodelsRate("arma"))
    return models


def errors(horizons: tuple[float, ...] = (1.0, 3.0)) -> None:
    models = forecasters()
    head = " | ".join(f"{m.name} MAE (÷naive)" for m in models)
    print(f"| trace | H | origins | {head} |")
    print("|---|---:|---:|" + "---:|" * len(models))
    for name in bundled_traces():
        bins = bin_trace(load_trace(name), WIDTH)
        for h in horizons:
            res = rolling_evaluation(bins, models, horizon=h * 3600.0, warmup=WARMUP)
            base = res["naive"].mae
            cells = " | ".join(
                f"{res[m.name].mae:.3f} ({res[m.name].mae / base:.2f})"
                + (f" [{res[m.name].fallbacks} fb]" if res[m.name].fallbacks else "")
                for m in models
            )
            print(f"| {name} | {h:g} h | {res['naive'].origins} | {cells} |")


def gains(runs: int = 300, seed: int = 0) -> None:
    offset = 3 * 3600.0
    models: list[Forecaster] = [NaiveRate(), LastWindow(6), StatsmodelsRate("ets")]
    names = [m.name for m in models[1:]] + ["oracle"]
    cols = " | ".join(f"{n} time, $ (÷naive)" for n in names)
    print(f"| trace | naive total (h) | naive $ | {cols} |")
    print("|---|---:|---:|" + "---:|" * len(models))
    for name in bundled_traces():
        sc = Scenario(
            steps=4 * 3600,
            step_time=(0.8, 1.2),
            save_time=(10, 20),
            backup_time=(40, 100),
            alloc_time=(86, 243),
            prep_time=(60, 120),
            grace=30.0,
            trace=name,
            trace_offset=offset,
            spot_price=1.0,
            on_demand_price=3.0,
        )
        bins = bin_trace(load_trace(name), WIDTH)
        out = {}
        for m in models:
            pol = Adaptive(hazard=forecast_hazard(bins, m, horizon=3600.0, offset=offset))
            out[m.name] = simulate(sc, pol, runs=runs, seed=seed, engine="event").mean
        out["oracle"] = simulate(sc, Adaptive(), runs=runs, seed=seed, engine="event").mean
        base = out["naive"]
        cells = " | ".join(
            f"{out[k]['total'] / base['total']:.3f}, {out[k]['cost'] / base['cost']:.3f}" for k in names
        )
        print(f"| {name} | {base['total'] / 3600:.2f} | {base['cost']:.2f} | {cells} |")


if __name__ == "__main__":
    t0 = time.perf_counter()
    errors()
    print(f"(forecast errors: {time.perf_counter() - t0:.0f} s)")
    if "--no-sim" not in sys.argv:
        t0 = time.perf_counter()
        print()
        gains()
        print(f"(simulation: {time.perf_counter() - t0:.0f} s)")
