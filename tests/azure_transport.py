"""Azure Resource Manager answered in-process, behind the REAL Azure SDK clients.

Azure's control plane has no emulator, so it is the one thing faked here, and it is faked at
the HTTP layer: a test builds a real client (e.g. `azure.mgmt.resource.ResourceManagementClient`,
the installed version) whose pipeline transport is `ArmTransport`. Everything above the wire is
the SDK's own code: its method signatures (a keyword-only `api_version` passed positionally
raises TypeError here exactly as in production), its request serialisation (URL, query string,
JSON body), its error mapping (404 → `ResourceNotFoundError`, an ARM error document →
`HttpResponseError` with `.error.code`) and its long-running-operation pollers.

- `ArmTransport(handler)`: an `azure.core.pipeline.transport.HttpTransport` that records every
  request (`.requests`) and answers with `handler(request) -> (status, json body or None)`.
- `GenericResources`: a handler holding ARM resources by id, as the generic
  `resources.*_by_id` operations see them: PUT stores the body (a NIC's IP configuration with
  a dynamic private IP gets one, as Azure assigns it), GET returns it or 404, DELETE removes
  it (204 when absent, as ARM answers). `refuse[resource_id] = code` answers the next PUT of
  that id with an ARM error document.
- `resource_client(handler)`: a real ResourceManagementClient wired to an `ArmTransport`.

No request leaves the process: the transport never opens a socket.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests
import urllib3
from azure.core.credentials import AccessToken
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest._requests_basic import RestRequestsTransportResponse

__all__ = [
    "ArmRequest",
    "ArmTransport",
    "FakeCredential",
    "GenericResources",
    "SUBSCRIPTION",
    "arm_error",
    "resource_client",
]

SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"


@dataclass
class ArmRequest:
    """One request as it left the SDK."""

    method: str
    url: str
    path: str
    query: dict[str, list[str]]
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def api_version(self) -> str | None:
        return (self.query.get("api-version") or [None])[0]


Handler = Callable[[ArmRequest], "tuple[int, Any]"]


def arm_error(code: str, message: str | None = None) -> dict[str, Any]:
    """Azure Resource Manager's error document."""
    return {"error": {"code": code, "message": message or f"{code} (answered by the test's ARM)"}}


class FakeCredential:
    """A TokenCredential that hands out a token nobody checks (the transport never sends it)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("spotnb-test-token", int(time.time()) + 3600)


class ArmTransport(HttpTransport):  # type: ignore[type-arg]
    """The SDK's pipeline ends here: the request is recorded and `handler` answers it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[ArmRequest] = []

    def __enter__(self) -> ArmTransport:
        return self

    def __exit__(self, *args: Any) -> None:
        pass

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def sleep(self, duration: float) -> None:
        pass  # the pollers' and the retry policy's waits: nothing is running behind them

    def send(self, request: Any, **kwargs: Any) -> Any:
        split = urlsplit(request.url)
        raw = request.content if hasattr(request, "content") else request.data
        if isinstance(raw, bytes):
            raw = raw.decode()
        body = json.loads(raw) if isinstance(raw, str) and raw else raw
        recorded = ArmRequest(
            method=request.method,
            url=request.url,
            path=split.path,
            query=parse_qs(split.query),
            body=body,
            headers=dict(request.headers),
        )
        self.requests.append(recorded)
        status, payload = self.handler(recorded)
        response = requests.Response()
        response.status_code = status
        response.url = request.url
        response.request = requests.Request(request.method, request.url).prepare()
        response.headers["x-ms-request-id"] = "spotnb-test"
        content = json.dumps(payload).encode() if payload is not None else b""
        if payload is not None:
            response.headers["Content-Type"] = "application/json; charset=utf-8"
        response.headers["Content-Length"] = str(len(content))
        response.raw = urllib3.HTTPResponse(
            body=io.BytesIO(content), status=status, headers=dict(response.headers), preload_content=False
        )
        out = RestRequestsTransportResponse(request=request, internal_response=response)
        out.read()
        return out


class GenericResources:
    """ARM resources by id (the generic `/{resourceId}?api-version=` routes)."""

    def __init__(self) -> None:
        self.store: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[str, str]] = []  # ("put" | "get" | "delete", resource id), in order
        self.puts: list[tuple[str, dict[str, Any]]] = []
        self.refuse: dict[str, str] = {}  # resource id → error code of its next PUT
        self.private_ip = "10.0.0.7"  # what Azure assigns a dynamic IP configuration

    def __call__(self, request: ArmRequest) -> tuple[int, Any]:
        rid = request.path
        if request.method == "PUT":
            self.log.append(("put", rid))
            if rid in self.refuse:
                return 403, arm_error(self.refuse.pop(rid))
            body = json.loads(json.dumps(request.body or {}))
            self.puts.append((rid, json.loads(json.dumps(body))))
            for config in body.get("properties", {}).get("ipConfigurations", []):
                props = config.setdefault("properties", {})
                if not props.get("privateIPAddress"):
                    props["privateIPAddress"] = self.private_ip
            created = rid not in self.store
            self.store[rid] = body
            return (201 if created else 200), self._view(rid)
        if request.method == "GET":
            self.log.append(("get", rid))
            if rid not in self.store:
                return 404, arm_error("ResourceNotFound", f"The Resource '{rid}' was not found.")
            return 200, self._view(rid)
        if request.method == "DELETE":
            self.log.append(("delete", rid))
            return (200 if self.store.pop(rid, None) is not None else 204), None
        return 405, arm_error("MethodNotAllowed")

    def _view(self, rid: str) -> dict[str, Any]:
        """The resource as ARM answers it: the stored body, its id and name, provisioned."""
        body = json.loads(json.dumps(self.store[rid]))
        parts = rid.strip("/").split("/")
        body.update(id=rid, name=parts[-1], type="/".join(parts[-3:-1]) if len(parts) >= 3 else "")
        body.setdefault("properties", {})["provisioningState"] = "Succeeded"
        return body


def resource_client(handler: Handler, subscription: str = SUBSCRIPTION) -> Any:
    """A real `ResourceManagementClient` whose requests `handler` answers; `.transport` is the
    `ArmTransport` (its `.requests` are what the SDK sent)."""
    from azure.mgmt.resource.resources import ResourceManagementClient

    transport = ArmTransport(handler)
    client = ResourceManagementClient(FakeCredential(), subscription, transport=transport)
    client.transport = transport  # type: ignore[attr-defined]
    return client
