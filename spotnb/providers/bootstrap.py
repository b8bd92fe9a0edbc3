"""The one script that turns a fresh cloud VM into a spotnb instance, and its per-cloud wrappers.

Why one generator: the three clouds differ only in how a boot script reaches the VM (EC2
`UserData`, Azure cloud-init `custom_data`, GCE `startup-script` metadata); what the script
does must be identical so a job behaves the same everywhere:

1. find a Python: the first of `PYTHON_CANDIDATES` that imports torch (the Deep Learning
   images ship one with CUDA torch), make a venv on top of it that sees the image's packages
   (`--system-site-packages`, plus a .pth to the image's own venv where it is one, as on the
   Deep Learning AMI) and pip-install spotnb plus the job's requirements; torch only when the
   image has none within `TORCH_SPEC`. spotnb is the notebook's own (`Config.spotnb_source="store"`): the wheel
   `spotnb.providers.shipping` put in the store, read with the VM's identity by `code_fetch` (its text is
   in the script) and refused unless its size and sha256 are the ones this script carries;
   or, with "index" or a pip spec, what pip finds for it (skipped when the Python already has
   this spotnb version; with a wheel, only when SPOTNB_PYTHON names that Python);
2. report a `bootstrap` event (VM uptime at script start, install seconds) into the store;
3. run `python -m spotnb.runtime.agent --store URL --job ID --incarnation N`;
4. report the agent's exit and power the VM off, so a finished VM stops billing even when no
   notebook is watching (EC2 is launched with shutdown behaviour `terminate`).

The VM needs no inbound port: everything flows through the store. The script holds no cloud
credential: the VM reaches the store with its own identity (instance profile, managed
identity, service account), and `spec.env` is checked. It does carry the job's HMAC key
(`SPOTNB_JOB_KEY`, see spotnb.core.signing), the one secret an instance needs to verify what it
runs; the script never echoes it (no `set -x`), the agent drops it from its environment, and
a dry run shows a placeholder instead. The job runs in `SPOTNB_WORKDIR` (default
/opt/spotnb/work), where the agent lays out the job's shipped files.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import shlex
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from spotnb.core.signing import KEY_ENV
from spotnb.providers.base import LaunchSpec
from spotnb.providers.shipping import pinned, store_extra
from spotnb.settings.base import COORDINATOR_IDLE_MINUTES, LIGHTHOUSE_PORT

if TYPE_CHECKING:
    from spotnb.settings.config import Config

KEY_PLACEHOLDER = "<the job key, added at launch>"
#: What `pip install spotnb[elastic]` adds, if spotnb's own metadata cannot be read (a source
#: checkout without an install); the pin is stated in pyproject.toml.
_ELASTIC_FALLBACK = ("torchft-nightly==2026.10.26",)

__all__ = [
    "bootstrap_script",
    "aws_user_data",
    "azure_custom_data",
    "gcp_startup_script",
    "coordinator_script",
    "azure_cloud_config",
    "azure_end_vm",
    "controller_script",
    "coordinator_install_specs",
    "elastic_requirements",
    "LIGHTHOUSE_PORT",
    "store_extra",
    "install_specs",
    "SecretInBootstrap",
    "PYTHON_CANDIDATES",
    "require_remote_store",
]

# Where the clouds' deep-learning images keep their Python with CUDA torch (AWS's Deep Learning
# AMI: the venv /opt/pytorch; GCP's Deep Learning VM: /opt/conda; Azure's Data Science VM:
# /anaconda), then the system one. The first that imports torch is used (`_INSTALL`).
PYTHON_CANDIDATES = (
    "/opt/pytorch/bin/python",
    "/opt/conda/bin/python",
    "/anaconda/envs/py310_default/bin/python",
    "/anaconda/bin/python",
    "/usr/bin/python3",
    "python3",
)
#: what a boot script installs when no Python of the image has a torch within it (spotnb's bound)
TORCH_SPEC = "torch>=2.1,<=2.14.1"
_TORCH_OK = (  # whether the torch `$PY` imports is within TORCH_SPEC (major.minor: local builds pass)
    "import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); "
    "sys.exit(not (2, 1) <= v <= (2, 14))"
)

# Names that must never be shipped in a boot script (they would land in the cloud's instance
# metadata, readable by anything on the VM and by whoever can describe the instance).
_SECRET_NAME = re.compile(
    r"(SECRET|PASSWORD|TOKEN|CREDENTIAL|ACCESS_KEY|CONNECTION_STRING|"
    r"ACCOUNT_KEY|SAS|PRIVATE_KEY)",
    re.I,
)


class SecretInBootstrap(ValueError):
    """An environment variable that looks like a credential was about to enter a boot script."""


def install_specs(spec: LaunchSpec) -> list[str]:
    """pip specs for the VM: the same spotnb version (with the store's extra) and the job's
    requirements. A requirement naming spotnb itself (a wheel URL, `spotnb @ git+...`) replaces
    the pinned release, which is how an unreleased checkout is shipped."""
    reqs = list(spec.requirements)
    own = [r for r in reqs if re.match(r"^\s*spotnb\b", r)]
    if own:
        return reqs
    extra = store_extra(spec.store_url)
    name = f"spotnb[{extra}]" if extra else "spotnb"
    pinned = f"{name}=={spec.spotnb_version}" if spec.spotnb_version else name
    return [pinned, *reqs]


def _check_env(env: dict[str, str]) -> None:
    for key in env:
        if _SECRET_NAME.search(key):
            raise SecretInBootstrap(
                f"LaunchSpec.env[{key!r}] looks like a credential; spotnb never puts credentials "
                "in a boot script. Give the VM an identity (instance profile, managed identity, "
                "service account) that can reach the store instead."
            )


def _exports(pairs: Iterable[tuple[str, str]]) -> str:
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in pairs)


# Finds a Python and, unless it already has this spotnb version, installs it in a venv on top
# (the image's torch is reused). Shared by the instance's and the coordinator's boot scripts, so
# both install spotnb the same way. Needs SPOTNB_VERSION and SPOTNB_REQUIREMENTS (the job's own:
# when there are any, the install always runs); {install} is the fragment `_install` makes.
_INSTALL = r"""PY=${{SPOTNB_PYTHON:-}}
SPOTNB_HAS_TORCH=0
if [ -z "$PY" ]; then
  # the first Python of the image that has torch (its CUDA build); else the first Python found
  for c in {pythons}; do
    if command -v "$c" >/dev/null 2>&1; then
      [ -n "$PY" ] || PY=$(command -v "$c")
      if "$c" -c "import torch" >/dev/null 2>&1; then PY=$(command -v "$c"); SPOTNB_HAS_TORCH=1; break; fi
    fi
  done
elif "$PY" -c "import torch" >/dev/null 2>&1; then
  SPOTNB_HAS_TORCH=1
fi
if [ -z "$PY" ]; then echo "spotnb bootstrap: no python found"; ${{SPOTNB_POWEROFF_CMD:-shutdown -h now}}; exit 1; fi
if [ "$SPOTNB_HAS_TORCH" = 1 ]; then
  echo "spotnb bootstrap: $PY, the image's torch $("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null)"
else
  echo "spotnb bootstrap: $PY (no Python of the image imports torch)"
fi

SPOTNB_INSTALLED=0
{install}
SPOTNB_T1=$(date +%s.%N)
"""

# The job's shipped wheel (`spotnb.providers.shipping`): fetched with the VM's identity and checked against
# SPOTNB_WHEEL_SIZE and _SHA256 before anything is installed (a refused wheel powers the VM off),
# then installed with its dependencies pinned to the notebook's versions.
_WHEEL_FETCH = r"""  SPOTNB_WHEEL_FILE=$(mktemp -d /tmp/spotnb-code-XXXXXX)/spotnb-$SPOTNB_VERSION-py3-none-any.whl
  if ! "$PY" - "$SPOTNB_WHEEL_FILE" <<'SPOTNB_FETCH'
{fetcher}
SPOTNB_FETCH
  then
    echo "spotnb bootstrap: the job's spotnb wheel is refused or unreadable; powering off"
    ${{SPOTNB_POWEROFF_CMD:-shutdown -h now}}; exit 1
  fi
"""
_WHEEL_PIP = r"""  # the wheel first (it replaces a spotnb of the same version), then its pinned dependencies
  "$PY" -m pip install --quiet --force-reinstall --no-deps "$SPOTNB_WHEEL_FILE" \
    && "$PY" -m pip install --quiet "$SPOTNB_WHEEL_FILE$SPOTNB_WHEEL_EXTRAS" {specs} || SPOTNB_PIP_OK=0
"""
_PIP = r"""  "$PY" -m pip install --quiet {specs} || SPOTNB_PIP_OK=0
"""
_INSTALL_STEP = r"""if {needed}; then
{fetch}  VENV=${{SPOTNB_VENV:-/opt/spotnb-venv}}
  if "$PY" -m venv --system-site-packages "$VENV"; then
    # The image's Python may itself be a venv (the Deep Learning AMI's /opt/pytorch): a venv
    # made from it sees its base interpreter's packages, not the image venv's, so its torch
    # would be missing and pip would download another. A .pth file adds the image venv's
    # site-packages after the new venv's own (spotnb's pins still win).
    SPOTNB_PTH=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/spotnb-image.pth
    "$PY" -c 'import site, sys; sys.prefix != sys.base_prefix and print(*site.getsitepackages(), sep=chr(10))' >"$SPOTNB_PTH"
    PY="$VENV/bin/python"
  else
    # no venv module (Ubuntu without python3-venv): a folder of its own on PYTHONPATH instead
    echo "spotnb bootstrap: $PY cannot make a venv; installing into $VENV/site"
    export PIP_TARGET="$VENV/site" PYTHONPATH="$VENV/site${{PYTHONPATH:+:$PYTHONPATH}}"
    mkdir -p "$PIP_TARGET"
  fi
  SPOTNB_PIP_OK=1
  # the torch this Python now sees (the image's, through the venv): kept when spotnb accepts it
  if ! "$PY" -c "{torch_ok}" >/dev/null 2>&1; then
    echo "spotnb bootstrap: no torch spotnb accepts on this image: installing {torch}"
    "$PY" -m pip install --quiet "${{SPOTNB_TORCH_SPEC:-{torch}}}" || SPOTNB_PIP_OK=0
  fi
  # shellcheck disable=SC2086
{pip}  if [ "$SPOTNB_PIP_OK" -ne 1 ]; then
    echo "spotnb bootstrap: pip install failed"; ${{SPOTNB_POWEROFF_CMD:-shutdown -h now}}; exit 1
  fi
  SPOTNB_INSTALLED=1
fi"""


def _install(check: str, specs: Iterable[str], wheel: bool) -> str:
    """The install step: pip `specs` unless `$PY` passes `check` (has this spotnb), or with
    `wheel` the job's shipped wheel first, always, unless SPOTNB_PYTHON names a Python that
    passes `check` (the test suite, a prepared image)."""
    quoted = " ".join(shlex.quote(s) for s in specs)
    has = f'"$PY" -c "{check}" 2>/dev/null'
    if wheel:
        needed = f'[ -n "$SPOTNB_REQUIREMENTS" ] || [ -z "${{SPOTNB_PYTHON:-}}" ] || ! {has}'
        fetch, pip = _WHEEL_FETCH.format(fetcher=_fetcher()), _WHEEL_PIP.format(specs=quoted)
    else:
        needed = f'[ -n "$SPOTNB_REQUIREMENTS" ] || ! {has}'
        fetch, pip = "", _PIP.format(specs=quoted)
    return _INSTALL_STEP.format(needed=needed, fetch=fetch, pip=pip, torch=TORCH_SPEC, torch_ok=_TORCH_OK)


_TEMPLATE = (
    r"""#!/bin/bash
# spotnb bootstrap for job {job} incarnation {inc} on {cloud} (spotnb {version}).
# Generated by spotnb.providers.bootstrap. It holds no credential: the VM reaches the store
# with its own identity; SPOTNB_JOB_KEY only lets the agent verify the job (never echo it).
# Override SPOTNB_PYTHON / SPOTNB_VENV / SPOTNB_LOG / SPOTNB_POWEROFF_CMD / SPOTNB_WORKDIR /
# SPOTNB_TORCH_SPEC (the torch installed when no Python of the image has one)
# in the environment to run it elsewhere (the test suite runs it on the CI machine).
set -uo pipefail
SPOTNB_T0=$(date +%s.%N)
SPOTNB_UPTIME=$(cut -d' ' -f1 /proc/uptime 2>/dev/null || echo 0)
{exports}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
export SPOTNB_WORKDIR=${{SPOTNB_WORKDIR:-/opt/spotnb/work}}
mkdir -p "$SPOTNB_WORKDIR" 2>/dev/null || SPOTNB_WORKDIR=$(mktemp -d -t spotnb-work-XXXXXX)
chmod 700 "$SPOTNB_WORKDIR"
SPOTNB_LOG=${{SPOTNB_LOG:-/var/log/spotnb-bootstrap.log}}
exec >>"$SPOTNB_LOG" 2>&1
echo "spotnb bootstrap: start $(date -u +%FT%TZ)"

"""
    + _INSTALL
    + r"""
spotnb_report() {{  # kind, JSON fields: one event into the job's log in the store
  SPOTNB_EVENT_KIND="$1" SPOTNB_EVENT_FIELDS="$2" "$PY" - <<'PYEOF' || echo "spotnb bootstrap: could not report $1"
import json, os
from spotnb.core.events import EventWriter
from spotnb.core.protocol import from_json
from spotnb.core.store import Store
store = Store(os.environ["SPOTNB_STORE"])
w = EventWriter(store, os.environ["SPOTNB_JOB"], int(os.environ["SPOTNB_INCARNATION"]), "boot")
w.emit(from_json({{**json.loads(os.environ["SPOTNB_EVENT_FIELDS"]), "kind": os.environ["SPOTNB_EVENT_KIND"]}}))
w.flush()
PYEOF
}}

SPOTNB_INSTALL_S=$(awk "BEGIN {{print $SPOTNB_T1 - $SPOTNB_T0}}")
spotnb_report bootstrap "{{\"phase\": \"installed\", \"cloud\": \"{cloud}\", \"boot_s\": $SPOTNB_UPTIME, \"install_s\": $SPOTNB_INSTALL_S, \"installed\": $SPOTNB_INSTALLED}}"

{command}
SPOTNB_CODE=$?
echo "spotnb bootstrap: agent exited with $SPOTNB_CODE"
spotnb_report bootstrap "{{\"phase\": \"agent_exited\", \"cloud\": \"{cloud}\", \"code\": $SPOTNB_CODE}}"
${{SPOTNB_POWEROFF_CMD:-shutdown -h now}}
"""
)


def bootstrap_script(spec: LaunchSpec, cloud: str) -> str:
    """The boot script for one incarnation (bash; identical on every cloud but for `cloud`)."""
    _check_env(spec.env)
    if not spec.spotnb_version:  # the notebook side's own version is the one to reproduce
        from spotnb import __version__

        spec = dataclasses.replace(spec, spotnb_version=__version__)
    if not spec.command or spec.command[0] != "python":
        raise ValueError(f"LaunchSpec.command must start with 'python', got {spec.command!r}")
    code = spec.code
    specs = list(spec.requirements) if code is not None else install_specs(spec)
    extra_reqs = list(spec.requirements)
    env = [
        ("SPOTNB_JOB", spec.job_id),
        ("SPOTNB_INCARNATION", str(spec.incarnation)),
        ("SPOTNB_STORE", spec.store_url),
        ("SPOTNB_VERSION", code.version if code is not None else spec.spotnb_version),
        ("SPOTNB_REQUIREMENTS", " ".join(extra_reqs)),
        *_code_env(code),
        (KEY_ENV, spec.job_key or KEY_PLACEHOLDER),
        *sorted(spec.env.items()),
    ]
    command = '"$PY" ' + " ".join(shlex.quote(c) for c in spec.command[1:])
    return _TEMPLATE.format(
        job=spec.job_id,
        inc=spec.incarnation,
        cloud=cloud,
        version=spec.spotnb_version or "unpinned",
        exports=_exports(env),
        pythons=" ".join(PYTHON_CANDIDATES),
        torch=TORCH_SPEC,
        install=_install(_version_check("spotnb"), specs, code is not None),
        command=command,
    )


def _version_check(imports: str) -> str:
    """The Python one-liner that says whether `$PY` already has this spotnb (and `imports`)."""
    return f"import sys, {imports}; sys.exit(spotnb.__version__ != '$SPOTNB_VERSION')"


def _code_env(code: Any) -> list[tuple[str, str]]:
    """The boot script's variables of the job's shipped spotnb (`spotnb.providers.shipping.CodeRef`): where
    the wheel is in the store, its size and sha256 (what the VM checks), the extras to install."""
    if code is None:
        return []
    return [
        ("SPOTNB_WHEEL_URL", code.url),
        ("SPOTNB_WHEEL_SHA256", code.sha256),
        ("SPOTNB_WHEEL_SIZE", str(code.size)),
        ("SPOTNB_WHEEL_EXTRAS", f"[{','.join(code.extras)}]" if code.extras else ""),
    ]


def _embedded(path: str, delimiter: str) -> str:
    """A module of this package without its docstring, comment lines and blank lines (EC2's user
    data holds 16 KB), as the body of a quoted here-document ending at `delimiter`. Plain text
    work, not `ast` (whose C state is not thread-safe on 3.11: launches run in threads)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / path).read_text()
    if text.startswith('"""'):
        text = text[text.index('"""', 3) + 3 :]
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if any(line.strip() == delimiter for line in lines):
        raise ValueError(f"{path} contains the line {delimiter!r}, which would end its here-document")
    return "\n".join(lines)


def _fetcher() -> str:
    """spotnb.providers.code_fetch's text, which the boot script runs before spotnb is installed."""
    return _embedded("providers/code_fetch.py", "SPOTNB_FETCH")


def aws_user_data(spec: LaunchSpec) -> str:
    """EC2 `UserData`: cloud-init runs a `#!` script once per instance (boto3 base64s it)."""
    script = bootstrap_script(spec, "aws")
    if len(script.encode()) > 16 * 1024:
        raise ValueError("EC2 UserData is limited to 16 KB; trim the job's requirements")
    return script


def azure_custom_data(spec: LaunchSpec) -> str:
    """Azure `os_profile.custom_data`: a base64 cloud-config that writes the script and runs it."""
    return azure_cloud_config(bootstrap_script(spec, "azure"))


# An Azure VM powered off from inside is Stopped but still allocated: billed for its compute
# until something deallocates or deletes it. On Azure the scripts therefore end the VM through
# Resource Manager with its managed identity (deallocate: no compute billed; the controller or
# `spotnb gc` deletes it), and power it off only when that is refused (the identity lacks
# Microsoft.Compute/virtualMachines/deallocate/action: docs/guide/clouds.md, Azure). Scheduled Events
# answers its first call only once it is on (up to two minutes), so the script asks at once, in
# the background: by the time the agent's notice watcher looks, it answers.
_AZURE_END = r"""spotnb_azure_end() {  # deallocate this VM with its managed identity; else power off
  local imds=http://169.254.169.254/metadata id token
  id=$(curl -sf -m 10 -H Metadata:true "$imds/instance/compute/resourceId?api-version=2021-02-01&format=text")
  token=$(curl -sf -m 10 -H Metadata:true "$imds/identity/oauth2/token?api-version=2018-02-01&resource=https%3A%2F%2Fmanagement.azure.com%2F" \
    | sed -n 's/.*"access_token" *: *"\([^"]*\)".*/\1/p')
  if [ -n "$id" ] && [ -n "$token" ] && curl -sf -m 30 -X POST -H "Authorization: Bearer $token" \
    -H "Content-Length: 0" "https://management.azure.com$id/deallocate?api-version=2023-03-01" >/dev/null; then
    echo "spotnb: Azure deallocates this VM (a Stopped VM is still billed)"; sleep 300
  else
    echo "spotnb: this VM's identity may not deallocate it (see docs/guide/clouds.md, Azure); powering off"
  fi
  shutdown -h now
}
SPOTNB_POWEROFF_CMD=${SPOTNB_POWEROFF_CMD:-spotnb_azure_end}
( curl -s -m 180 -H Metadata:true \
    "${SPOTNB_METADATA_URL:-http://169.254.169.254}/metadata/scheduledevents?api-version=2020-07-01" \
    >/dev/null 2>&1 & )"""


def azure_end_vm(script: str) -> str:
    """`script` (bash, with `set -uo pipefail` near its top) ending its VM the Azure way:
    `SPOTNB_POWEROFF_CMD` defaults to deallocating it through Resource Manager (`_AZURE_END`)."""
    head, marker, rest = script.partition("set -uo pipefail\n")
    if not marker:
        raise ValueError("an Azure boot script must start with `set -uo pipefail`")
    return head + marker + _AZURE_END + "\n" + rest


def azure_cloud_config(script: str) -> str:
    """A boot script as Azure `custom_data`: a base64 cloud-config that writes it and runs it
    (the instances' bootstrap and the coordinator's script alike), the VM ending itself by
    deallocation rather than a power-off that leaves it billed (`azure_end_vm`)."""
    script = azure_end_vm(script)
    indented = "\n".join("      " + line for line in script.splitlines())
    cloud_config = (
        "#cloud-config\n"
        "write_files:\n"
        "  - path: /opt/spotnb/bootstrap.sh\n"
        "    permissions: '0700'\n"
        "    content: |\n"
        f"{indented}\n"
        "runcmd:\n"
        "  - [bash, /opt/spotnb/bootstrap.sh]\n"
    )
    encoded = base64.b64encode(cloud_config.encode()).decode()
    if len(encoded) > 87380:  # Azure's limit on custom data (64 KB before base64)
        raise ValueError("Azure custom_data is limited to 64 KB; trim the job's requirements")
    return encoded


_COORDINATOR_TEMPLATE = (
    r"""#!/bin/bash
# spotnb coordinator for job {job} on {cloud} (spotnb {version}): torchft's lighthouse on port {port}.
# Generated by spotnb.providers.bootstrap. It holds no credential and no job key: the
# lighthouse only computes each step's quorum of replicas; it reads and writes nothing of the
# job. It powers off after {idle} min without any replica connected (a leak guard: the
# controller ends it when the job ends, and starts a new one if the job still needs it).
set -uo pipefail
{exports}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 RUST_LOG=${{RUST_LOG:-warn}}
SPOTNB_LOG=${{SPOTNB_LOG:-/var/log/spotnb-coordinator.log}}
exec >>"$SPOTNB_LOG" 2>&1
echo "spotnb coordinator: start $(date -u +%FT%TZ)"

"""
    + _INSTALL
    + r"""
spotnb_idle_watch() {{  # power off after {idle} min without a replica connected
  command -v ss >/dev/null 2>&1 || {{ echo "spotnb coordinator: no ss, no idle watch"; return; }}
  local idle=0
  while sleep 60; do
    if [ -n "$(ss -Htn state established '( sport = :{port} )' 2>/dev/null)" ]; then idle=0; else idle=$((idle + 1)); fi
    if [ "$idle" -ge {idle} ]; then
      echo "spotnb coordinator: no replica for {idle} min, powering off"; ${{SPOTNB_POWEROFF_CMD:-shutdown -h now}}; return
    fi
  done
}}
spotnb_idle_watch &

{module}# the lighthouse serves until its stdin closes: a FIFO this shell holds open never does
SPOTNB_HOLD=$(mktemp -u /tmp/spotnb-lighthouse-XXXXXX)
mkfifo -m 600 "$SPOTNB_HOLD" && exec 3<>"$SPOTNB_HOLD"
while true; do
  "$PY" {lighthouse} --min-replicas {min_replicas} --bind "[::]:{port}" \
    --host "$(hostname -I 2>/dev/null | cut -d' ' -f1)" --job {job} <&3
  echo "spotnb coordinator: lighthouse exited with $?, starting it again in 2 s"
  sleep 2
done
"""
)


# A coordinator that also drives the job (`Config.controller="cloud"`). Unlike the plain one it
# carries the job's key (written owner-only where `spotnb controller` looks for it; never
# echoed), and instead of an idle watch it ends when the controller says the job ended.
_CONTROLLER_TEMPLATE = (
    r"""#!/bin/bash
# spotnb coordinator for job {job} on {cloud} (spotnb {version}): the job's controller{lighthouse_note}.
# Generated by spotnb.providers.bootstrap. It holds no cloud credential: the VM launches the
# job's instances and reaches the store with its own identity. It does hold the job's key
# (SPOTNB_JOB_KEY), which the controller verifies the job spec with; it is never echoed.
# It powers off once the controller ends the job.
set -uo pipefail
{exports}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 RUST_LOG=${{RUST_LOG:-warn}}
export SPOTNB_HOME=${{SPOTNB_HOME:-/var/lib/spotnb}}
SPOTNB_LOG=${{SPOTNB_LOG:-/var/log/spotnb-coordinator.log}}
exec >>"$SPOTNB_LOG" 2>&1
echo "spotnb coordinator: start $(date -u +%FT%TZ)"

"""
    + _INSTALL
    + r"""
( umask 077 && mkdir -p "$SPOTNB_HOME/keys" && printf '%s' "$SPOTNB_JOB_KEY" > "$SPOTNB_HOME/keys/"{job}.key )
unset SPOTNB_JOB_KEY
{lighthouse}
# a controller frozen whole (its lease no longer renewed, its process still there) would hold
# the job forever on this machine: it is ended, and started again like one that crashed
spotnb_frozen() {{  # pid: whether it holds the job's lease and let it run out
  "$PY" - "$1" {job} <<'PYEOF'
import sys, time
from spotnb.control.jobdb import JobDB
lease = JobDB().lease(sys.argv[2])
sys.exit(0 if lease and lease["pid"] == int(sys.argv[1]) and lease["expires"] < time.time() else 1)
PYEOF
}}
WATCH=${{SPOTNB_WATCHDOG_S:-30}}
while true; do
  "$PY" -m spotnb.cli controller {job} --store {store} &
  CTL=$!
  while kill -0 "$CTL" 2>/dev/null; do
    sleep "$WATCH" & wait $!
    if kill -0 "$CTL" 2>/dev/null && spotnb_frozen "$CTL"; then
      echo "spotnb coordinator: the controller (pid $CTL) stopped renewing its lease; ending it"
      kill -9 "$CTL" 2>/dev/null
    fi
  done
  wait "$CTL"
  CODE=$?
  [ "$CODE" -eq 0 ] && break
  echo "spotnb coordinator: the controller exited with $CODE, starting it again in 5 s"
  sleep 5
done
echo "spotnb coordinator: the job ended, powering off"
${{SPOTNB_POWEROFF_CMD:-shutdown -h now}}
"""
)

#: The module a cloud controller imports to launch instances (checked before skipping the install).
_CLOUD_SDK = {"aws": "boto3", "azure": "azure.mgmt.compute", "gcp": "google.cloud.compute_v1"}

_LIGHTHOUSE_LOOP = r"""SPOTNB_HOLD=$(mktemp -u /tmp/spotnb-lighthouse-XXXXXX)
mkfifo -m 600 "$SPOTNB_HOLD" && exec 3<>"$SPOTNB_HOLD"
( while true; do
    "$PY" -m spotnb.runtime.group.lighthouse --min-replicas {min_replicas} --bind "[::]:{port}" \
      --host "$(hostname -I 2>/dev/null | cut -d' ' -f1)" --job {job} <&3
    echo "spotnb coordinator: lighthouse exited with $?, starting it again in 2 s"
    sleep 2
  done ) &
"""


def controller_script(
    job_id: str,
    *,
    store_url: str,
    job_key: str,
    cloud: str,
    instances: int,
    min_replicas: int,
    port: int = LIGHTHOUSE_PORT,
    spotnb_version: str = "",
    requirements: Iterable[str] = (),
    code: Any = None,
) -> str:
    """The boot script of a coordinator that hosts the job's controller (`Config.controller=
    "cloud"`): install spotnb with the cloud's and the store's extras (from the job's shipped
    wheel, `code`, when it has one), put the job key where `spotnb controller` finds it, run the
    lighthouse too when the job has several instances, keep the controller running (started
    again if it crashes) until it ends the job, then power off. `job_key` is the hex key, or
    `KEY_PLACEHOLDER` in a dry run."""
    if not spotnb_version:
        from spotnb import __version__

        spotnb_version = __version__
    own = [r for r in requirements if re.match(r"^\s*spotnb\b", r)]
    sdk = _CLOUD_SDK.get(cloud)
    store = store_extra(store_url)
    extras = sorted({*([cloud] if sdk else []), *([store] if store else [])})
    if instances > 1:
        extras.append("elastic")
    name = f"spotnb[{','.join(extras)}]"
    specs = own or [f"{name}=={spotnb_version}" if spotnb_version else name]
    if code is not None and not own:
        specs = []
        spotnb_version = code.version
    env = [
        ("SPOTNB_JOB", job_id),
        ("SPOTNB_VERSION", spotnb_version),
        ("SPOTNB_REQUIREMENTS", " ".join(own)),
        *(_code_env(code) if not own else []),
        (KEY_ENV, job_key),
    ]
    lighthouse = ""
    if instances > 1:
        lighthouse = _LIGHTHOUSE_LOOP.format(
            min_replicas=int(min_replicas), port=int(port), job=shlex.quote(job_id)
        )
    return _CONTROLLER_TEMPLATE.format(
        job=shlex.quote(job_id),
        cloud=cloud,
        version=spotnb_version,
        lighthouse_note=f" and torchft's lighthouse on port {int(port)}" if instances > 1 else "",
        exports=_exports(env),
        pythons=" ".join(PYTHON_CANDIDATES),
        torch=TORCH_SPEC,
        install=_install(
            _version_check(
                ", ".join(["spotnb", *([sdk] if sdk else []), *(["torchft"] if instances > 1 else [])])
            ),
            specs,
            code is not None and not own,
        ),
        lighthouse=lighthouse,
        store=shlex.quote(store_url),
    )


def elastic_requirements() -> list[str]:
    """What the `elastic` extra adds to spotnb, read from spotnb's own metadata so the pin is
    stated once (pyproject.toml); needed when the user ships spotnb itself as a requirement
    (a wheel URL, `spotnb @ git+...`), whose extras a boot script cannot add."""
    from importlib import metadata

    try:
        declared = metadata.requires("spotnb") or []
    except metadata.PackageNotFoundError:
        return list(_ELASTIC_FALLBACK)
    found = [
        r.split(";", 1)[0].strip()
        for r in declared
        if ";" in r and re.search(r"extra\s*==\s*[\"']elastic[\"']", r.split(";", 1)[1])
    ]
    return found or list(_ELASTIC_FALLBACK)


def coordinator_install_specs(spotnb_version: str, requirements: Iterable[str] = ()) -> list[str]:
    """pip specs for a coordinator: spotnb with its `elastic` extra, at the instances' version
    (or the user's own spotnb requirement, as `install_specs` does). The job's other
    requirements are not installed: the coordinator runs no job code."""
    own = [r for r in requirements if re.match(r"^\s*spotnb\b", r)]
    if own:
        return [*own, *elastic_requirements()]
    return [f"spotnb[elastic]=={spotnb_version}" if spotnb_version else "spotnb[elastic]"]


def coordinator_script(
    job_id: str,
    *,
    min_replicas: int,
    cloud: str,
    port: int = LIGHTHOUSE_PORT,
    spotnb_version: str = "",
    requirements: Iterable[str] = (),
    idle_minutes: int = COORDINATOR_IDLE_MINUTES,
    ship_lighthouse: bool = False,
) -> str:
    """The boot script of a job's coordinator VM: install spotnb as an instance's script does,
    then run torchft's lighthouse on `port` (started again if it dies) until the VM is ended.
    It carries no credential and no job key, so there is nothing to check in it but the job id.

    `ship_lighthouse` (`Config.spotnb_source="store"`): this coordinator has no identity to read
    the store's wheel with (it reads nothing of the job), so the script carries the one module it
    runs, this notebook's `spotnb/runtime/group/lighthouse.py` (standard library, torch and torchft),
    and installs only torchft, pinned to this notebook's version."""
    if not spotnb_version:
        from spotnb import __version__

        spotnb_version = __version__
    requirements = list(requirements)
    own = [r for r in requirements if re.match(r"^\s*spotnb\b", r)]
    ship_lighthouse = ship_lighthouse and not own
    specs = coordinator_install_specs(spotnb_version, requirements)
    check, module, lighthouse = (
        "import sys, spotnb, torchft; sys.exit(spotnb.__version__ != '$SPOTNB_VERSION')",
        "",
        "-m spotnb.runtime.group.lighthouse",
    )
    if ship_lighthouse:
        specs = [pinned("torchft-nightly")]
        check, lighthouse = "import torchft", '"$SPOTNB_LIGHTHOUSE"'
        module = (
            "# this notebook's spotnb/runtime/group/lighthouse.py: the one module this coordinator runs\n"
            "SPOTNB_LIGHTHOUSE=$(mktemp -d /tmp/spotnb-XXXXXX)/spotnb.runtime.group.lighthouse.py\n"
            "cat > \"$SPOTNB_LIGHTHOUSE\" <<'SPOTNB_MODULE'\n"
            + _embedded("runtime/group/lighthouse.py", "SPOTNB_MODULE")
            + "\nSPOTNB_MODULE\n"
        )
    env = [
        ("SPOTNB_JOB", job_id),
        ("SPOTNB_VERSION", spotnb_version),
        ("SPOTNB_REQUIREMENTS", ""),
    ]
    return _COORDINATOR_TEMPLATE.format(
        job=shlex.quote(job_id),
        cloud=cloud,
        version=spotnb_version,
        port=int(port),
        idle=int(idle_minutes),
        min_replicas=int(min_replicas),
        exports=_exports(env),
        pythons=" ".join(PYTHON_CANDIDATES),
        torch=TORCH_SPEC,
        # an image with this spotnb but without torchft still gets the lighthouse's dependency
        install=_install(check, specs, False),
        module=module,
        lighthouse=lighthouse,
    )


def gcp_startup_script(spec: LaunchSpec) -> str:
    """GCE metadata `startup-script`: the guest agent runs it at boot."""
    return bootstrap_script(spec, "gcp")


def require_remote_store(config: Config, provider: str) -> None:
    """A cloud VM reaches the store over the network: refuse file:// and memory:// early."""
    from spotnb.errors import ConfigError

    url = config.store_url()
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    if protocol in ("file", "memory", "local"):
        example = {
            "aws": "s3://my-bucket/spotnb",
            "azure": "az://my-container/spotnb",
            "gcp": "gs://my-bucket/spotnb",
        }.get(provider, "s3://bucket/prefix")
        raise ConfigError(
            f"Config.store: provider={provider!r} runs the job on a cloud VM, which "
            f"cannot reach {url!r}; give a bucket, e.g. store={example!r}"
        )
