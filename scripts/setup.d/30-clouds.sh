# Cloud providers (issue 5): what tests/test_aws*, test_azure*, test_gcp*, test_store_conformance
# and test_credentials* need. Sourced by scripts/setup.sh; idempotent; bash.
# - the SDKs, moto_server and gcp-storage-emulator come with the aws/azure/gcp/test extras,
#   which setup.sh installs (pinned by constraints.txt)
# - Azurite (npm) for Azure Blob, into a local prefix the fixtures look in
SPOTNB_NPM_PREFIX="${SPOTNB_NPM_PREFIX:-$HOME/.cache/spotnb/azurite}"
export SPOTNB_NPM_PREFIX
if ! command -v azurite-blob >/dev/null 2>&1 && [ ! -x "$SPOTNB_NPM_PREFIX/node_modules/.bin/azurite-blob" ]; then
  if command -v npm >/dev/null 2>&1; then
    mkdir -p "$SPOTNB_NPM_PREFIX"
    npm install --prefix "$SPOTNB_NPM_PREFIX" --no-audit --no-fund --loglevel=error 'azurite@^3.33' \
      || echo "setup: npm install azurite failed; Azure Blob store tests will be skipped"
  else
    echo "setup: npm not found; Azure Blob store tests will be skipped (apt-get install nodejs npm)"
  fi
fi
