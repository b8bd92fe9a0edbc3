"""Preemption-rate forecasts (spotnb.market.forecast): binning, the naive baseline, a forecaster that
follows a step change, fallbacks, the missing-extra error, and the policy hook."""

from __future__ import annotations

import math
import sys

import pytest

from spotnb.market.forecast import (
    INSTALL_HINT,
    Binned,
    LastWindow,
    NaiveRate,
    StatsmodelsRate,
    bin_trace,
    forecast_hazard,
    rolling_evaluation,
)
from spotnb.policy import Adaptive, Observation, SaveKind
from spotnb.traces import Trace, bundled_traces, load_trace

LIVE = 50


def step_trace(low: float = 0.2, high: float = 1.0, hours: float = 12.0) -> Trace:
    """`LIVE` instances, each preempted one replaced at once; the rate per instance-hour is `low`
    for the first half and `high` for the second, removals evenly spaced."""
    times: list[float] = [0.0]
    added, removed, counts = [LIVE], [0], [LIVE]
    half = hours * 3600.0 / 2
    for start, rate in ((0.0, low), (half, high)):
        gap = 3600.0 / (rate * LIVE)
        t = start + gap / 2
        while t < start + half:
            times.append(t)
            added.append(1)
            removed.append(1)
            counts.append(LIVE)
            t += gap
    return Trace("step", tuple(times), tuple(added), tuple(removed), tuple(counts), hours * 3600.0)


@pytest.mark.parametrize("width", [600.0, 420.0, 3600.0])
def test_binning_conserves_events_and_exposure(width: float) -> None:
    for name in bundled_traces():
        tr = load_trace(name)
        bins = bin_trace(tr, width)
        assert len(bins) == math.ceil(tr.span / width)
        assert sum(bins.events) == tr.removals
        assert sum(bins.exposure) == pytest.approx(tr.exposure, rel=1e-12)
        # the hourly bins are the trace's own hazard profile
        if width == 3600.0:
            rates = [r / 3600.0 if r is not None else 0.0 for r in bins.rates]
            assert rates == pytest.approx(tr.hazard_by_time(3600.0), rel=1e-9)


def test_naive_is_the_traces_censored_mttp() -> None:
    for name in bundled_traces():
        tr = load_trace(name)
        fc = NaiveRate().forecast(bin_trace(tr), 3600.0)
        assert fc.fallback is None
        assert fc.mttp == pytest.approx(tr.mttp, rel=1e-9)
        assert fc.low is not None and fc.high is not None and fc.low < fc.rate < fc.high


def test_forecasts_follow_a_step_up_and_beat_naive() -> None:
    bins = bin_trace(step_trace(0.2, 1.0))
    history = bins.head(54)  # 9 h: three hours into the high regime
    naive = NaiveRate().forecast(history, 3600.0)
    assert naive.rate == pytest.approx((0.2 * 6 + 1.0 * 3) / 9, rel=0.05)
    for f in (LastWindow(6), StatsmodelsRate("ets"), StatsmodelsRate("arma")):
        fc = f.forecast(history, 3600.0)
        assert fc.fallback is None, fc.fallback
        assert abs(fc.rate - 1.0) < 0.5 * abs(naive.rate - 1.0), (f, fc.rate, naive.rate)
        assert fc.mttp == pytest.approx(3600.0 / fc.rate)
    ets = StatsmodelsRate("ets").forecast(history, 3600.0)
    assert ets.low is not None and ets.high is not None and ets.low <= ets.rate <= ets.high
    # rolling origins across the step: lower error than naive for the window and ETS
    res = rolling_evaluation(bins, [NaiveRate(), LastWindow(6), StatsmodelsRate("ets")], 3600.0, 3 * 3600.0)
    assert res["naive"].origins == 72 - 18 - 6 + 1 and res["naive"].fallbacks == 0
    assert res["last6"].mae < 0.7 * res["naive"].mae
    assert res["ets"].mae < 0.7 * res["naive"].mae


def test_short_history_falls_back_with_a_reason(caplog: pytest.LogCaptureFixture) -> None:
    bins = bin_trace(step_trace())
    caplog.set_level("INFO", logger="spotnb.market.forecast")
    fc = StatsmodelsRate(min_bins=12).forecast(bins.head(5), 3600.0)
    assert fc.fallback is not None and "5 bins" in fc.fallback
    assert fc.rate == NaiveRate().forecast(bins.head(5), 3600.0).rate
    assert "5 bins" in caplog.text


def test_failed_fit_falls_back_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    model = StatsmodelsRate("ets")

    def broken(*args: object, **kwargs: object) -> object:
        raise ValueError("singular")

    monkeypatch.setattr(model, "_ets", broken)
    bins = bin_trace(step_trace())
    fc = model.forecast(bins.head(40), 3600.0)
    assert fc.fallback == "fit failed: ValueError: singular"
    assert fc.rate == NaiveRate().forecast(bins.head(40), 3600.0).rate


def test_missing_statsmodels_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in list(sys.modules):
        if mod == "statsmodels" or mod.startswith("statsmodels."):
            monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.setitem(sys.modules, "statsmodels", None)
    with pytest.raises(ImportError, match=r"pip install 'spotnb\[forecast\]'"):
        StatsmodelsRate()
    assert INSTALL_HINT == "pip install 'spotnb[forecast]'"


def test_adaptive_reads_its_mttp_from_a_forecast_hazard() -> None:
    obs = Observation(
        step=0, step_time=1.0, snapshot_time=10.0, upload_time=60.0, mttp=3600.0, restart_time=100.0, grace=30
    )
    plain = Adaptive().next_save(obs, 0)
    assert plain is not None and plain.kind is SaveKind.INSURANCE
    same = Adaptive(hazard=lambda o: 1 / 3600.0).next_save(obs, 0)
    assert same == plain
    riskier = Adaptive(hazard=lambda o: 4 / 3600.0).next_save(obs, 0)
    assert riskier is not None and riskier.step < plain.step
    assert Adaptive(hazard=lambda o: 0.0).next_save(obs, 0) is None  # no risk: no insurance
    # forecast_hazard: the forecast made at the last bin boundary before offset + now
    bins = bin_trace(step_trace(0.2, 1.0))
    hazard = forecast_hazard(bins, LastWindow(6), offset=9 * 3600.0)
    assert hazard(obs) * 3600.0 == pytest.approx(1.0, rel=0.05)
    assert hazard(obs.with_(now=-6 * 3600.0)) * 3600.0 == pytest.approx(0.2, rel=0.15)


def test_shrinkage_tames_bins_with_few_instances_alive() -> None:
    """A bin where one instance was alive for a minute and died has a raw rate of 60/h; the
    series the model sees pulls it toward the trailing rate, and leaves full bins nearly alone."""
    bins = bin_trace(step_trace(0.5, 0.5, hours=4.0))
    raw = Binned(bins.width, bins.events + (1,), bins.exposure + (60.0,))
    model = StatsmodelsRate()
    shrunk = model.series(raw)
    assert raw.rates[-1] == pytest.approx(60.0)
    assert shrunk[-1] is not None and shrunk[-1] < 1.0
    full = [r for r in shrunk[:-1] if r is not None]
    assert sum(full) / len(full) == pytest.approx(0.5, rel=0.05)
    assert StatsmodelsRate(shrink=0).series(raw) == raw.rates
