"""Forecasts of a market's preemption rate over the next hours, from its history (Parcae).

A trace's history is binned into fixed intervals (`bin_trace`): preemptions and exposure
(instance-seconds alive) per bin, so each bin has a rate per instance-hour. A `Forecaster`
turns the bins seen so far into a `Forecast` of the rate (and MTTP = 1/rate) over the next
`horizon` seconds:

* `NaiveRate`: the censored rate of the whole history (exposure / removals, what
  `Trace.mttp` and spotnb's job DB use today).
* `LastWindow(k)`: the same estimate over the last `k` bins only.
* `StatsmodelsRate`: exponential smoothing (statsmodels `ETSModel`, additive error, no trend:
  the level is a weighted mean whose decay is fitted by maximum likelihood) or an ARMA(1,1) with
  a constant (`SARIMAX`) on the per-bin rates (each shrunk toward the last 3 hours' rate by a
  pseudo-exposure of one median bin, so bins with few instances alive do not dominate), with a
  90 % interval for the horizon's mean rate. It falls back to `NaiveRate` (and says why in
  `Forecast.fallback`, also logged) when the history is shorter than `min_bins` or the fit
  fails. No seasonal term: the bundled traces cover 11 to 27 hours, not the several days a
  daily season needs to be estimated.

    from spotnb.market.forecast import StatsmodelsRate, bin_trace
    from spotnb.traces import load_trace
    bins = bin_trace(load_trace("bamboo/p3"))            # 10-minute bins
    StatsmodelsRate().forecast(bins.head(36), 3600.0)    # next hour, from the first 6 h

`rolling_evaluation` replays a trace origin by origin and scores each forecaster's mean
absolute error (`benchmarks/bench_forecast.py`); `forecast_hazard` turns a forecaster into the
`hazard` a policy (`Adaptive`, `Hedged`) reads its MTTP from. statsmodels (and pandas) are
imported only when a `StatsmodelsRate` is made: `pip install 'spotnb[forecast]'`.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spotnb.policy.base import Observation
from spotnb.traces.trace import Trace

__all__ = [
    "Binned",
    "bin_trace",
    "Forecast",
    "Forecaster",
    "NaiveRate",
    "LastWindow",
    "StatsmodelsRate",
    "rolling_evaluation",
    "Evaluation",
    "forecast_hazard",
    "INSTALL_HINT",
]

log = logging.getLogger("spotnb.market.forecast")

INSTALL_HINT = "pip install 'spotnb[forecast]'"


@dataclass(frozen=True)
class Binned:
    """Preemptions and exposure (instance-seconds alive) in consecutive bins of `width` seconds,
    the first starting at trace time 0."""

    width: float
    events: tuple[int, ...]
    exposure: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.events)

    @property
    def rates(self) -> list[float | None]:
        """Preemptions per instance-hour in each bin (None where nothing was alive)."""
        return [e * 3600.0 / x if x > 0 else None for e, x in zip(self.events, self.exposure, strict=True)]

    def head(self, n: int) -> Binned:
        """The first `n` bins: the history at the origin `n * width`."""
        return Binned(self.width, self.events[:n], self.exposure[:n])

    def window(self, start: int, stop: int) -> Binned:
        return Binned(self.width, self.events[start:stop], self.exposure[start:stop])

    def rate(self) -> float | None:
        """Censored rate over all the bins, per instance-hour (None without exposure)."""
        x = sum(self.exposure)
        return sum(self.events) * 3600.0 / x if x > 0 else None


def bin_trace(trace: Trace, width: float = 600.0) -> Binned:
    """Bin `trace` into `width`-second intervals. Removals at a change point count in the bin of
    that time; the live count after it is exposure until the next change (as `Trace.exposure`),
    so the bins' totals are exactly `trace.removals` and `trace.exposure`."""
    if not width > 0:
        raise ValueError(f"width must be positive, got {width}")
    events, exposure = trace.binned(width)
    return Binned(float(width), tuple(events), tuple(exposure))


@dataclass(frozen=True)
class Forecast:
    """The predicted mean preemption rate over the next `horizon` seconds."""

    rate: float  # preemptions per instance-hour
    horizon: float  # seconds
    model: str
    low: float | None = None  # interval on the rate (per instance-hour), when the model gives one
    high: float | None = None
    fallback: str | None = None  # why the naive rate was returned instead, if it was

    @property
    def mttp(self) -> float:
        """Mean time to preemption in seconds (inf when the rate is 0)."""
        return 3600.0 / self.rate if self.rate > 0 else math.inf

    @property
    def rate_per_second(self) -> float:
        return self.rate / 3600.0


class Forecaster(ABC):
    """Predicts the mean preemption rate over the next `horizon` seconds from the bins so far."""

    name = "forecaster"

    @abstractmethod
    def forecast(self, history: Binned, horizon: float) -> Forecast: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NaiveRate(Forecaster):
    """The censored rate of the whole history (removals / exposure), as `Trace.mttp`, with an
    approximate 90 % interval (normal approximation to the Poisson count)."""

    name = "naive"

    def forecast(self, history: Binned, horizon: float) -> Forecast:
        return _naive(history, horizon, self.name)


def _naive(history: Binned, horizon: float, model: str, fallback: str | None = None) -> Forecast:
    x = sum(history.exposure)
    n = sum(history.events)
    if x <= 0:
        return Forecast(0.0, horizon, model, fallback=fallback or "no exposure in the history")
    rate = n * 3600.0 / x
    half = 1.645 * math.sqrt(max(n, 1)) * 3600.0 / x
    return Forecast(rate, horizon, model, max(0.0, rate - half), rate + half, fallback)


class LastWindow(Forecaster):
    """The censored rate of the last `k` bins only (naive when they saw nothing alive)."""

    def __init__(self, k: int = 6) -> None:
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        self.k = int(k)
        self.name = f"last{k}"

    def forecast(self, history: Binned, horizon: float) -> Forecast:
        recent = history.window(max(0, len(history) - self.k), len(history))
        if sum(recent.exposure) <= 0:
            return _fall_back(history, horizon, self.name, f"nothing alive in the last {self.k} bins")
        return _naive(recent, horizon, self.name)

    def __repr__(self) -> str:
        return f"LastWindow(k={self.k})"


def _fall_back(history: Binned, horizon: float, model: str, reason: str) -> Forecast:
    log.info("forecast %s: naive rate instead (%s)", model, reason)
    return _naive(history, horizon, model, fallback=reason)


def _statsmodels() -> Any:
    try:
        import numpy as np
        from statsmodels.tsa.exponential_smoothing.ets import ETSModel
        from statsmodels.tsa.statespace.sarimax import SARIMAX
    except ImportError as exc:
        raise ImportError(
            f"StatsmodelsRate needs statsmodels ({exc.name or exc} is missing): {INSTALL_HINT}"
        ) from exc
    return np, ETSModel, SARIMAX


class StatsmodelsRate(Forecaster):
    """Exponential smoothing (`kind="ets"`) or ARMA(1,1) + constant (`kind="arma"`) on the
    per-bin rates (shrunk toward the trailing `trail` bins' rate, see `series`), fitted at every forecast;
    the naive rate when the history has fewer than `min_bins` bins or the fit fails. With
    `shrink=0`, bins where nothing was alive take the previous bin's rate.

    The interval (`level`, default 90 %) is that of the horizon's mean rate: from 200 simulated
    paths for ETS, from the forecast covariance for ARMA; both are clipped at 0."""

    def __init__(
        self,
        kind: str = "ets",
        min_bins: int = 12,
        level: float = 0.9,
        shrink: float = 1.0,
        trail: int = 18,
        seed: int = 0,
    ) -> None:
        if kind not in ("ets", "arma"):
            raise ValueError(f"kind is 'ets' or 'arma', got {kind!r}")
        if shrink < 0:
            raise ValueError(f"shrink must be non-negative, got {shrink}")
        self.np, self._ets, self._sarimax = _statsmodels()  # fail here, with the install hint
        self.kind = kind
        self.shrink = shrink
        self.trail = max(1, int(trail))
        self.min_bins = max(3, int(min_bins))
        self.level = level
        self.seed = seed
        self.name = kind

    def forecast(self, history: Binned, horizon: float) -> Forecast:
        series = _filled(self.series(history))
        if len(series) < self.min_bins:
            return _fall_back(
                history, horizon, self.name, f"{len(series)} bins of history, fewer than {self.min_bins}"
            )
        if max(series) == min(series):
            return _fall_back(history, horizon, self.name, "the history's rate is constant")
        steps = max(1, math.ceil(horizon / history.width))
        np = self.np
        import warnings

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # convergence chatter: judged by the result below
                if self.kind == "ets":
                    res = self._ets(np.asarray(series), error="add", trend=None).fit(disp=False)
                    paths = res.simulate(
                        steps, repetitions=200, anchor="end", rng=np.random.default_rng(self.seed)
                    )
                    mean = float(np.mean(res.forecast(steps)))
                    avg = np.asarray(paths).reshape(steps, -1).mean(axis=0)
                    q = (1.0 - self.level) / 2.0
                    low, high = (float(v) for v in np.quantile(avg, [q, 1.0 - q]))
                else:
                    res = self._sarimax(np.asarray(series), order=(1, 0, 1), trend="c").fit(disp=False)
                    fc = res.get_forecast(steps)
                    mean = float(np.mean(fc.predicted_mean))
                    # sd of a mean <= mean of the sds (whatever their correlation): conservative
                    se = float(np.mean(np.sqrt(np.asarray(fc.var_pred_mean))))
                    z = {0.8: 1.2816, 0.9: 1.6449, 0.95: 1.96}.get(self.level, 1.6449)
                    low, high = mean - z * se, mean + z * se
        except Exception as exc:  # statsmodels raises many types (LinAlgError, ValueError, ...)
            return _fall_back(history, horizon, self.name, f"fit failed: {type(exc).__name__}: {exc}")
        if not math.isfinite(mean):
            return _fall_back(history, horizon, self.name, "the fit gave a non-finite forecast")
        return Forecast(max(0.0, mean), horizon, self.name, max(0.0, low), max(0.0, high))

    def series(self, history: Binned) -> list[float | None]:
        """The per-bin rates the model is fitted to: each bin's events and exposure plus a
        pseudo-exposure of `shrink` median bins at the rate of the `trail` bins ending with it.
        A bin where few instances were alive then cannot swing the level, and the pull is
        toward the recent rate, not the whole history's, so a change of regime still shows.

        Chosen on the bundled traces (benchmarks/bench_forecast.py), so its scores there are
        optimistic: with the raw rates ETS's 1 h error was up to 1.9 times the naive one
        (a100x1-east1b, where bins with one or two live instances swing it); shrunk toward the
        whole history's rate, the level lagged a step change (0.72 of a new rate of 1.0 three
        hours after it, tests/market/test_forecast.py); toward the trailing 3 h, 0.98."""
        if not self.shrink:
            return history.rates
        alive = sorted(x for x in history.exposure if x > 0)
        x0 = self.shrink * alive[len(alive) // 2] if alive else 0.0
        out: list[float | None] = []
        ev = ex = 0.0
        for i, (e, x) in enumerate(zip(history.events, history.exposure, strict=True)):
            ev, ex = ev + e, ex + x
            if i >= self.trail:
                ev -= history.events[i - self.trail]
                ex -= history.exposure[i - self.trail]
            prior = ev / ex if ex > 0 else 0.0  # per instance-second
            out.append((e + prior * x0) * 3600.0 / (x + x0) if x + x0 > 0 else None)
        return out

    def __repr__(self) -> str:
        return f"StatsmodelsRate(kind={self.kind!r}, min_bins={self.min_bins}, shrink={self.shrink:g})"


def _filled(rates: Sequence[float | None]) -> list[float]:
    """Per-bin rates with the empty bins (nothing alive) carried forward; leading ones dropped."""
    out: list[float] = []
    for r in rates:
        if r is not None:
            out.append(r)
        elif out:
            out.append(out[-1])
    return out


@dataclass(frozen=True)
class Evaluation:
    """Rolling-origin scores of one forecaster on one trace."""

    model: str
    origins: int
    mae: float  # mean |forecast − realised rate|, per instance-hour
    fallbacks: int


def rolling_evaluation(
    bins: Binned,
    forecasters: Sequence[Forecaster],
    horizon: float = 3600.0,
    warmup: float = 2 * 3600.0,
) -> dict[str, Evaluation]:
    """At every bin boundary after `warmup` with a full `horizon` after it, forecast from the
    bins before it and compare with the rate the next `horizon` seconds realised (removals /
    exposure; origins whose horizon saw nothing alive are skipped)."""
    steps = max(1, math.ceil(horizon / bins.width))
    first = max(1, math.ceil(warmup / bins.width))
    errors: dict[str, list[float]] = {f.name: [] for f in forecasters}
    fallbacks = dict.fromkeys(errors, 0)
    for k in range(first, len(bins) - steps + 1):
        truth = bins.window(k, k + steps).rate()
        if truth is None:
            continue
        history = bins.head(k)
        for f in forecasters:
            fc = f.forecast(history, horizon)
            errors[f.name].append(abs(fc.rate - truth))
            fallbacks[f.name] += fc.fallback is not None
    return {
        name: Evaluation(name, len(e), sum(e) / len(e) if e else math.nan, fallbacks[name])
        for name, e in errors.items()
    }


def forecast_hazard(
    bins: Binned, forecaster: Forecaster, horizon: float = 3600.0, offset: float = 0.0
) -> Callable[[Observation], float]:
    """A policy's `hazard(obs) -> rate per second`: the forecast made at the last bin boundary
    before trace time `offset + obs.now`, from the bins before it (cached per boundary). Past
    the end of the trace, the last boundary's forecast."""
    cache: dict[int, float] = {}

    def hazard(obs: Observation) -> float:
        k = min(len(bins), max(1, int((offset + obs.now) // bins.width)))
        if k not in cache:
            cache[k] = forecaster.forecast(bins.head(k), horizon).rate_per_second
        return cache[k]

    hazard.__qualname__ = f"forecast_hazard({forecaster!r})"
    return hazard
