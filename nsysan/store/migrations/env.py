"""Alembic's environment for the review store: always run by :func:`nsysan.store.schema.upgrade`,
which hands over a connection already inside the one transaction the whole upgrade runs in."""

from __future__ import annotations

from alembic import context

from nsysan.store.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise SystemExit("the review store migrates itself when opened (nsysan.store.schema.upgrade); no alembic CLI")
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=config.attributes["version_table"],
    render_as_batch=True,  # SQLite alters a table by copying it; autogenerate writes batch operations
    on_version_apply=config.attributes.get("on_version_apply", ()),
)
with context.begin_transaction():  # the caller's transaction is open: this adds none
    context.run_migrations()
