"""How many GPUs an instance type has, where spotnb knows it (`Config.procs_per_instance` is
checked against it before anything launches; on the instance the default is
`torch.cuda.device_count()`).

A small dated table of the clouds' common GPU types (AWS, Azure, GCP documentation, read
2026-11) plus GCP's accelerator-optimised names, which say the count (`a2-highgpu-4g`,
`a3-highgpu-8g`). None for a type not in it: nothing is checked then.
"""

from __future__ import annotations

import os
import re
import sys

__all__ = ["gpu_count", "local_gpus", "local_capacity"]

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


def local_gpus() -> int:
    """The CUDA devices of this machine, as the local market's instances would see them:
    torch's count if torch is imported already (a CPU build sees none), else the NVIDIA
    driver's GPUs (`/proc/driver/nvidia/gpus`) narrowed by CUDA_VISIBLE_DEVICES, without the
    2-3 s of importing torch to validate a Config."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
        except Exception:  # noqa: BLE001 - a broken CUDA install runs on CPU, as the instance would
            return 0
    try:
        found = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    count = 0
    for entry in visible.split(","):  # CUDA stops at the first invalid entry ("-1" hides all)
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return min(count, found)


def local_capacity() -> tuple[int, str]:
    """The most processes one local-market instance can run here, and what sets it: the GPUs
    when CUDA has any (each local rank drives its own: `runtime.local_group`), else the cores
    this process may run on (its affinity, as a container's or `taskset`'s limit)."""
    gpus = local_gpus()
    if gpus:
        return gpus, f"the {gpus} GPU{'s' if gpus > 1 else ''} CUDA sees on this machine"
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity
        cores = os.cpu_count() or 1
    return cores, f"the {cores} CPU core{'s' if cores > 1 else ''} this machine gives spotnb"
