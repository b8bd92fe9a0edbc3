#!/usr/bin/env bash
# Builds the docs site, docs/ -> docs/_build/html, with Sphinx + MyST-NB (the `docs` extra,
# installed by scripts/setup.sh), warnings as errors: a broken link, a heading out of order, a
# tutorial cell that raises or a Config field without a description fails it. CI runs it at
# the end of scripts/test.sh.
#
# The tutorials in notebooks/ are committed without outputs, so the build executes them, on the
# local spot market in fast mode (SPOTNB_FAST=1, as the notebook tests run them), each in a
# temporary folder, with a throwaway SPOTNB_HOME. Outputs are cached by each notebook's code in
# docs/_build/.jupyter_cache: a rebuild runs only the tutorials that changed. They are run two at
# a time before Sphinx reads them (docs/_ext/execute_tutorials.py); `rm -rf docs/_build` starts
# cold.
#
#   bash scripts/docs.sh                 # build; open docs/_build/html/index.html
#   SPOTNB_DOCS_EXECUTE=off bash scripts/docs.sh   # the pages without running the tutorials
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
# the kernels import this checkout's spotnb (an editable install may point at another clone)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SPOTNB_FAST=1 SPOTNB_HOME="$home"
# plotly figures as HTML that draws itself, with plotly.js from its CDN (inline it would add
# 5 MB to each page), not the notebook-only mime type a static page cannot show
export PLOTLY_RENDERER=notebook_connected
if [ "${SPOTNB_DOCS_EXECUTE:-cache}" = cache ]; then
  # the tutorials two at a time into MyST-NB's cache (Sphinx would run them one by one)
  python docs/_ext/execute_tutorials.py docs/_build/.jupyter_cache notebooks/*.ipynb --jobs 2
fi
python -m sphinx -W --keep-going -q -b html docs docs/_build/html "$@"
echo "docs: built docs/_build/html in $((SECONDS - started)) s"
