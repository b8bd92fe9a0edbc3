"""A metadata server on 127.0.0.1 that speaks the clouds' exact notice protocols
(docs/dev/notices.md, "Cloud notices"), one URL prefix per local instance: `http://127.0.0.1:PORT/i/<instance-id>`.

The agent's real NoticeWatcher polls it unchanged. The injector schedules notices here; an
Azure acknowledgement (StartRequests) lets the "platform" proceed at once, as on Azure.
"""

from __future__ import annotations

import json
import secrets
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["MetadataEmulator", "InstanceMetadata"]


@dataclass
class InstanceMetadata:
    instance_id: str
    notice_deadline: float | None = None
    action: str = "terminate"
    event_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    rebalance_at: float | None = None
    maintenance: str = "NONE"
    document_incarnation: int = 0
    acked: bool = False
    on_ack: Callable[[], object] | None = None
    etags: dict[str, int] = field(default_factory=dict)


class MetadataEmulator:
    """Threaded HTTP server; `notify(instance_id, deadline)` schedules a preemption notice."""

    def __init__(self, token_max_ttl: int = 21600) -> None:
        self.instances: dict[str, InstanceMetadata] = {}
        self.tokens: dict[str, float] = {}
        self.token_max_ttl = token_max_ttl
        self.requests = 0
        self.paths: list[str] = []  # test hook: every request path, in order
        self.gcp_unavailable = 0  # test hook: answer this many GCP requests with 503
        # test hook: Azure Scheduled Events is off until a call has waited this long for its
        # answer (Azure: "the first call may take up to two minutes"); a call given up on
        # before is never answered and switches nothing on. inf: it never answers
        self.azure_first_call_s = 0.0
        self.azure_on = False
        self.cond = threading.Condition()
        handler = type("Handler", (_Handler,), {"emulator": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="spotnb-metadata", daemon=True)
        self._thread.start()

    def base_url(self, instance_id: str) -> str:
        return f"http://127.0.0.1:{self.port}/i/{instance_id}"

    def register(self, instance_id: str, on_ack: Callable[[], object] | None = None) -> InstanceMetadata:
        with self.cond:
            meta = self.instances[instance_id] = InstanceMetadata(instance_id, on_ack=on_ack)
            return meta

    def notify(self, instance_id: str, deadline: float, action: str = "terminate") -> None:
        """Publish a preemption notice that expects the kill at `deadline` (unix seconds)."""
        with self.cond:
            meta = self.instances[instance_id]
            meta.notice_deadline, meta.action = deadline, action
            meta.document_incarnation += 1
            for key in ("preempted",):
                meta.etags[key] = meta.etags.get(key, 0) + 1
            self.cond.notify_all()

    def rebalance(self, instance_id: str) -> None:
        with self.cond:
            self.instances[instance_id].rebalance_at = time.time()

    def maintenance_event(self, instance_id: str, value: str) -> None:
        with self.cond:
            meta = self.instances[instance_id]
            meta.maintenance = value
            meta.etags["maintenance-event"] = meta.etags.get("maintenance-event", 0) + 1
            self.cond.notify_all()

    def forget(self, instance_id: str) -> None:
        with self.cond:
            self.instances.pop(instance_id, None)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class _Handler(BaseHTTPRequestHandler):
    emulator: MetadataEmulator
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet server
        pass

    def _send(
        self,
        status: int,
        body: str | bytes = b"",
        ctype: str = "text/plain",
        headers: dict[str, str] | None = None,
    ) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> tuple[InstanceMetadata | None, str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        segs = parts.path.split("/", 3)  # ['', 'i', '<id>', 'rest']
        if len(segs) < 4 or segs[1] != "i":
            return None, "", {}
        meta = self.emulator.instances.get(segs[2])
        return meta, "/" + segs[3], parse_qs(parts.query)

    # -- verbs ------------------------------------------------------------------------------
    def do_PUT(self) -> None:  # noqa: N802
        self.emulator.requests += 1
        meta, path, _ = self._route()
        if meta is None:
            return self._send(404, "no such instance")
        if path == "/latest/api/token":
            if "X-Forwarded-For" in self.headers:
                return self._send(403, "Forbidden")
            try:
                ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
            except ValueError:
                return self._send(400, "Missing or invalid TTL")
            if not 1 <= ttl <= 21600:
                return self._send(400, "TTL out of range")
            token = secrets.token_urlsafe(32)
            ttl = min(ttl, self.emulator.token_max_ttl)
            self.emulator.tokens[token] = time.time() + ttl
            return self._send(200, token, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})
        self._send(404, "Not Found")

    def do_GET(self) -> None:  # noqa: N802
        self.emulator.requests += 1
        self.emulator.paths.append(self.path)
        meta, path, query = self._route()
        if meta is None:
            return self._send(404, "no such instance")
        if path.startswith("/latest/"):
            return self._aws(meta, path)
        if path.startswith("/metadata/scheduledevents"):
            return self._azure_get(meta)
        if path.startswith("/computeMetadata/v1/"):
            return self._gcp(meta, path, query)
        self._send(404, "Not Found")

    def do_POST(self) -> None:  # noqa: N802
        self.emulator.requests += 1
        meta, path, _ = self._route()
        if meta is None or not path.startswith("/metadata/scheduledevents"):
            return self._send(404, "Not Found")
        if self.headers.get("Metadata") != "true":
            return self._send(
                400,
                json.dumps({"error": "Bad request. Required metadata header not specified"}),
                "application/json",
            )
        length = int(self.headers.get("Content-Length", "0"))
        doc = json.loads(self.rfile.read(length) or b"{}")
        ids = {r.get("EventId") for r in doc.get("StartRequests", [])}
        callback = None
        with self.emulator.cond:
            if meta.notice_deadline is not None and meta.event_id in ids and not meta.acked:
                meta.acked = True
                callback = meta.on_ack
        self._send(200, "")
        if callback:
            callback()

    # -- AWS IMDSv2 -------------------------------------------------------------------------
    def _aws(self, meta: InstanceMetadata, path: str) -> None:
        token = self.headers.get("X-aws-ec2-metadata-token")
        expiry = self.emulator.tokens.get(token or "")
        if expiry is None or expiry < time.time():
            return self._send(401, "Unauthorized")
        if path == "/latest/meta-data/spot/instance-action":
            if meta.notice_deadline is None:
                return self._send(404, "Not Found")
            body = json.dumps({"action": meta.action, "time": _iso(meta.notice_deadline)})
            return self._send(200, body, "application/json")
        if path == "/latest/meta-data/spot/termination-time":
            if meta.notice_deadline is None:
                return self._send(404, "Not Found")
            return self._send(200, _iso(meta.notice_deadline))
        if path == "/latest/meta-data/events/recommendations/rebalance":
            if meta.rebalance_at is None:
                return self._send(404, "Not Found")
            return self._send(200, json.dumps({"noticeTime": _iso(meta.rebalance_at)}), "application/json")
        if path == "/latest/meta-data/instance-id":
            return self._send(200, meta.instance_id)
        self._send(404, "Not Found")

    # -- Azure Scheduled Events -------------------------------------------------------------
    def _client_gone(self) -> bool:
        """Whether the client closed its end (it gave up waiting for the answer)."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _azure_get(self, meta: InstanceMetadata) -> None:
        if self.headers.get("Metadata") != "true":
            return self._send(
                400,
                json.dumps({"error": "Bad request. Required metadata header not specified"}),
                "application/json",
            )
        em = self.emulator
        if not em.azure_on and em.azure_first_call_s > 0:  # the first call: switching it on
            deadline = time.monotonic() + em.azure_first_call_s
            while time.monotonic() < deadline:
                if self._client_gone():
                    return  # given up on: not answered, nothing switched on
                time.sleep(0.02)
            em.azure_on = True
        events = []
        if meta.notice_deadline is not None:
            events.append(
                {
                    "EventId": meta.event_id,
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": [meta.instance_id],
                    "EventStatus": "Started" if meta.acked else "Scheduled",
                    "NotBefore": formatdate(meta.notice_deadline, usegmt=True),
                    "Description": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
        body = json.dumps({"DocumentIncarnation": meta.document_incarnation, "Events": events})
        self._send(200, body, "application/json")

    # -- GCP metadata server ------------------------------------------------------------------
    def _gcp(self, meta: InstanceMetadata, path: str, query: dict[str, list[str]]) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, "Missing Metadata-Flavor:Google header.")
        with self.emulator.cond:
            busy = self.emulator.gcp_unavailable > 0
            if busy:
                self.emulator.gcp_unavailable -= 1
        if busy:
            return self._send(503, "Service Unavailable")
        key = path.rsplit("/", 1)[-1]
        if key not in ("preempted", "maintenance-event"):
            return self._send(404, "Not Found")
        if query.get("wait_for_change", ["false"])[0] == "true":
            last = query.get("last_etag", [None])[0]
            timeout = float(query.get("timeout_sec", ["300"])[0])
            deadline = time.time() + timeout
            with self.emulator.cond:
                while last is not None and str(meta.etags.get(key, 0)) == last:
                    left = deadline - time.time()
                    if left <= 0:
                        break
                    self.emulator.cond.wait(min(left, 0.5))
        with self.emulator.cond:
            if key == "preempted":
                value = "TRUE" if meta.notice_deadline is not None else "FALSE"
            else:
                value = meta.maintenance
            etag = str(meta.etags.get(key, 0))
        self._send(200, value, headers={"ETag": etag, "Metadata-Flavor": "Google"})
