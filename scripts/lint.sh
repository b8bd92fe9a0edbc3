#!/usr/bin/env bash
# Lint, format and types, as CI enforces them (scripts/test.sh runs this before the tests).
#   Python: ruff check (pyflakes, pycodestyle, bugbear, isort, pyupgrade, simplify), ruff format,
#           mypy on spotnb/ (pyproject.toml holds the settings)
#   TypeScript (extension/): eslint + prettier --check, tsc --noEmit
#   Generated files: the extension's protocol types and palette match the Python
# Fix most findings with:  ruff check --fix . && ruff format . && (cd extension && npm run lint:fix)
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
run() {
  local name=$1
  shift
  if ! "$@"; then
    failed+=("$name")
  fi
}
run "ruff check" ruff check .
run "ruff format" ruff format --check .
run "mypy" mypy
run "generated protocol files" python scripts/gen_protocol.py --check
if [ -d extension/node_modules ]; then
  run "eslint + prettier" bash -c "cd extension && npm run --silent lint"
  run "tsc --noEmit" bash -c "cd extension && npm run --silent typecheck"
elif [ -n "${CI:-}" ]; then
  failed+=("extension lint (extension/node_modules missing: run scripts/setup.sh)")
else
  echo "lint: extension/node_modules missing; skipping the TypeScript checks (scripts/setup.sh installs them)" >&2
fi
if [ ${#failed[@]} -gt 0 ]; then
  printf 'lint: failed: %s\n' "${failed[@]}" >&2
  echo "lint: fix with: ruff check --fix . && ruff format . && (cd extension && npm run lint:fix)" >&2
  exit 1
fi
echo "lint: ruff, ruff format, mypy, eslint, prettier, tsc: clean"
