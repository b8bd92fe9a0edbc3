"""How many GPUs an instance type has, where spotnb knows it (`Config.procs_per_instance` is
checked against it before anything launches; on the instance the default is
`torch.cuda.device_count()`).

A small dated table of the clouds' common GPU types (AWS, Azure, GCP documentation, read
2026-11) plus GCP's accelerator-optimised names, which say the count (`a2-highgpu-4g`,
`a3-highgpu-8g`). None for a type not in it: nothing is checked then.
"""

from __future__ import annotations

import re

__all__ = ["gpu_count"]

_TABLE: dict[str, int] = {
    # AWS
    "p3.2xlarge": 1,
    "p3.8xlarge": 4,
    "p3.16xlarge": 8,
    "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
    "g4dn.xlarge": 1,
    "g4dn.2xlarge": 1,
    "g4dn.4xlarge": 1,
    "g4dn.8xlarge": 1,
    "g4dn.16xlarge": 1,
    "g4dn.12xlarge": 4,
    "g4dn.metal": 8,
    "g5.xlarge": 1,
    "g5.2xlarge": 1,
    "g5.4xlarge": 1,
    "g5.8xlarge": 1,
    "g5.16xlarge": 1,
    "g5.12xlarge": 4,
    "g5.24xlarge": 4,
    "g5.48xlarge": 8,
    "g6.xlarge": 1,
    "g6.12xlarge": 4,
    "g6.48xlarge": 8,
    # Azure
    "Standard_NC6s_v3": 1,
    "Standard_NC12s_v3": 2,
    "Standard_NC24s_v3": 4,
    "Standard_NC24rs_v3": 4,
    "Standard_NC4as_T4_v3": 1,
    "Standard_NC8as_T4_v3": 1,
    "Standard_NC16as_T4_v3": 1,
    "Standard_NC64as_T4_v3": 4,
    "Standard_NC24ads_A100_v4": 1,
    "Standard_NC48ads_A100_v4": 2,
    "Standard_NC96ads_A100_v4": 4,
    "Standard_ND40rs_v2": 8,
    "Standard_ND96asr_v4": 8,
    "Standard_ND96amsr_A100_v4": 8,
    # GCP (the g2 family bundles L4s)
    "g2-standard-4": 1,
    "g2-standard-8": 1,
    "g2-standard-12": 1,
    "g2-standard-16": 1,
    "g2-standard-32": 1,
    "g2-standard-24": 2,
    "g2-standard-48": 4,
    "g2-standard-96": 8,
}

_GCP_ACCEL = re.compile(r"^a[23]-(?:high|mega|ultra|edge)gpu-(\d+)g$")


def gpu_count(instance_type: str) -> int | None:
    """The GPUs of `instance_type` (a `<cloud>/` prefix is ignored), or None when unknown."""
    name = instance_type.rsplit("/", 1)[-1]
    if name in _TABLE:
        return _TABLE[name]
    match = _GCP_ACCEL.match(name)
    return int(match.group(1)) if match else None
