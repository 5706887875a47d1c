"""Lease names kept through extensions, and a bound on names given before a lowered ack time.

``deliveries.fetched_due``: the deadline a lease was fetched with, kept while an extension
moves ``due``; ``groups.names_bound``: a bound on the lease names a group handed out before its
ack time was lowered. A transaction names a lease by its offset, delivery count and the
``ackDeadline`` its fetch answered; an extension moves the deadline, not the lease's name (nor
a seek's floor, which the fetched deadlines bound). A fence (a seek, a DLS replay) lifts the
group's lease floor above every name handed out, those given with a longer ack time than the
group's current one included.

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
    op.add_column(
        "groups", sa.Column("names_bound", sa.BigInteger, nullable=False, server_default="0")
    )


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("names_bound")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("fetched_due")
