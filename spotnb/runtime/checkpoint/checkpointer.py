"""Checkpoints that are never half there.

Phase 1 (`snapshot`, the only blocking part) copies the tracked state into CPU memory, reusing
buffers (pinned when CUDA is present) so later snapshots are a plain memcpy. Phase 2 (a
background thread) serialises the copy to a local spool file and uploads it in chunks,
hashing as it goes. Phase 3 writes `MANIFEST.json` (size and digest of every file, step,
kind) last: a checkpoint exists only once its manifest does. Restore takes the newest
checkpoint whose files verify and falls back to the one before. Files a save writes by value
carry a BLAKE3 digest, blobs stored by content their sha256 (`runtime/digest.py` says why);
restore checks whichever an entry carries.

A state larger than the snapshot memory budget (`Config.snapshot_memory`) is not copied whole:
`runtime/chunked.py` streams it through two half-budget buffers into `tensors.bin`, and
`state.pt` holds the skeleton that points into it. Every buffer a snapshot holds (whole-state
pools and chunk buffers) is counted in `Checkpointer.held_bytes`; their sum never exceeds
the budget, and `peak_bytes` records the highest it reached.

Files the script backs up (`ctx.backup(path)`, a file or a whole folder such as a Hugging Face
`checkpoint-500/`) are stored by content, once: `<root>/blobs/<sha256>`, listed in each manifest
that needs them. A file unchanged since an earlier checkpoint (a frozen base model, a tokenizer)
is not uploaded again; pruning deletes a blob when the last checkpoint that listed it goes.

Saves are incremental (`runtime/incremental.py`): a large tensor no optimizer trains is stored
the same way, as a blob, and a later save references it, neither copied nor hashed again,
while it is unchanged since the last committed save; the manifest lists it like a backed-up
file (`tensors/<sha256>`), so restore verifies it and pruning keeps it while any kept
checkpoint lists it. `Checkpointer.bandwidth` (bytes written per second of upload, measured)
and `pending_bytes` (what a save now would write) let the policy tell whether an emergency
save fits a notice before starting one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, cast

import torch

from spotnb.core import protocol as ev
from spotnb.core.files import remove_orphaned
from spotnb.core.protocol import SaveKind
from spotnb.core.signing import BadSignature, sign_doc, verify_doc
from spotnb.core.sizes import available_memory, human_bytes, total_memory
from spotnb.core.store import Store, is_safe_name
from spotnb.policy.base import EMERGENCY_MARGIN, Observation, snapshot_estimate, upload_estimate
from spotnb.runtime.beacon import Beacon, Phase
from spotnb.runtime.checkpoint import digest
from spotnb.runtime.checkpoint.chunked import (
    ALIGN,
    DATA_NAME,
    ChunkBuffers,
    Drain,
    Gate,
    Gated,
    TensorRef,
    copy_chunked,
    dense_layout,
    fill_refs,
    split_bytes,
)
from spotnb.runtime.checkpoint.incremental import BlobRef, Incremental, Seen, fill_blobs, map_tensors
from spotnb.runtime.checkpoint.staging import CudaStage

__all__ = [
    "Checkpointer",
    "Snapshot",
    "Manifest",
    "SaveCancelled",
    "InvalidManifest",
    "CHUNK",
    "emergency_skipped",
]

log = logging.getLogger(__name__)

CHUNK = 4 * 1024 * 1024
#: the folder of backed-up files, by content, beside the numbered checkpoint folders
BLOBS = "blobs"
_PERSISTENT = ("periodic", "final")
#: the default snapshot budget keeps this much of the host's RAM free: 10 % of it, at least
#: MARGIN_MIN (the training step's own allocations grow and shrink between saves)
MARGIN_MIN = 256 * 1024 * 1024
#: saves that wrote less than this measure the store's latency more than its bandwidth
BANDWIDTH_MIN = 256 * 1024
#: the default budget never goes below this (a host already short of memory still saves, slowly)
AUTO_MIN = 16 * 1024 * 1024


class SaveCancelled(Exception):
    """An upload was abandoned because a newer (emergency) checkpoint superseded it."""


class InvalidManifest(ValueError):
    """A MANIFEST.json that exists but cannot describe a checkpoint (unparseable, wrong shape).

    The checkpoint it names is skipped like one whose files fail their hash: restore falls
    back to the one before, and pruning treats it as debris instead of giving up."""


@dataclass
class Snapshot:
    state: Any
    step: int
    kind: SaveKind
    snapshot_s: float
    nbytes: int
    files: list[tuple[str, str]] = field(default_factory=list)  # (spooled local copy, manifest name)
    dests: dict[str, str] = field(default_factory=dict)  # manifest name -> restore path
    hashes: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (sha256, size)
    dirs: dict[str, str] = field(default_factory=dict)  # manifest name prefix -> folder restored
    #: a chunked snapshot: (its tensors.bin in the spool, the drain writing it); `state` is then
    #: the skeleton that points into it
    data: tuple[str, Drain] | None = None
    #: tensors stored by content (runtime/incremental.py): unchanged ones, already `BlobRef`s in
    #: `state`, and changed ones, copied, which the writer turns into new blobs
    referenced: dict[tuple, Seen] = field(default_factory=dict)
    fresh: dict[tuple, Seen] = field(default_factory=dict)


@dataclass
class Manifest:
    seq: int
    step: int
    kind: SaveKind  # (a newer writer's kind this spotnb does not know stays a string)
    files: dict[str, dict[str, Any]]
    incarnation: int
    created: float
    snapshot_s: float = 0.0
    upload_s: float = 0.0
    nbytes: int = 0  # "bytes" in MANIFEST.json: bytes this checkpoint wrote
    #: bytes it lists but did not write: blobs an earlier checkpoint stored (unchanged tensors,
    #: backed-up files); a restore reads nbytes + referenced
    referenced: int = 0
    dests: dict[str, str] = field(default_factory=dict)
    #: folders backed up whole: name prefix -> path. Restore makes each folder what it was
    #: (files written after the checkpoint go), so a trainer resuming from "the newest
    #: checkpoint folder in it" finds the one that was committed
    dirs: dict[str, str] = field(default_factory=dict)

    def blobs(self) -> set[str]:
        """The sha256 of every backed-up file this checkpoint lists by content."""
        return {meta["sha256"] for meta in self.files.values() if meta.get("blob")}

    def to_json(self, key: bytes | None = None, job_id: str = "") -> bytes:
        """The manifest as written; with a key, signed (it holds every file's digest, so the
        signature covers the state that restore will torch.load)."""
        doc = dict(self.__dict__)
        doc["bytes"] = doc.pop("nbytes")
        if key is not None:
            doc = sign_doc(key, job_id, _manifest_name(self.seq), doc)
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def parse(cls, raw: bytes, folder: str, key: bytes | None = None, job_id: str = "") -> Manifest:
        """A manifest from the bytes of `<folder>/MANIFEST.json`, checked field by field.

        Anything in the store may have been damaged or rewritten between incarnations, and a
        KeyError or TypeError deep inside restore would fail the whole job; refusing the shape
        here turns every such damage into "this checkpoint is invalid, take the previous one".
        Raises `InvalidManifest` saying what is wrong."""
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidManifest(f"MANIFEST.json is not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise InvalidManifest(f"MANIFEST.json is a {type(doc).__name__}, not an object")
        if key is not None:  # signed by this job's agent, for this folder, or not a checkpoint
            try:
                doc = verify_doc(key, job_id, _manifest_name(folder if folder.isdigit() else 0), doc)
            except BadSignature as exc:
                raise InvalidManifest(str(exc)) from None
        missing = [k for k in ("seq", "step", "kind", "files", "incarnation", "created") if k not in doc]
        if missing:
            raise InvalidManifest(f"MANIFEST.json lacks {', '.join(missing)}")
        for name in ("seq", "step", "incarnation"):
            if not _is_int(doc[name]) or doc[name] < 0:
                raise InvalidManifest(f"MANIFEST.json {name} is {doc[name]!r}, not a non-negative int")
        if not folder.isdigit() or doc["seq"] != int(folder):
            raise InvalidManifest(f"MANIFEST.json seq {doc['seq']} does not match its folder {folder}")
        if not isinstance(doc["kind"], str):
            raise InvalidManifest(f"MANIFEST.json kind is {doc['kind']!r}, not a string")
        for name in ("created", "snapshot_s", "upload_s", "bytes", "referenced"):
            if name in doc and (not isinstance(doc[name], (int, float)) or isinstance(doc[name], bool)):
                raise InvalidManifest(f"MANIFEST.json {name} is {doc[name]!r}, not a number")
        files = doc["files"]
        if not isinstance(files, dict) or "state.pt" not in files:
            raise InvalidManifest("MANIFEST.json files does not list state.pt")
        for name, meta in files.items():
            if not is_safe_name(name):
                raise InvalidManifest(f"MANIFEST.json lists a file outside its folder: {name!r}")
            wrong = digest.problem(meta)
            if wrong is not None:
                raise InvalidManifest(f"MANIFEST.json entry {name!r} {wrong}")
        dests = doc.get("dests", {})
        if not isinstance(dests, dict) or not all(
            isinstance(k, str) and k in files and isinstance(v, str) and v for k, v in dests.items()
        ):
            raise InvalidManifest("MANIFEST.json dests must map listed files to paths")
        dirs = doc.get("dirs", {})
        if not isinstance(dirs, dict) or not all(
            is_safe_name(k) and isinstance(v, str) and v for k, v in dirs.items()
        ):
            raise InvalidManifest("MANIFEST.json dirs must map name prefixes to folders")
        fields = set(cls.__dataclass_fields__)
        values = {k: v for k, v in doc.items() if k in fields}
        values["kind"] = SaveKind(doc["kind"]) if doc["kind"] in _SAVE_KINDS else doc["kind"]
        if "bytes" in doc:
            values["nbytes"] = doc["bytes"]
        return cls(**values)


_SAVE_KINDS = {k.value for k in SaveKind}


def emergency_skipped(obs: Observation, step: int, time_left: float) -> ev.EmergencySkipped:
    """The event of a notice too short for the emergency save `obs` describes (`save_bytes`:
    what it would write), saying what was not saved and why, in numbers: `needed` is the
    model's δ + β + margin."""
    delta, beta = snapshot_estimate(obs), upload_estimate(obs)
    size = obs.save_bytes or obs.state_bytes
    measured = obs.save_bytes and obs.upload_bps
    rate = f"at the measured {human_bytes(int(obs.upload_bps))}/s" if measured else "as measured"
    reason = (
        f"an emergency save would write {human_bytes(size)} (what changed since the last committed "
        f"save), ~{beta:.2f} s of upload {rate}, ~{delta:.2f} s of snapshot and {EMERGENCY_MARGIN} s to "
        f"spare, and {time_left:.2f} s were left: no upload was started (one that cannot finish "
        "before the kill would only abandon the save in flight). Nothing was written to the "
        "instance's disk, which a spot preemption does not keep; the job resumes from its last "
        "committed checkpoint"
    )
    needed = delta + beta + EMERGENCY_MARGIN
    return ev.EmergencySkipped(step=step, time_left=time_left, needed=needed, nbytes=size, reason=reason)


def _manifest_name(seq: int | str) -> str:
    """What a manifest's signature binds it to: its place, so it cannot be moved to another."""
    return f"ckpt/{int(seq):08d}/MANIFEST.json"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _copy_hashing(src: str, dest: str) -> tuple[str, int]:
    """Copy `src` to `dest`; its sha256 and size, from the one read."""
    sha = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        while chunk := fin.read(CHUNK):
            sha.update(chunk)
            fout.write(chunk)
            size += len(chunk)
    return sha.hexdigest(), size


def _write_tensor_hashing(t: torch.Tensor, dest: str) -> str:
    """Write a copied (contiguous, CPU) tensor's bytes to `dest`; their sha256."""
    sha = hashlib.sha256()
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().data if t.nelement() else memoryview(b"")
    with open(dest, "wb") as out:
        for i in range(0, len(raw), CHUNK):
            part = raw[i : i + CHUNK]
            sha.update(part)
            out.write(part)
    return sha.hexdigest()


def _copy_slice_hashing(src: str, offset: int, nbytes: int, dest: str) -> str:
    """Copy `nbytes` of `src` from `offset` to `dest`; their sha256."""
    sha = hashlib.sha256()
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        fin.seek(offset)
        left = nbytes
        while left:
            chunk = fin.read(min(CHUNK, left))
            if not chunk:
                raise ValueError(f"{DATA_NAME} ends before a tensor at {offset} (+{nbytes})")
            sha.update(chunk)
            fout.write(chunk)
            left -= len(chunk)
    return sha.hexdigest()


def _step_of(found: Manifest | Exception | None) -> float:
    return float(found.step) if isinstance(found, Manifest) else -math.inf


def _restore_dir(folder: str, files: dict[str, str]) -> None:
    """Make `folder` hold exactly `files` (verified local copy -> path inside it): built beside
    it, then swapped in, so a kill leaves either the old folder or the restored one whole."""
    folder = os.path.abspath(folder)
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    fresh = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.restore-", dir=parent)
    for local, dest in files.items():
        rel = os.path.relpath(os.path.abspath(dest), folder)
        target = os.path.join(fresh, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(local, target)
    old = None
    if os.path.lexists(folder):
        old = f"{fresh}.old"
        os.replace(folder, old)
    os.replace(fresh, folder)
    if old is not None and os.path.isdir(old):
        shutil.rmtree(old, ignore_errors=True)
    elif old is not None:
        os.unlink(old)


def _put_back(manifest: Manifest, paths: dict[str, str]) -> None:
    """Copy a restored checkpoint's backed-up files (verified local copies: `paths`) to the
    paths they were backed up from, each backed-up folder made whole again."""
    in_dirs = {n for n in manifest.dests if any(n.startswith(p + "/") for p in manifest.dirs)}
    for name, dest in manifest.dests.items():
        if name not in in_dirs:
            os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
            shutil.copyfile(paths[name], dest)
    for prefix, folder_path in manifest.dirs.items():
        _restore_dir(
            folder_path, {paths[n]: manifest.dests[n] for n in in_dirs if n.startswith(prefix + "/")}
        )


class _HashingFile:
    """A write-only file that hashes what passes through (torch.save only calls write)."""

    def __init__(self, f: Any) -> None:
        self.f, self.size = f, 0
        self.algo, self.sha = digest.fresh()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()

    def digest(self) -> dict[str, Any]:
        return {"size": self.size, self.algo: self.sha.hexdigest()}


class _BufferPool:
    """Keeps one CPU buffer per tensor position so repeated snapshots copy, not allocate."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.in_use = False
        self.pin = torch.cuda.is_available()
        self.layout: tuple[Any, ...] | None = None  # the state's tensors these buffers fit

    @property
    def nbytes(self) -> int:
        return sum(b.element_size() * b.nelement() for b in self.buffers.values())

    def clear(self) -> None:
        """Give the buffers' memory back (another layout, or room for another snapshot)."""
        self.buffers.clear()
        self.layout = None

    def copy(self, obj: Any, path: tuple = ()) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            key = path
            buf = self.buffers.get(key)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or t.is_sparse:
                buf = (
                    torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin and t.is_cuda)
                    if not t.is_sparse
                    else t.cpu()
                )
                if t.is_sparse:
                    return buf.clone()
                self.buffers[key] = buf
            buf.copy_(t, non_blocking=t.is_cuda)
            return buf
        if isinstance(obj, dict):
            return {k: self.copy(v, path + (k,)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self.copy(v, path + (i,)) for i, v in enumerate(obj)]
            return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
        # plain values (ints, floats, strings, numpy RNG tuples): copy so later mutation can't leak in
        return _plain_copy(obj)


def _remove_spooled(snap: Snapshot) -> None:
    """Delete a snapshot's spooled files (the script's, and a chunked snapshot's tensors)."""
    locals_ = [f for f, _ in snap.files] + ([snap.data[0]] if snap.data is not None else [])
    for local in locals_:
        if os.path.exists(local):
            os.unlink(local)


def _plain_copy(obj: Any) -> Any:
    if obj is None or isinstance(obj, (int, float, str, bytes, bool)):
        return obj
    import copy

    return copy.deepcopy(obj)


def _ewm(mean: float, var: float, x: float, alpha: float = 0.3) -> tuple[float, float]:
    """Exponentially weighted mean and variance (recent saves count most)."""
    if not mean:
        return x, 0.0
    diff = x - mean
    return mean + alpha * diff, (1 - alpha) * (var + alpha * diff * diff)


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


class Checkpointer:
    """Snapshots in the caller's thread; writes, uploads, commits and prunes in one worker."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        incarnation: int,
        emit: Callable[..., Any],
        beacon: Beacon | None = None,
        keep_last: int = 2,
        upload_bps: float | None = None,
        spool_dir: str | None = None,
        before_commit: Callable[[int], None] | None = None,
        key: bytes | None = None,
        snapshot_memory: int | None = None,
        read_stores: Sequence[Store] = (),
    ) -> None:
        self.store, self.job_id, self.incarnation = store, job_id, incarnation
        #: every store that may hold this job's checkpoints, the one this checkpointer writes
        #: first (`Config.regional_stores`: the home store and the regions' stores). Restore
        #: takes the newest committed, verified checkpoint among them; a checkpoint copied to
        #: several is one checkpoint (one seq), its copies tried in this order
        self.stores = [store] + [s for s in read_stores if s.url != store.url]
        self.stores = [s for i, s in enumerate(self.stores) if s.url not in {t.url for t in self.stores[:i]}]
        #: the URL of the store the last `load_latest` restored from (None: nothing restored)
        self.restored_from: str | None = None
        self._unreachable: set[str] = set()  # stores whose listing failed (warned once)
        #: blobs of the write store that failed verification at restore: a save writes them
        #: again instead of reusing them (same size, so `_upload_blob` would take them as good)
        self._damaged_blobs: set[str] = set()
        #: most bytes of host RAM snapshot buffers may hold at once (None: what is free, see
        #: `budget`)
        self.snapshot_memory = snapshot_memory
        self.peak_bytes = 0  # the most `held_bytes` reached (tests and benchmarks read it)
        # called with the step just before a manifest is written; raising aborts the commit
        self.before_commit = before_commit
        # with a key, manifests are signed at commit and only signed ones are restored (the
        # agent always has one; without, as in unit tests, nothing is authenticated)
        self.key = key
        self.emit = emit
        self.beacon = beacon or Beacon(None)
        self.keep_last = keep_last
        self.upload_bps = upload_bps
        if spool_dir is None and store.local:  # beside the store, so a save can be renamed in
            spool_dir = store.path(".spool")
            os.makedirs(spool_dir, exist_ok=True)
        remove_orphaned(spool_dir or tempfile.gettempdir(), "spotnb-spool-")
        self.spool = tempfile.mkdtemp(prefix=f"spotnb-spool-{os.getpid()}-", dir=spool_dir)
        self.root = store.job(job_id, "ckpt")
        self._pools: list[_BufferPool] = []
        self._chunks: ChunkBuffers | None = None
        self._cv = threading.Condition()
        self._pending: Snapshot | None = None
        self._busy = False
        self._cancel = threading.Event()
        self._closed = False
        self.snapshot_ema = 0.0  # δ
        self.upload_ema = 0.0  # β
        self.snapshot_var = 0.0  # their spread: an emergency save must fit the slow ones too
        self.upload_var = 0.0
        self.last_bytes = 0  # the last checkpoint's size: written + referenced
        self.last_written = 0  # what it wrote
        #: bytes per second a save's upload achieved (EWMA over saves that wrote BANDWIDTH_MIN
        #: or more; 0.0 until one has): β of a save of n bytes is about n / bandwidth
        self.bandwidth = 0.0
        self.incremental = Incremental()
        #: holds back the tracked optimizers' `step()` while a snapshot's drain writes their
        #: tensors in place (`runtime/chunked.py`); `gate.waited` is stall time spent there
        self.gate = Gate()
        self.gate.on_wait = self._gate_waited
        self._snapshots = 0  # samples in snapshot_ema
        self._stage = CudaStage()  # pinned host copies of gated CUDA tensors, reused
        #: why saves copy every tensor before training resumes (a torn snapshot was seen), or ""
        self.blocking = ""
        #: write saves whose tensors fit the budget the gated way too (their optimizers' tensors
        #: written in place, no copy); False keeps them as one whole-state copy + torch.save
        self.stream = True
        self.committed: list[Manifest] = []
        self.failures = 0
        self._seq = max(self._existing_seqs(), default=0)
        self._worker = threading.Thread(target=self._work, name="spotnb-checkpoint", daemon=True)
        self._worker.start()

    # -- phase 1 -------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        """Bytes of host RAM the snapshot buffers hold right now (idle ones included)."""
        chunks = self._chunks.nbytes if self._chunks else 0
        return sum(p.nbytes for p in self._pools) + chunks + self._stage.nbytes

    def budget(self) -> int:
        """The most bytes snapshot buffers may hold: `snapshot_memory` when given, else what
        the host has available now (psutil, or /proc/meminfo's MemAvailable) plus what the
        buffers already hold, minus a margin of 10 % of the RAM (at least 256 MB), and never
        below 16 MB. Unbounded when the host's memory cannot be read."""
        if self.snapshot_memory is not None:
            return self.snapshot_memory
        free = available_memory()
        if free is None:
            return 2**62
        margin = max(MARGIN_MIN, (total_memory() or 0) // 10)
        return max(AUTO_MIN, self.held_bytes + free - margin)

    def snapshot(
        self,
        state: Any,
        step: int,
        kind: SaveKind,
        files: list[tuple[str, str]] | None = None,
        dirs: dict[str, str] | None = None,
        frozen: set[int] | None = None,
        optimizers: list[torch.optim.Optimizer] | None = None,
    ) -> Snapshot:
        """Copy `state` (nested dicts/lists of tensors and plain values) into CPU memory, and
        the script's `files` ((path, manifest name); `dirs`: folders backed up whole) to the
        spool, hashing them.

        `frozen`: storage addresses of tensors no optimizer trains (`incremental.frozen_tensors`);
        those unchanged since the last committed save are referenced, not copied.

        `optimizers`: the tracked optimizers. Their parameters and state are not copied: a drain
        writes them from their own memory after this returns, and their `step()` waits until it
        has (`runtime/chunked.py`). The rest (or everything, without optimizers or after a torn
        snapshot) is copied before this returns: whole into a pool of buffers when it fits the
        budget and nothing is gated, else streamed through two buffers of at most half the
        budget to a spool file. Either way the buffers held never exceed the budget: a snapshot
        waits for the writer to give some back rather than allocate more."""
        self.beacon.set_snapshot(True)
        t0 = time.perf_counter()
        self.gate.wait()  # the previous snapshot's gated tensors are written: one gate at a time
        referenced: dict[tuple, Seen] = {}
        fresh: dict[tuple, Seen] = {}
        try:
            if frozen:
                state, referenced, fresh = self.incremental.split(state, frozen)
            layout, need = dense_layout(state)
            budget = self.budget()
            data: tuple[str, Drain] | None = None
            pool: _BufferPool | None = None
            gated = (
                Gated(optimizers, cuda=torch.cuda.is_available())
                if optimizers and not self.blocking
                else None
            )
            if gated is not None and need <= budget and (not self.stream or fresh):
                # within the budget, and streaming not wanted or frozen tensors to store as blobs
                # (tensors.bin would hold their bytes a second time): the whole-state copy
                gated = None
            if need <= budget and gated is None:
                pool = self._take_pool(layout, need, budget)
                try:
                    copied = pool.copy(state)
                    pool.layout = layout
                except BaseException:
                    pool.clear()
                    self._give_back(pool)
                    raise
                self.peak_bytes = max(self.peak_bytes, self.held_bytes)
            else:
                copied, data = self._snapshot_chunked(state, budget, gated)
            if pool is not None and torch.cuda.is_available():
                torch.cuda.synchronize()  # the pool's non-blocking copies (a gated snapshot's
                # device-to-host copies run on a side stream the optimizer gate waits for)
            spooled: list[tuple[str, str]] = []
            dests: dict[str, str] = {}
            hashes: dict[str, tuple[str, int]] = {}
            for src, name in files or []:
                local = os.path.join(self.spool, f"user-{uuid.uuid4().hex[:8]}")
                hashes[name] = _copy_hashing(src, local)  # the upload then knows if the store has it
                spooled.append((local, name))
                dests[name] = src
        finally:
            self.beacon.set_snapshot(False)
        dt = time.perf_counter() - t0
        snap = Snapshot(
            copied, step, kind, dt, need, spooled, dests, hashes, dict(dirs or {}), data, referenced, fresh
        )
        if pool is not None:
            snap._pool = pool  # type: ignore[attr-defined]
        self.snapshot_ema, self.snapshot_var = _ewm(self.snapshot_ema, self.snapshot_var, dt)
        self._snapshots += 1
        return snap

    def pending_bytes(self, state: Any, frozen: set[int] | None = None) -> tuple[int, int]:
        """(bytes a save of `state` now would write, bytes it would reference): what decides
        whether an emergency save fits a notice. Copies nothing."""
        referenced: dict[tuple, Seen] = {}
        if frozen:
            state, referenced, _ = self.incremental.split(state, frozen)
        _, need = dense_layout(state)
        return need, sum(seen.ref().nbytes for seen in referenced.values())

    def adopt(self, state: Any, frozen: set[int]) -> int:
        """Call after loading a restored state into the live objects: its unchanged frozen
        tensors are then referenced by the next save, as if this process had saved them
        (`Incremental.adopt`). The bytes adopted."""
        return self.incremental.adopt(state, frozen)

    def _take_pool(self, layout: tuple[Any, ...], need: int, budget: int) -> _BufferPool:
        """A pool for a state of `need` bytes, made room for within the budget: an idle one
        (one whose buffers already fit this state first), the queued save's, or a new one;
        idle buffers are freed, or the writer waited for, until the budget allows it."""
        with self._cv:
            while True:
                idle = [p for p in self._pools if not p.in_use]
                pool = next((p for p in idle if p.layout == layout), idle[0] if idle else None)
                if pool is None and self._pending is not None and "_pool" in self._pending.__dict__:
                    # one save uploading, one queued behind it: this snapshot supersedes the queued
                    # one at submit anyway, so it takes its buffers now rather than a third copy
                    # of the state (fresh memory costs page faults on the training thread)
                    superseded, self._pending = self._pending, None
                    pool = superseded.__dict__.pop("_pool")
                    pool.in_use = False  # this snapshot's now, or idle if it must wait below
                    self._discard(superseded)
                if pool is None:
                    pool = _BufferPool()
                if pool.layout != layout:
                    pool.clear()
                others = self.held_bytes - (pool.nbytes if pool in self._pools else 0)
                if others + need > budget:  # free what no save is using, then look again
                    others -= self._free_idle(keep=pool)
                if others + need <= budget:
                    pool.in_use = True
                    if pool not in self._pools:
                        self._pools.append(pool)
                    return pool
                self._wait_for_buffers()

    def _snapshot_chunked(
        self, state: Any, budget: int, gated: Gated | None
    ) -> tuple[Any, tuple[str, Drain]]:
        """Stream the state through two buffers of at most half the budget to a spool file, the
        `gated` tensors left for the drain to write in place: the skeleton, and (the file, its
        drain)."""
        chunk = budget // 2 // ALIGN * ALIGN
        if gated is not None:  # buffers for what is copied, not for the gated tensors
            copied, kept = split_bytes(state, gated)
            chunk = min(chunk, max(copied, 1024 * ALIGN) // ALIGN * ALIGN + ALIGN)
            if gated.cuda and kept + 2 * chunk > budget:  # no room for host copies of the GPU's
                gated = Gated(gated.optimizers, cuda=False)
                chunk = budget // 2 // ALIGN * ALIGN
        if gated is None or not gated.cuda:
            self._stage.clear()
        if chunk < ALIGN:
            raise ValueError(
                f"Config.snapshot_memory is {budget} bytes, too little to hold two {ALIGN}-byte "
                f"chunks: raise it (a few MB at least, e.g. snapshot_memory='64MB')"
            )
        with self._cv:
            if self._pending is not None and "_pool" in self._pending.__dict__:
                superseded, self._pending = self._pending, None  # superseded at submit anyway
                self._discard(superseded)
            while True:
                self._free_idle(keep=None)
                chunks = self._chunks
                if chunks is not None and not chunks.in_use and chunks.chunk != chunk:
                    self._chunks = chunks = None
                if chunks is None and self.held_bytes + 2 * chunk <= budget:
                    self._chunks = chunks = ChunkBuffers(chunk, pin=torch.cuda.is_available())
                if chunks is not None and not chunks.in_use:
                    chunks.in_use = True
                    break
                self._wait_for_buffers()
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        path = os.path.join(self.spool, f"data-{uuid.uuid4().hex[:8]}.bin")
        released = waiting = None
        if gated is not None and gated.optimizers:
            self.gate.hook(gated.optimizers)
            released = self.gate.close()
            waiting = self.gate.waiting
        drain = Drain(
            path,
            chunks,
            on_done=lambda: self._give_back(chunks),
            released=released,
            on_torn=self._torn,
            waiting=waiting,
        )
        try:
            skeleton = copy_chunked(state, drain, _plain_copy, gated, self._stage_cuda)
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        except BaseException:
            try:
                drain.result()
            except BaseException:  # noqa: BLE001 - the copy's own error is the one to report
                pass
            if os.path.exists(path):
                os.unlink(path)
            raise
        return skeleton, (path, drain)

    def _gate_waited(self, seconds: float) -> None:
        """`step()` waited for a gated snapshot: that is part of the save's δ too (the EWMA is
        linear in each sample, so adding to the last sample adds α·seconds to the mean)."""
        self.snapshot_ema += seconds if self._snapshots == 1 else 0.3 * seconds

    def _stage_cuda(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
        """Host copies of gated CUDA tensors on the side stream; the gate's event is theirs."""
        hosts, event = self._stage.stage(tensors)
        self.gate.event = event
        return hosts, event

    def _torn(self, reason: str) -> None:
        """A gated tensor changed under the drain (called from it): later snapshots copy
        everything before the step goes on; the save itself fails with `TornSnapshot`."""
        if not self.blocking:
            log.warning("checkpoint: %s", reason)
            self.emit(ev.JobWarning(message=f"checkpoint: {reason}"))
        self.blocking = reason

    def _free_idle(self, keep: _BufferPool | None) -> int:
        """Free every idle buffer (pools and chunk buffers) but `keep`'s; the bytes freed."""
        freed = 0
        for p in self._pools:
            if p is not keep and not p.in_use:
                freed += p.nbytes
                p.clear()
        self._pools = [p for p in self._pools if p is keep or p.in_use or p.buffers]
        if self._chunks is not None and not self._chunks.in_use:
            freed += self._chunks.nbytes
            self._chunks = None
        return freed

    def _wait_for_buffers(self) -> None:
        """Wait (holding `_cv`) until the writer gives buffers back; refuse to wait for ones no
        save will give back (snapshots taken but never submitted)."""
        draining = self._chunks is not None and self._chunks.in_use
        if not (self._busy or self._pending is not None or draining):
            raise RuntimeError(
                f"snapshot buffers ({human_bytes(self.held_bytes)}) are all held by snapshots "
                f"not submitted, and Config.snapshot_memory ({human_bytes(self.budget())}) allows "
                "no more: submit or save them first"
            )
        self._cv.wait(1.0)  # woken by _give_back; the timeout only re-checks the above

    def _give_back(self, holder: _BufferPool | ChunkBuffers) -> None:
        with self._cv:
            holder.in_use = False
            self._cv.notify_all()

    # -- phase 2 + 3 ---------------------------------------------------------------------
    def submit(self, snap: Snapshot) -> None:
        """Queue for background upload. A newer snapshot replaces one not started yet."""
        with self._cv:
            if self._pending is not None:
                self._discard(self._pending)
            self._pending = snap
            self._cv.notify_all()

    def save_now(self, snap: Snapshot) -> Manifest:
        """Upload in the caller's thread (emergency): abandon what the worker is doing first."""
        with self._cv:
            if self._pending is not None:
                self._release(self._pending)
                _remove_spooled(self._pending)
                self._pending = None
            if self._busy:
                self._cancel.set()
            while self._busy:
                self._cv.wait()
            self._cancel.clear()
            self._busy = True
        try:
            return self._write(snap)
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is pending or in flight."""
        deadline = None if timeout is None else time.time() + timeout
        with self._cv:
            while self._pending is not None or self._busy:
                left = None if deadline is None else deadline - time.time()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    @property
    def idle(self) -> bool:
        return self._pending is None and not self._busy

    def close(self) -> None:
        self.gate.unhook()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        shutil.rmtree(self.spool, ignore_errors=True)

    def _discard(self, snap: Snapshot) -> None:
        """A queued snapshot a newer one supersedes: its buffers back, its spooled files gone,
        and the event that says so."""
        self._release(snap)
        _remove_spooled(snap)
        self.emit(
            ev.CheckpointSkipped(
                step=snap.step,
                save_kind=snap.kind,
                reason="superseded by a newer snapshot before its upload began",
            )
        )

    def _release(self, snap: Snapshot) -> None:
        """Give the snapshot's buffers back, exactly once: a second release could free a pool
        that a newer snapshot has taken meanwhile and let a third one overwrite it mid-save."""
        pool = snap.__dict__.pop("_pool", None)
        if pool is not None:
            self._give_back(pool)

    def _work(self) -> None:
        # Background saves must not slow training: on Linux a thread has its own nice value, so
        # the writer yields the cores to the training threads whenever both want them.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                snap, self._pending = self._pending, None
                assert snap is not None  # the loop above waits for one
                self._busy = True
            try:
                self._write(snap)
            except SaveCancelled:
                self.emit(
                    ev.CheckpointSkipped(
                        step=snap.step, save_kind=snap.kind, reason="abandoned for an emergency checkpoint"
                    )
                )
            except Exception as exc:  # noqa: BLE001 - a failed save must not stop training
                self.failures += 1
                self.emit(ev.CheckpointFailed(step=snap.step, save_kind=snap.kind, error=repr(exc)))
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _next_seq(self) -> int:
        """A number no checkpoint folder has: another incarnation may have committed one (an
        emergency save during this one's start) since this checkpointer was made."""
        existing = self._existing_seqs()
        with self._cv:
            self._seq = max(self._seq, *existing, 0) + 1
            return self._seq

    def _existing_seqs(self) -> list[int]:
        """Every checkpoint folder's number in every store: a number is one checkpoint across
        them (a copy keeps its number), so a new save must take one no store has."""
        out = [int(n) for n in self.store.ls(self.root) if n.isdigit()]
        for other in self.stores[1:]:
            try:
                out += [int(n) for n in other.ls(self._root_of(other)) if n.isdigit()]
            except OSError:
                pass  # a store out of reach now: its numbers are older than the write store's
        return out

    def _root_of(self, store: Store) -> str:
        return store.job(self.job_id, "ckpt")

    def _write(self, snap: Snapshot) -> Manifest:
        seq = self._next_seq()
        folder = f"{self.root}/{seq:08d}"
        t0 = time.perf_counter()
        committed = False
        spool = os.path.join(self.spool, f"state-{seq}.pt")
        blobs: list[tuple[str, BlobRef]] = []
        written: dict[tuple, Seen] = {}
        try:
            self.beacon.set_phase(Phase.SAVE)
            state = snap.state
            if snap.fresh:  # changed candidates: each to its own spool file, hashed once
                state, blobs, written = self._spool_blobs(snap)
            with open(spool, "wb") as f:
                hashed = _HashingFile(f)
                torch.save(state, cast(IO[bytes], hashed))  # hashed as it is written: no second read
            self._release(snap)
            files: dict[str, dict[str, Any]] = {}
            self.beacon.set_phase(Phase.UPLOAD)
            if snap.referenced:
                files.update(self._referenced(snap.referenced))
            for local, ref in blobs:
                files[ref.name] = self._upload_blob(local, ref.sha256, ref.nbytes)
            files["state.pt"] = self._upload(spool, f"{folder}/state.pt", hashed.digest())
            if snap.data is not None:  # a chunked snapshot: its tensors, once the drain is done
                data, drain = snap.data
                files[DATA_NAME] = self._upload(data, f"{folder}/{DATA_NAME}", drain.result())
            for local, name in snap.files:
                files[name] = self._upload_blob(local, *snap.hashes[name])
                if os.path.exists(local):
                    os.unlink(local)
            upload_s = time.perf_counter() - t0
            total = sum(f["size"] for f in files.values() if not f.get("reused"))
            reused = sum(f["size"] for f in files.values() if f.get("reused"))
            manifest = Manifest(
                seq=seq,
                step=snap.step,
                kind=snap.kind,
                files=files,
                incarnation=self.incarnation,
                created=time.time(),
                snapshot_s=snap.snapshot_s,
                upload_s=upload_s,
                nbytes=total,
                referenced=reused,
                dests=snap.dests,
                dirs=snap.dirs,
            )
            if self.before_commit is not None:
                # what the run logged up to this step becomes durable no later than the state:
                # a kill right after the commit must not leave a hole in the loss curve that
                # the resume (which starts after this step) would never fill
                self.before_commit(snap.step)
            self.beacon.set_phase(Phase.COMMIT)
            self.store.write_bytes(f"{folder}/MANIFEST.json", manifest.to_json(self.key, self.job_id))
            committed = True
            self.incremental.commit(snap.referenced, written)
        finally:
            for local, _ in blobs:
                if os.path.exists(local):
                    os.unlink(local)
            self._release(snap)
            if not committed:
                self.beacon.set_phase(Phase.IDLE)
            if os.path.exists(spool):
                os.unlink(spool)  # a failed save must not leave its copy in the spool
            if snap.data is not None:
                snap.data[1].wait()  # a failed save still ends with its chunk buffers given back
            _remove_spooled(snap)
        self.upload_ema, self.upload_var = _ewm(self.upload_ema, self.upload_var, upload_s)
        if total >= BANDWIDTH_MIN and upload_s > 0:  # smaller ones measure latency, not bandwidth
            self.bandwidth = _ewm(self.bandwidth, 0.0, total / upload_s)[0]
        self.last_bytes, self.last_written = total + reused, total
        self.committed.append(manifest)
        self.emit(
            ev.Checkpoint(
                seq=seq,
                save_kind=snap.kind,
                step=snap.step,
                snapshot_s=snap.snapshot_s,
                upload_s=upload_s,
                nbytes=total,
                referenced_bytes=reused,
            )
        )
        # COMMIT lasts until the checkpoint is announced, so the local market can land a kill
        # between a commit and the news of it
        self.beacon.set_phase(Phase.IDLE)
        self._prune(manifest)
        return manifest

    def _spool_blobs(self, snap: Snapshot) -> tuple[Any, list[tuple[str, BlobRef]], dict[tuple, Seen]]:
        """The snapshot's state with every changed candidate replaced by its `BlobRef`, each
        written to a spool file and hashed on the way: (state, [(file, ref)], path -> the
        candidate with its blob, for the next save to reference once this one commits)."""
        data = None
        if snap.data is not None:  # chunked: the candidates' bytes are slices of tensors.bin
            data = snap.data[0]
            snap.data[1].result()
        blobs: list[tuple[str, BlobRef]] = []
        written: dict[tuple, Seen] = {}

        def leaf(path: tuple, obj: Any) -> Any:
            seen = snap.fresh.get(path)
            if seen is None or not isinstance(obj, (torch.Tensor, TensorRef)):
                return obj
            local = os.path.join(self.spool, f"blob-{uuid.uuid4().hex[:8]}")
            blobs.append((local, BlobRef("", 0, "", ())))  # listed first: removed even if this fails
            if isinstance(obj, TensorRef):
                assert data is not None
                sha = _copy_slice_hashing(data, obj.offset, obj.nbytes, local)
            else:
                sha = _write_tensor_hashing(obj, local)
            written[path] = dataclasses.replace(seen, sha256=sha)
            ref = written[path].ref()
            blobs[-1] = (local, ref)
            return ref

        return map_tensors(snap.state, leaf), blobs, written

    def _referenced(self, referenced: dict[tuple, Seen]) -> dict[str, dict[str, Any]]:
        """Manifest entries of the unchanged tensors a save references, after one listing of
        the blobs folder shows each is still there (one missing cannot be written from here:
        its bytes were not copied, so the save fails and the next one writes them again)."""
        have = set(self.store.ls(f"{self.root}/{BLOBS}"))
        out: dict[str, dict[str, Any]] = {}
        for seen in referenced.values():
            ref = seen.ref()
            if ref.sha256 not in have:
                self.incremental.forget()
                raise RuntimeError(
                    f"{BLOBS}/{ref.sha256[:12]}…, an unchanged tensor this save references, is no "
                    "longer in the store: save abandoned, the next one writes every tensor again"
                )
            out[ref.name] = {"size": ref.nbytes, "sha256": ref.sha256, "blob": True, "reused": True}
        return out

    def _upload_blob(self, local: str, sha256: str, size: int) -> dict[str, Any]:
        """A backed-up file, stored by content: not uploaded again when the store has it (an
        earlier checkpoint's copy, checked by size; restore checks its hash)."""
        path = f"{self.root}/{BLOBS}/{sha256}"
        try:
            damaged = sha256 in self._damaged_blobs
            if not damaged and self.store.exists(path) and self.store.fs.size(path) == size:
                return {"size": size, "sha256": sha256, "blob": True, "reused": True}
        except OSError:
            pass  # cannot tell: upload it
        meta = self._upload(local, path, {"size": size, "sha256": sha256})
        self._damaged_blobs.discard(sha256)
        return {**meta, "blob": True}

    def _upload(self, local: str, dest: str, known: dict[str, Any] | None = None) -> dict[str, Any]:
        """Copy a spooled file to the store in chunks, hashing as it goes (throttled if asked).
        On a local store a file already hashed is simply renamed into place when it can be."""
        if known is not None and self.store.local and not self.upload_bps:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            try:
                os.replace(local, dest)  # same filesystem: atomic, and no copy at all
                return known
            except OSError:
                pass  # another filesystem: copy below
        algo, hasher = digest.fresh()  # a file written by value (not a blob: those come `known`)
        start = time.perf_counter()
        target = f"{dest}.tmp-{uuid.uuid4().hex[:8]}" if self.store.local else dest
        if self.store.local:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            size = self._copy(local, target, known is None, hasher, start)
        except BaseException:
            if self.store.local and os.path.exists(target):
                os.unlink(target)  # a full disk or a cancel must not leave debris in the store
            raise
        if self.store.local:
            os.replace(target, dest)
        return known if known is not None else {"size": size, algo: hasher.hexdigest()}

    def _copy(self, local: str, target: str, hash_it: bool, hasher: Any, start: float) -> int:
        """Chunked, cancellable, throttled copy into the store; returns the bytes copied."""
        size = 0
        with open(local, "rb") as src, self.store.fs.open(target, "wb") as out:
            while True:
                if self._cancel.is_set() and threading.current_thread() is self._worker:
                    raise SaveCancelled()
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                if hash_it:
                    hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
                if self.upload_bps:
                    ahead = size / self.upload_bps - (time.perf_counter() - start)
                    if ahead > 0:
                        time.sleep(ahead)
        return size

    # -- retention -----------------------------------------------------------------------
    def _scan(self) -> list[tuple[int, Manifest | Exception | None, Store]]:
        """Every checkpoint folder of every store, newest first (a number found in several
        stores: the write store's copy first, then in `stores` order), with its manifest, None
        when it has none (a partial upload or copy), or the exception that reading or
        checking it raised. A store other than the write store that cannot be listed now (a
        region's bucket out of reach) is left out of this scan, with a warning."""
        out: list[tuple[int, int, Manifest | Exception | None, Store]] = []
        for rank, store in enumerate(self.stores):
            try:
                found = self._scan_store(store)
            except OSError as exc:
                if store is self.store:
                    raise
                if store.url not in self._unreachable:  # once per store, not at every save
                    self._unreachable.add(store.url)
                    self.emit(
                        ev.JobWarning(message=f"checkpoints in {store.url} cannot be listed now: {exc!r}")
                    )
                continue
            self._unreachable.discard(store.url)
            out += [(seq, rank, manifest, store) for seq, manifest in found]
        # one number in two stores is one checkpoint's copies (same step), or two checkpoints
        # numbered while one store was out of reach (`_existing_seqs`): the one further on first
        out.sort(key=lambda item: (-item[0], -_step_of(item[2]), item[1]))
        return [(seq, manifest, store) for seq, _, manifest, store in out]

    def _scan_store(self, store: Store) -> list[tuple[int, Manifest | Exception | None]]:
        store.invalidate()
        root = self._root_of(store)
        out: list[tuple[int, Manifest | Exception | None]] = []
        for name in reversed(store.ls(root)):
            if not name.isdigit():
                continue
            try:
                raw = store.read_bytes(f"{root}/{name}/MANIFEST.json")
                found: Manifest | Exception | None = Manifest.parse(raw, name, self.key, self.job_id)
            except FileNotFoundError:
                found = None
            except (ValueError, OSError) as exc:  # InvalidManifest is a ValueError
                found = exc
            out.append((int(name), found))
        return out

    def list_manifests(self, strict: bool = False) -> list[Manifest]:
        """Committed checkpoints (a well-formed manifest present), newest first. With `strict`,
        a manifest that exists but cannot be read (a transient store error, not a bad shape)
        raises instead of being skipped."""
        out: list[Manifest] = []
        for seq, found, _ in self._scan():
            if strict and isinstance(found, Exception) and not isinstance(found, InvalidManifest):
                raise found
            if isinstance(found, Manifest) and not any(m.seq == seq for m in out):
                out.append(found)  # one entry per checkpoint, whatever its copies
        return out

    def _prune(self, newest: Manifest) -> None:
        """Keep the newest two checkpoints of any kind (one to fall back to) and `keep_last`
        periodic ones; drop superseded insurance/emergency ones, abandoned partial uploads and
        checkpoints whose manifest is damaged.

        Decided folder by folder: one manifest that cannot be read right now is kept and left
        out of the count (it might be committed), never a reason to stop pruning the rest.
        Across stores (`Config.regional_stores`) the count is of checkpoints, not copies: a
        kept checkpoint keeps every copy, so the only copy of a kept one is never deleted."""
        try:
            scan = self._scan()
        except Exception as exc:  # noqa: BLE001 - pruning is housekeeping, never fatal
            self.emit(ev.JobWarning(message=f"checkpoint pruning failed: {exc!r}"))
            return
        manifests: list[Manifest] = []
        for _, m, _ in scan:
            if isinstance(m, Manifest) and not any(k.seq == m.seq for k in manifests):
                manifests.append(m)
        try:  # blobs' temp files of uploads and copies that died (a live one's is younger)
            self.store.clean_temp(f"{self.root}/{BLOBS}")
        except OSError:
            pass
        gone: dict[str, set[str]] = {}
        keep = {m.seq for m in manifests[:2]}
        keep |= {m.seq for m in [m for m in manifests if m.kind in _PERSISTENT][: self.keep_last]}
        for seq, found, store in scan:
            if seq in keep or seq == newest.seq:
                continue
            root = self._root_of(store)
            if isinstance(found, Manifest):
                doomed = True
            elif found is None:
                # a partial upload a preemption or cancel left behind (older than this save,
                # and still without a manifest: not one committing right now)
                doomed = seq < newest.seq and not store.exists(f"{root}/{seq:08d}/MANIFEST.json")
            else:
                # a damaged manifest is never restorable; one unreadable for now may be fine
                doomed = isinstance(found, InvalidManifest) and seq < newest.seq
            if not doomed:
                continue
            try:
                self._delete(seq, store)
            except Exception as exc:  # noqa: BLE001 - the next save prunes again
                self.emit(ev.JobWarning(message=f"checkpoint pruning could not delete {seq}: {exc!r}"))
                continue
            if isinstance(found, Manifest):
                gone.setdefault(store.url, set()).update(found.blobs())
        # a blob goes with the last checkpoint of its store that listed it (only blobs of
        # checkpoints just deleted: one a save of another writer has uploaded but not
        # committed yet stays)
        for store in self.stores:
            kept = set().union(
                *(
                    m.blobs()
                    for _, m, s in scan
                    if s is store and isinstance(m, Manifest) and m.seq in keep | {newest.seq}
                )
            )
            for sha in sorted(gone.get(store.url, set()) - kept):
                try:
                    store.rm(f"{self._root_of(store)}/{BLOBS}/{sha}")
                except Exception as exc:  # noqa: BLE001 - the next prune does not see it again: say so
                    self.emit(
                        ev.JobWarning(message=f"checkpoint pruning could not delete blob {sha[:12]}: {exc!r}")
                    )

    def _delete(self, seq: int, store: Store | None = None) -> None:
        store = store or self.store
        folder = f"{self._root_of(store)}/{seq:08d}"
        store.rm(f"{folder}/MANIFEST.json")  # manifest first: never a valid-looking half
        store.rm(folder, recursive=True)

    # -- restore -------------------------------------------------------------------------
    def load_latest(self) -> tuple[Manifest, Any] | None:
        """The newest checkpoint whose manifest is well formed and whose files all verify, and
        its state; None if there is none. Every checkpoint passed over is reported as a
        `checkpoint_invalid` event saying why. With several stores, a checkpoint whose copy in
        one fails is taken from its copy in the next before an older one is tried."""
        several = len(self.stores) > 1
        for seq, manifest, store in self._scan():
            where = f" in {store.url}" if several else ""
            if manifest is None:
                continue
            if isinstance(manifest, Exception):
                self.emit(
                    ev.CheckpointInvalid(
                        seq=seq, step=None, reason=f"checkpoint {seq:08d}{where}: {manifest}"
                    )
                )
                continue
            found = self._load(manifest, store)
            if found is not None:
                self.restored_from = store.url
                return manifest, found
        return None

    def _load(
        self, manifest: Manifest, store: Store | None = None, files: dict[str, str] | None = None
    ) -> Any | None:
        """The state of `manifest` once every file it lists verified (None, with a
        `checkpoint_invalid` event, when one does not), its backed-up files put back at their
        paths. With `files` (a reader outside the job: `spotnb.weights`) they are not put back:
        their verified copies stay in the spool, listed in `files` (manifest name -> local path)
        for the caller to use before `close`."""
        store = store or self.store
        root = self._root_of(store)
        folder = f"{root}/{manifest.seq:08d}"
        paths: dict[str, str] = {}
        read: dict[tuple, tuple[BlobRef, torch.Tensor]] = {}  # tensors read from blobs: to adopt
        try:
            for name, meta in manifest.files.items():
                where = f"{root}/{BLOBS}/{meta['sha256']}" if meta.get("blob") else f"{folder}/{name}"
                try:
                    paths[name] = self._fetch_verified(where, meta, store)
                except ValueError:  # its bytes do not match its hash
                    if meta.get("blob") and store is self.store:
                        self._damaged_blobs.add(meta["sha256"])
                    raise
            state = torch.load(paths["state.pt"], map_location="cpu", weights_only=False)
            if DATA_NAME in paths:  # written chunked: the skeleton's tensors are in tensors.bin
                state = fill_refs(state, paths[DATA_NAME])
            if any(name.startswith("tensors/") for name in paths):  # stored by content
                state = fill_blobs(state, paths, read)
            if files is not None:
                files.update({name: paths[name] for name in manifest.dests})
            else:
                _put_back(manifest, paths)
        except Exception as exc:  # noqa: BLE001 - any damage means: take the previous checkpoint
            reason = str(exc) if len(self.stores) == 1 else f"in {store.url}: {exc}"
            self.emit(ev.CheckpointInvalid(seq=manifest.seq, step=manifest.step, reason=reason))
            return None
        finally:
            kept = set((files or {}).values())
            for path in paths.values():
                if path.startswith(self.spool) and os.path.exists(path) and path not in kept:
                    os.unlink(path)
        # for `adopt`, once the caller has loaded the state: only blobs the write store holds
        # can be referenced by the next save (one restored from another store is written anew)
        self.incremental.restored = read if store is self.store else {}
        return state

    def _fetch_verified(self, path: str, meta: dict[str, Any], store: Store | None = None) -> str:
        """Copy `path` to the spool, checking its size and the digest its entry carries (sha256
        or BLAKE3, `digest.of`); ValueError when they differ. The local copy's path."""
        algo, want = digest.of(meta)
        hasher = digest.new(algo)
        local = os.path.join(self.spool, f"restore-{uuid.uuid4().hex[:8]}")
        size = 0
        with (store or self.store).fs.open(path, "rb") as src, open(local, "wb") as out:
            while chunk := src.read(CHUNK):
                hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
        got = hasher.hexdigest()
        if size != meta["size"] or got != want:
            os.unlink(local)
            raise ValueError(
                f"{path}: size {size} / {algo} {got[:12]} do not match the "
                f"manifest ({meta['size']} / {want[:12]})"
            )
        return local
