"""The review store's Alembic revisions (``versions/``), run at store open by :mod:`nsysan.store.schema`."""
