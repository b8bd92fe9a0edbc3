"""spotnb ships itself: the notebook's own spotnb, as a wheel in the store, is what a VM installs.

spotnb is not on the public index, and a notebook often runs an unreleased checkout; so a VM's
boot script cannot `pip install spotnb==<version>` (`Config.spotnb_source="index"` still does,
for those who publish it). With `spotnb_source="store"` (the default) the submit packages the
spotnb this process imported, whatever its origin (a wheel, an editable checkout, a git
install), and every VM of the job installs exactly that:

1. **Built from the imported package's files** (`spotnb/` as imported; never a build backend on
   a source tree: an installed wheel has no pyproject, a git install no checkout), without the
   JupyterLab extension (`spotnb/labextension`: a VM needs none, building it needs npm),
   `__pycache__` or dot-files. The zip is deterministic (sorted entries, fixed timestamps and
   modes), so the same code gives the same bytes and the same sha256; the build is cached per
   process on the files' sizes and mtimes, so a second submit costs a `stat` per file.
2. **Requires-Dist pinned to the notebook's versions** of what the VM runtime imports
   (`RUNTIME_DEPS`); numpy unpinned (the image's, built with its torch); torch not at all (the
   image's CUDA torch is used: `torch_requirement` is the hook for issue #25 item 2). The extras
   a VM asks for (`aws`, `azure`, `gcp`: the store's driver and, on a coordinator that drives the
   job, the cloud's SDK; `elastic`: torchft when `instances > 1`) are pinned the same way.
3. **Stored by content** at `code/spotnb-<version>-<sha256>.whl` under the store's root (shared by
   the jobs of the store, uploaded once per content; an object of that name with other bytes is
   replaced), and **referenced per job** by `jobs/<id>/code.json`, signed with the job key like
   `fn.pkl`: path, size and sha256. The launcher (the controller, here or on the job's
   coordinator) verifies that signature and the object's bytes, then writes the size and the
   sha256 into the boot script, the one document a VM trusts (it already carries the job key).
4. **Fetched with the VM's own identity** by `spotnb.providers.code_fetch` (standard library:
   it runs before spotnb exists on the VM), which refuses bytes of another size or sha256 with a
   log line; the boot script then powers the VM off, as after a failed install.

Why not a pre-signed URL (S3 presigned GET, GCS signed URL, Azure SAS) made at launch: it
carries the launcher's access key id and, with temporary credentials, its session token into
the VM's user data, which spotnb keeps free of credentials; a GCS URL cannot be signed with a
user's own credentials at all; and a job relaunches VMs for days, so each launch would need a
fresh one. The VM reaches the store with its identity anyway (the agent does, right after), so
reading one more object with it needs no new permission and no expiry. The coordinator that only
runs torchft's lighthouse has no identity (it reads nothing of the job): its boot script carries
the one module it runs instead (`bootstrap.coordinator_script`).

Notebook side: imports the store and the signing, never a provider or the runtime.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import threading
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotnb.core.signing import BadSignature, load_key, sign_doc, verify_doc
from spotnb.core.store import Store
from spotnb.errors import ConfigError, SpotnbError
from spotnb.market.transfer import store_cloud

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "CODE_DIR",
    "CODE_DOC",
    "RUNTIME_DEPS",
    "EXTRAS",
    "Wheel",
    "CodeRef",
    "CodeError",
    "build_wheel",
    "package_dir",
    "needs_code",
    "ship",
    "shipped",
    "code_for_launch",
    "planned_code",
    "pinned",
    "torch_requirement",
    "source_requirement",
    "own_requirement",
    "store_extra",
]

log = logging.getLogger("spotnb.providers.shipping")

CODE_DIR = "code"
CODE_DOC = "code.json"
#: What the runtime on a VM imports besides torch and numpy (pyproject's dependencies less the
#: notebook's own: ipywidgets, plotly, anywidget, pyyaml): pinned to the notebook's versions.
RUNTIME_DEPS = ("blake3", "cloudpickle", "fsspec", "pydantic")
#: Required, any version: the image's, built against its torch.
IMAGE_DEPS = ("numpy",)
#: The extras a VM may ask for (pyproject's of the same names), each pinned like RUNTIME_DEPS.
EXTRAS: dict[str, tuple[str, ...]] = {
    "aws": ("boto3", "s3fs"),
    "azure": ("adlfs", "azure-identity", "azure-mgmt-compute", "azure-mgmt-resource", "azure-storage-blob"),
    "gcp": ("gcsfs", "google-cloud-compute"),
    "elastic": ("torchft-nightly",),
}
#: Folders of the package a VM never needs (relative to `spotnb/`).
_SKIP_DIRS = {"labextension"}
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip can hold: every entry the same
_SUMMARY = "Train on cheap spot / preemptible GPUs from a Jupyter notebook, safely."


class CodeError(SpotnbError):
    """The job's shipped spotnb cannot be used: its `code.json` does not verify, or the wheel it
    names is gone or damaged and this process cannot put it back."""


@dataclass(frozen=True)
class Wheel:
    """A built spotnb wheel: its bytes and what it declares."""

    version: str
    sha256: str
    requires: tuple[str, ...]
    data: bytes = field(repr=False)
    files: tuple[str, ...] = field(default=(), repr=False)

    @property
    def filename(self) -> str:
        """The name pip needs to install it (name, version, tags)."""
        return f"spotnb-{self.version}-py3-none-any.whl"

    @property
    def store_name(self) -> str:
        """Its name in the store's `code/` folder: by content."""
        return f"spotnb-{self.version}-{self.sha256}.whl"


@dataclass(frozen=True)
class CodeRef:
    """Where a VM gets the job's spotnb and what it must be (written into the boot script)."""

    url: str  # the wheel in the store (a URL of the store's scheme, or a path)
    sha256: str
    size: int
    version: str
    extras: tuple[str, ...] = ()
    planned: bool = False  # a dry run's: built here, not uploaded

    def with_extras(self, extras: Any) -> CodeRef:
        wanted = tuple(dict.fromkeys(e for e in extras if e))
        return dataclasses.replace(self, extras=wanted)

    def describe(self) -> str:
        extras = f" with [{','.join(self.extras)}]" if self.extras else ""
        when = "uploaded at submit" if self.planned else "in the store"
        return (
            f"this notebook's spotnb {self.version} as a wheel {when}: {self.url} "
            f"({self.size / 1024:.0f} KiB, sha256 {self.sha256[:12]}…), installed{extras} with "
            "its dependencies pinned to this notebook's versions; the VM checks its sha256 first"
        )


# -- the wheel -----------------------------------------------------------------------------------
def package_dir() -> Path:
    """The folder of the spotnb this process imported."""
    import spotnb

    return Path(spotnb.__file__).resolve().parent


def _files(root: Path) -> list[tuple[str, Path]]:
    """(name in the wheel, file) of every file of the package a VM needs, sorted."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        top = here == root
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d != "__pycache__" and not d.startswith(".") and not (top and d in _SKIP_DIRS)
        )
        for name in filenames:
            if name.startswith(".") or name.endswith((".pyc", ".pyo")):
                continue
            found.append(("spotnb/" + (here / name).relative_to(root).as_posix(), here / name))
    return sorted(found)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> dict[str, str]:
    """spotnb's own declared requirements by normalised name (`s3fs>=2024.12.0`, or in a wheel
    this module built, `s3fs==2026.9.0`): what a package not installed here is asked for."""
    try:
        reqs = metadata.requires("spotnb") or []
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, str] = {}
    for req in reqs:
        spec = req.split(";", 1)[0].strip()
        m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec)
        if m:
            out.setdefault(_norm(m.group(0)), spec)
    return out


#: The pin stated in pyproject.toml, if neither torchft nor spotnb's metadata is installed here.
_FALLBACK = {"torchft-nightly": "torchft-nightly==2026.10.26"}


def pinned(name: str, declared: dict[str, str] | None = None) -> str:
    """`name==<the version installed here>`; else what spotnb declares for it; else `name`."""
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        pass
    declared = _declared() if declared is None else declared
    return declared.get(_norm(name)) or _FALLBACK.get(name, name)


def torch_requirement() -> str | None:
    """The torch a VM must install, or None to keep the image's (today: always None). Issue #25
    item 2 (the notebook's torch on the VM) plugs in here: what it returns joins Requires-Dist."""
    return None


def _requires() -> tuple[str, ...]:
    declared = _declared()
    reqs = [pinned(n, declared) for n in RUNTIME_DEPS] + list(IMAGE_DEPS)
    torch = torch_requirement()
    if torch:
        reqs.append(torch)
    for extra, names in EXTRAS.items():
        reqs += [f'{pinned(n, declared)}; extra == "{extra}"' for n in names]
    return tuple(reqs)


def _metadata(version: str, requires: tuple[str, ...]) -> bytes:
    lines = [
        "Metadata-Version: 2.1",
        "Name: spotnb",
        f"Version: {version}",
        f"Summary: {_SUMMARY}",
        "License: Apache-2.0",
        "Requires-Python: >=3.10",
    ]
    lines += [f"Provides-Extra: {e}" for e in EXTRAS]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return ("\n".join(lines) + "\n").encode()


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _zip(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, whatever this machine is: the same bytes everywhere
            z.writestr(info, data)
    return buf.getvalue()


def _build(version: str, files: list[tuple[str, Path]], requires: tuple[str, ...]) -> Wheel:
    info = f"spotnb-{version}.dist-info"
    entries = [(name, path.read_bytes()) for name, path in files]
    entries += [
        (f"{info}/METADATA", _metadata(version, requires)),
        (
            f"{info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: spotnb\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        ),
        (f"{info}/entry_points.txt", b"[console_scripts]\nspotnb = spotnb.cli:main\n"),
        (f"{info}/top_level.txt", b"spotnb\n"),
    ]
    record = "".join(f"{n},{_record_digest(d)},{len(d)}\n" for n, d in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))
    data = _zip(entries)
    return Wheel(version, hashlib.sha256(data).hexdigest(), requires, data, tuple(n for n, _ in files))


_LOCK = threading.Lock()
_CACHE: dict[str, Any] = {}


def build_wheel() -> Wheel:
    """This process's spotnb as a wheel (see the module docstring); cached while no file of the
    package changed (size, mtime) and the pins are the same."""
    from spotnb import __version__

    root = package_dir()
    files = _files(root)
    if not any(name == "spotnb/__init__.py" for name, _ in files):  # zipimport, a frozen app
        raise CodeError(
            f"cannot package this notebook's spotnb: {root} holds no spotnb/__init__.py to read. "
            "Set spotnb_source='index' (the published release) or a pip spec of spotnb"
        )
    requires = _requires()
    stamp = (__version__, requires, tuple((n, p.stat().st_mtime_ns, p.stat().st_size) for n, p in files))
    with _LOCK:
        if _CACHE.get("stamp") == stamp:
            return _CACHE["wheel"]
        wheel = _build(__version__, files, requires)
        _CACHE.update(stamp=stamp, wheel=wheel)
        return wheel


# -- what a job installs -------------------------------------------------------------------------
def store_extra(store_url: str) -> str | None:
    """The spotnb extra that brings the store's fsspec driver (s3:// → aws, gs:// → gcp ...):
    each cloud's extra is named after the cloud its store lives on."""
    return store_cloud(store_url)


def own_requirement(requirements: Any) -> bool:
    """Whether the job's requirements name spotnb itself (the older way to give its source)."""
    return any(re.match(r"^\s*spotnb\b", str(r)) for r in requirements or ())


def source_requirement(config: Config) -> list[str]:
    """`Config.spotnb_source` as a pip requirement to add (a spec), or nothing ("store", "index")."""
    source = getattr(config, "spotnb_source", "store")
    return [] if source in ("store", "index") else [source]


def needs_code(config: Config) -> bool:
    """Whether a VM of this job that installs spotnb (a cloud's: `Provider.ships_code`) installs
    the store's wheel: `spotnb_source="store"` and no spotnb in the requirements."""
    return getattr(config, "spotnb_source", "store") == "store" and not own_requirement(config.requirements)


def _ref(store_url: str, wheel: Wheel, planned: bool = False) -> CodeRef:
    return CodeRef(
        url=f"{store_url.rstrip('/')}/{CODE_DIR}/{wheel.store_name}",
        sha256=wheel.sha256,
        size=len(wheel.data),
        version=wheel.version,
        planned=planned,
    )


_VERIFIED: set[tuple[str, str]] = set()  # (store, object) whose bytes this process checked


def _upload(store: Store, wheel: Wheel) -> None:
    """Put the wheel at its name unless the same bytes are there (checked once per process)."""
    path = store.path(CODE_DIR, wheel.store_name)
    if (store.url, path) in _VERIFIED:
        return
    try:
        try:
            there = store.read_bytes(path)
        except FileNotFoundError:
            there = None
        if there is None or hashlib.sha256(there).hexdigest() != wheel.sha256:
            if there is not None:
                log.warning(
                    "%s/%s/%s did not hold the bytes its name says (replaced or damaged in the "
                    "store); uploading it again",
                    store.url,
                    CODE_DIR,
                    wheel.store_name,
                )
            store.write_bytes(path, wheel.data)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"Config.store: cannot put this notebook's spotnb into {store.url}/{CODE_DIR}/ "
            f"({type(exc).__name__}: {exc}); the job's VMs install it from there. Let this "
            "machine write the store, or set spotnb_source='index' (the published release) or a "
            "pip spec of spotnb"
        ) from None
    _VERIFIED.add((store.url, path))


def ship(store: Store, job_id: str, key: bytes, config: Config, vms: bool = True) -> CodeRef | None:
    """At submit: build this process's spotnb, upload it by content and write the job's signed
    `code.json`. None when the job's VMs do not install it: `vms` is False (a provider whose
    instances run this machine's Python: the local market), or not `needs_code`."""
    if not vms or not needs_code(config):
        return None
    try:
        wheel = build_wheel()
    except (OSError, CodeError) as exc:  # an unreadable file of the package, no package files
        raise ConfigError(f"Config.spotnb_source: {exc}") from None
    _upload(store, wheel)
    doc = {
        "wheel": f"{CODE_DIR}/{wheel.store_name}",
        "sha256": wheel.sha256,
        "size": len(wheel.data),
        "version": wheel.version,
        "requires": list(wheel.requires),
    }
    store.write_bytes(store.job(job_id, CODE_DOC), json.dumps(sign_doc(key, job_id, CODE_DOC, doc)).encode())
    ref = _ref(store.url, wheel)
    with _LOCK:
        _SHIPPED[(store.url, job_id)] = ref
    return ref


_SHIPPED: dict[tuple[str, str], CodeRef] = {}  # verified code.json per (store, job)


def shipped(store: Store, job_id: str, key: bytes | None) -> CodeRef | None:
    """The job's `code.json`, verified with its key; None if it has none (submitted by a spotnb
    that did not ship itself, or with another source). A bad signature raises CodeError."""
    with _LOCK:
        known = _SHIPPED.get((store.url, job_id))
    if known is not None:
        return known
    try:
        raw = store.read_bytes(store.job(job_id, CODE_DOC))
    except FileNotFoundError:
        return None
    try:
        doc = verify_doc(key, job_id, CODE_DOC, json.loads(raw))
        name = str(doc["wheel"])
        ok = re.fullmatch(rf"{CODE_DIR}/spotnb-[A-Za-z0-9.+!_-]+-[0-9a-f]{{64}}\.whl", name)
        if not ok or not name.endswith(f"-{doc['sha256']}.whl"):
            raise ValueError(f"it names {name!r}, not a wheel of {CODE_DIR}/ by its sha256")
        ref = CodeRef(
            url=f"{store.url}/{name}",
            sha256=str(doc["sha256"]),
            size=int(doc["size"]),
            version=str(doc["version"]),
        )
    except BadSignature as exc:
        raise CodeError(f"{exc}; its VMs would install code nobody shipped: not launching") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CodeError(f"job {job_id}: {CODE_DOC} is damaged ({exc}); not launching") from None
    with _LOCK:
        _SHIPPED[(store.url, job_id)] = ref
    return ref


def _check_object(store: Store, ref: CodeRef) -> None:
    """Before a launch: the wheel is in the store, whole. A missing or damaged one is put back
    when this process builds the very same bytes; otherwise CodeError (a VM would refuse it)."""
    name = ref.url.rsplit("/", 1)[-1]
    path = store.path(CODE_DIR, name)
    try:
        there = store.read_bytes(path)
    except FileNotFoundError:
        there = None
    if there is not None and hashlib.sha256(there).hexdigest() == ref.sha256:
        return
    wheel = build_wheel()
    if wheel.sha256 == ref.sha256:
        _VERIFIED.discard((store.url, path))
        _upload(store, wheel)
        return
    what = "is gone from" if there is None else "was replaced or damaged in"
    raise CodeError(
        f"the job's spotnb wheel {ref.url} {what} the store, and this machine's spotnb is other "
        "code (another sha256), so it cannot put it back: a VM would refuse it. Resubmit the job "
        "(or resume it from a notebook with the same spotnb)"
    )


def planned_code(config: Config) -> CodeRef | None:
    """A dry run's reference: this process's wheel where the submit would put it (nothing sent)."""
    if not needs_code(config):
        return None
    return _ref(config.store_url(), build_wheel(), planned=True)


def code_for_launch(
    config: Config, job_id: str, extras: Any = (), key: bytes | None = None
) -> CodeRef | None:
    """What a VM of `job_id` installs spotnb from, for its boot script: the job's verified
    `code.json` (shipped now if the job has none, e.g. submitted by an older spotnb), its wheel
    checked in the store; None when the job installs spotnb another way. Without the job's key
    on this machine (a dry run) it is the dry run's reference: the instance would refuse the job
    anyway (`Provider.launch` warns). `key`: the job's, when the caller holds it (a hosting
    coordinator's launch); else the key file's."""
    if not needs_code(config):
        return None
    key = key or load_key(job_id)
    if key is None:
        ref = planned_code(config)
        return ref.with_extras(extras) if ref is not None else None
    store = Store(config.store_url())
    ref = shipped(store, job_id, key) or ship(store, job_id, key, config)
    if ref is None:
        return None
    _check_object(store, ref)
    return ref.with_extras(extras)
