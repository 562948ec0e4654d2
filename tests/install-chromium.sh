#!/usr/bin/env bash
# Install Debian's Chromium for the browser tests (Playwright drives it; `playwright install`
# cannot download its own browsers on this network) and print its path on the last line.
# Needs root (as CI and these machines run).
set -euo pipefail
if [ ! -x /usr/bin/chromium ]; then
    # wait for another apt (unattended upgrades, a parallel job) rather than fail on its lock
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq chromium >/dev/null
fi
/usr/bin/chromium --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1
echo /usr/bin/chromium
