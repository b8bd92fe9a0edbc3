"""The parts of `spotnb doctor` its cloud checks share (`spotnb.doctor.report` is the command): what a
check returns (`Result`: ✔ / ✘ with the fix / ?), how checks run (each in its own daemon thread
once those it needs have ended, each within a time limit), how an exception reads (the
network's, or the cloud's odd answer), and the two checks every cloud runs the same way: the
store probe and the provider's own prices."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = [
    "Check",
    "Result",
    "ok",
    "fail",
    "unknown",
    "unexpected",
    "is_unreachable",
    "brief",
    "run_checks",
    "store_check",
    "price_result",
    "bucket_of",
    "CONNECT_TIMEOUT",
    "READ_TIMEOUT",
]

OK, FAIL, UNKNOWN, SKIP = "ok", "fail", "unknown", "skipped"
SYMBOLS = {OK: "✔", FAIL: "✘", UNKNOWN: "?", SKIP: "?"}
ASCII_SYMBOLS = {OK: "ok", FAIL: "FAIL", UNKNOWN: "?", SKIP: "?"}
#: seconds each request may take to connect and to answer (then: "could not reach")
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 5.0
#: seconds a whole check may take before it is reported as not answering
DEFAULT_TIMEOUT = 10.0
CLOUDS = ("aws", "azure", "gcp")
CLOUD_NAMES = {"aws": "AWS", "azure": "Azure", "gcp": "Google Cloud"}


@dataclass
class Result:
    """What one check found. `data` is for the checks that need this one (a region, a type's
    vCPUs); `unreachable` marks a "?" that is the network's, so those checks do not ask again."""

    status: str
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    unreachable: bool = False
    seconds: float = 0.0


def ok(detail: str, **data: Any) -> Result:
    return Result(OK, detail, data=data)


def fail(detail: str, fix: str, **data: Any) -> Result:
    return Result(FAIL, detail, fix, data=data)


def unknown(detail: str, fix: str = "", *, unreachable: bool = False, **data: Any) -> Result:
    return Result(UNKNOWN, detail, fix, data=data, unreachable=unreachable)


@dataclass
class Check:
    """One line of the report: `run(results)` gets the results of the checks it `needs` (by
    name) and returns its own."""

    name: str
    run: Callable[[dict[str, Result]], Result]
    needs: tuple[str, ...] = ()
    cloud: str = ""  # whose odd answer an exception the check lets through is


# -- errors --------------------------------------------------------------------------------------
_NETWORK_WORDS = (
    "could not connect",
    "connection refused",
    "failed to establish a new connection",
    "name or service not known",
    "failed to resolve",
    "temporary failure in name resolution",
    "nodename nor servname",
    "timed out",
    "timeout",
    "connection reset",
    "connection aborted",
    "remote end closed connection",
    "max retries exceeded",
    "network is unreachable",
    "no route to host",
    "cannot connect to host",
    "connect timeout",
    "read timeout",
    "server disconnected",
)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen) or len(seen) > 20:
            continue
        seen.append(e)
        todo += [
            e.__cause__,
            e.__context__,
            *[a for a in getattr(e, "args", ()) if isinstance(a, BaseException)],
        ]
    return seen


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` means the cloud could not be reached (no network, DNS, refused, timed out)
    rather than an answer: looked for along its causes, by type where the SDKs have one and by
    the words of the message where they wrap it (azure-identity, gcsfs)."""
    names = {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ServiceRequestError",
        "ServiceResponseError",
        "ServiceRequestTimeoutError",
        "ServiceResponseTimeoutError",
        "TransportError",
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "NewConnectionError",
        "NameResolutionError",
        "ConnectTimeout",
        "ReadTimeout",
        "RetryError",
    }
    for e in _chain(exc):
        if isinstance(e, (ConnectionError, socket.timeout, TimeoutError, socket.gaierror)):
            return True
        if any(t.__name__ in names for t in type(e).__mro__):
            return True
        text = str(e).lower()
        if any(w in text for w in _NETWORK_WORDS):
            return True
    return False


def brief(exc: BaseException, limit: int = 300) -> str:
    """An exception in one line: its type and the first line of its message, cut to `limit`."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "…"


def unreachable_result(cloud: str, exc: BaseException) -> Result:
    return unknown(f"could not reach {CLOUD_NAMES.get(cloud, cloud)} ({brief(exc, 160)})", unreachable=True)


def unexpected(cloud: str, exc: BaseException) -> Result:
    """A "?" for an error the check does not know: the network's, or the cloud's odd answer."""
    if is_unreachable(exc):
        return unreachable_result(cloud, exc)
    return unknown(
        f"{CLOUD_NAMES.get(cloud, cloud)} answered with an error this check cannot read: {brief(exc)}"
    )


# -- running -------------------------------------------------------------------------------------
def run_checks(checks: list[Check], timeout: float) -> list[tuple[str, Result]]:
    """Run `checks`, each as soon as those it needs have ended, each in its own daemon thread
    (so one that hangs is left behind, not waited for); returns (name, result) in order."""
    results: dict[str, Result] = {}
    started: dict[str, float] = {}
    lock = threading.Condition()
    by_name = {c.name: c for c in checks}

    def runner(check: Check, inputs: dict[str, Result]) -> None:
        t0 = time.monotonic()
        try:
            result = check.run(inputs)
        except Exception as exc:  # noqa: BLE001 - an answer no check expected must not end the run
            result = (
                unexpected(check.cloud, exc) if check.cloud else unknown(f"this check failed: {brief(exc)}")
            )
        result.seconds = time.monotonic() - t0
        with lock:
            if check.name not in results:  # not already reported as timed out
                results[check.name] = result
            lock.notify_all()

    with lock:
        while len(results) < len(checks):
            now = time.monotonic()
            for check in checks:
                if check.name in results or check.name in started:
                    continue
                needs = [n for n in check.needs if n in by_name]
                if not all(n in results for n in needs):
                    continue
                skipped = _skip(check, {n: results[n] for n in needs})
                if skipped is not None:
                    results[check.name] = skipped
                    continue
                started[check.name] = now
                inputs = {n: results[n] for n in needs}
                threading.Thread(
                    target=runner, args=(check, inputs), daemon=True, name=f"doctor-{check.name}"
                ).start()
            for name, t0 in started.items():
                if name not in results and now - t0 > timeout:
                    results[name] = unknown(
                        f"no answer within {timeout:g} s (the cloud is slow or hangs)", unreachable=True
                    )
                    results[name].seconds = now - t0
            if len(results) < len(checks):
                lock.wait(0.05)
    return [(c.name, results[c.name]) for c in checks]


def _skip(check: Check, inputs: dict[str, Result]) -> Result | None:
    """The result of a check that cannot run because of one it needs, or None to run it."""
    for name, r in inputs.items():
        if r.status == FAIL:
            return Result(SKIP, f"skipped: needs {name}")
        if r.status == SKIP:
            return Result(SKIP, r.detail)
    for name, r in inputs.items():
        if r.unreachable:
            what = (
                r.detail.split(" (", 1)[0].split(":", 1)[0]
                if r.detail.startswith("could not reach")
                else "no answer"
            )
            return Result(UNKNOWN, f"{what}: not checked (see {name})", unreachable=True)
    for name, r in inputs.items():
        if r.status != OK:
            return Result(SKIP, f"skipped: {name} could not be checked")
    return None


# -- the store -----------------------------------------------------------------------------------
def store_options(config: Config, url: str) -> dict[str, Any]:
    """fsspec options for a store probe: short timeouts and no retries where the driver takes
    them, and an az:// store's account name (as the VM gets it) when no connection string is set."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    if scheme in ("s3", "s3a"):
        return {
            "config_kwargs": {
                "connect_timeout": CONNECT_TIMEOUT,
                "read_timeout": READ_TIMEOUT,
                "retries": {"total_max_attempts": 1, "mode": "standard"},
            },
            "skip_instance_cache": True,
        }
    if scheme in ("az", "abfs", "abfss"):
        opts: dict[str, Any] = {
            "skip_instance_cache": True,
            "connection_timeout": int(CONNECT_TIMEOUT),
            "read_timeout": int(READ_TIMEOUT),
        }
        account = getattr(config, "azure_storage_account", None) or os.environ.get(
            "AZURE_STORAGE_ACCOUNT_NAME"
        )
        if account and not os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
            opts["account_name"] = account
        return opts
    if scheme in ("gs", "gcs"):
        return {"skip_instance_cache": True, "requests_timeout": READ_TIMEOUT}
    return {}


def bucket_of(url: str) -> tuple[str, str]:
    """(bucket or container, prefix) of an object-store URL (an az:// URL may name its account
    after the container: `az://container@account.blob.core.windows.net/prefix`)."""
    rest = url.split("://", 1)[1] if "://" in url else url
    bucket, _, prefix = rest.partition("/")
    return bucket.split("@", 1)[0], prefix.strip("/")  # az://container@account.blob.core…/


def _fix_for_store(cloud: str | None, bucket: str, prefix: str, action: str) -> str:
    where = f"{bucket}/{prefix}" if prefix else bucket
    if cloud == "aws":
        return (
            f"allow s3:{action} on arn:aws:s3:::{where}/* for the identity of the credentials check "
            "(an IAM policy of your user or role, and the bucket policy if it has one)"
        )
    if cloud == "azure":
        return (
            "give your identity 'Storage Blob Data Contributor' on the storage account (Owner and "
            "Contributor hold no data permission): az role assignment create --role "
            "'Storage Blob Data Contributor' --assignee <you> --scope <storage account id>"
        )
    if cloud == "gcp":
        return (
            f"gcloud storage buckets add-iam-policy-binding gs://{bucket} --member user:<you> "
            "--role roles/storage.objectAdmin"
        )
    return f"make {where} writable for this user"


def _missing_fix(cloud: str | None, url: str, bucket: str, close: list[str]) -> str:
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    create = {
        "aws": f"aws s3 mb s3://{bucket}",
        "azure": f"az storage container create --account-name <account> -n {bucket} --auth-mode login",
        "gcp": f"gcloud storage buckets create gs://{bucket}",
    }.get(cloud or "", "create it")
    return f"{hint}correct Config.store ({url!r}) or create it: {create}"


def _close_buckets(store: Any, bucket: str) -> list[str]:
    """Names close to `bucket` among those the credentials can list (best effort)."""
    import difflib

    try:
        names = [str(n).rstrip("/").split("/")[-1] for n in store.fs.ls("", detail=False)]
    except Exception:  # noqa: BLE001 - listing buckets is a hint, never the check
        return []
    return difflib.get_close_matches(bucket, names, n=2, cutoff=0.75)


def _is_denied(exc: BaseException) -> bool:
    words = (
        "forbidden",
        "accessdenied",
        "access denied",
        "authorizationpermissionmismatch",
        "authorizationfailure",
        "not authorized",
        "permission",
        "403",
    )
    for e in _chain(exc):
        if isinstance(e, PermissionError):
            return True
        if any(w in str(e).lower() for w in words):
            return True
    return False


def _is_missing(exc: BaseException) -> bool:
    words = (
        "nosuchbucket",
        "containernotfound",
        "the specified container does not exist",
        "the specified bucket does not exist",
        "bucket does not exist",
    )
    for e in _chain(exc):
        if isinstance(e, FileNotFoundError):
            return True
        if any(w in str(e).lower() for w in words):
            return True
    return False


def _no_retries(fs: Any) -> None:
    """One attempt per request where the driver allows it: s3fs retries a connection error 5
    times with back-off, azure-storage-blob (under adlfs, which passes no retry setting) 3 times
    from 15 s up. gcsfs's retries are fixed when it is imported: the check's time limit stops it."""
    if type(fs).__name__ == "S3FileSystem":
        fs.retries = 1
    policy = getattr(getattr(getattr(fs, "service_client", None), "_config", None), "retry_policy", None)
    if policy is not None and hasattr(policy, "total_retries"):
        policy.total_retries = 0


def store_check(config: Config, opener: Callable[[str, dict[str, Any]], Any] | None = None) -> Result:
    """Write a small probe object under the store's root, read it back, delete it: what every
    job's controller does first, with the credentials of this machine."""
    from spotnb.core.store import Store
    from spotnb.market.transfer import store_cloud

    url = config.store_url()
    cloud = store_cloud(url)
    bucket, prefix = bucket_of(url)
    opts = store_options(config, url)
    try:
        store = (opener or (lambda u, o: Store(u, **o)))(url, opts)
        _no_retries(store.fs)
    except Exception as exc:  # noqa: BLE001 - a driver's constructor raises many kinds
        if is_unreachable(exc):
            return unreachable_result(cloud or "the store", exc)
        return fail(f"cannot open {url}: {brief(exc)}", "check Config.store and the store's driver settings")
    probe = store.path(f".spotnb-doctor-{uuid.uuid4().hex[:12]}")
    payload = f"spotnb doctor probe {time.time()}".encode()
    t0 = time.monotonic()
    step = "write"
    try:
        store.write_bytes(probe, payload)
        step = "read"
        back = store.read_bytes(probe)
        step = "delete"
        store.rm(probe)
    except Exception as exc:  # noqa: BLE001 - each driver raises its own kinds
        if is_unreachable(exc) and not _is_denied(exc):
            return unreachable_result(cloud or "the store", exc)
        if step == "write" and _is_missing(exc):
            close = _close_buckets(store, bucket)
            return fail(
                f"{url}: {bucket!r} does not exist ({brief(exc, 160)})",
                _missing_fix(cloud, url, bucket, close),
            )
        if _is_denied(exc):
            action = {"write": "PutObject", "read": "GetObject", "delete": "DeleteObject"}[step]
            what = {
                "write": "cannot write to it (read-only from here?)",
                "read": "wrote a probe but cannot read it back",
                "delete": "wrote and read a probe but cannot delete it (spotnb prunes old checkpoints)",
            }[step]
            return fail(f"{url}: {what}: {brief(exc, 200)}", _fix_for_store(cloud, bucket, prefix, action))
        return unknown(f"{url}: the {step} of a probe failed: {brief(exc)}")
    if back != payload:
        return fail(f"{url}: the probe read back differs from what was written", "check the store's driver")
    took = time.monotonic() - t0
    return ok(f"{url}: wrote, read back and deleted a probe object ({took:.1f} s)")


def price_result(cloud: str, provider: Any, itype: str, where: str, *, live_word: str) -> Result:
    """The provider's own prices for `itype` in `where`: ✔ live, ? the dated table (the live
    fetch failed), ✘ no price at all (the ledger and `max_cost` could not price the job)."""
    try:
        found = provider.prices(itype, [where])
    except Exception as exc:  # noqa: BLE001 - a provider's fetch that breaks on an odd answer
        return unexpected(cloud, exc)
    if not found:
        return fail(
            f"no spot price for {itype} in {where}: neither the cloud nor spotnb's table has one",
            "check the instance type and region, or set Config.price_spot and price_on_demand",
        )
    live = {z: p for z, p in found.items() if live_word in p.source}
    rows = live or found
    low = min(rows.values(), key=lambda p: p.spot)
    spots = sorted(p.spot for p in rows.values())
    span = (
        f"${spots[0]:.4f}/h"
        if len(spots) == 1 or spots[0] == spots[-1]
        else f"${spots[0]:.4f}–{spots[-1]:.4f}/h"
    )
    text = f"spot {span} for {itype} in {', '.join(sorted(rows)) if len(rows) <= 3 else f'{len(rows)} zones'}"
    if live:
        return ok(f"{text} (on demand ${low.on_demand:.4f}/h; {low.source})")
    return unknown(
        f"no live price (could not reach {CLOUD_NAMES.get(cloud, cloud)}'s prices, or they were refused); "
        f"{text} from {low.source}",
        "spotnb uses the dated table until they can be read",
    )
