"""A checkpoint's `MANIFEST.json`, and the pure decisions made from manifests.

A checkpoint exists only once its manifest does: the manifest lists every file with its size
and digest (`digest.py`), the step and kind of save, and where backed-up files go back to.
Everything here is pure (no store, no clock, no threads): building a manifest from what an
upload wrote, writing and parsing its JSON (signed when the job has a key), checking a fetched
copy against its entry, and ordering what a scan of the stores found so that restore takes the
newest checkpoint first. The writer (`upload.py`), the reader (`restore.py`), retention
(`prune.py`), sharded saves (`sharded.py`) and `spotnb.weights` share it, so the file they all
read and write is defined once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from spotnb.core.protocol import SaveKind
from spotnb.core.signing import BadSignature, sign_doc, verify_doc
from spotnb.core.store import is_safe_name
from spotnb.runtime.checkpoint import digest

__all__ = [
    "Manifest",
    "InvalidManifest",
    "Found",
    "BLOBS",
    "CHUNK",
    "build",
    "check_copy",
    "step_of",
    "newest_first",
    "distinct",
]

#: the unit checkpoint files are copied and hashed in (spooling, upload, restore)
CHUNK = 4 * 1024 * 1024
#: the folder of backed-up files, by content, beside the numbered checkpoint folders
BLOBS = "blobs"

T = TypeVar("T")


class InvalidManifest(ValueError):
    """A MANIFEST.json that exists but cannot describe a checkpoint (unparseable, wrong shape).

    The checkpoint it names is skipped like one whose files fail their hash: restore falls
    back to the one before, and pruning treats it as debris instead of giving up."""


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

#: what reading one checkpoint folder's manifest gave: the manifest, None when it has none (a
#: partial upload or copy), or the exception that reading or checking it raised
Found: TypeAlias = Manifest | Exception | None


def build(
    seq: int,
    step: int,
    kind: SaveKind,
    files: dict[str, dict[str, Any]],
    incarnation: int,
    created: float,
    snapshot_s: float,
    upload_s: float,
    dests: dict[str, str],
    dirs: dict[str, str],
) -> Manifest:
    """The manifest of a whole-state save that uploaded `files`: what it wrote (`nbytes`) and
    what it lists without writing (`referenced`: entries marked `reused`, blobs an earlier
    checkpoint stored) are told apart, so the policy's β measures only bytes that moved."""
    total = sum(f["size"] for f in files.values() if not f.get("reused"))
    reused = sum(f["size"] for f in files.values() if f.get("reused"))
    return Manifest(
        seq=seq,
        step=step,
        kind=kind,
        files=files,
        incarnation=incarnation,
        created=created,
        snapshot_s=snapshot_s,
        upload_s=upload_s,
        nbytes=total,
        referenced=reused,
        dests=dests,
        dirs=dirs,
    )


def check_copy(path: str, meta: dict[str, Any], size: int, got: str) -> None:
    """ValueError unless a copy of `path` of `size` bytes, whose hex digest (of the algorithm
    the entry carries, `digest.of`) is `got`, is what the manifest entry `meta` records."""
    algo, want = digest.of(meta)
    if size != meta["size"] or got != want:
        raise ValueError(
            f"{path}: size {size} / {algo} {got[:12]} do not match the "
            f"manifest ({meta['size']} / {want[:12]})"
        )


def step_of(found: Found) -> float:
    """The step a scanned folder holds, for ordering: -inf when it has no readable manifest."""
    return float(found.step) if isinstance(found, Manifest) else -math.inf


def newest_first(found: Iterable[tuple[int, int, Found, T]]) -> list[tuple[int, Found, T]]:
    """Scanned folders `(seq, rank of its store, what its manifest gave, store)` in the order
    restore tries them: highest number first. One number in two stores is one checkpoint's
    copies (same step), or two checkpoints numbered while one store was out of reach: the one
    further on (higher step) first, then the stores in their rank (the write store first)."""
    ordered = sorted(found, key=lambda item: (-item[0], -step_of(item[2]), item[1]))
    return [(seq, manifest, store) for seq, _, manifest, store in ordered]


def distinct(found: Iterable[Found]) -> list[Manifest]:
    """The committed checkpoints among scanned folders (in the order given), one entry per
    checkpoint whatever its copies: the first manifest of each number."""
    out: list[Manifest] = []
    for m in found:
        if isinstance(m, Manifest) and not any(k.seq == m.seq for k in out):
            out.append(m)
    return out


def _manifest_name(seq: int | str) -> str:
    """What a manifest's signature binds it to: its place, so it cannot be moved to another."""
    return f"ckpt/{int(seq):08d}/MANIFEST.json"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
