"""The deadline a lease was fetched with, kept while an extension moves ``due``.

A transaction names a lease by its offset, delivery count and the ``ackDeadline`` its fetch
answered; a lease extension moves the deadline, not the lease's name (nor a seek's floor,
which the fetched deadlines bound).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN (nullable, no default): SQLite does it in place, without copying
    # the table as a batch operation would.
    op.add_column("deliveries", sa.Column("fetched_due", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("fetched_due")
