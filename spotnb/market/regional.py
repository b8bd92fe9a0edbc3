"""The checkpoint follows the job to another region (`Config.regional_stores`, issue 10).

The job's home store keeps what it keeps (spec, function, events, incarnation documents,
result); its checkpoints may also live in a store near a zone, `regional_stores={"<region or
zone>": "<url>"}`. Before an incarnation restores, the controller decides where it reads and
writes (`Regional.place`, from `ZonePlanner.place_checkpoint`), by cost, with B the newest
committed checkpoint's bytes (written + referenced: what a restore reads), b the bytes one
save writes, S the policy's expected number of later saves over the remaining work there
(`expected_saves`) and r(x→y) the $/GB between two places (`Provider.egress_per_gb`):

    copy        = B·c(source→target)  + B·r(target→zone)     then every save stays in the region
    read across = B·r(source→zone)    + S·b·r(zone→source)   every save crosses back

where `target` is the zone's store (its region's, or the home store when the zone has none)
and c the copy's route: the controller streams the copy, so its bytes go through the
controller's machine (`Regional.copy_rate`: a notebook's controller pays the source cloud's
internet egress; on the local market, or with a controller beside the home store, source →
home → target). Both sides pay the checkpoint's crossing once; the copy pays off by the saves
that then stay in the region, so it wins with a save or more to come and a copy route no
dearer than the restore's, and loses near the end of the job or when its route is dearer (a
notebook's controller, two regions far from home). The copy is made only when it costs
strictly less (a tie reads across: copying would only add a wait). The choice, both costs
and why go into a `checkpoint_placed` event; the $ spent (the copy or the restore across,
then each save written across) is the ledger's transfer line.

A copy (`copy_checkpoint`) streams every file the manifest lists (its blobs too) to the
target, each written atomically and read back to check its digest and size against the
manifest, and writes the manifest last, byte for byte (its signature binds it to
`ckpt/<seq>/MANIFEST.json` and the job, not to a store, so the agent verifies it there as
at home). A controller killed mid-copy leaves files without a manifest: not a checkpoint;
restore skips them, the next copy of that seq overwrites them, pruning removes them.

The instance learns the choice from `incarnations/<n>.ckpt.json` (`{"write": url, "read":
[urls]}`), which the controller writes after the copy and which the agent waits for (after
the previous incarnation's end marker) when its incarnation document says `ckpt_doc`. It
reads from every store of the job (`read`): restore takes the newest committed checkpoint whose
files verify across them, a copy that fails falling back to its other copies, then to older
checkpoints (`runtime.checkpoint.Checkpointer`, `read_stores`). Each store is reached with the
same credentials as the home store (the SDK's chain on the instance); nothing secret is in a
URL (refused at Config).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import posixpath
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotnb.core.store import Store, is_safe_name
from spotnb.market.placement import Transfer
from spotnb.runtime.checkpoint import digest

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "CKPT_DOC",
    "CopyFailed",
    "Placement",
    "Regional",
    "check_config",
    "choose",
    "copy_checkpoint",
    "expected_saves",
    "newest_committed",
]

log = logging.getLogger("spotnb.market.regional")

#: an incarnation's checkpoint document: `incarnations/<n>.ckpt.json`
CKPT_DOC = "{n:04d}.ckpt.json"
_CHUNK = 4 * 1024 * 1024


class CopyFailed(RuntimeError):
    """A checkpoint could not be copied (a source file that does not match its manifest, a
    target that refused a write); nothing that could be taken for committed was left."""


# -- configuration --------------------------------------------------------------------------
def check_config(config: Config, check_url: Callable[[str], object]) -> None:
    """Refuse `Config.regional_stores` that could not work, before anything is launched:
    raises ValueError naming the field, the entry and the fix. `check_url`: the home store's
    URL check (`Config.store`'s: no credentials, a writable filesystem, an absolute path)."""
    stores = config.regional_stores
    if stores is None:
        return

    if not isinstance(stores, dict) or not stores:
        raise ValueError(
            "regional_stores: give {region or zone: store URL}, e.g. "
            "{'us-west-2': 's3://my-bucket-usw2/spot'}"
        )
    if config.instances > 1 or (config.procs_per_instance or 1) > 1:
        raise ValueError(
            "regional_stores applies to jobs on one instance with one process (a group restores "
            "from its peers or in shards); remove regional_stores, or set instances=1 and "
            "procs_per_instance=1"
        )
    if config.procs_per_instance is None and config.provider != "local":
        from spotnb.market.gpus import gpu_count

        types = (
            config.instance_type.values()
            if isinstance(config.instance_type, dict)
            else [config.instance_type]
        )
        many = [t for t in types if (gpu_count(str(t)) or 1) > 1]
        if many:
            raise ValueError(
                f"regional_stores applies to one process per instance, and {many[0]!r} would run "
                "one per GPU (procs_per_instance defaults to the GPU count): set "
                "procs_per_instance=1, or remove regional_stores"
            )
    home = _where(config.store_url())
    seen: dict[tuple[str, str], str] = {}
    zones = _runnable(config)
    for key, url in stores.items():
        field = f"regional_stores[{key!r}]"
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"regional_stores: a key {key!r} is not a region or zone name")
        if not isinstance(url, str) or not url.strip():
            raise ValueError(f"{field}: give a store URL, e.g. 's3://bucket/prefix', not {url!r}")
        if url != url.strip():
            raise ValueError(
                f"{field}: the URL {url!r} has spaces or a line break around it (a folder would "
                "be made under each process's working directory); remove them"
            )
        if "?" in url:
            raise ValueError(
                f"{field}: the URL carries a query (a SAS token?); it would travel in the job's "
                "events. Give the bucket only: the regional store is reached with the same "
                "credentials as the home store"
            )
        try:
            check_url(url.strip())
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}") from None
        _check_visible(field, url, config.provider)
        where = _where(url.strip())
        if where == home:
            raise ValueError(f"{field} is the job's home store; leave that zone out of regional_stores")
        if where in seen:
            raise ValueError(f"{field} is also the store of {seen[where]!r}: one store per region")
        seen[where] = key
        if zones is not None and not any(z == key or z.startswith(key) for z in zones):
            raise ValueError(
                f"{field}: the job cannot run in {key!r}; its zones are {sorted(zones)}. Name one "
                "of them (or its region), or add it to regions"
            )
        _check_reachable(field, url.strip())


def _check_visible(field: str, url: str, provider: str) -> None:
    """The instances write their checkpoints there: a store only this process sees (memory://)
    or, for a job on cloud VMs, a folder of this machine would take saves that die with the
    instance (the home store is refused so by the provider's check; this one is not its)."""
    from fsspec.core import split_protocol

    protocol = (split_protocol(url)[0] or "file").lower()
    if protocol == "memory":
        raise ValueError(
            f"{field}: a memory:// store is visible to one process only; the instances would "
            "save where nothing outlives them. Give a folder or a bucket"
        )
    if provider != "local" and protocol in ("file", "local"):
        raise ValueError(
            f"{field}: provider={provider!r} runs the job on cloud VMs, which cannot reach {url!r} "
            "on this machine (their saves would stay on their own disks); give a bucket in that "
            "region, e.g. 's3://my-bucket-usw2/spot'"
        )


def _where(url: str) -> tuple[str, str]:
    """(filesystem, absolute root) of a store URL: two spellings of one folder or bucket
    (`file:///d/s`, `/d/s/`, `/d/./s`) are one place."""
    from fsspec.core import split_protocol

    protocol, rest = split_protocol(url)
    protocol = (protocol or "file").lower()
    if protocol in ("file", "local"):
        return ("file", os.path.realpath(os.path.expanduser(rest)))
    return (protocol, rest.strip("/"))


def _same_place(a: Store, b: Store) -> bool:
    if a.local and b.local:
        return os.path.realpath(a.root) == os.path.realpath(b.root)
    return a.fs.protocol == b.fs.protocol and a.root.strip("/") == b.root.strip("/")


def _runnable(config: Config) -> list[str] | None:
    """The zones the job may run in, when known without asking a cloud (None: any)."""
    regions = config.candidate_regions()
    if config.provider == "local":
        zones = list(getattr(config, "local_regions", None) or {"local": None})
        return zones if regions == "cheapest" or not regions else list(regions)
    return list(regions) if isinstance(regions, list) and regions else None


def _check_reachable(field: str, url: str) -> None:
    """A local folder must exist or be creatable by this user; object stores are asked at the
    first copy (their credentials are the home store's)."""
    from fsspec.core import split_protocol

    protocol, rest = split_protocol(url)
    if protocol not in (None, "file", "local"):
        return
    path = os.path.expanduser(rest)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{field}: {path} is a file, not a folder")
    try:  # the folder the instances will write: made now (owner only), and written once
        os.makedirs(path, mode=0o700, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".spotnb-probe-"):
            pass
    except OSError as exc:
        raise ValueError(
            f"{field}: {path} cannot be created or written ({exc.strerror or exc}); mount it, "
            "free space or fix its permissions, or choose another folder"
        ) from None


# -- the cost rule ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """Where an incarnation restores from and writes, and why (`choose`)."""

    action: str  # copy | read_across | in_place | fresh
    write: str  # the URL its saves go to
    copy_cost: float
    read_cost: float
    cost: float  # $ spent now (the copy and its restore, or the restore across)
    save_per_gb: float  # $/GB of each later save
    reason: str


def choose(
    nbytes: float,
    save_bytes: float,
    saves: float,
    rates: Mapping[str, float],
    source: str,
    target: str,
) -> Placement:
    """The cost rule of the module's docstring. `rates`: $/GB of "copy" (source → target),
    "local" (target → zone), "across" (source → zone), "back" (zone → source)."""
    gb, save_gb = nbytes / 1e9, save_bytes / 1e9
    copy = gb * (rates["copy"] + rates["local"])
    per_save = save_gb * rates["back"]
    # saves that cost nothing add nothing, however many (inf × 0 would be NaN: no comparison)
    read = gb * rates["across"] + (saves * per_save if per_save > 0 else 0.0)
    terms = (
        f"copy {gb:.3f} GB once = ${copy:.6f}; read across = restore ${gb * rates['across']:.6f} + "
        f"{saves:.1f} expected save(s) × {save_gb:.3f} GB × ${rates['back']:.3f}/GB = ${read:.6f}"
    )
    if copy < read:
        return Placement("copy", target, copy, read, copy, 0.0, f"copied to {target}: {terms}")
    return Placement(
        "read_across", source, copy, read, gb * rates["across"], rates["back"], f"left in {source}: {terms}"
    )


def expected_saves(policy: Any, obs: Any, start: int, total: int | None, mttp: float) -> float:
    """Saves the policy is expected to take from step `start` to the end: the ones it plans
    (`next_save`, asked as the runtime asks it) plus one emergency save per expected notice
    (the remaining wall time over the zone's MTTP). Unknown length: infinite."""
    if not total or obs.step_time <= 0:
        return math.inf
    count, last = 0.0, start
    o = obs.with_(step=start, total_steps=total)
    for _ in range(100_000):
        plan = policy.next_save(o, last)
        if plan is None or plan.step <= last or plan.step > total:  # the end's save counts
            break
        count += 1
        last = plan.step
        o = o.with_(step=last)
    if math.isfinite(mttp) and mttp > 0:
        count += max(0, total - start) * obs.step_time / mttp
    return count


# -- the store side ---------------------------------------------------------------------------
def newest_committed(store: Store, job_id: str) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint folder of `store` with a manifest that parses as an object with
    files (not verified: the agent verifies, and falls back), and that manifest."""
    root = store.job(job_id, "ckpt")
    store.invalidate()
    for name in reversed(store.ls(root)):
        if not name.isdigit():
            continue
        try:
            doc = json.loads(store.read_bytes(f"{root}/{name}/MANIFEST.json"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("files"), dict) and _counts_ok(doc):
            return int(name), doc
    return None


def _counts_ok(doc: Mapping[str, Any]) -> bool:
    """Whether the numbers the controller reads (`bytes`, `referenced`, `step`) are absent or
    finite and not negative: another manifest (damaged, a foreign writer's; the agent would
    refuse it) must not stop the controller or bill a negative transfer."""
    for key in ("bytes", "referenced", "step"):
        value = doc.get(key, 0)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not (math.isfinite(value) and value >= 0):
            return False
    return True


def _order(found: tuple[int, dict[str, Any]] | tuple[int, dict[str, Any], list[str]]) -> tuple[int, float]:
    step = found[1].get("step")
    return (found[0], float(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else -1.0)


def copy_checkpoint(
    src: Store, dst: Store, job_id: str, seq: int, bps: float | None = None
) -> tuple[int, float]:
    """Copy checkpoint `seq` from `src` to `dst` (see the module's docstring); (bytes copied,
    seconds). `bps`: bytes/s to hold the copy to (the local market's emulated bandwidth).
    Raises CopyFailed; the target then holds no manifest for `seq`."""
    t0 = time.perf_counter()
    if _same_place(src, dst):  # rewriting a checkpoint onto itself would unmake it first
        raise CopyFailed(f"{src.url} and {dst.url} are the same store: nothing to copy")
    src_root, dst_root = src.job(job_id, "ckpt"), dst.job(job_id, "ckpt")
    folder = f"{seq:08d}"
    manifest_path = f"{dst_root}/{folder}/MANIFEST.json"
    try:
        raw = src.read_bytes(f"{src_root}/{folder}/MANIFEST.json")
        files = json.loads(raw)["files"]
        if not isinstance(files, dict):
            raise CopyFailed(f"checkpoint {folder}: its manifest lists no files")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CopyFailed(f"checkpoint {folder}: its manifest cannot be read ({exc!r})") from None
    dst.rm(manifest_path)  # a copy in the target is committed only by this copy's manifest
    # the temp files of a copy of this checkpoint that died (a controller killed mid-copy):
    # only the controller holding the job's lease copies into this folder
    dst.clean_temp(f"{dst_root}/{folder}", older_than=0.0)
    with contextlib.suppress(OSError):  # and any stale one among the blobs (a live writer's is younger)
        dst.clean_temp(f"{dst_root}/blobs")
    copied = 0
    sent = 0
    try:
        for name, meta in files.items():
            wrong = digest.problem(meta)
            if not is_safe_name(name) or wrong is not None:
                raise CopyFailed(
                    f"checkpoint {folder}: its manifest lists {name!r}, "
                    + (f"which {wrong}" if wrong else "a name outside its folder")
                )
            found, size = digest.of(meta), meta["size"]
            rel = f"blobs/{meta[digest.ADDRESS]}" if meta.get("blob") else f"{folder}/{name}"
            if not is_safe_name(rel):
                raise CopyFailed(f"checkpoint {folder}: {name!r} names a blob {rel!r} outside its folder")
            target = f"{dst_root}/{rel}"
            if meta.get("blob") and _matches(dst, target, found, size):
                continue  # an earlier copy brought it (blobs are by content)
            n = _copy_file(src, f"{src_root}/{rel}", dst, target, found, size, bps, t0, sent)
            sent += n
            copied += n
            if not _matches(dst, target, found, size):
                raise CopyFailed(f"{target}: the copy does not match the manifest (read back)")
        dst.write_bytes(manifest_path, raw)  # last: the copy is a checkpoint from now on
    except CopyFailed:
        dst.rm(manifest_path)
        raise
    except (OSError, ValueError) as exc:  # a full disk, a store that went away
        dst.rm(manifest_path)
        raise CopyFailed(f"checkpoint {folder} to {dst.url}: {exc!r}") from None
    return copied, time.perf_counter() - t0


def _matches(store: Store, path: str, found: tuple[str, str], size: int) -> bool:
    """Whether `path` holds `size` bytes with the digest `found` ((algorithm, hex))."""
    algo, want = found
    hasher = digest.new(algo)
    n = 0
    try:
        with store.fs.open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                hasher.update(chunk)
                n += len(chunk)
    except (OSError, ValueError):
        return False
    return hasher.hexdigest() == want and n == size


def _copy_file(
    src: Store,
    path: str,
    dst: Store,
    target: str,
    found: tuple[str, str],
    size: int,
    bps: float | None,
    t0: float,
    sent: int,
) -> int:
    """Stream one file, hashing it on the way (a source that does not match its manifest is
    not copied: the agent would refuse it anyway); atomic in the target."""
    algo, want = found
    hasher = digest.new(algo)
    n = 0
    tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}" if dst.local else target
    if dst.local:
        os.makedirs(posixpath.dirname(target), mode=0o700, exist_ok=True)
    try:
        with src.fs.open(path, "rb") as fin, dst.fs.open(tmp, "wb") as fout:
            while chunk := fin.read(_CHUNK):
                hasher.update(chunk)
                fout.write(chunk)
                n += len(chunk)
                if bps:
                    ahead = (sent + n) / bps - (time.perf_counter() - t0)
                    if ahead > 0:
                        time.sleep(ahead)  # the emulated link's pace, not a wait for an event
        if hasher.hexdigest() != want or n != size:
            raise CopyFailed(f"{path}: the source does not match its manifest ({algo}/size)")
        if dst.local:
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
    except BaseException:
        if dst.local and os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return n


# -- the controller's helper ------------------------------------------------------------------
class Regional:
    """The job's stores and the choice for one incarnation (`ZonePlanner.place_checkpoint`)."""

    def __init__(self, config: Config, provider: Any, home: Store, job_id: str) -> None:
        self.config, self.provider, self.home, self.job_id = config, provider, home, job_id
        self.urls: dict[str, str] = {k: v.rstrip("/") for k, v in (config.regional_stores or {}).items()}
        self._stores: dict[str, Store] = {home.url: home}
        self._home_place: tuple[str | None, str | None] | None = None

    def store(self, url: str) -> Store:
        if url not in self._stores:
            self._stores[url] = Store(url)
        return self._stores[url]

    def all_urls(self) -> list[str]:
        return [self.home.url, *self.urls.values()]

    def target_for(self, zone: str | None) -> str:
        """The store of `zone`: its own, its region's, or the home store."""
        if zone:
            if zone in self.urls:
                return self.urls[zone]
            region = self.provider.zone_location(zone)[1]
            for key in (region, *sorted(self.urls, key=len, reverse=True)):
                if key and key in self.urls and (key == region or zone.startswith(key)):
                    return self.urls[key]
        return self.home.url

    def place_of(self, url: str) -> tuple[str | None, str | None]:
        """(cloud, region) of a store: the home store's from the provider, a regional one's
        from its key."""
        from spotnb.market.transfer import store_cloud

        if url == self.home.url:
            if self._home_place is None:  # asked once: a cloud may answer it with an API call
                try:
                    cloud, region = self.provider.store_location()
                    self._home_place = (cloud, region)
                except Exception:  # noqa: BLE001 - unknown: priced as another region
                    self._home_place = (store_cloud(url), None)
            return self._home_place
        key = next(k for k, v in self.urls.items() if v == url)
        cloud, region = self.provider.zone_location(key)
        return (store_cloud(url) or cloud, region)

    def copy_rate(self, here: tuple[str | None, str | None], there: tuple[str | None, str | None]) -> float:
        """$/GB of a copy from `here` to `there`: the controller streams it, so the bytes go
        through its machine. A notebook's controller on a cloud's stores: out of the source's
        cloud at its internet rate (into the target is free); a controller beside the home
        store (the local market's, a cloud controller): source → home's place → target."""
        from spotnb.market.transfer import EGRESS

        if self.provider.name != "local" and self.config.controller == "notebook":
            return EGRESS[here[0]]["internet"] if here[0] in EGRESS else 0.0
        via = self.place_of(self.home.url)
        return self.provider.egress_per_gb(here, via) + self.provider.egress_per_gb(via, there)

    def transfer(self, zone: str, source: str | None, nbytes: float, saved: bool) -> Transfer:
        """Moving the checkpoint to `zone`, for the zone ranking (`placement.rank_zones`), as
        `place` would move it: from `source` (the store the job's saves go to now; None: the
        home store), copied once into the zone's store when that is another store (its first
        start pays the copy; its later starts and its saves stay in the zone's region), else
        read from and written back to `source` at every start and save. The ranking prices the
        copy, the choice `place` makes unless the job is near its end."""
        from spotnb.market.transfer import BANDWIDTH, egress_per_gb

        source = source if source in self.all_urls() else self.home.url
        target = self.target_for(zone)
        here, there, place = self.place_of(source), self.place_of(target), self.provider.zone_location(zone)
        rate = self.provider.egress_per_gb

        def seconds(a: tuple[str | None, str | None], b: tuple[str | None, str | None]) -> float:
            return 0.0 if egress_per_gb(a, b)[1] in ("same region", "same place") else nbytes / BANDWIDTH

        if target == source:
            route = egress_per_gb(here, place)[1]
            return Transfer(nbytes, rate(here, place), seconds(here, place), saved, route, rate(place, here))
        return Transfer(
            nbytes,
            self.copy_rate(here, there) + rate(there, place),
            seconds(here, there) + seconds(there, place),
            saved,
            f"copied to {target}",
            rate(place, there),
            per_gb_later=rate(there, place),
            seconds_later=seconds(there, place),
        )

    def newest(self) -> tuple[int, dict[str, Any], list[str]] | None:
        """The newest committed checkpoint across the stores: (seq, manifest, URLs holding it)."""
        best: tuple[int, dict[str, Any], list[str]] | None = None
        for url in self.all_urls():
            try:
                found = newest_committed(self.store(url), self.job_id)
            except Exception as exc:  # noqa: BLE001 - a store out of reach holds nothing now
                log.warning("job %s: checkpoints in %s cannot be listed: %r", self.job_id, url, exc)
                continue
            if found is None:
                continue
            # one number with two steps: numbered while a store was out of reach; the agent
            # restores the one further on (`Checkpointer._scan`), so that one is placed
            key, best_key = _order(found), _order(best) if best is not None else None
            if best is None or best_key is None or key > best_key:
                best = (found[0], found[1], [url])
            elif key == best_key:
                best[2].append(url)
        return best

    def place(
        self, zone: str | None, saves_for: Any, save_bytes: float, bps: float | None
    ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """Decide (and copy) for a new instance in `zone`: (its checkpoint document, the
        `checkpoint_placed` event's fields, warnings). `saves_for(step)`: the expected later
        saves from that step."""
        target = self.target_for(zone)
        doc = {"write": target, "read": self.all_urls()}
        newest = self.newest()
        fields: dict[str, Any] = {"zone": zone, "target": target}
        if newest is None:
            return doc, {**fields, "action": "fresh", "source": target, "reason": "no checkpoint yet"}, []
        seq, manifest, holders = newest
        nbytes = float(manifest.get("bytes", 0) or 0) + float(manifest.get("referenced", 0) or 0)
        fields.update(seq=seq, nbytes=int(nbytes))
        if target in holders:
            reason = f"checkpoint {seq} is already in {target}"
            return doc, {**fields, "action": "in_place", "source": target, "reason": reason}, []
        source = holders[0]
        step = int(manifest.get("step", 0) or 0)
        saves = saves_for(step)
        here, there, zone_place = (
            self.place_of(source),
            self.place_of(target),
            self.provider.zone_location(zone),
        )
        rate = self.provider.egress_per_gb
        rates = {
            "copy": self.copy_rate(here, there),
            "local": rate(there, zone_place),
            "across": rate(here, zone_place),
            "back": rate(zone_place, here),
        }
        choice = choose(nbytes, save_bytes or nbytes, saves, rates, source, target)
        fields.update(
            source=source,
            saves=saves if math.isfinite(saves) else -1.0,
            copy_cost=choice.copy_cost,
            read_cost=choice.read_cost,
            cost=choice.cost,
            save_per_gb=choice.save_per_gb,
            action=choice.action,
            reason=choice.reason,
        )
        warnings: list[str] = []
        if choice.action == "copy":
            try:
                _, seconds = copy_checkpoint(self.store(source), self.store(target), self.job_id, seq, bps)
                fields["copy_s"] = seconds
            except (CopyFailed, OSError, ValueError) as exc:
                warnings.append(
                    f"the checkpoint could not be copied to {target} ({exc}); the instance in "
                    f"{zone} reads it across from {source} and writes there"
                )
                doc["write"] = source
                fields.update(
                    action="read_across",
                    cost=nbytes / 1e9 * rates["across"],
                    save_per_gb=rates["back"],
                    reason=f"the copy failed; {choice.reason}",
                )
        else:
            doc["write"] = source
        return doc, fields, warnings
