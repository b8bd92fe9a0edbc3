"""Preemption-notice watchers: one per cloud protocol (docs/dev/notices.md, "Cloud notices"); the
same code polls the
real metadata endpoint on a VM and the local market's emulator (only the base URL differs).

A watcher runs in a daemon thread, polls, and calls `on_notice(Notice)` once when a
preemption is scheduled (and `on_hint` for rebalance recommendations). Network errors are
retried quietly: a watcher must never kill the training it protects.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

__all__ = [
    "Notice",
    "NoticeWatcher",
    "AwsWatcher",
    "AzureWatcher",
    "GcpWatcher",
    "make_watcher",
    "DEFAULT_BASE_URLS",
]

DEFAULT_BASE_URLS = {
    "aws": "http://169.254.169.254",
    "azure": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
}


@dataclass(frozen=True)
class Notice:
    deadline: float  # unix seconds of the expected kill
    source: str  # aws | azure | gcp
    action: str  # terminate, stop, Preempt, TERMINATE_ON_HOST_MAINTENANCE, ...
    event_id: str | None = None
    received: float = field(default_factory=time.time)


class _HTTPError(Exception):
    def __init__(self, status: int, body: bytes = b"") -> None:
        super().__init__(status)
        self.status, self.body = status, body


def _request(
    url: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = 2.0,
) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (metadata URL)
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        raise _HTTPError(exc.code, exc.read()) from None


class NoticeWatcher(ABC):
    """Base: a polling loop in a daemon thread. Subclasses implement `check()`."""

    source = "none"

    def __init__(
        self,
        base_url: str | None = None,
        poll: float = 1.0,
        grace: float = 30.0,
        on_notice: Callable[[Notice], None] | None = None,
        on_hint: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.base_url = (base_url or DEFAULT_BASE_URLS.get(self.source, "")).rstrip("/")
        self.poll, self.grace = poll, grace
        self.on_notice, self.on_hint = on_notice, on_hint
        self.notice: Notice | None = None
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @abstractmethod
    def check(self) -> Notice | None:
        """One look at the endpoint: the notice if one is scheduled."""

    def acknowledge(self) -> None:
        """Tell the platform it may proceed now (Azure); a no-op elsewhere."""

    def start(self) -> NoticeWatcher:
        self._thread = threading.Thread(target=self._run, name=f"spotnb-notice-{self.source}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set() and self.notice is None:
            try:
                notice = self.check()
            except Exception:  # noqa: BLE001 - the endpoint may be briefly unreachable
                self.errors += 1
                notice = None
            if notice is not None:
                self.notice = notice
                if self.on_notice:
                    self.on_notice(notice)
                return
            self._stop.wait(self._interval())

    def _interval(self) -> float:
        return self.poll


def _iso(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class AwsWatcher(NoticeWatcher):
    """EC2 Spot instance-action through IMDSv2 (token refreshed on 401 or before it expires)."""

    source = "aws"
    token_ttl = 21600

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token: str | None = None
        self._token_expiry = 0.0
        self._rebalance_seen = False

    def _get_token(self) -> str:
        if self._token is None or time.time() > self._token_expiry:
            _, body, headers = _request(
                f"{self.base_url}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl)},
            )
            self._token = body.decode().strip()
            granted = {k.lower(): v for k, v in headers.items()}.get("x-aws-ec2-metadata-token-ttl-seconds")
            try:
                ttl = float(granted) if granted else float(self.token_ttl)
            except ValueError:
                ttl = float(self.token_ttl)
            # refresh 60 s (or a tenth of a short TTL) before the server's own expiry
            self._token_expiry = time.time() + ttl - min(60.0, ttl / 10)
        return self._token

    def _get(self, path: str) -> tuple[int, bytes]:
        for attempt in (0, 1):
            headers = {"X-aws-ec2-metadata-token": self._get_token()}
            try:
                status, body, _ = _request(f"{self.base_url}{path}", headers=headers)
                return status, body
            except _HTTPError as exc:
                if exc.status == 401 and attempt == 0:
                    self._token = None  # expired or revoked: fetch a new one and retry once
                    continue
                return exc.status, exc.body
        return 401, b""

    def check(self) -> Notice | None:
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            doc = json.loads(body)
            return Notice(deadline=_iso(doc["time"]), source="aws", action=doc.get("action", "terminate"))
        if not self._rebalance_seen:
            status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
            if status == 200:
                self._rebalance_seen = True
                if self.on_hint:
                    self.on_hint({"source": "aws", "hint": "rebalance", **json.loads(body)})
        return None


class AzureWatcher(NoticeWatcher):
    """Azure Scheduled Events: Preempt/Terminate for this VM; acknowledged after the save.

    Scheduled Events is switched on by the first call to it, which can take up to two minutes
    to answer; a call given up on earlier may never switch it on, and a notice would then never
    be seen. So until it has answered once, each call waits `first_timeout` (in the watcher's own
    thread: the training never waits for it); after that, `timeout`. (The Azure boot script also
    asks it once at boot, in the background.)"""

    source = "azure"
    url_suffix = "/metadata/scheduledevents?api-version=2020-07-01"
    first_timeout = 180.0  # Azure: "the first call may take up to two minutes"
    timeout = 2.0

    def __init__(self, *args: Any, vm_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.vm_name = vm_name
        self.document_incarnation: int | None = None
        self.answered = False  # Scheduled Events answered once: it is on

    name_suffix = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"

    def _resolve_vm_name(self) -> None:
        """Ask IMDS once for this VM's name (events list the resources they affect)."""
        self._name_resolved = True
        try:
            _, body, _ = _request(self.base_url + self.name_suffix, headers={"Metadata": "true"})
        except (OSError, _HTTPError):
            return  # unknown: take every Preempt/Terminate event as ours
        name = body.decode().strip()
        if name:
            self.vm_name = name

    def check(self) -> Notice | None:
        if self.vm_name is None and not getattr(self, "_name_resolved", False):
            self._resolve_vm_name()
        _, body, _ = _request(
            self.base_url + self.url_suffix,
            headers={"Metadata": "true"},
            timeout=self.timeout if self.answered else self.first_timeout,
        )
        self.answered = True
        doc = json.loads(body)
        if not isinstance(doc, dict):
            raise ValueError("Scheduled Events answered something other than a JSON object")
        incarnation = doc.get("DocumentIncarnation")
        if incarnation == self.document_incarnation:
            return None  # nothing changed since the last look
        self.document_incarnation = incarnation
        for event in doc.get("Events", []):
            if event.get("EventType") not in ("Preempt", "Terminate"):
                continue
            if self.vm_name and event.get("Resources") and self.vm_name not in event["Resources"]:
                continue
            not_before = event.get("NotBefore") or ""
            deadline = (
                parsedate_to_datetime(not_before).timestamp() if not_before else time.time() + self.grace
            )
            return Notice(
                deadline=deadline, source="azure", action=event["EventType"], event_id=event.get("EventId")
            )
        return None

    def acknowledge(self) -> None:
        if self.notice is None or not self.notice.event_id:
            return
        body = json.dumps({"StartRequests": [{"EventId": self.notice.event_id}]}).encode()
        try:
            _request(
                self.base_url + self.url_suffix,
                method="POST",
                data=body,
                headers={"Metadata": "true", "Content-Type": "application/json"},
            )
        except (OSError, _HTTPError):
            pass  # the platform proceeds at NotBefore anyway


class GcpWatcher(NoticeWatcher):
    """GCP `preempted` and `maintenance-event`, long-polled with etags (two threads)."""

    source = "gcp"
    headers = {"Metadata-Flavor": "Google"}
    long_poll_timeout = 30

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._etags: dict[str, str] = {}
        self.unavailable = 0  # 503 answers seen (retried)

    def _watch(self, path: str) -> str | None:
        etag = self._etags.get(path)
        if etag is None:
            # First look: a plain read returns the current value and its etag at once (a long
            # poll without last_etag would wait for the *next* change and miss a notice that
            # is already there).
            query = ""
        else:
            query = f"?wait_for_change=true&timeout_sec={self.long_poll_timeout}&last_etag={etag}"
        try:
            _, body, headers = _request(
                f"{self.base_url}/computeMetadata/v1/instance/{path}{query}",
                headers=self.headers,
                timeout=self.long_poll_timeout + 5,
            )
        except _HTTPError as exc:
            if exc.status == 503:  # the metadata server is busy (during maintenance): retry
                self.unavailable += 1
                self._stop.wait(self.poll)
                return None
            raise
        new_etag = {k.lower(): v for k, v in headers.items()}.get("etag")
        if new_etag:
            self._etags[path] = new_etag
        return body.decode().strip()

    def check(self) -> Notice | None:  # one look at both endpoints (used by tests and fallback)
        for path in ("preempted", "maintenance-event"):
            notice = self._interpret(path, self._watch_once(path))
            if notice:
                return notice
        return None

    def _watch_once(self, path: str) -> str | None:
        try:
            _, body, _ = _request(f"{self.base_url}/computeMetadata/v1/instance/{path}", headers=self.headers)
        except _HTTPError:
            return None
        return body.decode().strip()

    def _interpret(self, path: str, value: str | None) -> Notice | None:
        if value is None:
            return None
        if path == "preempted" and value.upper() == "TRUE":
            return Notice(deadline=time.time() + self.grace, source="gcp", action="PREEMPTED")
        if path == "maintenance-event" and value.startswith(("TERMINATE_", "SHUTDOWN_")):
            return Notice(deadline=time.time() + self.grace, source="gcp", action=value)
        return None

    def start(self) -> NoticeWatcher:
        for path in ("preempted", "maintenance-event"):
            threading.Thread(
                target=self._long_poll, args=(path,), daemon=True, name=f"spotnb-notice-gcp-{path}"
            ).start()
        return self

    def _long_poll(self, path: str) -> None:
        while not self._stop.is_set() and self.notice is None:
            try:
                notice = self._interpret(path, self._watch(path))
            except Exception:  # noqa: BLE001
                self.errors += 1
                self._stop.wait(self.poll)
                continue
            if notice is not None:
                with self._lock:  # two long-poll threads: only the first notice counts
                    first = self.notice is None
                    if first:
                        self.notice = notice
                if first and self.on_notice:
                    self.on_notice(notice)
                return


_WATCHERS: dict[str, type[NoticeWatcher]] = {"aws": AwsWatcher, "azure": AzureWatcher, "gcp": GcpWatcher}


def make_watcher(source: str, **kwargs: Any) -> NoticeWatcher:
    try:
        cls = _WATCHERS[source]
    except KeyError:
        raise ValueError(f"unknown notice format {source!r}; one of {sorted(_WATCHERS)}") from None
    return cls(**kwargs)
