"""Station and group ids are never reused: AUTOINCREMENT on SQLite.

PostgreSQL's sequences already are. Without it a station or group created after the newest one
was deleted took its id, and state kept by id in RAM or in other tables (pending message ids, id
runs, a fork's source, a group's leases) could be taken for the new one's.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for table in ("streams", "groups"):
            with op.batch_alter_table(
                table, recreate="always", table_kwargs={"sqlite_autoincrement": True}
            ):
                pass


def downgrade() -> None:
    pass
