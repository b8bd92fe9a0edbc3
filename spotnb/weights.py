"""The trained weights out of the store: a checkpoint's tracked state in the notebook, and files
that other tools read.

    ckpt = job.checkpoint()               # or spot.load_checkpoint(job_id), from any process
    model.load_state_dict(ckpt["model"])  # what ctx.track(model=...) tracked; ckpt.step, ckpt.state
    spotnb export JOB_ID out/             # out/model.safetensors (safetensors.torch.load_file)

A checkpoint is read by the code that restores it on an instance (`runtime/checkpoint/checkpointer.py`:
every file checked against its signed manifest, chunked and incremental saves put together;
`runtime/checkpoint/sharded.py` for DCP checkpoints, loaded whole into this one process), never a second
reader. The manifest's signature is checked with the job's key, as `job.result()` does, so
from another machine the key file must be copied to the same place first. Nothing a checkpoint
backed up (`ctx.backup`) is put back where the instance had it: only `export` writes files,
into the folder it is given.

torch (and safetensors) are imported inside the functions: `import spotnb` stays light.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotnb.core.store import Store
from spotnb.errors import CheckpointError, SpotnbError

if TYPE_CHECKING:
    from spotnb.runtime.checkpoint.manifest import Manifest

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "load_checkpoint",
    "read_checkpoint",
    "export",
    "export_from",
    "job_key",
    "FORMATS",
]

log = logging.getLogger(__name__)

#: what `export` writes a tracked model as: safetensors (`<name>.safetensors`) or torch
#: (`<name>.pt`, `torch.save` of its state dict)
FORMATS = ("safetensors", "torch")
#: the prefix of the folders a Hugging Face Trainer writes (`checkpoint-<step>/`)
_HF_PREFIX = "checkpoint-"
_SYNC_KEY = "_spotnb_sync"  # the state `ctx.replicate` tracks itself (runtime/group/elastic.py)


class Checkpoint(dict):
    """The tracked state of one checkpoint: a dict of what `ctx.track` tracked, by name, each
    the object's `state_dict()` with its tensors on the CPU (`ckpt["model"]` loads with
    `model.load_state_dict`, `ckpt["optimizer"]` with `opt.load_state_dict`).

    Attributes: `step` (the steps done when it was saved: a resume goes on from there),
    `state` (`ctx.state`), `seq` (its folder's number), `kind` (periodic, emergency, ...),
    `job_id`, `sharded` (saved in DCP's format by several processes: its model state dicts are
    whole, its optimizers' are keyed by parameter name, as `get_optimizer_state_dict` returns
    them: load them with `torch.distributed.checkpoint.state_dict.set_optimizer_state_dict`),
    and `skipped` (the newer checkpoints passed over, each with why)."""

    def __init__(
        self,
        tracked: dict[str, Any],
        *,
        step: int,
        state: dict[str, Any],
        seq: int,
        kind: str,
        job_id: str,
        sharded: bool = False,
        skipped: list[str] | None = None,
    ) -> None:
        super().__init__(tracked)
        self.step, self.state, self.seq, self.kind = step, state, seq, kind
        self.job_id, self.sharded = job_id, sharded
        self.skipped = list(skipped or [])

    def __repr__(self) -> str:
        return (
            f"Checkpoint(job={self.job_id!r}, step={self.step}, seq={self.seq}, kind={self.kind!r}, "
            f"tracked={sorted(self)}, state={sorted(self.state)})"
        )

    def weights(self) -> dict[str, dict[str, Any]]:
        """The tracked models' state dicts (name -> parameter name -> tensor): the tracked
        objects whose state dict is a flat mapping of names to tensors (an optimizer's, a
        scheduler's are not)."""
        return {name: sd for name, sd in self.items() if _is_module_state(sd)}


def _is_module_state(sd: Any) -> bool:
    import torch

    if not isinstance(sd, dict) or not sd or "param_groups" in sd:
        return False
    values = [v for k, v in sd.items() if not str(k).endswith("_extra_state")]
    return (
        bool(values)
        and all(isinstance(k, str) for k in sd)
        and all(isinstance(v, torch.Tensor) for v in values)
    )


# -- finding the job ----------------------------------------------------------------------------
def _open(job_id: str, store: str | None) -> tuple[str, Store, bytes]:
    """(the full job id, its store, its key): from the job DB, or from `store` for a job this
    machine does not know. Raises SpotnbError saying what is missing."""
    from spotnb.control.jobdb import JobDB

    db = JobDB()
    row = db.job(job_id)
    if row is None and store is None:
        raise SpotnbError(
            f"no job {job_id!r} in {db.path}; pass store= (the job's Config.store URL) to read its "
            "checkpoints from the store directly"
        )
    full_id = row["id"] if row else job_id
    url = store or row["store"]  # type: ignore[index]
    try:
        st = Store(url)
        known = st.exists(st.job(full_id, "spec.json"))
    except Exception as exc:  # noqa: BLE001 - a store that cannot be opened or listed: say which
        raise SpotnbError(f"job {full_id}: cannot open its store {url!r}: {exc}") from None
    if not known:
        raise SpotnbError(f"job {full_id!r} is not in store {url!r} (no spec.json)")
    return full_id, st, job_key(full_id)


def job_key(job_id: str) -> bytes:
    """The job's key on this machine, or SpotnbError saying where to copy it."""
    from spotnb.core.signing import key_path, load_key

    key = load_key(job_id)
    if key is None:
        raise SpotnbError(
            f"job {job_id}: its key is not on this machine ({key_path(job_id)}), so its "
            "checkpoints cannot be verified and are not loaded; copy the key file from the "
            "machine that submitted the job to that path"
        )
    return key


def _read_stores(store: Store, job_id: str, key: bytes) -> list[Store]:
    """The job's regional stores (`Config.regional_stores`), from its signed spec: its
    checkpoints may be there. A spec that does not verify means a wrong key (or a forged spec):
    refused."""
    from spotnb.core.spec import SpecError, load_spec

    try:
        spec = load_spec(store, job_id, key)
    except SpecError as exc:
        raise SpotnbError(
            f"job {job_id}: its spec does not verify with the key on this machine: {exc}"
        ) from None
    urls = spec.config.get("regional_stores") or {}
    out = []
    for url in sorted(set(urls.values()) if isinstance(urls, dict) else ()):
        try:
            out.append(Store(url))
        except Exception as exc:  # noqa: BLE001 - a region out of reach: its copies are copies
            log.warning(
                "job %s: regional store %s cannot be opened: %s", job_id, url, exc, extra={"job_id": job_id}
            )
    return out


# -- reading -------------------------------------------------------------------------------------
@contextlib.contextmanager
def _reading(
    job_id: str, store: Store, key: bytes, step: int | None
) -> Iterator[tuple[Checkpoint, Manifest, dict[str, str]]]:
    """The checkpoint of `step` (None: the newest that verifies), its manifest and its
    backed-up files' verified local copies (manifest name -> path), valid inside the `with`:
    never put back at the paths the instance backed them up from (on the local market those
    are this machine's, a Trainer's `output_dir` that a restore would make what it was)."""
    from spotnb.core import protocol as ev
    from spotnb.runtime.checkpoint.checkpointer import Checkpointer

    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise SpotnbError(f"step={step!r}: a checkpoint's step is a non-negative int (or None: the newest)")
    events: list[Any] = []
    spool = tempfile.mkdtemp(prefix="spotnb-read-")
    ck = Checkpointer(
        store,
        job_id,
        0,
        events.append,
        key=key,
        spool_dir=spool,
        read_stores=_read_stores(store, job_id, key),
    )
    try:
        skipped: list[str] = []
        damaged: list[str] = []  # of the step asked for
        steps: list[int] = []
        for seq, found, where in ck._scan():  # newest first; a seq in several stores: each copy
            if found is None:  # an upload in flight, or one a preemption abandoned
                continue
            if isinstance(found, Exception):
                skipped.append(f"checkpoint {seq:08d}: {found}")
                continue
            steps.append(found.step)
            if step is not None and found.step != step:
                continue
            files: dict[str, str] = {}
            before = len(events)
            got = _load(ck, found, where, files)
            reasons = [e.reason for e in events[before:] if isinstance(e, ev.CheckpointInvalid)]
            if got is None:
                why = "; ".join(reasons) or "it does not verify"
                (damaged if step is not None else skipped).append(
                    f"checkpoint {seq:08d} (step {found.step}): {why}"
                )
                continue
            tracked, at, user, sharded = got
            if skipped:
                log.warning(
                    "job %s: passed over %d newer checkpoint(s) that do not verify, for step %d: %s",
                    job_id,
                    len(skipped),
                    at,
                    " | ".join(skipped),
                    extra={"job_id": job_id},
                )
            ckpt = Checkpoint(
                tracked,
                step=at,
                state=user,
                seq=seq,
                kind=str(getattr(found.kind, "value", found.kind)),
                job_id=job_id,
                sharded=sharded,
                skipped=skipped + damaged,
            )
            yield ckpt, found, files
            return
        raise CheckpointError(_none_found(job_id, step, sorted(set(steps)), skipped, damaged))
    finally:
        ck.close()
        shutil.rmtree(spool, ignore_errors=True)


def _none_found(
    job_id: str, step: int | None, steps: list[int], skipped: list[str], damaged: list[str]
) -> str:
    where = f"job {job_id}"
    if step is None and not skipped:
        return f"{where} has no checkpoint yet (none committed so far); wait for its first save"
    if step is None:
        return (
            f"{where}: no checkpoint verifies against its manifest: " + " | ".join(skipped) + ". The "
            "store was damaged or written by someone else; nothing can be loaded from it"
        )
    if damaged:
        return (
            f"{where}: the checkpoint of step {step} does not verify against its manifest: "
            + " | ".join(damaged)
            + f". Ask for step=None (the newest that verifies) or another step of {steps}"
        )
    unread = f" ({len(skipped)} more whose manifest cannot be read: {' | '.join(skipped)})" if skipped else ""
    return (
        f"{where} has no checkpoint of step {step}; its checkpoints are of steps {steps}{unread}. "
        "The store keeps the newest two and Config.keep_last periodic ones: pass one of those "
        "steps, or step=None for the newest that verifies"
    )


def _load(
    ck: Any, manifest: Manifest, store: Store, files: dict[str, str]
) -> tuple[dict[str, Any], int, dict[str, Any], bool] | None:
    """(tracked name -> state dict, step, ctx.state, sharded) of one checkpoint, read and
    verified by the runtime's own restore, its backed-up files listed in `files`; None (and a
    `checkpoint_invalid` event) if it does not verify."""
    if any(name.startswith("dcp/") for name in manifest.files):  # DCP's folder: maybe sharded
        from spotnb.runtime.checkpoint.sharded import ShardedCheckpointer, is_sharded

        if is_sharded(manifest):
            from spotnb.runtime.checkpoint import sharded_state

            # (from the home store: a group of processes has no regional stores, agent.py)
            with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": one process, yes
                warnings.filterwarnings("ignore", message=".*torch.distributed is disabled")
                found = ShardedCheckpointer(ck).load_with(None, [manifest])
            if found is None:
                return None
            loaded = found[1]
            shared = sharded_state._unpickled(loaded[sharded_state.SHARED])
            tracked = {k.split(".", 1)[1]: v for k, v in loaded.items() if k.startswith(("model.", "optim."))}
            tracked.update(shared.get("objects", {}))
            return _public(tracked), int(shared["step"]), dict(shared.get("user", {})), True
    state = ck._load(manifest, store, files)
    if state is None:
        return None
    return _public(state.get("objects", {})), int(state["step"]), dict(state.get("user", {})), False


def _public(tracked: dict[str, Any]) -> dict[str, Any]:
    return {name: sd for name, sd in tracked.items() if name != _SYNC_KEY}


def load_checkpoint(job_id: str, step: int | None = None, *, store: str | None = None) -> Checkpoint:
    """The tracked state of job `job_id`'s checkpoint of `step` (None: the newest one that
    verifies), as a `Checkpoint`: `ckpt["model"]` is the state dict of what
    `ctx.track(model=...)` tracked, `ckpt.step` the step, `ckpt.state` `ctx.state`; tensors on
    the CPU. Works from any process and machine that has the job's store (`store=`, its URL,
    when this machine's job DB does not know the job) and its key file (copied from the machine
    that submitted it to `$SPOTNB_HOME/keys/<id>.key`).

    A checkpoint whose files do not match its signed manifest is never returned: with
    `step=None` the next older one is (`ckpt.skipped` and a warning say which were passed
    over and why); with a `step`, CheckpointError says what is wrong and which steps exist."""
    full_id, st, key = _open(job_id, store)
    return read_checkpoint(full_id, st, key, step)


def read_checkpoint(job_id: str, store: Store, key: bytes, step: int | None = None) -> Checkpoint:
    """`load_checkpoint` of a job whose store and key are at hand (`Job.checkpoint`)."""
    with _reading(job_id, store, key, step) as (ckpt, _, _):
        return ckpt


# -- export ------------------------------------------------------------------------------------
def export(
    job_id: str,
    folder: str | os.PathLike[str],
    *,
    step: int | None = None,
    format: str = "safetensors",
    store: str | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """Write job `job_id`'s trained weights (its checkpoint of `step`, None: the newest that
    verifies) into `folder` as files other tools read; returns their paths.

    - each tracked model as `<name>.safetensors` (`safetensors.torch.load_file`; tensors that
      share memory, such as tied embeddings, are written as separate copies, since safetensors
      refuses shared memory: `model.load_state_dict` ties them again) or, with
      `format="torch"`, `<name>.pt` (`torch.save` of its state dict, sharing kept);
    - a Hugging Face job's Trainer folder of that step, `checkpoint-<step>/`, as the Trainer
      wrote it (weights, optimizer, scheduler, trainer state: `from_pretrained` and
      `resume_from_checkpoint` read it);
    - other files the job backed up (`ctx.backup`), under their own names.

    Refuses to replace a file that exists unless `overwrite`."""
    full_id, st, key = _open(job_id, store)
    return export_from(full_id, st, key, folder, step=step, format=format, overwrite=overwrite)


def export_from(
    job_id: str,
    store: Store,
    key: bytes,
    folder: str | os.PathLike[str],
    *,
    step: int | None = None,
    format: str = "safetensors",
    overwrite: bool = False,
) -> list[Path]:
    """`export` of a job whose store and key are at hand (`Job.export`)."""
    if format not in FORMATS:
        raise SpotnbError(f"export format {format!r}: choose one of {', '.join(FORMATS)}")
    full_id = job_id
    out = Path(folder)
    with _reading(full_id, store, key, step) as (ckpt, manifest, files):
        plan = _plan(ckpt, manifest, files, format)
        if not plan:
            raise SpotnbError(
                f"job {full_id}: checkpoint {ckpt.seq:08d} (step {ckpt.step}) holds no model "
                f"weights (no tracked module: it tracks {sorted(ckpt) or 'nothing'}) and no "
                "backed-up files: nothing to export"
            )
        clash = [rel for rel in plan if (out / rel).exists() or (out / rel.split("/")[0]).is_file()]
        if clash and not overwrite:
            raise SpotnbError(
                f"export to {out}: {', '.join(sorted(clash)[:5])} already exist there; choose an "
                "empty folder, remove them, or pass overwrite=True (--overwrite)"
            )
        written = []
        for rel, write in plan.items():
            target = out / rel
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
                try:
                    write(tmp)
                    os.replace(tmp, target)
                finally:
                    if tmp.exists():
                        tmp.unlink()
            except OSError as exc:
                raise SpotnbError(f"export to {out}: cannot write {rel}: {exc.strerror or exc}") from None
            written.append(target)
    return written


def _plan(ckpt: Checkpoint, manifest: Manifest, files: dict[str, str], format: str) -> dict[str, Any]:
    """What `export` writes: relative path -> a function that writes it to a given path."""
    plan: dict[str, Any] = {}
    meta = {"format": "pt", "spotnb_job": ckpt.job_id, "step": str(ckpt.step), "seq": str(ckpt.seq)}
    for name, sd in ckpt.weights().items():
        if format == "safetensors":
            plan[f"{name}.safetensors"] = lambda path, sd=sd: _save_safetensors(sd, path, meta)
        else:
            plan[f"{name}.pt"] = lambda path, sd=sd: _save_torch(sd, path)
    for rel, local in _backed_up(manifest, files, ckpt.step).items():
        plan[rel] = lambda path, local=local: shutil.copyfile(local, path)
    return plan


def _backed_up(manifest: Manifest, files: dict[str, str], step: int) -> dict[str, str]:
    """The backed-up files to export (relative path in the export folder -> verified local
    copy): of a backed-up folder that holds a Trainer's `checkpoint-<step>/`, that folder only;
    of any other, the folder under its own name; a file under its name."""
    out: dict[str, str] = {}
    for prefix, folder in manifest.dirs.items():
        inside = {
            os.path.relpath(manifest.dests[n], folder).replace(os.sep, "/"): files[n]
            for n in files
            if n.startswith(prefix + "/")
        }
        inside = {rel: local for rel, local in inside.items() if _inside(rel)}
        hf = f"{_HF_PREFIX}{step}/"
        mine = {rel: local for rel, local in inside.items() if rel.startswith(hf)}
        base = os.path.basename(os.path.normpath(folder)) or "backup"
        out.update(mine or {f"{base}/{rel}": local for rel, local in inside.items()})
    for name, local in files.items():
        if not any(name.startswith(p + "/") for p in manifest.dirs):
            out[os.path.basename(manifest.dests[name]) or name.replace("/", "_")] = local
    return out


def _inside(rel: str) -> bool:
    return not rel.startswith("/") and ".." not in rel.split("/")


def _save_safetensors(sd: dict[str, Any], path: Path, metadata: dict[str, str]) -> None:
    import torch

    try:
        from safetensors.torch import save_file
    except ImportError:  # pragma: no cover - a dependency; only a broken install lacks it
        raise SpotnbError(
            "export as safetensors needs the safetensors package (a spotnb dependency): "
            "pip install safetensors, or export with format='torch'"
        ) from None
    # a module's `_extra_state` object is left out: safetensors holds tensors only
    tensors = {name: t.detach().cpu().contiguous() for name, t in sd.items() if isinstance(t, torch.Tensor)}
    save_file(_unshare(tensors), str(path), metadata=metadata)


def _unshare(tensors: dict[str, Any]) -> dict[str, Any]:
    """Tensors that share memory with another (tied weights; views into one buffer read back)
    each copied into its own: safetensors refuses shared memory, and `model.load_state_dict`
    of the copies ties them again."""
    counts: dict[int, int] = {}
    for t in tensors.values():
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            counts[ptr] = counts.get(ptr, 0) + 1
    return {
        name: t.clone() if t.numel() and counts[t.untyped_storage().data_ptr()] > 1 else t
        for name, t in tensors.items()
    }


def _save_torch(sd: dict[str, Any], path: Path) -> None:
    import torch

    torch.save(sd, str(path))
