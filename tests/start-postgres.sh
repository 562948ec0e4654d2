#!/usr/bin/env bash
# Install (Debian's postgresql), start a server on loopback, create a throw-away database for the
# store tests, and print its SQLAlchemy URL on the last line. Needs root (as CI and these machines run).
# When it started the server itself (it was not running) and NSYSAN_PG_STARTED_FILE names a file, it
# writes the cluster there ("15 main"), so tests/run.sh stops that server again, and only that one.
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    # wait for another apt (unattended upgrades, a parallel job) rather than fail on its lock
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq postgresql >/dev/null
fi
version=$(ls /usr/lib/postgresql | sort -n | tail -n 1)
if ! pg_lsclusters -h 2>/dev/null | grep -q "^$version main"; then
    pg_createcluster "$version" main >/dev/null
fi
if ! pg_ctlcluster "$version" main status >/dev/null 2>&1; then
    pg_ctlcluster "$version" main start
    if [ -n "${NSYSAN_PG_STARTED_FILE:-}" ]; then
        echo "$version main" > "$NSYSAN_PG_STARTED_FILE"
    fi
fi
for _ in $(seq 1 30); do
    su postgres -c "pg_isready -q -h 127.0.0.1" && break
    sleep 1
done
su postgres -c "psql -q -c \"DO \\\$\\\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='nsysan') THEN CREATE ROLE nsysan LOGIN PASSWORD 'nsysan'; END IF; END \\\$\\\$;\"" >/dev/null
su postgres -c "psql -q -c \"DROP DATABASE IF EXISTS nsysan_test\"" >/dev/null
su postgres -c "psql -q -c \"CREATE DATABASE nsysan_test OWNER nsysan\"" >/dev/null
echo "postgresql+psycopg://nsysan:nsysan@127.0.0.1:5432/nsysan_test"
