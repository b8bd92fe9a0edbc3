# shellcheck shell=bash
# Builds the JupyterLab extension (extension/ -> spotnb/labextension/) and makes JupyterLab and
# jupyter_server use it and the spotnb.views.server extension. Sourced by scripts/setup.sh from the
# repository root after `pip install -e .`; idempotent (npm is skipped when the lock file has
# not changed since the last run; tsc + jupyter-builder then take a few seconds).
# Needs node >= 18 and npm. npm, not jlpm: yarn-berry fails here on a darwin-only optional
# package of rspack that the reachable registry does not serve. `npm install` (which follows
# package-lock.json) rather than `npm ci`: for the same reason the lock has no entries for
# rspack's other-platform optional bindings, and `npm ci` refuses such a lock as "out of sync".

_spotnb_labext() {
  local root="$PWD" started=$SECONDS
  if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    if [ -n "${CI:-}" ]; then
      echo "setup: 50-labextension: node and npm are required to build the JupyterLab extension" >&2
      return 1
    fi
    echo "setup: 50-labextension: node/npm not found; skipping the JupyterLab extension build" >&2
    return 0
  fi
  # every step is checked explicitly: `set -e` does not apply inside a function or subshell
  # whose status is tested, which is how a sourced fragment has to run
  local ext="$root/extension" lock_sum stamp="$root/extension/node_modules/.spotnb-lock.sha256"
  lock_sum=$(sha256sum "$ext/package-lock.json" | cut -d' ' -f1) || return 1
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_sum" ]; then
    (cd "$ext" && npm install --no-audit --no-fund --loglevel=error) || {
      echo "setup: 50-labextension: npm install failed" >&2; return 1; }
    lock_sum=$(sha256sum "$ext/package-lock.json" | cut -d' ' -f1)
    echo "$lock_sum" > "$stamp"
  fi
  (cd "$ext" && npx --no-install tsc) || { echo "setup: 50-labextension: tsc failed" >&2; return 1; }
  (cd "$ext" && jupyter-builder build .) || {
    echo "setup: 50-labextension: jupyter-builder build failed" >&2; return 1; }
  cp "$ext/install.json" "$root/spotnb/labextension/install.json" || return 1

  # Put the fresh build where `pip install` puts the wheel's shared-data
  # (<prefix>/share/jupyter/labextensions/spotnb). Copy, never symlink: pip records these files,
  # and a later install or uninstall through a symlink fails (or deletes the build itself).
  local prefix
  prefix=$(python -c 'import sys; print(sys.prefix)')
  local dest="$prefix/share/jupyter/labextensions/spotnb"
  mkdir -p "$(dirname "$dest")"
  if [ -L "$dest" ]; then
    rm -f "$dest"
  fi
  mkdir -p "$dest"
  cp -r "$root/spotnb/labextension/." "$dest/" || return 1

  # The server extension: the same file the wheel installs through shared-data.
  mkdir -p "$prefix/etc/jupyter/jupyter_server_config.d"
  cp "$root/jupyter-config/jupyter_server_config.d/spotnb.json" \
     "$prefix/etc/jupyter/jupyter_server_config.d/spotnb.json" || return 1

  if ! jupyter labextension list 2>&1 | grep -E '^\s*spotnb v[0-9.]+ .*enabled.*OK' >/dev/null; then
    echo "setup: 50-labextension: jupyter labextension list does not show spotnb enabled OK:" >&2
    jupyter labextension list >&2 || true
    return 1
  fi
  if ! jupyter server extension list 2>&1 | grep -E 'spotnb\.views\.server .*enabled' >/dev/null; then
    echo "setup: 50-labextension: jupyter server extension list does not show spotnb.views.server:" >&2
    jupyter server extension list >&2 || true
    return 1
  fi
  echo "setup: 50-labextension: built and installed in $((SECONDS - started)) s"
}
_spotnb_labext_status=0
_spotnb_labext || _spotnb_labext_status=$?
unset -f _spotnb_labext
if [ "$_spotnb_labext_status" -ne 0 ]; then
  unset _spotnb_labext_status
  return 1 2>/dev/null || exit 1
fi
unset _spotnb_labext_status
