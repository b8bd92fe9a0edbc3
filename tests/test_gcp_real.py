"""Real-cloud smoke test (costs a few cents): a tiny job on a real GCE Spot VM, end to end.

Skipped unless GOOGLE_CLOUD_PROJECT and SPOTNB_REAL_GCP_STORE (gs://bucket/prefix) are set;
credentials come from Application Default Credentials (`gcloud auth application-default
login` or GOOGLE_APPLICATION_CREDENTIALS). SPOTNB_REAL_INSTALL as for AWS.
"""
from __future__ import annotations

import functools
import os

import pytest

import spotnb as spot
from tests.core import jobfns

pytestmark = pytest.mark.skipif(
    not (os.environ.get("GOOGLE_CLOUD_PROJECT") and os.environ.get("SPOTNB_REAL_GCP_STORE")),
    reason="real GCP smoke test: set GOOGLE_CLOUD_PROJECT and SPOTNB_REAL_GCP_STORE=gs://bucket/prefix")


def test_real_gcp_job() -> None:
    install = os.environ.get("SPOTNB_REAL_INSTALL")
    cfg = spot.Config(provider="gcp", store=os.environ["SPOTNB_REAL_GCP_STORE"],
                      instance_type=os.environ.get("SPOTNB_REAL_GCP_TYPE", "g2-standard-4"),
                      region=os.environ.get("SPOTNB_REAL_GCP_ZONE", "us-central1-a"),
                      gcp_project=os.environ["GOOGLE_CLOUD_PROJECT"],
                      requirements=[install] if install else [], ship_modules=["tests.core.jobfns"],
                      max_cost=1.0, heartbeat_timeout="15m")
    job = spot.train(functools.partial(jobfns.slow_steps, steps=20, step_time=0.1), cfg)
    try:
        assert job.result(timeout=1800) == 20
    finally:
        job.stop() if not job.done else None
