"""Real-cloud smoke tests (a few cents each): a tiny job on a real spot VM, end to end.

Each is skipped unless its cloud's credentials and a store are in the environment (the skip
reason lists the variables); credentials come from each SDK's own chain. The VM installs this
checkout's spotnb, shipped through the store (Config.spotnb_source="store"); SPOTNB_REAL_INSTALL
gives a pip spec to install instead (e.g. 'spotnb @ git+https://.../spotnb@main'). See
notebooks/03-clouds.ipynb, "Smoke tests".
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pytest

import spotnb as spot
from tests.support import jobfns

env = os.environ.get


def _aws() -> dict[str, Any]:
    return dict(
        store=env("SPOTNB_REAL_AWS_STORE"),
        instance_type=env("SPOTNB_REAL_AWS_TYPE", "g4dn.xlarge"),
        region=env("SPOTNB_REAL_AWS_REGION", "us-east-1"),
    )


def _azure() -> dict[str, Any]:
    return dict(
        store=env("SPOTNB_REAL_AZURE_STORE"),
        instance_type=env("SPOTNB_REAL_AZURE_TYPE", "Standard_NC4as_T4_v3"),
        region=env("SPOTNB_REAL_AZURE_LOCATION", "eastus"),
        azure_resource_group=env("SPOTNB_REAL_AZURE_RG"),
        azure_subnet_id=env("SPOTNB_REAL_AZURE_SUBNET"),
        azure_identity_id=env("SPOTNB_REAL_AZURE_IDENTITY"),
    )


def _gcp() -> dict[str, Any]:
    return dict(
        store=env("SPOTNB_REAL_GCP_STORE"),
        instance_type=env("SPOTNB_REAL_GCP_TYPE", "g2-standard-4"),
        region=env("SPOTNB_REAL_GCP_ZONE", "us-central1-a"),
        gcp_project=env("GOOGLE_CLOUD_PROJECT"),
    )


CLOUDS: dict[str, tuple[tuple[str, ...], Callable[[], dict[str, Any]]]] = {
    "aws": (("SPOTNB_REAL_AWS_STORE", "AWS_ACCESS_KEY_ID|AWS_PROFILE"), _aws),
    "azure": (
        (
            "AZURE_SUBSCRIPTION_ID",
            "SPOTNB_REAL_AZURE_STORE",
            "SPOTNB_REAL_AZURE_RG",
            "SPOTNB_REAL_AZURE_SUBNET",
            "SPOTNB_REAL_AZURE_IDENTITY",
            "AZURE_STORAGE_ACCOUNT_NAME",
        ),
        _azure,
    ),
    "gcp": (("GOOGLE_CLOUD_PROJECT", "SPOTNB_REAL_GCP_STORE"), _gcp),
}


def _missing(needed: tuple[str, ...]) -> list[str]:
    return [n for n in needed if not any(env(alt) for alt in n.split("|"))]


@pytest.mark.parametrize("provider", sorted(CLOUDS))
def test_real_spot_job(provider: str) -> None:
    needed, settings = CLOUDS[provider]
    if _missing(needed):
        pytest.skip(f"real {provider} smoke test: set {', '.join(_missing(needed))}")
    install = env("SPOTNB_REAL_INSTALL")
    cfg = spot.Config(
        provider=provider,
        spotnb_source=install or "store",
        ship_modules=["tests.support.jobfns"],
        max_cost=1.0,
        heartbeat_timeout="15m",
        **settings(),
    )
    job = spot.train(functools.partial(jobfns.slow_steps, steps=20, step_time=0.1), cfg)
    try:
        assert job.result(timeout=1800) == 20
    finally:
        if not job.done:
            job.stop()
    assert any(e["kind"] == "bootstrap" for e in job.events)
