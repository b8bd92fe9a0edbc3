"""spotnb: train on cheap spot / preemptible GPUs from a notebook, safely.

    import spotnb as spot
    job = spot.train(fit, spot.Config(provider="local", local_mttp="2m"))
    job.result()

Everything is imported lazily so `import spotnb` stays light and imports no cloud SDK.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "train",
    "run",
    "ctx",
    "attach",
    "resume",
    "jobs",
    "load_checkpoint",
    "Config",
    "Job",
    "JobFailed",
    "JobStopped",
    "ConfigError",
    "SpotnbError",
    "CheckpointError",
    "Breakdown",
    "policy",
    "__version__",
]

_LAZY = {
    "train": "spotnb.api",
    "run": "spotnb.script_job",
    "ctx": "spotnb.runtime.script.client",
    "attach": "spotnb.api",
    "resume": "spotnb.api",
    "jobs": "spotnb.api",
    "load_checkpoint": "spotnb.weights",
    "Config": "spotnb.settings.config",
    "Job": "spotnb.job",
    "Breakdown": "spotnb.core.ledger",
    "JobFailed": "spotnb.errors",
    "JobStopped": "spotnb.errors",
    "ConfigError": "spotnb.errors",
    "SpotnbError": "spotnb.errors",
    "CheckpointError": "spotnb.errors",
    "_jupyter_labextension_paths": "spotnb._jupyter",
    "_jupyter_server_extension_points": "spotnb._jupyter",
}

if TYPE_CHECKING:
    from spotnb.api import attach, jobs, resume, train
    from spotnb.core.ledger import Breakdown
    from spotnb.errors import CheckpointError, ConfigError, JobFailed, JobStopped, SpotnbError
    from spotnb.job import Job
    from spotnb.runtime.script.client import ctx
    from spotnb.script_job import run
    from spotnb.settings.config import Config
    from spotnb.weights import load_checkpoint


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in ("policy", "sim"):
        return import_module(f"spotnb.{name}")
    raise AttributeError(f"module 'spotnb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
