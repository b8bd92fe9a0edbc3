# shellcheck shell=bash
# The docs site's tools (the `docs` extra of pyproject.toml: Sphinx, MyST-NB, furo), pinned by
# constraints.txt, for scripts/docs.sh, which scripts/test.sh runs after the tests. Sourced by
# scripts/setup.sh after spotnb itself is installed; idempotent. Only the extra's packages are
# installed (not spotnb again, whose editable build runs the extension's builder).
_spotnb_docs() {
  local py
  py=$(python -c 'import sys; print(sys.executable)')
  mapfile -t _spotnb_docs_reqs < <(python -c '
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')
  if python -m uv --version >/dev/null 2>&1; then
    python -m uv pip install -q --python "$py" -c "$SPOTNB_CONSTRAINTS" "${_spotnb_docs_reqs[@]}"
  else
    python -m pip install -q -c "$SPOTNB_CONSTRAINTS" "${_spotnb_docs_reqs[@]}"
  fi
}
_spotnb_docs
