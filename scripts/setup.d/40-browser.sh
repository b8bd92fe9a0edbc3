# Sourced by the CI setup script: what tests/views/test_browser.py needs (idempotent).
# Headless Chromium from Debian at /usr/bin/chromium (Playwright drives it via executable_path,
# so no `playwright install` download is needed), plus the Python side of the notebook tests.
if ! command -v chromium >/dev/null 2>&1 || [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = "0" ]; then
        apt-get update && apt-get install -y --no-install-recommends chromium fonts-dejavu-core
    else
        sudo apt-get update && sudo apt-get install -y --no-install-recommends chromium fonts-dejavu-core
    fi
fi
python -c "import playwright, jupyterlab, nbclient, ipykernel" 2>/dev/null \
    || python -m pip install "playwright>=1.45" "jupyterlab>=4.2" "nbclient>=0.10" "ipykernel>=6.29"
