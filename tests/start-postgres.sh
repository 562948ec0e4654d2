#!/usr/bin/env bash
# Install (Debian's postgresql), start a server on loopback, create a throw-away database for the
# store tests, and print its SQLAlchemy URL on the last line. Needs root (as CI and these machines run).
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /usr/lib/postgresql | sort -n | tail -n 1)
if ! pg_lsclusters -h 2>/dev/null | grep -q "^$version main"; then
    pg_createcluster "$version" main >/dev/null
fi
pg_ctlcluster "$version" main start 2>/dev/null || true
for _ in $(seq 1 30); do
    su postgres -c "pg_isready -q -h 127.0.0.1" && break
    sleep 1
done
su postgres -c "psql -q -c \"DO \\\$\\\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='nsysan') THEN CREATE ROLE nsysan LOGIN PASSWORD 'nsysan'; END IF; END \\\$\\\$;\"" >/dev/null
su postgres -c "psql -q -c \"DROP DATABASE IF EXISTS nsysan_test\"" >/dev/null
su postgres -c "psql -q -c \"CREATE DATABASE nsysan_test OWNER nsysan\"" >/dev/null
echo "postgresql+psycopg://nsysan:nsysan@127.0.0.1:5432/nsysan_test"
