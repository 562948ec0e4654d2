#!/usr/bin/env bash
# Install Debian's Chromium for the browser tests (Playwright drives it; `playwright install`
# cannot download its own browsers on this network) and print its path on the last line.
# Needs root (as CI and these machines run).
set -euo pipefail
if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
/usr/bin/chromium --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1
echo /usr/bin/chromium
