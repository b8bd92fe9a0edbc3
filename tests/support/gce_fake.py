"""A stateful Compute Engine behind google-cloud-compute's REAL REST transport, and a GCE
identity (metadata server + OAuth token endpoint), for the GCP fake-cloud run
(tests/providers/gcp/test_e2e.py).

Compute Engine's control plane has no emulator, so it is faked, below `requests`
(`tests/gcp_transport.GceAdapter`): the provider's clients are real `compute_v1` clients with
`transport="rest"`, so the URL, query and JSON body of every call are google-cloud-compute's own.
`FakeCompute` keeps the instances that `instances.insert` created, with the body as sent (its
metadata `startup-script` included), and answers:

- `zones.list`: the region's zones, UP (`zone_status[zone]` another status; `zone_items` the
  exact items instead; `zones_refused` an error answer), its `region eq` filter applied;
- `instances.insert`: GCE's 404 for a machine type it lacks, else a DONE zonal operation; the
  instance is PROVISIONING until the "hypervisor" (the test's VM runner) boots it (`boot`:
  RUNNING; `status_on_insert(body)` picks another first status). A refusal is given as the
  answer itself, (HTTP status, JSON), a synchronous error document or a DONE operation carrying
  GCE's asynchronous error (`gcp_transport.done_operation(error=...)`): `refuse_next` (the next
  inserts, in turn), `refuse[zone]`, `refuse_all`;
- `instances.get` (404 once deleted), `instances.delete`, `instances.list` (label filters
  `labels.KEY = "VALUE"` and `labels.KEY:*`; `list_lags`: it shows nothing yet),
  `instances.aggregatedList` (same filters),
  `instances.simulateMaintenanceEvent` (logged in `maintenance`), `zoneOperations.get`;
  `set_status` and `vanish` (the platform deleted it) change an instance behind the client;
- `addresses.insert/get/delete` (a reservation gets `next_ip`, RESERVED; `refuse_address`
  refuses the insert) and `firewalls.insert/get/delete`, kept as sent (`addresses`,
  `firewalls`);
- anything else: 501, so an unexpected call fails the test loudly.

`GceIdentity` is one loopback HTTP server with two roles:

- the GCE metadata server's identity endpoints, as google-auth and spotnb's `code_fetch` read
  them on a VM (`GCE_METADATA_HOST` / `GCE_METADATA_IP` / `SPOTNB_GCE_METADATA_URL`): the ping
  (`/` answers `Metadata-Flavor: Google`), `project/project-id`, and the default service
  account's info, email and access token (`VM_TOKEN`);
- an OAuth 2.0 token endpoint (`POST /token`) for the notebook's Application Default
  Credentials (a service account key file whose `token_uri` names it: `key_file`; an
  `authorized_user` file cannot be pointed elsewhere, google-auth always sends it to Google),
  answering `NOTEBOOK_TOKEN`.

Every secret is a recognisable canary (`GCP_CANARIES`, and each line of the notebook's private
key: `secrets()`) so a test can scan what spotnb wrote.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.gcp_transport import GceAdapter, GceRequest, done_operation, gce_error

__all__ = ["FakeCompute", "GceIdentity", "GCP_CANARIES", "SERVICE_ACCOUNT"]

SERVICE_ACCOUNT = "spotnb-vm@spotnb-e2e.iam.gserviceaccount.com"
GCP_CANARIES = {
    "notebook_private_key_id": "spotnbcanarygcpprivatekeyid5e4d3c2b1a09",
    "notebook_access_token": "ya29.spotnb-canary-gcp-notebook-access-2f1e",
    "vm_access_token": "ya29.spotnb-canary-gcp-vm-access-token-9d8c",
}
VM_TOKEN = GCP_CANARIES["vm_access_token"]
NOTEBOOK_TOKEN = GCP_CANARIES["notebook_access_token"]
_API = "https://www.googleapis.com/compute/v1"


class FakeCompute:
    """Compute Engine's instances, zones and zone operations for one project (see the module)."""

    def __init__(
        self,
        project: str,
        region: str,
        zones: tuple[str, ...] = ("a", "b", "c"),
        machine_types: tuple[str, ...] = ("g2-standard-4", "n1-standard-4", "e2-small"),
    ) -> None:
        self.project, self.region, self.machine_types = project, region, machine_types
        self.zones = [f"{region}-{z}" for z in zones]
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name) -> resource
        self.deleted: list[str] = []
        self.zone_status: dict[str, str] = {}
        self.zone_items: list[dict[str, Any]] | None = None
        self.zones_refused: tuple[int, Any] | None = None
        self.refuse_next: list[tuple[int, Any]] = []
        self.refuse: dict[str, tuple[int, Any]] = {}
        self.refuse_all: tuple[int, Any] | None = None
        self.status_on_insert: Callable[[dict[str, Any]], str] = lambda body: "PROVISIONING"
        self.maintenance: list[str] = []
        self.list_lags = False  # instances.list does not show the instances yet (GCE's lag)
        self.addresses: dict[str, dict[str, Any]] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.next_ip = "10.128.0.42"
        self.refuse_address: tuple[int, Any] | None = None
        self.lock = threading.Lock()
        self.adapter = GceAdapter(self.handle)
        self._ops = 0

    # -- clients -------------------------------------------------------------------------------
    def clients(self) -> dict[str, Any]:
        """Real REST clients of google-cloud-compute whose every request this fake answers,
        as GCPProvider's keyword arguments."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import compute_v1

        out: dict[str, Any] = {}
        for key, cls in (
            ("instances", compute_v1.InstancesClient),
            ("zones", compute_v1.ZonesClient),
            ("machine_types", compute_v1.MachineTypesClient),
            ("addresses", compute_v1.AddressesClient),
            ("firewalls", compute_v1.FirewallsClient),
        ):
            client = cls(credentials=AnonymousCredentials(), transport="rest")
            client._transport._session.mount("https://", self.adapter)
            client._transport._session.mount("http://", self.adapter)
            out[key] = client
        # the Cloud Billing catalog (prices): not served (the adapter answers 501), so the
        # provider prices from its dated table
        import requests

        catalog = requests.Session()
        catalog.mount("https://", self.adapter)
        catalog.mount("http://", self.adapter)
        out["catalog"] = catalog
        return out

    # -- the hypervisor's side -------------------------------------------------------------------
    def provisioning(self) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(i) for i in self.instances.values() if i["status"] == "PROVISIONING"]

    def boot(self, zone: str, name: str) -> None:
        self._set_status(zone, name, "RUNNING")

    def set_status(self, zone: str, name: str, status: str) -> None:
        self._set_status(zone, name, status)

    def vanish(self, zone: str, name: str) -> None:
        """The platform deleted the instance (a Spot VM's termination action DELETE)."""
        with self.lock:
            self.instances.pop((zone, name), None)

    def inserts(self) -> list[Any]:
        """Every instances.insert request as sent (refused ones included), in order."""
        return [
            r
            for r in self.adapter.requests
            if r.method == "POST" and r.path.endswith("/instances") and "/zones/" in r.path
        ]

    def inserted_zones(self) -> list[str]:
        return [r.path.split("/zones/")[1].split("/")[0] for r in self.inserts()]

    def power_off(self, zone: str, name: str) -> None:
        """The guest shut down: GCE keeps the instance, TERMINATED (its disk still billed)."""
        self._set_status(zone, name, "TERMINATED")

    def _set_status(self, zone: str, name: str, status: str) -> None:
        with self.lock:
            inst = self.instances.get((zone, name))
            if inst is not None:
                inst["status"] = status

    def left(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(i["name"], i["status"]) for i in self.instances.values()]

    # -- the API ---------------------------------------------------------------------------------
    def _operation(self, zone: str, kind: str, target: str) -> dict[str, Any]:
        self._ops += 1
        op = done_operation(zone, name=f"operation-{self._ops}")
        op["zone"] = f"{_API}/projects/{self.project}/zones/{zone}"
        op["operationType"] = kind
        op["targetLink"] = f"{_API}/projects/{self.project}/zones/{zone}/instances/{target}"
        return op

    def _plain_operation(self, where: dict[str, str], kind: str, target: str) -> dict[str, Any]:
        """A finished regional or global Operation (`where`: {"region": ...} or {})."""
        self._ops += 1
        op = done_operation("-", name=f"operation-{self._ops}")
        del op["zone"]
        op.update({k: f"{_API}/projects/{self.project}/regions/{v}" for k, v in where.items()})
        op["operationType"] = kind
        op["targetLink"] = target
        return op

    def handle(self, req: GceRequest) -> tuple[int, Any]:
        prefix = f"/compute/v1/projects/{self.project}/"
        if not req.path.startswith(prefix):
            return 404, gce_error(404, f"The resource 'projects/{req.path}' was not found")
        parts = req.path[len(prefix) :].split("/")
        with self.lock:
            if parts == ["zones"] and req.method == "GET":
                return self._zones(req)
            if parts == ["aggregated", "instances"] and req.method == "GET":
                return 200, self._aggregated(req)
            if len(parts) >= 3 and parts[0] == "zones" and parts[2] == "instances":
                return self._instances(req, parts[1], parts[3:])
            if len(parts) == 4 and parts[0] == "zones" and parts[2] == "operations":
                return 200, self._operation(parts[1], "insert", "?")
            if len(parts) >= 3 and parts[0] == "regions" and parts[2] == "addresses":
                return self._addresses(req, parts[1], parts[3:])
            if len(parts) == 4 and parts[0] == "regions" and parts[2] == "operations":
                return 200, self._plain_operation({"region": parts[1]}, "insert", "?")
            if len(parts) >= 2 and parts[:2] == ["global", "firewalls"]:
                return self._firewalls(req, parts[2:])
            if len(parts) == 3 and parts[:2] == ["global", "operations"]:
                return 200, self._plain_operation({}, "insert", "?")
        return 501, gce_error(501, f"the fake Compute API does not serve {req.method} {req.path}", "x")

    def _instances(self, req: GceRequest, zone: str, rest: list[str]) -> tuple[int, Any]:
        if zone not in self.zones:
            return 400, gce_error(400, f"Invalid value for field 'zone': '{zone}'. Unknown zone.", "invalid")
        if not rest:
            if req.method == "POST":
                body = req.body
                name = body["name"]
                refusal = (
                    self.refuse_next.pop(0) if self.refuse_next else self.refuse.get(zone, self.refuse_all)
                )
                if refusal is not None:
                    return refusal
                machine = body["machineType"].rsplit("/", 1)[-1]
                if machine not in self.machine_types:  # GCE's synchronous 404 for the type
                    path = f"projects/{self.project}/zones/{zone}/machineTypes/{machine}"
                    return 404, gce_error(404, f"The resource '{path}' was not found")
                if (zone, name) in self.instances:
                    msg = (
                        f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists"
                    )
                    return 409, gce_error(409, msg, "alreadyExists")
                self.instances[(zone, name)] = {
                    **body,
                    "kind": "compute#instance",
                    "id": str(1000 + len(self.instances) + len(self.deleted)),
                    "status": self.status_on_insert(body),
                    "creationTimestamp": datetime.now(timezone.utc).isoformat(),
                    "zone": f"{_API}/projects/{self.project}/zones/{zone}",
                    "selfLink": f"{_API}/projects/{self.project}/zones/{zone}/instances/{name}",
                }
                return 200, self._operation(zone, "insert", name)
            if req.method == "GET":
                wanted = _label_filter(req)
                if self.list_lags:
                    return 200, {"kind": "compute#instanceList", "items": []}
                items = [copy.deepcopy(i) for (z, _), i in self.instances.items() if z == zone and wanted(i)]
                return 200, {"kind": "compute#instanceList", "items": items}
        name = rest[0]
        inst = self.instances.get((zone, name))
        if inst is None:
            path = f"projects/{self.project}/zones/{zone}/instances/{name}"
            return 404, gce_error(404, f"The resource '{path}' was not found")
        if len(rest) == 1 and req.method == "GET":
            return 200, copy.deepcopy(inst)
        if len(rest) == 1 and req.method == "DELETE":
            del self.instances[(zone, name)]
            self.deleted.append(name)
            return 200, self._operation(zone, "delete", name)
        if rest[1:] == ["simulateMaintenanceEvent"] and req.method == "POST":
            self.maintenance.append(name)
            return 200, self._operation(zone, "simulateMaintenanceEvent", name)
        return 501, gce_error(501, f"the fake Compute API does not serve {req.method} {req.path}", "x")

    def _zones(self, req: GceRequest) -> tuple[int, Any]:
        if self.zones_refused is not None:
            return self.zones_refused
        region = f"{_API}/projects/{self.project}/regions/{self.region}"
        items = self.zone_items
        if items is None:
            items = [
                {"name": z, "status": self.zone_status.get(z, "UP"), "region": region} for z in self.zones
            ]
        match = re.fullmatch(r"region eq (.*)", " ".join(req.query.get("filter", [])))
        if match:
            items = [i for i in items if re.fullmatch(match.group(1), i["region"])]
        return 200, {"kind": "compute#zoneList", "items": copy.deepcopy(items)}

    def _addresses(self, req: GceRequest, region: str, rest: list[str]) -> tuple[int, Any]:
        base = f"projects/{self.project}/regions/{region}/addresses"
        if not rest and req.method == "POST":
            if self.refuse_address is not None:
                return self.refuse_address
            name = req.body["name"]
            if name in self.addresses:
                return 409, gce_error(409, f"The resource '{base}/{name}' already exists", "alreadyExists")
            self.addresses[name] = {
                **req.body,
                "kind": "compute#address",
                "address": req.body.get("address") or self.next_ip,
                "status": "RESERVED",
                "region": f"{_API}/projects/{self.project}/regions/{region}",
            }
            return 200, self._plain_operation({"region": region}, "insert", f"{_API}/{base}/{name}")
        if len(rest) == 1 and rest[0] in self.addresses:
            if req.method == "GET":
                return 200, copy.deepcopy(self.addresses[rest[0]])
            if req.method == "DELETE":
                del self.addresses[rest[0]]
                return 200, self._plain_operation({"region": region}, "delete", f"{_API}/{base}/{rest[0]}")
        if len(rest) == 1:
            return 404, gce_error(404, f"The resource '{base}/{rest[0]}' was not found")
        return 501, gce_error(501, f"the fake Compute API does not serve {req.method} {req.path}", "x")

    def _firewalls(self, req: GceRequest, rest: list[str]) -> tuple[int, Any]:
        base = f"projects/{self.project}/global/firewalls"
        if not rest and req.method == "POST":
            name = req.body["name"]
            if name in self.firewalls:
                return 409, gce_error(409, f"The resource '{base}/{name}' already exists", "alreadyExists")
            self.firewalls[name] = {**req.body, "kind": "compute#firewall"}
            return 200, self._plain_operation({}, "insert", f"{_API}/{base}/{name}")
        if len(rest) == 1 and rest[0] in self.firewalls:
            if req.method == "GET":
                return 200, copy.deepcopy(self.firewalls[rest[0]])
            if req.method == "DELETE":
                del self.firewalls[rest[0]]
                return 200, self._plain_operation({}, "delete", f"{_API}/{base}/{rest[0]}")
        if len(rest) == 1:
            return 404, gce_error(404, f"The resource '{base}/{rest[0]}' was not found")
        return 501, gce_error(501, f"the fake Compute API does not serve {req.method} {req.path}", "x")

    def _aggregated(self, req: GceRequest) -> dict[str, Any]:
        wanted = _label_filter(req)
        scoped: dict[str, Any] = {}
        for (zone, _), inst in self.instances.items():
            if wanted(inst):
                scoped.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(copy.deepcopy(inst))
        return {"kind": "compute#instanceAggregatedList", "items": scoped}


def _label_filter(req: GceRequest) -> Callable[[dict[str, Any]], bool]:
    """GCE's list filter on labels, as spotnb writes it: `labels.KEY:*` (has the label) and
    `labels.KEY = "VALUE"`, all of them to hold."""
    text = " ".join(req.query.get("filter", []))
    present = re.findall(r"labels\.([\w-]+):\*", text)
    equal = re.findall(r'labels\.([\w-]+)\s*=\s*"([^"]*)"', text)

    def wanted(inst: dict[str, Any]) -> bool:
        labels = inst.get("labels") or {}
        return all(k in labels for k in present) and all(labels.get(k) == v for k, v in equal)

    return wanted


class GceIdentity:
    """The VM's service account through a GCE metadata server, and the notebook's OAuth token
    endpoint (see the module). `requests` counts the paths asked."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.requests: Counter[str] = Counter()
        self.private_key_lines: list[str] = []
        identity = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: str, ctype: str = "application/text") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                path = self.path.split("?", 1)[0]
                identity.requests[f"POST {path}"] += 1
                if path != "/token":
                    return self._send(404, "Not Found")
                body = {"access_token": NOTEBOOK_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
                self._send(200, json.dumps(body), "application/json")

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                identity.requests[path] += 1
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._send(403, "Missing Metadata-Flavor:Google header.")
                sa = "/computeMetadata/v1/instance/service-accounts/default/"
                answers = {
                    "/": ("computeMetadata/", "application/text"),
                    "/computeMetadata/v1/project/project-id": (identity.project, "application/text"),
                    "/computeMetadata/v1/universe/universe-domain": ("googleapis.com", "application/text"),
                    sa: (
                        json.dumps(
                            {"aliases": ["default"], "email": SERVICE_ACCOUNT, "scopes": [_CLOUD_PLATFORM]}
                        ),
                        "application/json",
                    ),
                    sa + "email": (SERVICE_ACCOUNT, "application/text"),
                    sa + "token": (
                        json.dumps({"access_token": VM_TOKEN, "expires_in": 3599, "token_type": "Bearer"}),
                        "application/json",
                    ),
                }
                if path not in answers:
                    return self._send(404, "Not Found")
                self._send(200, *answers[path])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="gce-identity").start()

    def vm_env(self) -> dict[str, str]:
        """What points a VM's google-auth and spotnb's code fetch at this metadata server."""
        return {
            "GCE_METADATA_HOST": self.host,
            "GCE_METADATA_IP": self.host,
            "SPOTNB_GCE_METADATA_URL": f"http://{self.host}",
        }

    def key_file(self, where: Path) -> Path:
        """The notebook's Application Default Credentials: a service account key file (as
        `gcloud iam service-accounts keys create` writes it, with a fresh RSA key) whose
        `token_uri` is this server."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        self.private_key_lines = [line for line in pem.splitlines() if not line.startswith("-----")]
        path = where / "notebook-key.json"
        path.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": self.project,
                    "private_key_id": GCP_CANARIES["notebook_private_key_id"],
                    "private_key": pem,
                    "client_email": f"notebook@{self.project}.iam.gserviceaccount.com",
                    "client_id": "100000000000000000001",
                    "token_uri": f"http://{self.host}/token",
                }
            )
        )
        return path

    def secrets(self) -> list[bytes]:
        """Every canary: the static ones and each line of the notebook's private key."""
        return [v.encode() for v in GCP_CANARIES.values()] + [
            line.encode() for line in self.private_key_lines
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


_CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
