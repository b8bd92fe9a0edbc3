#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine (idempotent), printing how long
# each step took.
#
# Fast because pip never resolves: every Python package is pinned in constraints.txt (versions
# known to install together; refresh with scripts/update-constraints.sh). Without it, pip spent
# 12.7 minutes backtracking through the extras' dependency graph (boto3/botocore/aiobotocore,
# moto, jupyter) on a fresh virtualenv.
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
# every extra (clouds, test) and the linters (dev: ruff, mypy), pinned
step "pip install -e .[test,aws,azure,gcp,dev]" \
  python -m pip install -q -c "$SPOTNB_CONSTRAINTS" -e '.[test,aws,azure,gcp,dev]'
for fragment in scripts/setup.d/*.sh; do
  [ -e "$fragment" ] || continue
  _fragment_started=$SECONDS
  # shellcheck disable=SC1090
  source "$fragment"
  echo "setup: $fragment: $((SECONDS - _fragment_started)) s"
done
echo "setup: total: $((SECONDS - _setup_started)) s"
