#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine (idempotent).
# torch first, from the CPU wheel, so nothing pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q 'torch==2.13.0' || python -m pip install -q 'torch>=2.1,<=2.14.1'
# an earlier setup may have linked the extension into share/ (pip cannot replace files through it)
labext="$(python -c 'import sys; print(sys.prefix)')/share/jupyter/labextensions/spotnb"
if [ -L "$labext" ]; then rm -f "$labext"; fi
python -m pip install -q -e '.[test,aws,azure,gcp]'
for fragment in scripts/setup.d/*.sh; do
  [ -e "$fragment" ] || continue
  echo "setup: $fragment"
  # shellcheck disable=SC1090
  source "$fragment"
done
