#!/usr/bin/env bash
# Install what the tests need, then run them: the README's test command, and what CI runs (.ci/run).
# Installs into the current Python: torch (an existing install is used as it is; otherwise the CPU
# build from PyTorch's CPU wheel index, since the default index's torch pulls several GB of CUDA
# wheels), nsysan with its test extras, and Debian's Nsight Systems into ~/.cache/nsysan; starts
# Debian's PostgreSQL on loopback for the store tests (and stops it at the end if it started it),
# and installs Debian's Chromium for the dashboard's browser tests (Playwright, from the test
# extras, drives it). docs/testing.md has the details. Extra arguments go to pytest
# (bash tests/run.sh -k realtraces).
set -euo pipefail
cd "$(dirname "$0")/.."

pip_install() { python3 -m pip install --quiet --disable-pip-version-check "$@"; }
if python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
    echo "tests/run.sh: using the installed torch $(python3 -c 'import torch; print(torch.__version__)')" >&2
else
    index="${NSYSAN_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
    if ! pip_install --index-url "$index" torch==2.13.0; then
        echo "tests/run.sh: $index did not serve torch; installing torch==2.13.0 from the configured index" >&2
        pip_install torch==2.13.0
    fi
fi
pip_install -e ".[all,test]"

# The code checks come first and fail the run (docs/testing.md): lint, formatting, types, layering.
echo "tests/run.sh: ruff check, ruff format --check, mypy, lint-imports" >&2
python3 -m ruff check --quiet .
python3 -m ruff format --check --quiet .
python3 -m mypy
lint-imports --no-cache

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

# a PostgreSQL server this script starts is stopped when it ends, whatever the tests do
pg_started=$(mktemp)
stop_postgres() {
    if [ -s "$pg_started" ]; then
        # shellcheck disable=SC2046  # "VERSION CLUSTER", two words
        pg_ctlcluster $(cat "$pg_started") stop || echo "tests/run.sh: could not stop PostgreSQL $(cat "$pg_started")" >&2
    fi
    rm -f "$pg_started"
}
trap stop_postgres EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export NSYSAN_PG_STARTED_FILE=$pg_started

provide "Nsight Systems" NSYS -x .ci/install-nsys.sh "the real-nsys tests"
provide PostgreSQL NSYSAN_TEST_PG_URL -n tests/start-postgres.sh "the PostgreSQL store tests"
provide Chromium NSYSAN_CHROMIUM -x tests/install-chromium.sh "the browser tests"

# The real exports live outside the repository (../shared/realtraces beside CI's checkout, or
# NSYSAN_REALTRACES): without them their tests skip, naming what is missing; under CI=true they fail.
realtraces=${NSYSAN_REALTRACES:-../shared/realtraces}
if ! compgen -G "$realtraces/*.sqlite.xz" >/dev/null && [ "${CI:-}" != "true" ]; then
    echo "tests/run.sh: no real traces in $realtraces; the real-trace tests will skip" >&2
fi

python3 -m pytest -ra "$@"
