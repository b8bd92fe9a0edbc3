# Cloud providers (issue 5): what tests/test_aws*, test_azure*, test_gcp*, test_store_conformance
# and test_credentials* need. Sourced by scripts/setup.sh; idempotent; bash.
# - the SDK extras (pip) with lower bounds that keep pip from backtracking s3fs to 0.4.2
# - moto_server (pip moto[server]) and gcp-storage-emulator (pip) for S3 / GCS
# - Azurite (npm) for Azure Blob, into a local prefix the fixtures look in
python -m pip install -q \
  'boto3>=1.34' 's3fs>=2024.12.0' 'moto[server]>=5.1' \
  'azure-mgmt-compute>=33' 'azure-identity>=1.15' 'azure-storage-blob>=12.20' 'adlfs>=2024.12.0' \
  'google-cloud-compute>=1.20' 'gcsfs>=2024.12.0' 'gcp-storage-emulator>=2024.8'
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
