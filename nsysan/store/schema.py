"""The store's schema, brought up to date when a store is opened: Alembic revisions
(``nsysan/store/migrations/versions``) run programmatically, no alembic.ini.

A store written before nsysan used Alembic records its schema number (1, 2 or 3) in ``nsysan_meta``
only: it is stamped with the revision of that number, then upgraded like any other. Every revision
also records its number in ``nsysan_meta``, so an older nsysan refuses a store a newer one wrote.

The whole upgrade, stamp included, is one transaction: on PostgreSQL under an advisory lock, on
SQLite under ``BEGIN IMMEDIATE`` with pysqlite's own transaction handling switched off, so its DDL
commits or rolls back with the rest. Of two servers opening one old store, one upgrades it and the
other then finds nothing to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from nsysan.errors import InputError
from nsysan.store.models import VERSION_TABLE

SCRIPT_LOCATION = Path(__file__).parent / "migrations"
# schema numbers of the hand-written migrations (nsysan_meta.schema_version) -> their Alembic revision
LEGACY_REVISIONS = {1: "0001", 2: "0002", 3: "0003"}
_PG_LOCK = 0x6E737973616E  # pg_advisory_xact_lock key: "nsysan"

# called after each revision is applied, inside the transaction (tests make one fail)
after_revision: list[Callable[..., None]] = []


def config(connection: sa.Connection | None = None) -> Config:
    """Alembic's configuration, built in code: the package's scripts, nsysan's version table."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    cfg.set_main_option("file_template", "s%%(rev)s_%%(slug)s")
    cfg.attributes["version_table"] = VERSION_TABLE
    cfg.attributes["on_version_apply"] = tuple(after_revision)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    revision = ScriptDirectory.from_config(config()).get_current_head()
    assert revision is not None
    return revision


def upgrade(url: str, shown: str) -> None:
    """Bring the store at ``url`` to the newest revision (a new store: every revision from the
    first); ``shown`` is the URL as it may be printed. Refuses a store of a newer nsysan."""
    with _transaction(url) as conn:
        cfg = config(conn)
        script = ScriptDirectory.from_config(cfg)
        tables = set(sa.inspect(conn).get_table_names())
        if VERSION_TABLE not in tables and "nsysan_meta" in tables:
            legacy = conn.execute(sa.text("SELECT value FROM nsysan_meta WHERE key = 'schema_version'")).scalar()
            if legacy is None and "traces" not in tables:  # an earlier nsysan stopped before its first tables
                conn.execute(sa.text("DROP TABLE nsysan_meta"))
            elif legacy is None or int(legacy) not in LEGACY_REVISIONS:
                raise InputError(f"{shown}: store schema {legacy} is newer than this nsysan (revision {head()})")
            else:
                command.stamp(cfg, LEGACY_REVISIONS[int(legacy)])
        for current in MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_heads():
            try:
                script.get_revision(current)
            except CommandError:
                raise InputError(
                    f"{shown}: store schema revision {current} is newer than this nsysan (revision {head()})"
                ) from None
        command.upgrade(cfg, "head")


@contextmanager
def _transaction(url: str) -> Iterator[sa.Connection]:
    """A connection in a transaction that holds the store's migration lock."""
    sqlite = url.startswith("sqlite")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"timeout": 60} if sqlite else {})
    if sqlite:  # pysqlite would run DDL outside any transaction: begin them ourselves

        @sa.event.listens_for(engine, "connect")
        def _no_pysqlite_transactions(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin_immediate(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock now: a second opener waits here

    try:
        with engine.connect() as conn, conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK)))
            yield conn
    finally:
        engine.dispose()
