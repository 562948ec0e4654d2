"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    # alter a table inside op.batch_alter_table(...) (SQLite copies the table); end by recording the next
    # schema number in nsysan_meta, which older nsysan read to refuse the store:
    # op.execute(sa.text("UPDATE nsysan_meta SET value = 'N' WHERE key = 'schema_version'"))
    ${upgrades if upgrades else "pass"}
