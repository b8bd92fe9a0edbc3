"""Real-cloud smoke test (costs a few cents): a tiny job on a real EC2 spot instance, end to end.

Skipped unless credentials are in the environment (AWS_ACCESS_KEY_ID or AWS_PROFILE) and
SPOTNB_REAL_AWS_STORE names an s3:// store. SPOTNB_REAL_INSTALL gives the pip spec the VM
installs spotnb from while it is not on PyPI (e.g. 'spotnb @ git+https://.../spotnb@main');
SPOTNB_REAL_AWS_TYPE the instance type (default g4dn.xlarge), SPOTNB_REAL_AWS_REGION the region.
See notebooks/03-clouds.ipynb, section "Smoke tests".
"""
from __future__ import annotations

import functools
import os

import pytest

import spotnb as spot
from tests.core import jobfns

pytestmark = pytest.mark.skipif(
    not (os.environ.get("SPOTNB_REAL_AWS_STORE")
         and (os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE"))),
    reason="real AWS smoke test: set AWS credentials and SPOTNB_REAL_AWS_STORE=s3://bucket/prefix")


def test_real_aws_job() -> None:
    install = os.environ.get("SPOTNB_REAL_INSTALL")
    cfg = spot.Config(provider="aws", store=os.environ["SPOTNB_REAL_AWS_STORE"],
                      instance_type=os.environ.get("SPOTNB_REAL_AWS_TYPE", "g4dn.xlarge"),
                      region=os.environ.get("SPOTNB_REAL_AWS_REGION", "us-east-1"),
                      requirements=[install] if install else [], ship_modules=["tests.core.jobfns"],
                      max_cost=1.0, heartbeat_timeout="15m")
    job = spot.train(functools.partial(jobfns.slow_steps, steps=20, step_time=0.1), cfg)
    try:
        assert job.result(timeout=1800) == 20
    finally:
        job.stop() if not job.done else None
    assert any(e["kind"] == "bootstrap" for e in job.events)
