#!/usr/bin/env bash
# Sets up from nothing, then runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh   # lint, format and types: a violation fails CI like a failing test
export SPOTNB_FAST=1
exec python -m pytest "$@"
