#!/usr/bin/env bash
# Sets up from nothing, then runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh   # lint, format and types: a violation fails CI like a failing test
export SPOTNB_FAST=1
# two workers: most tests wait on real processes (instances, JupyterLab, emulators), so two
# at once roughly halve the wall time on 2 cores (measured: 17:22 -> 11:00, on a busy machine)
# the slowest tests are listed at the end, so a suite creeping towards its budget says where.
# worksteal: an idle worker takes tests queued for the other. With `load`, xdist hands each
# worker a quarter of the suite up front, the slowest first (tests/slowest.txt), and a run
# ended with one worker still on its queue while the other idled (22:24 for 19:00 of tests)
status=0
python -m pytest -n 2 --dist worksteal --durations=25 "$@" || status=$?
# then the docs site, warnings as errors, its tutorials executed (scripts/docs.sh); the exit
# status is the tests' when they failed, else the docs build's
docs_status=0
bash scripts/docs.sh || docs_status=$?
[ "$status" -ne 0 ] || status=$docs_status
exit "$status"
