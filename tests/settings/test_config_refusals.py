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
    # counts are whole numbers, strictly (issue #29 item 9: "3", 2.0 and "2" were taken)
    ({"instances": "3"}, "instances", "give the number itself: instances=3"),
    ({"instances": 3.0}, "instances", "a float; give a whole number: instances=3"),
    ({"procs_per_instance": 2.0}, "procs_per_instance", "procs_per_instance=2"),
    ({"procs_per_instance": "2"}, "procs_per_instance", "procs_per_instance=2"),
    ({"max_retries": " 2 "}, "max_retries", "max_retries=2"),
    ({"keep_last": "two"}, "keep_last", "whole number"),
    ({"save_every": 2.5}, "save_every", "whole number"),
    ({"save_every": math.nan}, "save_every", "whole number"),
    ({"min_instances": True}, "min_instances", "whole number"),
    ({"instances": -0.0}, "instances", "a float"),
    ({"instances": 10**400}, "instances", "past 2**53"),  # formatting it raised OverflowError
    ({"keep_last": 2**60}, "keep_last", "past 2**53"),
    ({"max_crashes": [3]}, "max_crashes", "whole number"),
    ({"keep_last": None}, "keep_last", "the default is keep_last=2"),
    ({"coordinator_idle_minutes": 10**6}, "coordinator_idle_minutes", "10080"),
    # one spelling per sync strategy (" ddp" was a strategy that was not ddp everywhere else)
    ({"instances": 2, "sync": " ddp"}, "sync", "sync='ddp'"),
    ({"instances": 2, "sync": "DDP"}, "sync", "sync='ddp'"),
    ({"instances": 2, "sync": "local_sgd: 8"}, "sync", "sync='local_sgd:8'"),
    ({"sync": " ddp"}, "sync", "sync='ddp'"),
    # regions: somewhere to run, each named once
    ({"regions": []}, "regions", "nowhere to run"),
    ({"regions": [""]}, "regions", "empty name"),
    ({"regions": ["us-east-1", " us-west-2"]}, "regions", "write 'us-west-2'"),
    ({"regions": ["a", "b", "a"]}, "regions", "names 'a' twice"),
    ({"regions": "us-east-1"}, "regions", "regions=['us-east-1']"),
    ({"regions": "Cheapest"}, "regions", "regions='cheapest'"),
    ({"regions": [None]}, "regions", "region's name"),
    ({"regions": ["x" * 10_000]}, "regions", "no region's name"),
    ({"region": ""}, "region", "empty name"),
    ({"region": "eu-west-1\n"}, "region", "write 'eu-west-1'"),
    ({"region": "eu\x00west"}, "region", "no region's name"),
    # a zone priced from the table next to zones with their own prices
    ({"local_regions": {"zone-a": {"price": 0.1}, "zone-b": {}}}, "local_regions", "'zone-b' has no price"),
    ({"local_regions": {"zone-a": {"price": 0.1}, "zone-b": {"price": None}}}, "local_regions", "no price"),
    # more processes than any instance runs (the local market's limit is checked at submit)
    ({"procs_per_instance": 9999}, "procs_per_instance", "more than 256"),
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
        {"instances": 2, "sync": "local_sgd:8", "min_instances": 1, "keep_last": 3, "max_retries": 0},
        {"instances": 2, "sync": "auto"},
        {"save_every": None, "max_preemptions": None, "max_stalled_relaunches": None},
        {"regions": ["us-east-1", "us-west-2"], "provider": "aws"},
        {"regions": "cheapest", "region": None},
        {"local_regions": {"zone-a": {}, "zone-b": {}}},  # every zone on the table's price
        {"procs_per_instance": 16, "provider": "aws", "instance_type": "x9.huge"},
        {"heartbeat_timeout": "90s", "max_wait": "1h"},  # durations as text are durations
    ],
)
def test_sane_values_still_pass(kwargs: dict) -> None:
    spot.Config(**kwargs)


def test_numpy_integers_are_counts_and_negative_zero_is_no_price() -> None:
    np = pytest.importorskip("numpy")
    config = spot.Config(instances=np.int64(1), keep_last=np.int32(3), price_spot=-0.0)
    assert config.instances == 1 and type(config.instances) is int and type(config.keep_last) is int
    assert str(config.price_spot) == "0.0"  # it was -0.0: "$-0.00/h"


def test_more_processes_than_the_local_machine_runs_are_refused_at_submit(monkeypatch, tmp_path) -> None:
    """procs_per_instance=9999 passed on the local market: every process of a local instance
    runs here, so the limit is this machine's (its cores; its GPUs where CUDA has some)."""
    import spotnb.market.gpus

    monkeypatch.chdir(tmp_path)
    config = spot.Config(procs_per_instance=3)  # a Config read back on a bigger machine stays valid
    monkeypatch.setattr(spotnb.market.gpus, "local_gpus", lambda: 0)
    monkeypatch.setattr(spotnb.market.gpus.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    with pytest.raises(
        ConfigError,
        match=r"Config.procs_per_instance: 3 .* more than the 2 CPU cores .* procs_per_instance=2",
    ):
        spot.train(lambda ctx: None, config, dry_run=True)
    monkeypatch.setattr(spotnb.market.gpus, "local_gpus", lambda: 1)
    with pytest.raises(ConfigError, match=r"the 1 GPU CUDA sees on this machine .* procs_per_instance=1"):
        spot.train(lambda ctx: None, spot.Config(procs_per_instance=2), dry_run=True)
    assert spot.jobs() == []


def test_the_gpus_cuda_sees_without_importing_torch(monkeypatch) -> None:
    import sys

    import spotnb.market.gpus

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(spotnb.market.gpus.os, "listdir", lambda path: ["0000:01:00.0", "0000:02:00.0"])
    for visible, seen in ((None, 2), ("0", 1), ("1,0", 2), ("", 0), ("-1", 0), ("0,-1,1", 1), ("0,1,2,3", 2)):
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert spotnb.market.gpus.local_gpus() == seen, visible


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
