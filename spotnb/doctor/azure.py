"""`spotnb doctor --provider azure`: the Azure checks (see `spotnb.doctor.report`).

The credential is the one `DefaultAzureCredential` would pick here, made alone so the report can
name it (a service principal or workload identity in the environment, a managed identity, the
Azure CLI's `az login`). Every client has a 3 s connect and 5 s read timeout and no retry
(`retry_total=0`). What is asked: a token for Azure Resource Manager and the subscription
(credentials), the subscription's locations (region), `virtual_machine_sizes.list` (instance
type), `usage.list`'s `lowPriorityCores` (spot vCPUs: one regional quota for every VM series),
the managed identity and its role assignments on the storage account (identity), the Marketplace
image or image id (image), and the provider's own Retail Prices fetch (prices).
"""

from __future__ import annotations

import difflib
import os
from typing import TYPE_CHECKING, Any

from spotnb.doctor.checks import (
    CONNECT_TIMEOUT,
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

__all__ = ["checks", "BLOB_WRITER_ROLES", "credential_source"]

ARM = "https://management.azure.com"
ARM_SCOPE = "https://management.azure.com/.default"
#: role definition ids (the same in every subscription) that may write blobs
BLOB_WRITER_ROLES = {
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
}
_IDENTITY_API = "2023-01-31"
_IMAGE_API = "2023-07-03"
_SUBSCRIPTION_API = "2022-12-01"
_ROLES_API = "2022-04-01"


def credential_source(env: Any = None) -> str | None:
    """Which credential `DefaultAzureCredential` would use here, found without a network call
    (the provider's `has_credentials` order), or None."""
    env = os.environ if env is None else env
    if env.get("AZURE_CLIENT_ID") and env.get("AZURE_TENANT_ID"):
        if env.get("AZURE_CLIENT_SECRET") or env.get("AZURE_CLIENT_CERTIFICATE_PATH"):
            return "service principal"
        if env.get("AZURE_FEDERATED_TOKEN_FILE"):
            return "workload identity"
    if env.get("IDENTITY_ENDPOINT") or env.get("MSI_ENDPOINT"):
        return "managed identity"
    home = env.get("AZURE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".azure")
    if any(os.path.isfile(os.path.join(home, n)) for n in ("msal_token_cache.json", "msal_token_cache.bin")):
        return "az login"
    return None


_SOURCE_WORDS = {
    "service principal": "a service principal in the environment ($AZURE_CLIENT_ID, $AZURE_TENANT_ID, "
    "$AZURE_CLIENT_SECRET or a certificate)",
    "workload identity": "workload identity ($AZURE_FEDERATED_TOKEN_FILE)",
    "managed identity": "this machine's managed identity",
    "az login": "the Azure CLI's login (az login)",
}


def _make_credential(source: str, transport: Any) -> Any:
    from azure.identity import (
        AzureCliCredential,
        EnvironmentCredential,
        ManagedIdentityCredential,
        WorkloadIdentityCredential,
    )

    kw: dict[str, Any] = {
        "connection_timeout": CONNECT_TIMEOUT,
        "read_timeout": READ_TIMEOUT,
        "retry_total": 0,
    }
    if transport is not None:
        kw["transport"] = transport
    authority = os.environ.get("AZURE_AUTHORITY_HOST")
    if authority and source in ("service principal", "workload identity"):
        # a sovereign cloud's (or a test's) authority: msal would validate it against the public
        # cloud's instance discovery first
        kw.update(authority=authority, disable_instance_discovery=True)
    if source == "service principal":
        return EnvironmentCredential(**kw)
    if source == "workload identity":
        return WorkloadIdentityCredential(**kw)
    if source == "managed identity":
        return ManagedIdentityCredential(client_id=os.environ.get("AZURE_CLIENT_ID"), **kw)
    return AzureCliCredential(process_timeout=int(READ_TIMEOUT * 2))


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)


def _error_code(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    return str(getattr(error, "code", "") or "")


def checks(
    config: Config,
    provider_cls: Any,
    transport: Any = None,
    arm_endpoint: str | None = None,
    **_: Any,
) -> list[Check]:
    """The Azure checks for `config`. `transport`: an azure-core transport for every request
    (tests); `arm_endpoint`: Azure Resource Manager's URL (a sovereign cloud's, a test's)."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
    )
    from azure.core.rest import HttpRequest

    base_url = arm_endpoint or os.environ.get("SPOTNB_AZURE_ARM_ENDPOINT") or ARM
    state: dict[str, Any] = {}
    provider = provider_cls(config)
    sub = config.azure_subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
    regions = config.candidate_regions()
    location = config.region or (next((r for r in regions if r), None) if isinstance(regions, list) else None)
    itype = (
        config.instance_type
        if isinstance(config.instance_type, str)
        else config.instance_type.get("azure", "")
    )
    store_url = config.store_url()
    on_blob = store_url.startswith(("az://", "abfs://", "abfss://"))

    def client_kw() -> dict[str, Any]:
        kw: dict[str, Any] = {
            "base_url": base_url,
            "connection_timeout": CONNECT_TIMEOUT,
            "read_timeout": READ_TIMEOUT,
            "retry_total": 0,
        }
        if transport is not None:
            kw["transport"] = transport
        return kw

    def resources() -> Any:
        from azure.mgmt.resource.resources import ResourceManagementClient

        return ResourceManagementClient(state["credential"], str(sub), **client_kw())

    def compute() -> Any:
        from azure.mgmt.compute import ComputeManagementClient

        return ComputeManagementClient(state["credential"], str(sub), **client_kw())

    def get(path: str) -> Any:
        """GET an ARM path through the SDK's pipeline; the response (status, json())."""
        return resources().send_request(HttpRequest("GET", path))

    def credentials(_: dict[str, Result]) -> Result:
        source = credential_source()
        if source is None:
            return fail("no Azure credentials found", provider_cls.credentials_hint)
        words = _SOURCE_WORDS[source]
        try:
            credential = _make_credential(source, transport)
            credential.get_token(ARM_SCOPE)
        except ClientAuthenticationError as exc:
            if is_unreachable(exc):
                return unexpected("azure", exc)
            return fail(
                f"Azure refused the credentials of {words}: {brief(exc, 240)}",
                "az login again, or renew the service principal's secret (az ad sp credential reset)",
            )
        except Exception as exc:  # noqa: BLE001 - CredentialUnavailableError and the network's
            if is_unreachable(exc):
                return unexpected("azure", exc)
            return fail(f"no token from {words}: {brief(exc, 240)}", provider_cls.credentials_hint)
        state["credential"] = credential
        if not sub:
            return fail(
                f"{words} works, but no subscription is given",
                "set Config.azure_subscription_id or $AZURE_SUBSCRIPTION_ID (az account show --query id)",
            )
        resp = get(f"/subscriptions/{sub}?api-version={_SUBSCRIPTION_API}")
        if resp.status_code in (401, 403, 404):
            return fail(
                f"{words} cannot use subscription {sub} (HTTP {resp.status_code}: {_arm_message(resp)})",
                "check the subscription id (az account list -o table), and that this identity has a "
                "role on it "
                "(Contributor, to create VMs)",
            )
        if resp.status_code != 200:
            return unknown(
                f"Azure answered HTTP {resp.status_code} for subscription {sub}: {_arm_message(resp)}"
            )
        body = resp.json()
        name, status = body.get("displayName", sub), body.get("state", "Enabled")
        if status not in ("Enabled", "Warned"):
            return fail(
                f"subscription {name!r} ({sub}) is {status}", "enable it in the portal (Subscriptions)"
            )
        return ok(f"{words}: subscription {name!r} ({sub})")

    def region(_: dict[str, Result]) -> Result:
        if not location:
            return fail("no location given", "set Config.region to an Azure location such as 'eastus'")
        resp = get(f"/subscriptions/{sub}/locations?api-version={_SUBSCRIPTION_API}")
        if resp.status_code != 200:
            return unknown(f"Azure answered HTTP {resp.status_code} for the locations: {_arm_message(resp)}")
        names = [str(x["name"]) for x in resp.json()["value"]]
        if location not in names:
            close = difflib.get_close_matches(location, names, n=2, cutoff=0.6)
            return fail(
                f"{location!r} is not an Azure location of this subscription",
                (f"did you mean {' or '.join(close)}? " if close else "")
                + "az account list-locations -o table",
            )
        return ok(f"{location}")

    def instance_type(_: dict[str, Result]) -> Result:
        sizes = {s.name.lower(): s for s in compute().virtual_machine_sizes.list(location)}
        size = sizes.get(itype.lower())
        if size is None:
            names = [s.name for s in sizes.values()]
            close = difflib.get_close_matches(itype, names, n=2, cutoff=0.7)
            return fail(
                f"{location} has no VM size {itype!r}",
                (f"did you mean {' or '.join(close)}? " if close else "")
                + f"az vm list-sizes -l {location} -o table",
            )
        return ok(
            f"{size.name}: {size.number_of_cores} vCPUs, offered in {location}",
            vcpus=int(size.number_of_cores),
        )

    def quota(inputs: dict[str, Result]) -> Result:
        need = int(inputs["instance type"].data["vcpus"]) * config.instances
        try:
            usage = next(
                (
                    u
                    for u in compute().usage.list(location)
                    if getattr(u.name, "value", "") == "lowPriorityCores"
                ),
                None,
            )
        except HttpResponseError as exc:
            if _status(exc) in (401, 403):
                return unknown(f"may not read the usage of {location} ({_error_code(exc) or _status(exc)})")
            raise
        if usage is None:
            return unknown(f"the usage of {location} lists no spot vCPUs (lowPriorityCores)")
        limit, used = float(usage.limit), float(usage.current_value)
        many = f"{config.instances} × " if config.instances > 1 else ""
        if limit - used < need:
            return fail(
                f"'Total Regional Spot vCPUs' (lowPriorityCores) in {location}: {used:g} of {limit:g} "
                "in use; "
                f"{many}{itype} needs {need}",
                _quota_fix(str(location), sub, need),
            )
        return ok(
            f"'Total Regional Spot vCPUs' in {location}: {used:g} of {limit:g} in use, {many}{itype} "
            f"needs {need}"
        )

    def store(_: dict[str, Result]) -> Result:
        return store_check(config)

    def identity(_: dict[str, Result]) -> Result:
        ident = config.azure_identity_id
        if not ident:
            return fail(
                "Config.azure_identity_id is not set: the VM would have no identity to reach the store",
                "az identity create -g <group> -n spotnb-vm; give its id (az identity show ... --query id)",
            )
        try:
            found = resources().resources.get_by_id(ident, api_version=_IDENTITY_API)
        except ResourceNotFoundError:
            return fail(
                f"no managed identity {ident}", "az identity create -g <group> -n <name>, and give its id"
            )
        except HttpResponseError as exc:
            if _status(exc) == 400:  # not a resource id at all
                return fail(
                    f"Config.azure_identity_id is not a resource id: {brief(exc, 200)}",
                    "give the id az identity show prints",
                )
            raise
        principal = (found.properties or {}).get("principalId")
        name = ident.rstrip("/").rsplit("/", 1)[-1]
        if not on_blob:
            return unknown(
                f"identity {name!r} exists; the store is not Azure Blob ({store_url}): not checked "
                "whether it may write it"
            )
        account = provider.storage_account()
        if not account:
            return unknown(f"identity {name!r} exists; no storage account named: not checked")
        listed = list(
            resources().resources.list(
                filter=f"resourceType eq 'Microsoft.Storage/storageAccounts' and name eq '{account}'"
            )
        )
        if not listed:
            return unknown(
                f"identity {name!r} exists; storage account {account!r} is not in subscription {sub}: "
                "not checked"
            )
        account_id = str(listed[0].id)
        container = bucket_of(store_url)[0]
        target = f"{account_id}/blobServices/default/containers/{container}".lower()
        resp = get(
            f"{account_id}/providers/Microsoft.Authorization/roleAssignments?api-version={_ROLES_API}"
            f"&$filter=assignedTo('{principal}')"
        )
        if resp.status_code in (401, 403):
            return unknown(
                f"identity {name!r} exists; may not read the role assignments of {account!r}: not checked",
                "allow Microsoft.Authorization/roleAssignments/read (Reader on the account)",
            )
        if resp.status_code != 200:
            return unknown(
                f"Azure answered HTTP {resp.status_code} for the role assignments: {_arm_message(resp)}"
            )
        granted = [
            BLOB_WRITER_ROLES[rid]
            for a in resp.json().get("value", [])
            for props in [a.get("properties") or {}]
            for rid in [str(props.get("roleDefinitionId", "")).rstrip("/").rsplit("/", 1)[-1]]
            if rid in BLOB_WRITER_ROLES and target.startswith(str(props.get("scope", "")).lower().rstrip("/"))
        ]
        scope = (
            "role assignments to the identity itself; not checked: groups, custom roles, conditions, "
            "the account's firewall"
        )
        if not granted:
            return fail(
                f"identity {name!r} has no Storage Blob Data Contributor or Owner on "
                f"{account}/{container} ({scope})",
                "az role assignment create --role 'Storage Blob Data Contributor' --assignee-object-id "
                f"{principal} "
                f"--assignee-principal-type ServicePrincipal --scope {account_id}",
            )
        return ok(f"identity {name!r} has {granted[0]} on {account}/{container} ({scope})")

    def image(_: dict[str, Result]) -> Result:
        from spotnb.providers.azure.provider import DEFAULT_IMAGE

        ref = config.azure_image or DEFAULT_IMAGE
        if ref.startswith("/"):
            try:
                resources().resources.get_by_id(ref, api_version=_IMAGE_API)
            except ResourceNotFoundError:
                return fail(
                    f"no image {ref}", "check Config.azure_image (az image list / az sig image-version list)"
                )
            return ok(f"{ref}")
        parts = ref.split(":")
        if len(parts) != 4:
            return fail(
                f"Config.azure_image {ref!r} is not 'publisher:offer:sku:version'", "az vm image list --all"
            )
        publisher, offer, sku, version = parts
        vm_images = compute().virtual_machine_images
        where = f"--publisher {publisher} --offer {offer} --sku {sku} --location {location} --all"
        try:
            if version == "latest":
                found = vm_images.list(location, publisher, offer, sku, top=1, orderby="name desc")
                if not found:
                    raise ResourceNotFoundError("no version")
                version = f"latest = {found[0].name}"
            else:
                vm_images.get(location, publisher, offer, sku, version)
        except ResourceNotFoundError:
            default = "" if config.azure_image else " (spotnb's default)"
            return fail(
                f"no image {ref}{default} in {location}",
                f"set Config.azure_image to an image with CUDA and torch (az vm image list {where})",
            )
        return ok(f"{publisher}:{offer}:{sku} ({version}) in {location}")

    def prices(_: dict[str, Result]) -> Result:
        if not location:
            return unknown("no location given: not checked")
        return price_result("azure", provider, itype, location, live_word="Retail Prices API")

    return [
        Check("credentials", credentials, (), "azure"),
        Check("region", region, ("credentials",), "azure"),
        Check("instance type", instance_type, ("region",), "azure"),
        Check("spot quota", quota, ("instance type",), "azure"),
        Check("store", store, (), "azure"),
        Check("identity", identity, ("credentials",), "azure"),
        Check("image", image, ("region",), "azure"),
        Check("prices", prices, (), "azure"),
    ]


def _arm_message(resp: Any) -> str:
    try:
        error = resp.json().get("error") or {}
        return f"{error.get('code', '')}: {error.get('message', '')}".strip(": ")[:240]
    except Exception:  # noqa: BLE001 - not JSON
        return (resp.text() if callable(getattr(resp, "text", None)) else "")[:120] or "no message"


def _quota_fix(location: str, subscription: str | None, need: int) -> str:
    scope = f"/subscriptions/{subscription}/providers/Microsoft.Compute/locations/{location}"
    return (
        "the portal's Quotas blade "
        "(https://portal.azure.com/#view/Microsoft_Azure_Capacity/QuotaMenuBlade/~/myQuotas: "
        f"Compute, {location}, 'Total Regional Spot vCPUs'), or az quota update --resource-name "
        "lowPriorityCores "
        f"--scope {scope} --limit-object value={need} --resource-type lowPriority"
    )
