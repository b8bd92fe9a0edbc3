"""The content digests a checkpoint manifest carries, and checking them.

A manifest entry names its digest by its key: `{"size": n, "blake3": "<hex>"}` or
`{"size": n, "sha256": "<hex>"}`. Restore, the regional copy and pruning read whichever the
entry carries (`of`), so manifests written before BLAKE3 (sha256 only) still restore.

Why two:

- **sha256** stays where the digest is an address: the content-addressed blobs
  (`blobs/<sha256>`: backed-up files, unchanged tensors of incremental saves) are named by it,
  and dedup across saves (and across the checkpoints that already exist) depends on that name.
- **BLAKE3** (`FRESH`) for the files a save writes by value (`tensors.bin`, `state.pt`, a
  sharded save's DCP files): hashing every byte of every save is the one pass spotnb does that
  `torch.distributed.checkpoint` does not, and on a small host it competes with training.
  BLAKE3 is ~4× sha256's speed on one core (6.0 vs 1.6 GB/s on the 2-core Xeon of
  benchmarks/CHECKPOINT.md, with AVX-512) and, unlike xxh3 (18 GB/s there) or CRC32, it is a
  cryptographic hash: the signed manifest (`signing.py`) still pins every byte a restore
  reads, so who can write the store can corrupt a checkpoint's tensors or its pickled
  `state.pt` only detectably. A non-cryptographic 128-bit hash with a public secret would let
  them forge a colliding `state.pt`, which restore unpickles.

Shared by the runtime and the notebook side (the regional copy): imports neither.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

__all__ = ["ALGORITHMS", "FRESH", "ADDRESS", "fresh", "new", "of", "problem", "MissingHasher"]

log = logging.getLogger(__name__)

#: the digest of files a save writes by value
FRESH = "blake3"
#: the digest that names a content-addressed blob (`blobs/<sha256>`)
ADDRESS = "sha256"
#: every digest a manifest entry may carry (hex characters of each); when an entry carries
#: several, the first of these is the one checked
ALGORITHMS: dict[str, int] = {"blake3": 64, "sha256": 64}

_warned = False


class MissingHasher(RuntimeError):
    """A checkpoint file's digest needs a package this Python does not have."""


def new(algo: str) -> Any:
    """A fresh hasher of `algo` (`update`, `hexdigest`), single-threaded (the cores belong to
    training)."""
    if algo == "sha256":
        return hashlib.sha256()
    if algo == "blake3":
        try:
            from blake3 import blake3
        except ImportError:
            raise MissingHasher(
                "this checkpoint's files carry BLAKE3 digests and the blake3 package is not "
                "installed: `pip install blake3` (a dependency of spotnb) to restore it"
            ) from None
        return blake3()
    raise ValueError(f"unknown digest {algo!r}: one of {', '.join(ALGORITHMS)}")


def fresh() -> tuple[str, Any]:
    """(name, hasher) for a file a save writes by value: BLAKE3, or sha256 when the blake3
    package cannot be imported (an install without spotnb's dependencies: said once)."""
    global _warned
    try:
        return FRESH, new(FRESH)
    except MissingHasher:
        if not _warned:
            _warned = True
            log.warning("checkpoint: the blake3 package is missing; hashing with sha256 (slower)")
        return ADDRESS, new(ADDRESS)


def of(meta: dict[str, Any]) -> tuple[str, str]:
    """(algorithm, hex digest) a manifest entry carries: the first of `ALGORITHMS` present.
    ValueError when it carries none (`Manifest.parse` refuses such an entry first)."""
    for algo in ALGORITHMS:
        if isinstance(meta.get(algo), str):
            return algo, meta[algo]
    raise ValueError(f"a manifest entry carries no digest ({' or '.join(ALGORITHMS)}): {sorted(meta)}")


def problem(meta: Any) -> str | None:
    """What is wrong with a manifest entry's size and digests, or None: a non-negative int
    `size`, at least one digest of `ALGORITHMS`, each digest present a hex string of its length,
    and a blob (`"blob": true`, stored by content) carrying the sha256 that names it."""
    if not isinstance(meta, dict):
        return f"is a {type(meta).__name__}, not an object with a size and a digest"
    size = meta.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"has size {size!r}, not a non-negative int"
    present = [a for a in ALGORITHMS if a in meta]
    if not present:
        return f"carries no digest: it needs one of {', '.join(repr(a) for a in ALGORITHMS)} besides its size"
    for algo in present:
        value = meta[algo]
        if not (isinstance(value, str) and len(value) == ALGORITHMS[algo] and _is_hex(value)):
            return f"has a {algo} that is not {ALGORITHMS[algo]} hex digits: {value!r}"
    if meta.get("blob") and ADDRESS not in meta:
        return f"is a blob without the {ADDRESS} that names it (blobs/<{ADDRESS}>)"
    return None


def _is_hex(value: str) -> bool:
    return all(c in "0123456789abcdef" for c in value)
