#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine (idempotent), printing how long
# each step took.
#
# Fast because nothing is resolved here and downloads run in parallel: every Python package is
# pinned in constraints.txt (versions known to install together; refresh them with
# scripts/update-constraints.sh), and uv (itself pinned, from PyPI through pip) installs them.
# Without the pins pip spent 12.7 to 30+ minutes backtracking through the extras' dependency
# graph (boto3/botocore/aiobotocore, moto, jupyter) on a fresh virtualenv; with them but through
# pip's sequential downloads, about 7 minutes on a busy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
SPOTNB_CONSTRAINTS="${SPOTNB_CONSTRAINTS:-$PWD/constraints.txt}"
export SPOTNB_CONSTRAINTS
_setup_started=$SECONDS

# step NAME CMD...: run CMD, then print how long it took (its exit status is kept)
step() {
  local name="$1" started=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "setup: $name: $((SECONDS - started)) s$([ "$status" -eq 0 ] || echo " (failed: exit $status)")"
  return "$status"
}

# torch first, from the CPU wheel, so nothing pulls a multi-GB CUDA build (not in the
# constraints: a GPU machine installs its own torch first, any of 2.1 to 2.14.1)
_torch() {
  python -c 'import torch' 2>/dev/null \
    || python -m pip install -q 'torch==2.13.0' || python -m pip install -q 'torch>=2.1,<=2.14.1'
}
step "torch" _torch
# an earlier setup may have linked the extension into share/ (pip cannot replace files through it)
labext="$(python -c 'import sys; print(sys.prefix)')/share/jupyter/labextensions/spotnb"
if [ -L "$labext" ]; then rm -f "$labext"; fi
# every extra (clouds, test) and the linters (dev: ruff, mypy), pinned; with pip if uv is not
# available (slower, same versions)
_extras() {
  local spec='.[test,aws,azure,gcp,elastic,forecast,hf,lightning,dev]' py
  py=$(python -c 'import sys; print(sys.executable)')
  if python -m pip install -q -c "$SPOTNB_CONSTRAINTS" uv && python -m uv --version >/dev/null; then
    python -m uv pip install -q --python "$py" -c "$SPOTNB_CONSTRAINTS" -e "$spec"
  else
    echo "setup: uv unavailable; installing with pip" >&2
    python -m pip install -q -c "$SPOTNB_CONSTRAINTS" -e "$spec"
  fi
}
step "install -e .[test,aws,azure,gcp,elastic,forecast,hf,lightning,dev]" _extras
for fragment in scripts/setup.d/*.sh; do
  [ -e "$fragment" ] || continue
  _fragment_started=$SECONDS
  # shellcheck disable=SC1090
  source "$fragment"
  echo "setup: $fragment: $((SECONDS - _fragment_started)) s"
done
echo "setup: total: $((SECONDS - _setup_started)) s"
