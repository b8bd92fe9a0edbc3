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
- `ArmCompute`: Microsoft.Compute's virtual machines (create as a long-running operation that
  succeeds, is refused at once, or fails later as Azure's asynchronous AllocationFailed does;
  get; list and list_all; instance view, or given status codes; delete; deallocate;
  simulate_eviction) and usages, over a `GenericResources` for the rest.
  `compute_client(handler)`: a real ComputeManagementClient wired to an `ArmTransport`.

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
    "ArmCompute",
    "ArmRequest",
    "ArmTransport",
    "compute_client",
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
        answer = self.handler(recorded)
        status, payload = answer[0], answer[1]
        extra_headers: dict[str, str] = dict(answer[2]) if len(answer) > 2 else {}
        response = requests.Response()
        response.status_code = status
        response.url = request.url
        response.request = requests.Request(request.method, request.url).prepare()
        response.headers["x-ms-request-id"] = "spotnb-test"
        # bytes go out as they are (a body that is no ARM document); anything else as JSON
        content = (
            payload
            if isinstance(payload, bytes)
            else json.dumps(payload).encode()
            if payload is not None
            else b""
        )
        if payload is not None:
            response.headers["Content-Type"] = "application/json; charset=utf-8"
        response.headers.update(extra_headers)
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
        if request.method == "GET" and rid.rstrip("/").endswith("/resources") and rid.count("/") <= 4:
            return 200, {"value": self._listed(request)}  # the subscription's resources, filtered
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

    def _listed(self, request: ArmRequest) -> list[dict[str, Any]]:
        """`resources.list(filter="tagName eq 'k' and tagValue eq 'v'")`: the stored resources
        with that tag (the one filter spotnb sends)."""
        import re

        wanted = re.search(
            r"tagName eq '([^']*)'(?: and tagValue eq '([^']*)')?", (request.query.get("$filter") or [""])[0]
        )
        out = []
        for rid in self.store:
            tags = self.store[rid].get("tags") or {}
            if wanted and (
                wanted.group(1) not in tags or (wanted.group(2) and tags[wanted.group(1)] != wanted.group(2))
            ):
                continue
            out.append(self._view(rid))
        return out

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


class ArmCompute:
    """Microsoft.Compute as ARM answers it, for a real `ComputeManagementClient`; any other
    path goes to `generic` (the network, by id). Per VM name:

    - `refuse[name] = (status, code, message)`: the create PUT is answered with that ARM error
      (a quota, a throttle); `refuse_all` the same for every VM;
    - `fail_later[name] = (code, message)`: the PUT is accepted (201, Creating) and its
      operation, polled through `Azure-AsyncOperation`, fails with that error (Azure's
      asynchronous AllocationFailed); `fail_all_later` the same for every VM;
    - a created VM carries `properties.timeCreated` (kept across updates), as Azure sets it;
    - `power[name]`: the PowerState code its instance view shows ("running" once created);
    - `views[name]`: when set, the exact status codes its instance view shows instead (e.g.
      `["ProvisioningState/creating"]`, no PowerState yet);
    - `simulate_eviction` (POST simulateEviction) is accepted (204) and logged, nothing more.

    `usages[location]` answers `usage.list` (name → (current, limit)). `log`: (method, VM name or
    path) of every compute request, in order."""

    def __init__(self, generic: GenericResources | None = None) -> None:
        self.generic = generic or GenericResources()
        self.vms: dict[str, dict[str, Any]] = {}
        self.power: dict[str, str] = {}
        self.views: dict[str, list[str]] = {}
        self.refuse: dict[str, tuple[int, str, str]] = {}
        self.refuse_all: tuple[int, str, str] | None = None
        self.fail_later: dict[str, tuple[str, str]] = {}
        self.fail_all_later: tuple[str, str] | None = None
        self.usages: dict[str, dict[str, tuple[float, float]]] = {}
        self.log: list[tuple[str, str]] = []
        self._operations: dict[str, tuple[str, str]] = {}

    def __call__(self, request: ArmRequest) -> tuple[Any, ...]:
        path = request.path
        if "/operations/" in path and path.rsplit("/", 1)[-1] in self._operations:
            code, message = self._operations[path.rsplit("/", 1)[-1]]
            return 200, {"status": "Failed", "error": {"code": code, "message": message}}
        if path.endswith("/usages"):
            location = path.split("/locations/")[1].split("/")[0]
            value = [
                {"name": {"value": k, "localizedValue": k}, "currentValue": c, "limit": lim, "unit": "Count"}
                for k, (c, lim) in self.usages.get(location, {}).items()
            ]
            return 200, {"value": value}
        if path.endswith("/virtualMachines") and request.method == "GET":  # list, list_all
            group = (
                path.split("/resourceGroups/")[1].split("/")[0].lower()
                if "/resourceGroups/" in path
                else None
            )
            return 200, {
                "value": [
                    vm
                    for vm in self.vms.values()
                    if group is None or f"/resourcegroups/{group}/" in vm["id"].lower()
                ]
            }
        if "/virtualMachines/" not in path:
            return self.generic(request)
        rest = path.split("/virtualMachines/")[1].split("/")
        name, action = rest[0], (rest[1] if len(rest) > 1 else "")
        self.log.append((request.method if not action else f"{request.method} {action}", name))
        vm_id = path.split("/virtualMachines/")[0] + "/virtualMachines/" + name
        if request.method == "PUT":
            refused = self.refuse.pop(name, None) or self.refuse_all
            if refused is not None:
                status, code, message = refused
                return status, arm_error(code, message)
            body = json.loads(json.dumps(request.body or {}))
            body.update(id=vm_id, name=name, type="Microsoft.Compute/virtualMachines")
            created = self.vms.get(name, {}).get("properties", {}).get("timeCreated")
            body.setdefault("properties", {})["timeCreated"] = created or _now()
            later = self.fail_later.pop(name, None) or self.fail_all_later
            if later is not None:
                op = f"op-{len(self._operations) + 1}"
                self._operations[op] = later
                body.setdefault("properties", {})["provisioningState"] = "Creating"
                self.vms[name] = body
                self.power[name] = "starting"
                url = f"https://management.azure.com/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/x/operations/{op}?api-version=2024-07-01"
                return 201, body, {"Azure-AsyncOperation": url}
            body.setdefault("properties", {})["provisioningState"] = "Succeeded"
            self.vms[name] = body
            self.power[name] = "running"
            return 200, body
        if request.method == "GET" and action == "instanceView":
            if name not in self.vms:
                return 404, arm_error("ResourceNotFound", f"The Resource '{vm_id}' was not found.")
            if name in self.views:
                return 200, {"statuses": [{"code": code} for code in self.views[name]]}
            state = self.vms[name].get("properties", {}).get("provisioningState", "Succeeded")
            return 200, {
                "statuses": [
                    {"code": f"ProvisioningState/{state.lower()}"},
                    {"code": f"PowerState/{self.power.get(name, 'running')}"},
                ]
            }
        if request.method == "GET":
            if name not in self.vms:
                return 404, arm_error("ResourceNotFound", f"The Resource '{vm_id}' was not found.")
            return 200, self.vms[name]
        if request.method == "DELETE":
            existed = self.vms.pop(name, None) is not None
            self.power.pop(name, None)
            self.views.pop(name, None)
            return (200 if existed else 204), None
        if request.method == "POST" and action == "simulateEviction":
            return 204, None
        if request.method == "POST" and action == "deallocate":
            self.power[name] = "deallocated"
            return 200, None
        return 405, arm_error("MethodNotAllowed")


def _now() -> str:
    """A VM's `timeCreated`, as Azure sets it on creation."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat()


def compute_client(handler: Handler, subscription: str = SUBSCRIPTION) -> Any:
    """A real `ComputeManagementClient` whose requests `handler` answers (`.transport`: the
    `ArmTransport`, its `.requests` what the SDK sent)."""
    from azure.mgmt.compute import ComputeManagementClient

    transport = ArmTransport(handler)
    client = ComputeManagementClient(FakeCredential(), subscription, transport=transport)
    client.transport = transport  # type: ignore[attr-defined]
    return client
