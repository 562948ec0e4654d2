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

# provide PART VAR TEST SCRIPT SKIPS: run SCRIPT (which installs or starts PART and prints what the
# tests need on its last line), check that line with `[ TEST line ]` and export it as VAR. Without it,
# CI fails; elsewhere the tests named by SKIPS skip.
provide() {
    local part=$1 var=$2 test=$3 script=$4 skips=$5 value
    if value=$(bash "$script" | tail -n 1) && [ "$test" "$value" ]; then
        export "$var=$value"
    elif [ "${CI:-}" = "true" ]; then
        echo "tests/run.sh: could not provide $part; CI needs it for $skips" >&2
        exit 1
    else
        echo "tests/run.sh: no $part here; $skips will skip" >&2
    fi
}

provide "Nsight Systems" NSYS -x .ci/install-nsys.sh "the real-nsys tests"
provide PostgreSQL NSYSAN_TEST_PG_URL -n tests/start-postgres.sh "the PostgreSQL store tests"
provide Chromium NSYSAN_CHROMIUM -x tests/install-chromium.sh "the browser tests"

exec python3 -m pytest -ra "$@"
