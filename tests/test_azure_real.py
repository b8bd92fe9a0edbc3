"""Real-cloud smoke test (costs a few cents): a tiny job on a real Azure Spot VM, end to end.

Skipped unless AZURE_SUBSCRIPTION_ID and SPOTNB_REAL_AZURE_STORE (az://container/prefix) are
set, with SPOTNB_REAL_AZURE_RG, SPOTNB_REAL_AZURE_SUBNET, SPOTNB_REAL_AZURE_IDENTITY and
AZURE_STORAGE_ACCOUNT_NAME from the one-time setup in notebooks/03-clouds.ipynb; credentials
come from DefaultAzureCredential (env, `az login`). SPOTNB_REAL_INSTALL as for AWS.
"""
from __future__ import annotations

import functools
import os

import pytest

import spotnb as spot
from tests.core import jobfns

_NEEDED = ("AZURE_SUBSCRIPTION_ID", "SPOTNB_REAL_AZURE_STORE", "SPOTNB_REAL_AZURE_RG",
           "SPOTNB_REAL_AZURE_SUBNET", "SPOTNB_REAL_AZURE_IDENTITY", "AZURE_STORAGE_ACCOUNT_NAME")
pytestmark = pytest.mark.skipif(not all(os.environ.get(k) for k in _NEEDED),
                                reason="real Azure smoke test: set " + ", ".join(_NEEDED))


def test_real_azure_job() -> None:
    install = os.environ.get("SPOTNB_REAL_INSTALL")
    cfg = spot.Config(provider="azure", store=os.environ["SPOTNB_REAL_AZURE_STORE"],
                      instance_type=os.environ.get("SPOTNB_REAL_AZURE_TYPE", "Standard_NC4as_T4_v3"),
                      region=os.environ.get("SPOTNB_REAL_AZURE_LOCATION", "eastus"),
                      azure_resource_group=os.environ["SPOTNB_REAL_AZURE_RG"],
                      azure_subnet_id=os.environ["SPOTNB_REAL_AZURE_SUBNET"],
                      azure_identity_id=os.environ["SPOTNB_REAL_AZURE_IDENTITY"],
                      requirements=[install] if install else [], ship_modules=["tests.core.jobfns"],
                      max_cost=1.0, heartbeat_timeout="15m")
    job = spot.train(functools.partial(jobfns.slow_steps, steps=20, step_time=0.1), cfg)
    try:
        assert job.result(timeout=1800) == 20
    finally:
        job.stop() if not job.done else None
