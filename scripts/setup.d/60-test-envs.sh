# shellcheck shell=bash
# The two environments the browser and tutorial tests run in, built ahead of the tests (each
# is cached under ~/.cache/spotnb and rebuilt only when what it is made from changes):
# - the Binder environment, made the way repo2docker makes it from binder/ (tests/support/binder_env.py)
# - a virtualenv made only with README's install line, plus JupyterLab (tests/support/browser_lab.py)
# Built here rather than in the first test that needs one, so that a worker of the test run
# does not spend its first two minutes installing while the other waits on the same lock.
_spotnb_test_envs() {
  python - <<'PY' || return 1
import sys
sys.path.insert(0, ".")
from tests.support.binder_env import binder_python
from tests.support.browser_lab import readme_python

print(f"setup: 60-test-envs: binder env {binder_python()}")
print(f"setup: 60-test-envs: README env {readme_python()}")
PY
}
_spotnb_test_envs_status=0
_spotnb_test_envs || _spotnb_test_envs_status=$?
unset -f _spotnb_test_envs
if [ "$_spotnb_test_envs_status" -ne 0 ]; then
  unset _spotnb_test_envs_status
  echo "setup: 60-test-envs: building the test environments failed" >&2
  return 1 2>/dev/null || exit 1
fi
unset _spotnb_test_envs_status
