"""What a Compute Engine "not found" is about: the zone, or something the user configured.

`instances.insert` answers 404 when anything the request names is missing, with the message
`The resource '<path>' was not found` (synchronously, or in the operation's error). Only some
of those paths belong to a zone: the zone itself (a region's fallback suffix it lacks), a
machine type, accelerator type or disk type the zone does not offer. Another zone of the region
may have those, so the launch moves on. Everything else (the image or its family, the network,
the subnetwork, the service account, the project) is missing in every zone: trying the next
zone only ends in a misleading "no zone can run <instance type>". `missing_resource` names it
and the Config field to fix; `missing_resource_error` turns that into the ConfigError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spotnb.errors import ConfigError

__all__ = [
    "MissingResource",
    "ZONAL_KINDS",
    "error_texts",
    "missing_resource",
    "missing_resource_error",
    "zone_lacks",
]

#: Resource kinds (`…/zones/<zone>/<kind>/<name>`) that one zone may lack and another offer.
ZONAL_KINDS = frozenset({"machineTypes", "acceleratorTypes", "diskTypes"})
_NOT_FOUND = re.compile(r"The resource '(?P<path>[^']+)'(?: of type '(?P<kind>\w+)')? was not found")
_SA_MISSING = re.compile(r"[Ss]ervice account \W?(?P<email>[\w.@-]+)\W? does not exist")
_ZONE_ONLY = re.compile(r"^(?:.*/)?projects/[^/]+/zones/[^/]+$")
_PROJECT_ONLY = re.compile(r"^(?:.*/)?projects/(?P<project>[^/]+)$")


@dataclass(frozen=True)
class MissingResource:
    """A resource the request names that does not exist (in any zone)."""

    what: str  # "image", "network", "subnetwork", "service account", "project", "resource"
    resource: str  # as GCE names it
    field: str | None  # the Config field that names it (None: not one spotnb knows)


def error_texts(exc: BaseException) -> list[str]:
    """The exception's message and those of its error items (an operation's errors)."""
    texts = [str(exc)]
    for item in getattr(exc, "errors", None) or []:
        message = getattr(item, "message", None) or (item.get("message") if isinstance(item, dict) else None)
        if message:
            texts.append(str(message))
    return texts


def missing_resource(
    exc: BaseException,
    image_field: str = "gcp_image",
    service_account_field: str = "gcp_service_account",
) -> MissingResource | None:
    """What `exc` (a GCE error) says is missing, unless that is zone-specific (the zone itself,
    a machine, accelerator or disk type there) or it names nothing: then None."""
    for text in error_texts(exc):
        sa = _SA_MISSING.search(text)
        if sa:
            return MissingResource("service account", sa.group("email"), service_account_field)
        found = _NOT_FOUND.search(text)
        if not found:
            continue
        path, kind = found.group("path"), found.group("kind")
        parts = path.split("/")
        if kind == "serviceAccount" or "serviceAccounts" in parts:
            email = re.sub(r"^One of \[(.*)\]$", r"\1", parts[-1])
            return MissingResource("service account", email, service_account_field)
        if "images" in parts or "imageFamilyViews" in parts:
            return MissingResource("image", path, image_field)
        if "subnetworks" in parts:
            return MissingResource("subnetwork", path, "gcp_subnetwork")
        if "networks" in parts:
            return MissingResource("network", path, "gcp_network")
        if ZONAL_KINDS & set(parts) or _ZONE_ONLY.match(path):
            return None  # this zone lacks it; another may not
        if _PROJECT_ONLY.match(path):
            return MissingResource("project", path, "gcp_project")
        return MissingResource("resource", path, None)
    return None


def zone_lacks(exc: BaseException) -> bool:
    """True when `exc` says the zone itself, or a machine, accelerator or disk type in it, was
    not found: another zone of the region may have it."""
    for text in error_texts(exc):
        found = _NOT_FOUND.search(text)
        if found:
            path = found.group("path")
            if ZONAL_KINDS & set(path.split("/")) or _ZONE_ONLY.match(path):
                return True
    return False


_FIXES = {
    "gcp_image": (
        "give an image or image family that exists and the project may read, e.g. "
        "'projects/deeplearning-platform-release/global/images/family/<family>' "
        "(gcloud compute images describe-from-family <family> --project <image project>)"
    ),
    "gcp_coordinator_image": (
        "give an image or image family that exists and the project may read "
        "(gcloud compute images describe-from-family <family> --project <image project>)"
    ),
    "gcp_network": (
        "give a network of the project (gcloud compute networks list); a new project in an "
        "organisation may have no 'default' network"
    ),
    "gcp_subnetwork": "give a subnetwork of the job's region (gcloud compute networks subnets list)",
    "gcp_service_account": (
        "give a service account email of the project (gcloud iam service-accounts list); "
        "'default' is the Compute Engine default service account, which a new project may lack"
    ),
    "controller_identity": ("give a service account email of the project (gcloud iam service-accounts list)"),
    "gcp_project": "give the id of a project with the Compute Engine API enabled",
}


def missing_resource_error(missing: MissingResource, exc: BaseException, where: str) -> ConfigError:
    """The final error: what is missing, the field that names it, how to fix it, and GCE's words."""
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if missing.field is None:
        return ConfigError(
            f"GCP: the {missing.what} {missing.resource!r} was not found (launching in {where}); "
            f"check the Config field that names it. GCE said: {said}"
        )
    return ConfigError(
        f"Config.{missing.field}: the {missing.what} {missing.resource!r} was not found "
        f"(launching in {where}); {_FIXES.get(missing.field, 'give one that exists')}. GCE said: {said}"
    )
