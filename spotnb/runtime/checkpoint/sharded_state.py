"""What a sharded job's checkpoint holds: `ctx.track`'s state as one DCP state dict.

A job whose tracked model holds `DTensor`s (FSDP2's `fully_shard` inside the instance's group,
`Config.procs_per_instance`) is saved by `ShardedCheckpointer` on every rank at once. Its DCP
state dict holds everything a resume needs, so that one `MANIFEST.json` commits all of it
together (a second, rank-0 checkpoint for the step and RNG could commit without the shards or
the reverse, and the job would resume weights of one step with the counters of another):

- `model.<name>`: `get_model_state_dict` of each tracked module (DTensors: each rank writes
  its own shard; DCP reshards them into another number of processes on load);
- `optim.<name>`: `get_optimizer_state_dict` of each tracked optimizer, paired with the
  tracked module that owns its parameters;
- `spotnb.shared`: rank 0's step, `ctx.state` and the other tracked objects' state dicts
  (scheduler, data position: the same on every rank), pickled into one bytes leaf;
- `spotnb.rng.<rank>`: each rank's own RNG states (ranks draw different dropout masks and
  batches), restored to the same rank; a rank that did not exist when the checkpoint was
  written keeps its fresh RNG (a resharded resume is exact in the weights, not in the draws).
"""

from __future__ import annotations

import io
from collections.abc import Collection
from typing import Any

import cloudpickle
import torch

from spotnb.runtime.checkpoint import moved

__all__ = ["has_dtensors", "save_state", "load_template", "apply_loaded", "SHARED", "rng_key"]

SHARED = "spotnb.shared"


def rng_key(rank: int) -> str:
    return f"spotnb.rng.{rank}"


def _is_dtensor(t: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(t, DTensor)


def has_dtensors(tracked: dict[str, Any]) -> bool:
    """Whether any tracked module has a `DTensor` parameter (the job is sharded)."""
    for obj in tracked.values():
        if isinstance(obj, torch.nn.Module) and any(_is_dtensor(p) for p in obj.parameters()):
            return True
    return False


def _owner(tracked: dict[str, Any], name: str, optim: torch.optim.Optimizer) -> torch.nn.Module:
    """The tracked module whose parameters `optim` trains (DCP's optimizer state is keyed by
    the module's parameter names)."""
    inner = getattr(optim, "optim", optim)  # a spotnb wrapper's optimizer
    wanted = {id(p) for g in inner.param_groups for p in g["params"]}
    for obj in tracked.values():
        if isinstance(obj, torch.nn.Module) and wanted & {id(p) for p in obj.parameters()}:
            return obj
    raise ValueError(
        f"ctx.track({name}=...): this optimizer trains parameters of no tracked module; track the "
        "sharded model with it (ctx.track(model=model, optimizer=opt)) so its state can be sharded"
    )


def _pickled(value: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(value, buf, pickle_module=cloudpickle)  # the notebook's classes by value, as upload's
    return buf.getvalue()


def _unpickled(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False, pickle_module=moved.pickle_module)


def _parts(tracked: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    modules = {n: o for n, o in tracked.items() if isinstance(o, torch.nn.Module)}
    optims = {
        n: o
        for n, o in tracked.items()
        if isinstance(o, torch.optim.Optimizer)
        or isinstance(getattr(o, "optim", None), torch.optim.Optimizer)
    }
    others = {n: o for n, o in tracked.items() if n not in modules and n not in optims}
    return modules, optims, others


def save_state(
    tracked: dict[str, Any], shared: dict[str, Any], rng: dict[str, Any], rank: int
) -> dict[str, Any]:
    """The DCP state dict of this rank (see the module docstring). `shared`: step and user
    state, written by rank 0 only."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    modules, optims, others = _parts(tracked)
    out: dict[str, Any] = {f"model.{n}": get_model_state_dict(m) for n, m in modules.items()}
    for n, o in optims.items():
        out[f"optim.{n}"] = get_optimizer_state_dict(_owner(tracked, n, o), getattr(o, "optim", o))
    if rank == 0:
        objects = {n: o.state_dict() for n, o in others.items()}
        out[SHARED] = _pickled({**shared, "objects": objects})
    out[rng_key(rank)] = _pickled(rng)
    return out


def load_template(tracked: dict[str, Any], saved_keys: Collection[str], rank: int) -> dict[str, Any]:
    """The state dict DCP loads into on this rank: the current (sharded) layout of every
    tracked model and optimizer, and the bytes leaves the checkpoint has."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    modules, optims, _ = _parts(tracked)
    out: dict[str, Any] = {f"model.{n}": get_model_state_dict(m) for n, m in modules.items()}
    for n, o in optims.items():
        out[f"optim.{n}"] = get_optimizer_state_dict(_owner(tracked, n, o), getattr(o, "optim", o))
    out[SHARED] = b""
    if rng_key(rank) in saved_keys:
        out[rng_key(rank)] = b""
    return out


def apply_loaded(tracked: dict[str, Any], loaded: dict[str, Any], rank: int) -> tuple[dict[str, Any], Any]:
    """Put what DCP loaded into the tracked objects; returns (rank 0's shared part with the
    other objects' states, this rank's RNG state or None)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    modules, optims, others = _parts(tracked)
    for n, m in modules.items():
        set_model_state_dict(m, loaded[f"model.{n}"])
    for n, o in optims.items():
        set_optimizer_state_dict(_owner(tracked, n, o), getattr(o, "optim", o), loaded[f"optim.{n}"])
    shared = _unpickled(loaded[SHARED])
    for n, o in others.items():
        if n in shared.get("objects", {}):
            o.load_state_dict(shared["objects"][n])
    raw = loaded.get(rng_key(rank))
    return shared, (_unpickled(raw) if raw else None)
