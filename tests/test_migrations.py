"""The Alembic migrations form one linear chain, numbered in order, that upgrades an empty
database to head and downgrades it to the first release's schema and back on both engines."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from stations.store import db

VERSIONS = Path(db.__file__).resolve().parent / "migrations"


def _config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(VERSIONS))
    config.set_main_option("sqlalchemy.url", url)
    return config


def test_one_linear_chain_numbered_in_order() -> None:
    script = ScriptDirectory.from_config(_config("sqlite://"))
    assert len(script.get_heads()) == 1, script.get_heads()
    chain = list(reversed(list(script.walk_revisions())))
    revisions = [r.revision for r in chain]
    assert revisions == [f"{n:04d}" for n in range(1, len(revisions) + 1)], revisions
    for r in chain:
        assert Path(r.path).name.startswith(r.revision + "_"), r.path


def test_downgrade_and_upgrade_again(db_url: str) -> None:
    engine = db.make_engine(db_url, writer=True)
    try:
        db.upgrade(engine)
        url = engine.url.render_as_string(hide_password=False)
        command.downgrade(_config(url), "0005")
        command.upgrade(_config(url), "head")
        db.upgrade(engine)  # and the server's own upgrade finds nothing to do
    finally:
        engine.dispose()


def test_downgrade_splits_rows_that_pack_ids(db_url: str) -> None:
    """Before 0011 a row of several messages carried no ids or headers: the downgrade splits
    such a row into one row per message, each with its own id and headers."""
    from sqlalchemy import text

    engine = db.make_engine(db_url, writer=True)
    try:
        db.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO streams (name, content_type, created_at, accessed_at, closed, "
                    "tail, head, deleted, msg_count, byte_count, config) VALUES "
                    "('s', 'application/json', 0, 0, false, 3, 0, false, 3, 9, '{}')"
                )
            )
            sid = conn.execute(text("SELECT id FROM streams WHERE name = 's'")).scalar_one()
            conn.execute(
                text(
                    "INSERT INTO messages (stream_id, seq, data, msg_id, headers, stored_at, span)"
                    " VALUES (:s, 3, :d, :m, :h, 7, 3)"
                ),
                {"s": sid, "d": b'1\n"b"\n{}', "m": "a\n\n" + "c" * 256, "h": '\n{"k":"v"}\n'},
            )
        url = engine.url.render_as_string(hide_password=False)
        command.downgrade(_config(url), "0010")
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT seq, span, data, msg_id, headers, stored_at FROM messages ORDER BY seq"
                )
            ).all()
        assert [tuple(r) for r in rows] == [
            (1, 1, b"1", "a", None, 7),
            (2, 1, b'"b"', None, '{"k":"v"}', 7),
            (3, 1, b"{}", "c" * 256, None, 7),
        ]
        command.upgrade(_config(url), "head")
    finally:
        engine.dispose()
