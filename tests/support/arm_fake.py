"""A stateful Azure for a whole job: Resource Manager behind the real SDK clients, and what a VM
reaches from inside (IMDS, and Resource Manager with its managed identity's token).

`FakeArm` holds one subscription's resources: `azure_transport.ArmCompute` (virtual machines:
create, get, instance view, delete, deallocate) over its `GenericResources` (the resource group,
the virtual network spotnb creates on first use, anything put by id), answered under one lock
because the controller's thread, the VM runner's and the VMs' own calls reach it at once.

- `clients()`: a real ComputeManagementClient and ResourceManagementClient whose pipeline ends
  in `ArmTransport` (every request the SDK's own serialisation; `.requests` what was sent), as
  AzureProvider's `compute` / `resources` arguments.
- `created()`: the VMs Resource Manager created that no hypervisor has started yet (`started`).
- The VM side is one loopback HTTP server (`url`): `/vm/<name>/metadata/...` is that VM's IMDS
  (`instance/compute/resourceId`, `instance/compute/name`, and the managed identity's token,
  `VM_TOKEN`, a canary), and `/arm/<resource id>/<action>` is Resource Manager as a VM's `curl`
  reaches it (the bearer token must be `VM_TOKEN`): it is answered by the same `ArmCompute`, and a
  deallocation also stops the VM's processes (`on_deallocate`), as Azure's does.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.azure_transport import ArmCompute, ArmRequest, arm_error, compute_client, resource_client

__all__ = ["FakeArm", "VM_TOKEN"]

VM_TOKEN = "eyJspotnb-canary-azure-vm-managed-identity-token-7c6b"


class FakeArm:
    """One subscription's Resource Manager, and its VMs' IMDS (see the module)."""

    def __init__(self) -> None:
        self.compute = ArmCompute()
        self.lock = threading.RLock()
        self.started: set[str] = set()
        self.vm_requests: Counter[str] = Counter()  # "<method> <path>" a VM sent
        self.on_deallocate: Callable[[str], None] = lambda name: None
        arm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: str = "", ctype: str = "application/json") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                split = urlsplit(self.path)
                arm.vm_requests[f"GET {split.path}"] += 1
                parts = split.path.split("/", 3)  # "", "vm", name, rest
                if len(parts) < 4 or parts[1] != "vm" or self.headers.get("Metadata") != "true":
                    return self._send(400, json.dumps({"error": "bad request"}))
                name, rest = parts[2], "/" + parts[3]
                if rest == "/metadata/identity/oauth2/token":
                    body = {
                        "access_token": VM_TOKEN,
                        "expires_in": "3599",
                        "resource": parse_qs(split.query).get("resource", [""])[0],
                        "token_type": "Bearer",
                    }
                    return self._send(200, json.dumps(body))
                if rest == "/metadata/instance/compute/resourceId":
                    return self._send(200, arm.vm_id(name), "text/plain")
                if rest == "/metadata/instance/compute/name":
                    return self._send(200, name, "text/plain")
                return self._send(404, json.dumps({"error": "not found"}))

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                split = urlsplit(self.path)
                arm.vm_requests[f"POST {split.path}"] += 1
                if not split.path.startswith("/arm/"):
                    return self._send(404, json.dumps(arm_error("NotFound")))
                if self.headers.get("Authorization") != f"Bearer {VM_TOKEN}":
                    return self._send(401, json.dumps(arm_error("InvalidAuthenticationToken")))
                path = split.path[len("/arm") :]
                url = f"https://management.azure.com{path}"
                request = ArmRequest("POST", url, path, parse_qs(split.query))
                status, body = arm.handle(request)[:2]
                self._send(status, json.dumps(body) if body is not None else "")
                if status < 300 and path.endswith("/deallocate"):
                    arm.on_deallocate(path.split("/virtualMachines/")[1].split("/")[0])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="azure-vm-side").start()

    def handle(self, request: ArmRequest) -> tuple[Any, ...]:
        with self.lock:
            return self.compute(request)

    def clients(self) -> dict[str, Any]:
        """AzureProvider's keyword arguments: real SDK clients answered by this fake."""
        return {"compute": compute_client(self.handle), "resources": resource_client(self.handle)}

    def vm_id(self, name: str) -> str:
        with self.lock:
            vm = self.compute.vms.get(name)
            return vm["id"] if vm else ""

    def created(self) -> list[dict[str, Any]]:
        """Created VMs no hypervisor has started yet (each returned once)."""
        with self.lock:
            vms = self.compute.vms
            fresh = [json.loads(json.dumps(vm)) for n, vm in vms.items() if n not in self.started]
            self.started.update(vm["name"] for vm in fresh)
            return fresh

    def set_power(self, name: str, state: str) -> None:
        """What the hypervisor saw: the guest shut down ("stopped": still allocated)."""
        with self.lock:
            if name in self.compute.vms:
                self.compute.power[name] = state

    def left(self) -> dict[str, str]:
        """Every VM still in the subscription, with its power state."""
        with self.lock:
            return {n: self.compute.power.get(n, "?") for n in self.compute.vms}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
