"""provider="any" given bad input: each a clear error naming the field and the fix, before
anything launches. The clouds' compute control planes are mocked as in
tests/providers/test_any_cloud.py (recording fakes for Azure and GCP, moto for AWS); the validation,
the zone names and the placement are the real ones."""

from __future__ import annotations

import pytest

import spotnb as spot
from spotnb.errors import ConfigError
from spotnb.providers import multi
from tests.providers.test_any_cloud import _config, _Retail, _spec, clouds, retail  # noqa: F401,F811 - fixtures
from tests.support import jobfns
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures


def test_zones_on_clouds_that_any_clouds_leaves_out_are_named_as_such() -> None:
    """Not "found credentials for none of the clouds": the credentials are not the problem."""
    with pytest.raises(ConfigError, match=r"any_clouds.*'gcp/us-central1-a'.*gcp") as err:
        _config(any_clouds=["aws"], regions=["gcp/us-central1-a"])
    assert "credentials" not in str(err.value)
    _config(any_clouds=["aws", "gcp"], regions=["gcp/us-central1-a"])  # fine


def test_an_empty_zone_list_is_refused_as_such() -> None:
    with pytest.raises(ConfigError, match=r"regions: .*empty.*'cheapest'"):
        _config(regions=[])


def test_cheapest_with_no_zone_priced_anywhere_is_refused_before_a_launch(
    clouds: _Retail,  # noqa: F811 - the fixture
    s3_store_url: str,
) -> None:
    """regions='cheapest' on a cloud that prices no zone (GCP's dated table has no regions,
    an instance type no cloud offers): the controller has no zone to pick. A launch must not
    go out to a default region of the first cloud with it; it says what to fix."""
    config = _config(store=s3_store_url, instance_type={"gcp": "g2-standard-4"}, regions="cheapest")
    p = multi.AnyCloudProvider(config)
    assert p.prices("gcp:g2-standard-4") == {}
    with pytest.raises(ConfigError, match=r"instance_type: no zone of gcp .*regions=\['gcp/"):
        p.launch(_spec(None))
    assert p.sub("gcp").gce.adapter.requests == []  # nothing was asked of the cloud
    plan = spot.train(jobfns.slow_steps, config, dry_run=True)
    assert "no zone" in str(plan)
    p.close()
