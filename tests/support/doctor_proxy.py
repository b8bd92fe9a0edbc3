"""A loopback HTTP proxy in front of an emulator (moto, Azurite, the GCS emulator) for the
`spotnb doctor` tests: each request is offered to `rule(request)`, which answers it (status,
content type, body), makes it hang, or returns None to forward it unchanged.

Where an emulator lacks an API the doctor calls (moto: Service Quotas for EC2, IAM
SimulatePrincipalPolicy, the Deep Learning AMI's public SSM parameter), the test's rule answers
it in the cloud's own wire format, so the SDK still parses a real response. Faults (a cloud
answering 500, garbage, or hanging; a read-only bucket) are rules too.
"""

from __future__ import annotations

import http.client
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["ProxyRequest", "RuleProxy", "HANG"]

HANG = "hang"


@dataclass
class ProxyRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    service: str = ""  # AWS: the SigV4 credential scope's service ("ec2", "sts", "servicequotas", …)
    access_key: str = ""
    form: dict[str, list[str]] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """An AWS JSON-protocol operation ("ServiceQuotasV20190624.GetServiceQuota")."""
        return self.headers.get("x-amz-target", "")

    @property
    def action(self) -> str:
        """An AWS query-protocol operation ("SimulatePrincipalPolicy")."""
        return (self.form.get("Action") or [""])[0]


Answer = "tuple[int, str, bytes] | str | None"
Rule = Callable[[ProxyRequest], Any]


class RuleProxy:
    def __init__(self, upstream: str, rule: Rule | None = None) -> None:
        self.upstream = urlsplit(upstream)
        self.rule: Rule = rule or (lambda r: None)
        self.seen: list[ProxyRequest] = []
        self.release = threading.Event()  # ends every hanging request (at close)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length", "0") or 0)
                body = self.rfile.read(length) if length else b""
                if not length and self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = self._chunked()
                headers = {k.lower(): v for k, v in self.headers.items()}
                scope = re.search(r"Credential=([^/]+)/\d+/[^/]+/([^/]+)/", headers.get("authorization", ""))
                text = body.decode(errors="replace")
                form = parse_qs(text) if "x-www-form-urlencoded" in headers.get("content-type", "") else {}
                request = ProxyRequest(
                    self.command,
                    self.path,
                    headers,
                    body,
                    scope.group(2) if scope else "",
                    scope.group(1) if scope else "",
                    form,
                )
                proxy.seen.append(request)
                answer = proxy.rule(request)
                if answer == HANG:
                    proxy.release.wait(60)
                    return
                if answer is not None:
                    status, ctype, data = answer
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                out = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "transfer-encoding")
                }
                if body or self.command in ("PUT", "POST"):
                    out["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body or None, headers=out)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            def _chunked(self) -> bytes:
                data = b""
                while True:
                    size = int(self.rfile.readline().strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return data
                    data += self.rfile.read(size)
                    self.rfile.readline()

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
