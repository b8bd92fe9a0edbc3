"""Compute Engine answered in-process, behind google-cloud-compute's REAL REST transport.

Compute Engine's control plane has no emulator, so it is the one thing faked here, and it is
faked below `requests`: a test builds real clients (`compute_v1.InstancesClient`,
`compute_v1.ZonesClient`, `transport="rest"`, anonymous credentials) and mounts `GceAdapter` on
their session. Everything above the wire is google-cloud-compute's and google-api-core's own
code: the request's URL, query and JSON body, the mapping of an HTTP error document to
`google.api_core.exceptions` (404 → NotFound, with GCE's message and `errors` items), and the
extended operation that raises an operation's error.

- `GceAdapter(handler)`: a `requests` transport adapter that records every request
  (`.requests`) and answers with `handler(request) -> (status, json body)`.
- `gce_error(status, message, reason)`: Compute Engine's error document.
- `done_operation(zone, error=None)`: an insert's Operation, finished (optionally with the
  error GCE reports asynchronously, e.g. ZONE_RESOURCE_POOL_EXHAUSTED).
- `compute_clients(handler)`: an InstancesClient and a ZonesClient on one adapter.

No request leaves the process: the adapter never opens a socket; an unexpected request is
answered 501, never forwarded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests
from requests.adapters import BaseAdapter

__all__ = ["GceAdapter", "GceRequest", "compute_clients", "done_operation", "gce_error"]


@dataclass
class GceRequest:
    method: str
    url: str
    path: str
    query: dict[str, list[str]]
    body: Any
    timeout: Any = None  # what the client gave `requests` (None: no bound)


Handler = Callable[[GceRequest], "tuple[int, Any]"]


def gce_error(status: int, message: str, reason: str = "notFound") -> dict[str, Any]:
    """The JSON error document Compute Engine's REST API answers with."""
    return {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


def done_operation(
    zone: str, name: str = "operation-1", error: tuple[int, str, str] | None = None
) -> dict[str, Any]:
    """A finished zonal Operation; `error` = (HTTP status, code, message) as GCE reports an
    asynchronous failure."""
    op: dict[str, Any] = {
        "kind": "compute#operation",
        "name": name,
        "zone": f"https://www.googleapis.com/compute/v1/projects/p/zones/{zone}",
        "operationType": "insert",
        "status": "DONE",
        "progress": 100,
    }
    if error is not None:
        status, code, message = error
        op["error"] = {"errors": [{"code": code, "message": message}]}
        op["httpErrorStatusCode"] = status
        op["httpErrorMessage"] = {404: "NOT FOUND", 503: "SERVICE UNAVAILABLE"}.get(status, "ERROR")
    return op


class GceAdapter(BaseAdapter):
    """The session's transport: the request is recorded and `handler` answers it."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.requests: list[GceRequest] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        split = urlsplit(request.url or "")
        raw = request.body.decode() if isinstance(request.body, bytes) else request.body
        recorded = GceRequest(
            method=request.method or "",
            url=request.url or "",
            path=split.path,
            query=parse_qs(split.query),
            body=json.loads(raw) if raw else None,
            timeout=kwargs.get("timeout"),
        )
        self.requests.append(recorded)
        if split.hostname != "compute.googleapis.com":
            status, payload = 501, gce_error(501, f"the test's GCE does not serve {split.hostname}", "x")
        else:
            status, payload = self.handler(recorded)
        response = requests.Response()
        response.status_code = status
        response.url = request.url or ""
        response.request = request
        response.headers["Content-Type"] = "application/json; charset=UTF-8"
        response._content = json.dumps(payload).encode()
        response.encoding = "utf-8"
        return response

    def close(self) -> None:
        pass


def compute_clients(handler: Handler) -> tuple[Any, Any, GceAdapter]:
    """Real REST `InstancesClient` and `ZonesClient` whose requests `handler` answers."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    adapter = GceAdapter(handler)
    clients = []
    for cls in (compute_v1.InstancesClient, compute_v1.ZonesClient):
        client = cls(credentials=AnonymousCredentials(), transport="rest")
        client._transport._session.mount("https://", adapter)
        client._transport._session.mount("http://", adapter)
        clients.append(client)
    return clients[0], clients[1], adapter
