"""A cloud's "your quota is too low" told apart from "no capacity now", and said so it can be fixed.

A new account's GPU spot quota is zero (AWS: every GPU family's spot vCPU quota; Azure: the
regional spot vCPUs; GCP: `GPUS_ALL_REGIONS` and each GPU model's regional quota). The clouds
answer a launch over the quota with an error that reads like a capacity shortage, and a
controller that retries it waits forever. These functions read a launch error and return a
`QuotaError` (spotnb.errors) that names the quota, its current value where the error or an API
gives it, and the console page and command that raise it; None when the error is something
else. They import no SDK: the providers pass the error's code and message (and what they could
look up), so each is tested on the clouds' own words. Style of `gcp_errors`: the final error says
what to fix and quotes the cloud.
"""

from __future__ import annotations

import re

from spotnb.errors import QuotaError

__all__ = [
    "AWS_QUOTA_CODES",
    "AZURE_QUOTA_CODES",
    "aws_spot_quota",
    "aws_quota_error",
    "azure_quota_error",
    "gcp_quota_error",
]

#: EC2 error codes that mean an account limit (the spot vCPU quota, the older instance count
#: limit), never a shortage: `RequestLimitExceeded` (API throttling) is not one of them.
AWS_QUOTA_CODES = frozenset({"MaxSpotInstanceCountExceeded", "VcpuLimitExceeded", "InstanceLimitExceeded"})

#: Service Quotas codes of EC2's spot vCPU quotas, by instance family prefix (longest first).
_AWS_SPOT_QUOTAS: tuple[tuple[str, str, str], ...] = (
    ("trn", "All Trn Spot Instance Requests", "L-5480EFD2"),
    ("inf", "All Inf Spot Instance Requests", "L-B5D1601B"),
    ("dl", "All DL Spot Instance Requests", "L-85EED4F7"),
    ("vt", "All G and VT Spot Instance Requests", "L-3819A6DF"),
    ("g", "All G and VT Spot Instance Requests", "L-3819A6DF"),
    ("p", "All P Spot Instance Requests", "L-7212CCBC"),
    ("f", "All F Spot Instance Requests", "L-88CF9481"),
    ("x", "All X Spot Instance Requests", "L-E3A00192"),
)
_AWS_STANDARD = ("All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests", "L-34B43A08")


def aws_spot_quota(instance_type: str) -> tuple[str, str]:
    """(name, Service Quotas code) of the spot vCPU quota `instance_type` counts against."""
    family = re.match(r"[a-z]+", instance_type.lower())
    prefix = family.group(0) if family else ""
    for start, name, code in _AWS_SPOT_QUOTAS:
        if prefix.startswith(start):
            return name, code
    return _AWS_STANDARD


def _num(value: float | None, unit: str = "") -> str:
    """'is 0 vCPUs', or what is known when the value is not."""
    if value is None:
        return "is at a value the error did not give"
    return f"is {value:g}{unit}"


def aws_quota_error(
    code: str,
    message: str,
    *,
    instance_type: str,
    region: str,
    where: str,
    limit: float | None = None,
    vcpus: int | None = None,
) -> QuotaError | None:
    """The QuotaError of an EC2 launch refused with `code`, or None (not a quota). `limit`: the
    quota's value from Service Quotas, if the provider could read it; `vcpus`: the type's."""
    if code not in AWS_QUOTA_CODES:
        return None
    name, quota_code = aws_spot_quota(instance_type)
    said = re.search(r"(?:vCPU )?limit of (\d+)", message or "")
    if limit is None and said:
        limit = float(said.group(1))
    desired = max(vcpus or 0, int(limit or 0) + (vcpus or 1))
    fix = (
        f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
        f"{quota_code} --region {region} --desired-value {desired}, or the Service Quotas console: "
        f"https://{region}.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/{quota_code} "
        f"(see it now: aws service-quotas get-service-quota --service-code ec2 --quota-code {quota_code} "
        f"--region {region})"
    )
    needs = f"; {instance_type} needs {vcpus} vCPUs" if vcpus else ""
    text = (
        f"AWS quota: {name!r} ({quota_code}) in {region} {_num(limit, ' vCPUs')}{needs}, so EC2 "
        f"refused the spot instance in {where} ({code}: {_first_line(message)}). This is the "
        f"account's quota, not a capacity shortage: no retry can succeed until it is raised. "
        f"Raise it: {fix}"
    )
    return QuotaError(text, cloud="aws", quota=name, region=region, limit=limit, fix=fix)


#: ARM error codes that may be a quota; `OperationNotAllowed` only with a quota message (Azure
#: also answers throttling, HTTP 429, and a disabled subscription with it).
AZURE_QUOTA_CODES = frozenset(
    {"QuotaExceeded", "OperationNotAllowed", "SpotQuotaExceeded", "LowPriorityQuotaExceeded"}
)
_AZ_QUOTA = re.compile(r"exceeding approved (?P<quota>.+?) quota", re.IGNORECASE)
_AZ_FIELD = r"{}\s*:\s*(?P<v>\d+(?:\.\d+)?)"
_AZ_PORTAL = "https://portal.azure.com/#view/Microsoft_Azure_Capacity/QuotaMenuBlade/~/myQuotas"


def _az_field(message: str, label: str) -> float | None:
    found = re.search(_AZ_FIELD.format(re.escape(label)), message, re.IGNORECASE)
    return float(found.group("v")) if found else None


def azure_quota_error(
    code: str,
    message: str,
    *,
    status: int | None,
    location: str,
    subscription: str,
    usage: tuple[float, float] | None = None,
) -> QuotaError | None:
    """The QuotaError of an ARM refusal, or None: throttling (HTTP 429) and an
    `OperationNotAllowed` that names no quota are not quotas. `usage`: (current, limit) of the
    spot vCPUs from the Usage API, when the message gives no value."""
    message = message or ""
    if status == 429 or code not in AZURE_QUOTA_CODES:
        return None
    named = _AZ_QUOTA.search(message)
    if code == "OperationNotAllowed" and not (named or re.search(r"\bquota\b", message, re.IGNORECASE)):
        return None
    quota = named.group("quota").strip() if named else "Total Regional Spot vCPUs (lowPriorityCores)"
    limit = _az_field(message, "Current Limit")
    current = _az_field(message, "Current Usage")
    if limit is None and usage is not None:
        current, limit = usage
    required = _az_field(message, "New Limit Required")
    spot = "lowpriority" in quota.replace(" ", "").replace("-", "").lower() or "spot" in quota.lower()
    resource = "lowPriorityCores" if spot or not named else quota.split()[0]
    scope = f"/subscriptions/{subscription}/providers/Microsoft.Compute/locations/{location}"
    fix = (
        f"the portal's Quotas blade ({_AZ_PORTAL}: Compute, location {location}, "
        f"{'Total Regional Spot vCPUs' if resource == 'lowPriorityCores' else resource}), or "
        f"az quota update --resource-name {resource} --scope {scope} --limit-object "
        f"value={int(required) if required else '<vCPUs>'} --resource-type "
        f"{'lowPriority' if resource == 'lowPriorityCores' else 'dedicated'} "
        f"(see it now: az vm list-usage --location {location} -o table)"
    )
    values = _num(limit, " vCPUs") + (f" ({current:g} in use)" if current is not None else "")
    need = f", {required:g} needed" if required is not None else ""
    text = (
        f"Azure quota: {quota!r} in {location} {values}{need}, so Azure refused the spot VM "
        f"({code}: {_first_line(message)}). This is the subscription's quota, not a capacity "
        f"shortage: no retry can succeed until it is raised. Raise it: {fix}"
    )
    return QuotaError(text, cloud="azure", quota=quota, region=location, limit=limit, fix=fix)


#: GCE's resource quota error ("Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region
#: us-central1."); an API rate limit ("Quota exceeded for quota metric 'Queries'") is not one.
_GCP_QUOTA = re.compile(
    r"Quota '(?P<quota>[A-Z0-9_]+)' exceeded(?:\.\s*Limit:\s*(?P<limit>[\d.]+)"
    r"(?:\s+in region (?P<region>[a-z0-9-]+)|\s+(?P<globally>globally))?)?"
)


def gcp_quota_error(
    texts: list[str], *, project: str, region: str, codes: tuple[str, ...] = ()
) -> QuotaError | None:
    """The QuotaError in a GCE error's messages (`gcp.errors.error_texts`), or None. `codes`: the
    error items' codes and reasons: QUOTA_EXCEEDED / quotaExceeded with a message that names no
    quota is still one (of the region: GCE's words quoted)."""
    for text in texts:
        found = _GCP_QUOTA.search(text or "")
        if not found:
            continue
        quota = found.group("quota")
        limit = float(found.group("limit")) if found.group("limit") else None
        where = found.group("region") or region
        globally = bool(found.group("globally")) or quota.endswith("ALL_REGIONS")
        see = (
            f"gcloud compute project-info describe --project {project} "
            f"--flatten=quotas --filter=quotas.metric={quota}"
            if globally
            else f"gcloud compute regions describe {where} --project {project} "
            f"--flatten=quotas --filter=quotas.metric={quota}"
        )
        fix = (
            f"the console's quotas page, https://console.cloud.google.com/iam-admin/quotas?project={project} "
            f"(filter: {quota}{'' if globally else f', region {where}'}; 'Edit quotas'); see it now: {see}"
        )
        place = "in every region (a project-wide quota)" if globally else f"in {where}"
        text_out = (
            f"GCP quota: {quota} {place} {_num(limit)}, so Compute Engine refused the spot VM "
            f"(it said: {_first_line(text)}). This is the project's quota, not a capacity "
            f"shortage: no retry can succeed until it is raised. Raise it: {fix}"
        )
        return QuotaError(
            text_out,
            cloud="gcp",
            quota=quota,
            region=None if globally else where,
            limit=limit,
            scope="global" if globally else "region",
            fix=fix,
        )
    if {"QUOTA_EXCEEDED", "quotaExceeded"} & set(codes) or any("QUOTA_EXCEEDED" in (t or "") for t in texts):
        fix = (
            f"find it on the console's quotas page, https://console.cloud.google.com/iam-admin/quotas"
            f"?project={project} (region {region}), or: gcloud compute regions describe {region} "
            f"--project {project} --flatten=quotas"
        )
        said = next((t for t in texts if (t or "").strip()), "")
        text_out = (
            f"GCP quota: Compute Engine refused the spot VM in {region} for a quota it did not name "
            f"(QUOTA_EXCEEDED: {_first_line(said)}). This is the project's quota, not a capacity "
            f"shortage: no retry can succeed until it is raised. Raise it: {fix}"
        )
        return QuotaError(text_out, cloud="gcp", quota="QUOTA_EXCEEDED", region=region, fix=fix)
    return None


def _first_line(message: str) -> str:
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else "no message"
    return line if len(line) <= 400 else line[:400] + "…"
