"""What moving a checkpoint between the store and a zone costs, in dollars and seconds.

The store stays where it is (one URI for the whole job): a zone in another region, or on
another cloud, reads the checkpoint across at each start and writes each save back across.
The clouds bill the bytes that leave a region (egress); ingress is free. This module prices
one copy of the checkpoint (`transfer_to`), and `spotnb.market.placement` multiplies it by the
expected number of copies.

Egress list prices, $/GB, the first tier (10 TB a month; 1 TB for GCP) of each cloud's public
price page, read 2026-11 (they have not changed since 2024): AWS "Data Transfer" on
https://aws.amazon.com/ec2/pricing/on-demand/ (between regions $0.02 for most pairs, $0.01
us-east-1 ↔ us-east-2, up to $0.09 from South America/Middle East; out to the internet $0.09);
Azure https://azure.microsoft.com/pricing/details/bandwidth/ (between regions within a
continent $0.02, across continents $0.05; internet egress $0.087); GCP
https://cloud.google.com/vpc/network-pricing (between regions within a continent $0.02,
across continents $0.05–0.08; internet egress, Premium tier, $0.12). The table keeps one
figure per cloud and route: the common in-continent inter-region rate and the first-tier
internet rate. Within one region reading the store is free (S3, GCS and Blob Storage charge
nothing to a VM of the same region), and the local market is one machine.

The transfer time is the bytes at `BANDWIDTH`, an assumed 50 MB/s (400 Mbit/s: what a single
object-store stream sustains across regions; within a region the measured restart already
holds the restore).
"""

from __future__ import annotations

import math
from typing import Any

from spotnb.market.placement import Transfer

__all__ = [
    "EGRESS",
    "EGRESS_DATE",
    "BANDWIDTH",
    "NOMINAL_CHECKPOINT_BYTES",
    "store_cloud",
    "egress_per_gb",
    "transfer_to",
    "checkpoint_bytes",
]

#: when the egress figures were read (see the module's docstring for the pages)
EGRESS_DATE = "2026-11"
#: cloud → {"region": $/GB between two of its regions, "internet": $/GB out of the cloud}
EGRESS: dict[str, dict[str, float]] = {
    "aws": {"region": 0.02, "internet": 0.09},
    "azure": {"region": 0.02, "internet": 0.087},
    "gcp": {"region": 0.02, "internet": 0.12},
}
#: bytes/s a checkpoint is assumed to move at between regions or clouds
BANDWIDTH = 50e6
#: the checkpoint size assumed before the job's first save is committed (1 GB: a ~100 M
#: parameter model with its Adam state in fp32); the latest committed checkpoint's size after
NOMINAL_CHECKPOINT_BYTES = 1e9

#: store URL scheme → the cloud its bytes live on (file://, memory://: this machine)
_SCHEMES = {
    "s3": "aws",
    "s3a": "aws",
    "gs": "gcp",
    "gcs": "gcp",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "adl": "azure",
}


def store_cloud(url: str) -> str | None:
    """The cloud a store URL's bytes live on; None for a store on this machine or unknown."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return _SCHEMES.get(scheme)


def egress_per_gb(
    src: tuple[str | None, str | None], dst: tuple[str | None, str | None]
) -> tuple[float, str]:
    """$/GB to copy bytes from `src` to `dst`, each (cloud, region), and the route in words.
    A region that is not known (None) on the same cloud is taken as another region: the
    figure then errs towards the cost of crossing, never towards a free ride."""
    (src_cloud, src_region), (dst_cloud, dst_region) = src, dst
    if src_cloud is None or dst_cloud is None or src_cloud not in EGRESS:
        return 0.0, "same place"  # a store on this machine, the local market
    if src_cloud != dst_cloud:
        return EGRESS[src_cloud]["internet"], f"across clouds ({src_cloud} → {dst_cloud})"
    if src_region is not None and src_region == dst_region:
        return 0.0, "same region"
    return EGRESS[src_cloud]["region"], "across regions"


def transfer_to(
    store: tuple[str | None, str | None],
    zone: tuple[str | None, str | None],
    nbytes: float,
    restore_first: bool,
) -> Transfer:
    """Moving a checkpoint of `nbytes` between the store and a zone, each (cloud, region):
    restores leave the store's region (its cloud's rate), saves leave the zone's."""
    per_gb, route = egress_per_gb(store, zone)
    back, _ = egress_per_gb(zone, store)
    if route in ("same region", "same place"):
        return Transfer(nbytes, 0.0, 0.0, restore_first, route)
    return Transfer(nbytes, per_gb, nbytes / BANDWIDTH, restore_first, route, back)


def checkpoint_bytes(state: Any) -> tuple[float, bool]:
    """(bytes of one checkpoint, whether one was committed) from a JobState: the largest of
    the last ten checkpoints' `bytes` + `referenced_bytes` (what a restore reads: an incremental
    checkpoint writes only what changed; a log older than that field counts only the bytes
    written); `NOMINAL_CHECKPOINT_BYTES` before the first save."""
    saves = list(getattr(state, "checkpoints", None) or [])
    sizes = [
        float(getattr(save, "nbytes", 0) or 0) + float(getattr(save, "referenced_bytes", 0) or 0)
        for save in saves[-10:]
    ]
    # a corrupt record's size (inf, NaN, negative) is no size: inf bytes × a free link would
    # price a zone at NaN, which sorts anywhere
    biggest = max((s for s in sizes if math.isfinite(s) and s > 0), default=0.0)
    return (biggest if biggest > 0 else NOMINAL_CHECKPOINT_BYTES), bool(saves)
