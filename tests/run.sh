#!/usr/bin/env bash
# Install what the tests need, then run them: the README's test command, and what CI runs (.ci/run).
# Installs into the current Python: torch's CPU build first (an unpinned torch would pull several GB
# of CUDA wheels), nsysan with its test extras, and Debian's Nsight Systems into ~/.cache/nsysan;
# installs and starts Debian's PostgreSQL on loopback for the store tests, and installs Debian's
# Chromium for the dashboard's browser tests (Playwright, from the test extras, drives it).
# Extra arguments go to pytest (bash tests/run.sh -k realtraces).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check torch==2.13.0
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"

if nsys_path=$(bash .ci/install-nsys.sh | tail -n 1) && [ -x "$nsys_path" ]; then
    export NSYS="$nsys_path"
elif [ "${CI:-}" = "true" ]; then
    echo "tests/run.sh: could not install Nsight Systems; CI needs it" >&2
    exit 1
else
    echo "tests/run.sh: no Nsight Systems here; the real-nsys tests will skip" >&2
fi

if pg_url=$(bash tests/start-postgres.sh | tail -n 1) && [ -n "$pg_url" ]; then
    export NSYSAN_TEST_PG_URL="$pg_url"
elif [ "${CI:-}" = "true" ]; then
    echo "tests/run.sh: could not start PostgreSQL; CI needs it" >&2
    exit 1
else
    echo "tests/run.sh: no PostgreSQL here; the PostgreSQL store tests will skip" >&2
fi

if chromium_path=$(bash tests/install-chromium.sh | tail -n 1) && [ -x "$chromium_path" ]; then
    export NSYSAN_CHROMIUM="$chromium_path"
elif [ "${CI:-}" = "true" ]; then
    echo "tests/run.sh: could not install Chromium; CI needs it for the browser tests" >&2
    exit 1
else
    echo "tests/run.sh: no Chromium here; the browser tests will skip" >&2
fi

exec python3 -m pytest -ra "$@"
