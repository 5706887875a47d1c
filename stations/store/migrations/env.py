"""Alembic environment: runs on the connection handed in by ``stations.store.db.upgrade``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, text

from stations.store.schema import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Several `stations serve` processes may start at once against one database.
            connection.execute(text("SELECT pg_advisory_xact_lock(4437)"))
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("alembic: no connection handed in and no sqlalchemy.url configured")
    engine = create_engine(url)
    with engine.connect() as conn:
        _run(conn)
