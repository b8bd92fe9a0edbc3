"""`spotnb doctor --provider gcp`: the Google Cloud checks (see `spotnb.doctor.report`).

Credentials are Application Default Credentials, found as the provider finds them
(`GCPProvider.has_credentials`: a key file, gcloud's ADC file, a GCE machine; no metadata-server
probe elsewhere) and refreshed once. Every request has a 5 s timeout and no retry. What is
asked: `regions.get` (region, and its quotas), `zones.get`, `machineTypes.get` in the region's
zones (instance type), `projects.get` (`GPUS_ALL_REGIONS`, the default service account), IAM
`serviceAccounts.get` and the IAM policies of the bucket and the project (identity),
`images.get` / `images.getFromFamily` (image), and the provider's own price fetch (the Cloud
Billing catalog, else the dated table).
"""

from __future__ import annotations

import difflib
import os
import re
from typing import TYPE_CHECKING, Any

from spotnb.doctor.checks import (
    READ_TIMEOUT,
    Check,
    Result,
    brief,
    bucket_of,
    fail,
    is_unreachable,
    ok,
    price_result,
    store_check,
    unexpected,
    unknown,
)

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = ["checks", "gpu_quota_metric", "WRITER_ROLES"]

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
#: predefined roles that may create, read and delete objects in a bucket
WRITER_ROLES = {
    "roles/storage.objectAdmin",
    "roles/storage.objectUser",
    "roles/storage.admin",
    "roles/editor",
    "roles/owner",
}
#: accelerator type → its regional quota metric, where the rule below does not give it
_GPU_METRICS = {
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
}
_IMAGE = re.compile(
    r"^(?:https://www\.googleapis\.com/compute/v1/)?(?:projects/(?P<project>[^/]+)/)?global/images/(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))$"
)


def gpu_quota_metric(accelerator: str) -> str:
    """'nvidia-tesla-t4' → 'NVIDIA_T4_GPUS' (the regional quota; spot VMs use the PREEMPTIBLE_
    one when the project has it)."""
    if accelerator in _GPU_METRICS:
        return _GPU_METRICS[accelerator]
    name = accelerator.removeprefix("nvidia-").removeprefix("tesla-")
    return f"NVIDIA_{name.upper().replace('-', '_')}_GPUS"


def _source(env: Any = None) -> str:
    env = os.environ if env is None else env
    named = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if named:
        return f"the key file $GOOGLE_APPLICATION_CREDENTIALS ({named})"
    return (
        "gcloud's application default credentials (gcloud auth application-default login), or this GCE VM's"
    )


def _reason(exc: BaseException) -> str:
    """A Google API error's reason ('accessNotConfigured', 'SERVICE_DISABLED', 'notFound')."""
    for detail in getattr(exc, "errors", None) or []:
        if isinstance(detail, dict) and detail.get("reason"):
            return str(detail["reason"])
    reason = getattr(exc, "reason", None)
    return str(reason or "")


def checks(config: Config, provider_cls: Any, http_adapter: Any = None, **_: Any) -> list[Check]:
    """The Google Cloud checks for `config`. `http_adapter`: a `requests` transport adapter
    mounted on every session of the checks' Google API clients (tests)."""
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    state: dict[str, Any] = {}
    regions = config.candidate_regions()
    where = config.region or (next((r for r in regions if r), None) if isinstance(regions, list) else None)
    itype = (
        config.instance_type if isinstance(config.instance_type, str) else config.instance_type.get("gcp", "")
    )
    store_url = config.store_url()
    on_gcs = store_url.startswith(("gs://", "gcs://"))

    def mount(session: Any) -> Any:
        if http_adapter is not None:
            session.mount("https://", http_adapter)
            session.mount("http://", http_adapter)
        return session

    def client(cls: Any) -> Any:
        made = cls(credentials=state["credentials"], transport="rest")
        if http_adapter is not None:
            mount(made._transport._session)
        return made

    def authorized() -> Any:
        from google.auth.transport.requests import AuthorizedSession

        return mount(AuthorizedSession(state["credentials"]))

    def call(method: Any, **kw: Any) -> Any:
        return method(**kw, retry=None, timeout=READ_TIMEOUT)

    def region_of(name: str) -> str:
        return name.rsplit("-", 1)[0] if re.match(r"^[a-z]+-[a-z]+\d+-[a-z]$", name) else name

    def api_error(exc: Exception) -> Result:
        """A Google API refusal: the API not enabled, no permission, or the credentials refused."""
        project = state.get("project")
        reason = _reason(exc)
        if (
            reason in ("accessNotConfigured", "SERVICE_DISABLED")
            or "has not been used" in str(exc)
            or ("is disabled" in str(exc))
        ):
            return fail(
                f"the Compute Engine API is not enabled in project {project}",
                f"gcloud services enable compute.googleapis.com --project {project}",
            )
        if isinstance(exc, gexc.Unauthorized):
            return fail(
                f"Google refused the credentials: {brief(exc, 200)}", "gcloud auth application-default login"
            )
        return fail(
            f"no permission in project {project}: {brief(exc, 200)}",
            "grant the credentials' identity a role with compute read access (roles/compute.viewer) "
            "in the project",
        )

    def credentials(_: dict[str, Result]) -> Result:
        import google.auth
        import google.auth.exceptions as gauth
        from google.auth.transport.requests import Request

        named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if named and not os.path.isfile(named):
            return fail(
                f"$GOOGLE_APPLICATION_CREDENTIALS names {named}, which is not a file",
                "fix the path, or unset it and run gcloud auth application-default login",
            )
        if not provider_cls.has_credentials():
            return fail("no Google credentials found", provider_cls.credentials_hint)
        source = _source()
        try:
            creds, found_project = google.auth.default(scopes=[CLOUD_PLATFORM])
        except gauth.DefaultCredentialsError as exc:
            return fail(
                f"the credentials of {source} cannot be read: {brief(exc, 240)}",
                provider_cls.credentials_hint,
            )
        request = Request()  # the token endpoint's (a key file's token_uri, Google's)

        def bounded(*args: Any, **kw: Any) -> Any:
            kw.setdefault("timeout", READ_TIMEOUT)
            return request(*args, **kw)

        try:
            creds.refresh(bounded)
        except gauth.RefreshError as exc:
            if is_unreachable(exc):
                return unexpected("gcp", exc)
            return fail(
                f"Google refused the credentials of {source}: {brief(exc, 240)}",
                "they are expired or revoked: gcloud auth application-default login (or a new key file)",
            )
        except gauth.TransportError as exc:
            return unexpected("gcp", exc)
        state["credentials"] = creds
        project = (
            config.gcp_project
            or os.environ.get("GOOGLE_CLOUD_PROJECT")
            or os.environ.get("CLOUDSDK_CORE_PROJECT")
            or found_project
        )
        if not project:
            return fail(
                f"{source} works, but no project is given", "set Config.gcp_project or $GOOGLE_CLOUD_PROJECT"
            )
        state["project"] = project
        who = getattr(creds, "service_account_email", None)
        return ok(f"{source}{f': {who}' if who and who != 'default' else ''}, project {project}")

    def region(_: dict[str, Result]) -> Result:
        if not where:
            return fail("no region or zone given", "set Config.region, e.g. 'us-central1' or 'us-central1-a'")
        name = region_of(where)
        try:
            found = call(client(compute_v1.RegionsClient).get, project=state["project"], region=name)
        except gexc.NotFound:
            from spotnb.providers.gcp.zones import REGION_ZONES

            close = difflib.get_close_matches(name, list(REGION_ZONES), n=2, cutoff=0.6)
            return fail(
                f"{name!r} is not a region of project {state['project']} (or the project does not exist)",
                (f"did you mean {' or '.join(close)}? " if close else "") + "gcloud compute regions list",
            )
        except (gexc.Forbidden, gexc.Unauthorized) as exc:
            return api_error(exc)
        zones = sorted(str(z).rsplit("/", 1)[-1] for z in found.zones)
        state["quotas"] = {q.metric: (float(q.limit), float(q.usage)) for q in found.quotas}
        if where != name:
            if where not in zones:
                return fail(f"{name} has no zone {where!r}", f"one of {', '.join(zones)}")
            zones = [where]
        if found.status and found.status != "UP":
            return fail(f"{name} is {found.status}", "pick another region")
        state["zones"] = zones
        return ok(f"{where} (zones {', '.join(zones)})")

    def instance_type(_: dict[str, Result]) -> Result:
        types = client(compute_v1.MachineTypesClient)
        found, missing = None, []
        for zone in state["zones"]:
            try:
                mt = call(types.get, project=state["project"], zone=zone, machine_type=itype)
            except gexc.NotFound:
                missing.append(zone)
                continue
            found = found or mt
            state.setdefault("type_zones", []).append(zone)
        if found is None:
            from spotnb.market.prices import known_instance_types

            close = difflib.get_close_matches(
                itype, [t for t in known_instance_types() if t != itype], n=2, cutoff=0.7
            )
            return fail(
                f"no machine type {itype!r} in {', '.join(missing)}",
                (f"did you mean {' or '.join(close)}? " if close else "")
                + f"gcloud compute machine-types list --filter zone:{region_of(where or '')}",
            )
        gpus = [(str(a.guest_accelerator_type), int(a.guest_accelerator_count)) for a in found.accelerators]
        if not gpus and config.gcp_accelerator_type:
            gpus = [(config.gcp_accelerator_type, int(config.gcp_accelerator_count))]
        shape = f"{found.guest_cpus} vCPUs" + "".join(f", {c} × {t}" for t, c in gpus)
        return ok(
            f"{itype}: {shape}, in {', '.join(state['type_zones'])}", cpus=int(found.guest_cpus), gpus=gpus
        )

    def quota(inputs: dict[str, Result]) -> Result:
        data = inputs["instance type"].data
        n = config.instances
        regional: dict[str, tuple[float, float]] = state["quotas"]
        try:
            project = call(client(compute_v1.ProjectsClient).get, project=state["project"])
        except (gexc.Forbidden, gexc.Unauthorized) as exc:
            return unknown(f"may not read the project's quotas: {brief(exc, 160)}")
        state["default_sa"] = str(project.default_service_account or "")
        glob = {q.metric: (float(q.limit), float(q.usage)) for q in project.quotas}
        family = itype.split("-", 1)[0].upper()
        wanted: list[tuple[str, float, dict[str, tuple[float, float]]]] = []
        cpu = next(
            (
                m
                for m in ("PREEMPTIBLE_CPUS", f"{family}_CPUS", "CPUS")
                if m in regional and (m != "PREEMPTIBLE_CPUS" or regional[m][0] > 0)
            ),
            "CPUS",
        )
        wanted.append((cpu, data["cpus"] * n, regional))
        gpus = sum(c for _, c in data.get("gpus", []))
        for accel, count in data.get("gpus", []):
            metric = gpu_quota_metric(accel)
            pre = f"PREEMPTIBLE_{metric}"
            wanted.append((pre if regional.get(pre, (0.0, 0.0))[0] > 0 else metric, count * n, regional))
        if gpus:
            wanted.append(("GPUS_ALL_REGIONS", gpus * n, glob))
        short: list[str] = []
        fine: list[str] = []
        unseen: list[str] = []
        for metric, need, table in wanted:
            if metric not in table:
                unseen.append(metric)
                continue
            limit, used = table[metric]
            text = f"{metric} {used:g}/{limit:g} in use, needs {need:g}"
            (short if limit - used < need else fine).append(text)
        where_q = region_of(where or "")
        if short:
            return fail(
                f"in {where_q}: {'; '.join(short)}",
                "request more on https://console.cloud.google.com/iam-admin/quotas?project="
                f"{state['project']} (filter by the metric; {where_q} for the regional ones), or see them: "
                "gcloud compute regions "
                f"describe {where_q} --project {state['project']}",
            )
        if unseen:
            return unknown(
                f"{where_q} lists no quota {', '.join(unseen)} (the GPU may not be offered there); "
                f"{'; '.join(fine)}"
            )
        return ok(f"in {where_q}: {'; '.join(fine)}")

    def store(_: dict[str, Result]) -> Result:
        return store_check(config)

    def identity(_: dict[str, Result]) -> Result:
        project = state["project"]
        email = config.gcp_service_account
        session = authorized()
        if not email:
            try:
                email = str(
                    call(client(compute_v1.ProjectsClient).get, project=project).default_service_account or ""
                )
            except (gexc.Forbidden, gexc.Unauthorized) as exc:
                return unknown(f"may not read the project's default service account: {brief(exc, 160)}")
            if not email:
                return fail(
                    f"project {project} has no default compute service account",
                    "set Config.gcp_service_account to a service account that may use the bucket",
                )
        got = session.get(
            f"https://iam.googleapis.com/v1/projects/-/serviceAccounts/{email}", timeout=READ_TIMEOUT
        )
        if got.status_code == 404:
            return fail(
                f"no service account {email}",
                f"gcloud iam service-accounts create {email.split('@', 1)[0]} --project {project}, or fix "
                "Config.gcp_service_account",
            )
        if got.status_code in (401, 403):
            return unknown(f"may not read service account {email} (HTTP {got.status_code}): not checked")
        got.raise_for_status()
        if got.json().get("disabled"):
            return fail(f"service account {email} is disabled", f"gcloud iam service-accounts enable {email}")
        if not on_gcs:
            return unknown(f"service account {email} exists; the store is not GCS ({store_url}): not checked")
        bucket = bucket_of(store_url)[0]
        member = f"serviceAccount:{email}"
        roles: set[str] = set()
        seen = []
        policies = [
            ("bucket", "GET", f"https://storage.googleapis.com/storage/v1/b/{bucket}/iam"),
            (
                "project",
                "POST",
                f"https://cloudresourcemanager.googleapis.com/v1/projects/{project}:getIamPolicy",
            ),
        ]
        for what, method, url in policies:
            resp = session.request(
                method, url, timeout=READ_TIMEOUT, **({"json": {}} if method == "POST" else {})
            )
            if resp.status_code != 200:
                continue
            seen.append(what)
            for binding in resp.json().get("bindings", []):
                if member in binding.get("members", []):
                    roles.add(str(binding.get("role")))
        scope = (
            f"bindings of the {' and '.join(seen)} IAM polic{'ies' if len(seen) > 1 else 'y'} naming it; "
            "not checked: "
            "groups, custom roles, conditions, folder and organization policies"
        )
        if not seen:
            return unknown(
                f"service account {email} exists; may not read the IAM policies of {bucket} or {project}: "
                "not checked"
            )
        writers = sorted(roles & WRITER_ROLES)
        if not writers:
            return fail(
                f"service account {email} has no role that writes objects in gs://{bucket} ({scope})",
                f"gcloud storage buckets add-iam-policy-binding gs://{bucket} --member {member} "
                "--role roles/storage.objectAdmin",
            )
        return ok(f"service account {email} has {writers[0]} ({scope})")

    def image(_: dict[str, Result]) -> Result:
        from spotnb.providers.gcp.provider import DEFAULT_IMAGE

        ref = str(config.gcp_image or DEFAULT_IMAGE)
        m = _IMAGE.match(ref)
        if not m:
            return fail(
                f"Config.gcp_image {ref!r} is not an image URL",
                "projects/P/global/images/NAME or .../images/family/F",
            )
        project = m.group("project") or state["project"]
        images = client(compute_v1.ImagesClient)
        default = "" if config.gcp_image else " (spotnb's default)"
        try:
            if m.group("family"):
                found = call(images.get_from_family, project=project, family=m.group("family"))
            else:
                found = call(images.get, project=project, image=m.group("name"))
        except gexc.NotFound:
            return fail(
                f"no image {ref}{default}",
                "set Config.gcp_image to an image with CUDA and torch (gcloud compute images list "
                f"--project {project})",
            )
        except (gexc.Forbidden, gexc.Unauthorized) as exc:
            return unknown(f"may not read image {ref}: {brief(exc, 160)}")
        status = str(getattr(found.deprecated, "state", "") or "")
        if status in ("OBSOLETE", "DELETED"):
            return fail(f"image {found.name} ({ref}) is {status}", "set Config.gcp_image to a current image")
        note = f", {status}" if status else ""
        return ok(f"{found.name} ({ref}{default}{note})")

    def prices(inputs: dict[str, Result]) -> Result:
        zones_client = client(compute_v1.ZonesClient)
        provider = provider_cls(
            config,
            zones=zones_client,
            machine_types=client(compute_v1.MachineTypesClient),
            catalog=authorized(),
        )
        return price_result("gcp", provider, itype, where or "", live_word="Cloud Billing catalog")

    store_needs = ("credentials",) if on_gcs else ()
    return [
        Check("credentials", credentials, (), "gcp"),
        Check("region", region, ("credentials",), "gcp"),
        Check("instance type", instance_type, ("region",), "gcp"),
        Check("spot quota", quota, ("instance type",), "gcp"),
        Check("store", store, store_needs, "gcp"),
        Check("identity", identity, ("credentials",), "gcp"),
        Check("image", image, ("credentials",), "gcp"),
        Check("prices", prices, ("region",), "gcp"),
    ]
