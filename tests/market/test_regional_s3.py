"""Regional stores on S3 (`spotnb.market.regional`) against moto_server over real HTTP: two buckets in
two regions, the copy between them (the object-store path: no temp files, a PUT per file),
the restore from the copy, and the fall-back to the home bucket's copy when the regional one
is damaged. moto stands in for S3, which cannot run here."""

from __future__ import annotations

import uuid

import pytest
import torch

from spotnb.core.store import Store
from spotnb.market.regional import copy_checkpoint, newest_committed
from tests.support.clouds_fixtures import *  # noqa: F401,F403 - fixtures
from tests.support.jobs import Recorder, ckpt_save

KEY = b"k" * 32


@pytest.fixture
def buckets(aws_env: str) -> tuple[Store, Store]:
    import boto3

    out = []
    for region in ("us-east-1", "us-west-2"):
        name = f"spotnb-{region}-{uuid.uuid4().hex[:8]}"
        client = boto3.client("s3", region_name=region)
        extra = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
        client.create_bucket(Bucket=name, **extra)
        out.append(Store(f"s3://{name}/spot"))
    return out[0], out[1]


def test_a_checkpoint_copied_between_two_regions_buckets_restores_and_falls_back(buckets) -> None:
    from spotnb.runtime.checkpoint.checkpointer import Checkpointer

    home, west = buckets
    ck = Checkpointer(home, "job", 1, Recorder(), key=KEY)
    ckpt_save(ck, 10)
    ck.close()
    seq, _ = newest_committed(home, "job")
    copied, _ = copy_checkpoint(home, west, "job", seq)
    assert copied > 0 and newest_committed(west, "job")[0] == seq
    rec = Recorder()
    there = Checkpointer(west, "job", 2, rec, key=KEY, read_stores=[home])
    manifest, state = there.load_latest()
    assert manifest.step == 10 and there.restored_from == west.url
    assert torch.equal(state["objects"]["w"], torch.full((64, 64), 10.0))
    # a damaged object in the west bucket: the same checkpoint from the home bucket
    path = west.job("job", "ckpt", f"{seq:08d}", "state.pt")
    data = bytearray(west.read_bytes(path))
    data[len(data) // 2] ^= 0xFF
    west.write_bytes(path, bytes(data))
    again = Checkpointer(west, "job", 3, rec, key=KEY, read_stores=[home])
    manifest, _ = again.load_latest()
    assert manifest.seq == seq and again.restored_from == home.url
    assert west.url in rec.kinds("checkpoint_invalid")[0]["reason"]
    there.close()
    again.close()
