"""Input that would hang, livelock or scatter a job is refused when the Config is made, with an
error naming the field and saying what to write instead (long before any instance exists)."""

from __future__ import annotations

import math

import pytest

import spotnb as spot
from spotnb.errors import ConfigError

REFUSED = [
    # durations: infinite, NaN, absurd
    ({"local_mttp": math.inf}, "local_mttp", "finite"),
    ({"local_mttp": "inf"}, "local_mttp", "finite"),
    ({"local_mttp": math.nan}, "local_mttp", "finite"),
    ({"local_mttp": "1000d"}, "local_mttp", "None for no random preemptions"),
    ({"local_mttp": 0}, "local_mttp", "positive"),
    ({"local_grace": math.inf}, "local_grace", "finite"),
    ({"local_grace": "3d"}, "local_grace", "notice"),
    ({"local_alloc_delay": math.inf}, "local_alloc_delay", "finite"),
    ({"local_alloc_delay": [0.1, math.inf]}, "local_alloc_delay", "finite"),
    ({"local_alloc_delay": "2d"}, "local_alloc_delay", "wait"),
    ({"local_schedule": [math.inf]}, "local_schedule", "finite"),
    ({"local_schedule": [{"after": "1e400"}]}, "local_schedule", "finite"),
    ({"local_schedule": ["365d"]}, "local_schedule", "30 d"),
    ({"notice_poll": math.inf}, "notice_poll", "finite"),
    ({"notice_poll": "1h"}, "notice_poll", "miss"),
    ({"heartbeat_timeout": "1000d"}, "heartbeat_timeout", "1 d"),
    ({"heartbeat_timeout": math.inf}, "heartbeat_timeout", "finite"),
    ({"heartbeat_timeout": "nan"}, "heartbeat_timeout", "finite"),
    # stores spotnb cannot write, or whose place depends on the working directory
    ({"store": "http://example.com/spot"}, "store", "only be read"),
    ({"store": "https://example.com/spot"}, "store", "only be read"),
    ({"store": "zip://a.zip"}, "store", "only be read"),
    ({"store": "nosuchfs://bucket"}, "store", "fsspec"),
    ({"store": "relative/dir"}, "store", "absolute"),
    ({"store": "./dir"}, "store", "absolute"),
    ({"store": "file://relative/dir"}, "store", "three slashes"),
    # prices: an infinite price billed every second of a job (issue #29 item 5)
    ({"price_spot": math.inf}, "price_spot", "finite"),
    ({"price_spot": "inf"}, "price_spot", "finite"),
    ({"price_spot": "1e400"}, "price_spot", "finite"),
    ({"price_spot": math.nan}, "price_spot", "finite"),
    ({"price_spot": -1}, "price_spot", ">= 0"),
    ({"price_spot": True}, "price_spot", "$/h"),
    ({"price_spot": "cheap"}, "price_spot", "$/h"),
    ({"price_on_demand": math.inf}, "price_on_demand", "finite"),
    ({"price_on_demand": math.nan}, "price_on_demand", "finite"),
    ({"coordinator_price": math.inf}, "coordinator_price", "finite"),
    # names
    ({"name": "x" * 1000}, "name", "at most"),
    ({"name": "evil\nname"}, "name", "control characters"),
    ({"name": "bell\x07"}, "name", "control characters"),
]


@pytest.mark.parametrize(
    "kwargs, field, hint", REFUSED, ids=[f"{f}={str(list(k.values())[0])[:20]}" for k, f, _ in REFUSED]
)
def test_refused_with_the_field_and_the_fix(kwargs: dict, field: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        spot.Config(**kwargs)
    message = str(info.value)
    assert f"Config.{field}" in message and hint in message, message


@pytest.mark.parametrize("kwargs, field, hint", REFUSED[:3])
def test_refused_on_assignment_too(kwargs: dict, field: str, hint: str) -> None:
    config = spot.Config()
    with pytest.raises(ConfigError, match=f"Config.{field}"):
        setattr(config, field, kwargs[field])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"store": "/abs/path"},
        {"store": "file:///abs/path"},
        {"store": "memory://x"},
        {"store": "s3://bucket/prefix"},
        {"store": "gs://bucket/p"},
        {"store": "az://c/p"},
        {"local_mttp": "6s", "local_grace": 0, "local_alloc_delay": [0, "2m"]},
        {"heartbeat_timeout": "1h", "notice_poll": "30s"},
        {"name": "ünïcode name – fine " * 5},
        {"local_schedule": ["30d", {"after": 0}]},
        {"price_spot": 0, "price_on_demand": "9.5"},
    ],
)
def test_sane_values_still_pass(kwargs: dict) -> None:
    spot.Config(**kwargs)


def test_refused_before_anything_is_launched(tmp_path, monkeypatch) -> None:
    """A relative store never reaches `train`: no job, no instance, no folder in the cwd."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="Config.store"):
        spot.train(lambda ctx: None, spot.Config(store="rel/store"))
    assert not (tmp_path / "rel").exists()


def test_a_config_shows_what_was_set_not_every_clouds_fields() -> None:
    config = spot.Config(instances=2, local_mttp="2m")
    shown = repr(config)
    assert shown == "Config(local_mttp=120.0, instances=2)" and str(config) == shown
    assert "azure_" not in repr(spot.Config()) and repr(spot.Config()) == "Config()"
    assert "gcp_project" in config.model_dump()  # everything is still there
