"""Producer sessions found by the time they were last written.

``ix_producers_updated_at``: the producer expiry (``stations serve --producer-expiry-ms``)
deletes the sessions idle past it by an index range scan, however many are live.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_producers_updated_at", "producers", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_producers_updated_at", table_name="producers")
