"""The Alembic migrations form one linear chain, numbered in order, that upgrades an empty
database to head and downgrades it to the first release's schema and back on both engines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
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
    # What a start compares a database's revision with, without importing Alembic.
    assert db.newest_revision() == script.get_current_head()


def test_downgrade_and_upgrade_again(db_url: str) -> None:
    engine = db.make_engine(db_url, writer=True)
    try:
        db.upgrade(engine)
        url = engine.url.render_as_string(hide_password=False)
        command.downgrade(_config(url), "0005")
        db.upgrade(engine)  # the server's own upgrade takes an older schema to head
        with engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == db.newest_revision()
        command.downgrade(_config(url), "0005")
        command.upgrade(_config(url), "head")
        db.upgrade(engine)  # and finds nothing to do at head
    finally:
        engine.dispose()


RESTART = """
import sys
from stations.store import db
engine = db.make_engine(sys.argv[1], writer=True)
db.upgrade(engine)
engine.dispose()
print(sorted({name.split(".")[0] for name in sys.modules} & {"alembic", "mako"}))
"""


def test_a_start_at_the_newest_schema_does_not_import_alembic(db_url: str) -> None:
    """Importing Alembic (and Mako) was 0.4 s of CPU in every start, a third of a restart after
    a crash, though a database at head has nothing to migrate."""
    engine = db.make_engine(db_url, writer=True)
    try:
        db.upgrade(engine)  # a new database: migrated
    finally:
        engine.dispose()
    started = subprocess.run(
        [sys.executable, "-c", RESTART, db_url], capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "[]", started.stdout


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


def test_run_entries_become_chunks_and_back(db_url: str) -> None:
    """0012 stores a run's ids as rows of up to 64 ids in order; its downgrade gives back one
    row per id."""
    from sqlalchemy import text

    engine = db.make_engine(db_url, writer=True)
    try:
        url = engine.url.render_as_string(hide_password=False)
        command.upgrade(_config(url), "0011")
        entries = [(f"id-{k:04d}", k + 1, 1000 + k) for k in range(300)]
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO id_runs VALUES (7, 1, 300, 1000, 1299)"))
            conn.execute(
                text("INSERT INTO id_run_entries VALUES (7, 1, :m, :s, :t)"),
                [{"m": m, "s": s, "t": t} for m, s, t in reversed(entries)],
            )
        command.upgrade(_config(url), "head")
        with engine.connect() as conn:
            chunks = conn.execute(
                text("SELECT first_id, ids, msg_ids FROM id_run_chunks ORDER BY first_id")
            ).all()
        assert [(f, n) for f, n, _ in chunks][-2:] == [("id-0192", 64), ("id-0256", 44)]
        assert bytes(chunks[-1][2]).decode().split("\n") == [m for m, _, _ in entries[256:]]
        command.downgrade(_config(url), "0011")
        with engine.connect() as conn:
            back = conn.execute(
                text("SELECT msg_id, seq, stored_at FROM id_run_entries ORDER BY msg_id")
            ).all()
        assert [tuple(r) for r in back] == entries
        command.upgrade(_config(url), "head")
    finally:
        engine.dispose()


def test_station_and_group_ids_are_never_reused(tmp_path: Path) -> None:
    """SQLite hands out max(id) + 1 unless a table has AUTOINCREMENT: a station (or group)
    created after the newest one was deleted took its id. 0015 rebuilds both tables with
    AUTOINCREMENT, keeping their rows and ids."""
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'ids.db'}"
    command.upgrade(_config(url), "0014")
    engine = create_engine(url)
    stream = (
        "INSERT INTO streams (name, content_type, created_at, accessed_at, closed, tail, head, "
        "deleted, msg_count, byte_count, config) VALUES "
        "(:name, 'application/json', 0, 0, false, 0, 0, false, 0, 0, '{}')"
    )
    group = (
        "INSERT INTO groups (stream_id, name, max_ack_time_ms, max_msg_deliveries, cursor, "
        "created_at) VALUES (1, :name, 30000, 2, 0, 0)"
    )
    try:
        with engine.begin() as conn:
            for name in ("a", "b"):
                conn.execute(text(stream), {"name": name})
                conn.execute(text(group), {"name": name})
        command.upgrade(_config(url), "head")
        with engine.begin() as conn:
            assert conn.execute(text("SELECT id, name FROM streams ORDER BY id")).all() == [
                (1, "a"),
                (2, "b"),
            ]
            assert conn.execute(text("SELECT id, name FROM groups ORDER BY id")).all() == [
                (1, "a"),
                (2, "b"),
            ]
            conn.execute(text("DELETE FROM streams WHERE id = 2"))
            conn.execute(text("DELETE FROM groups WHERE id = 2"))
            conn.execute(text(stream), {"name": "c"})
            conn.execute(text(group), {"name": "c"})
            assert conn.execute(text("SELECT id FROM streams WHERE name = 'c'")).scalar() == 3
            assert conn.execute(text("SELECT id FROM groups WHERE name = 'c'")).scalar() == 3
    finally:
        engine.dispose()


def test_each_migrations_summary_is_one_line() -> None:
    """Alembic logs a migration's docstring summary (up to its first blank line) at info: a
    summary of two lines put a line without time or level in the log of a first start or an
    upgrade (found by a review), which breaks one-record-per-line log readers."""
    import ast

    versions = Path(__file__).resolve().parent.parent / "stations/store/migrations/versions"
    long = []
    for path in sorted(versions.glob("0*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "\n" in doc.split("\n\n")[0]:
            long.append(path.name)
    assert long == []
