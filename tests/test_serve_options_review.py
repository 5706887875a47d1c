"""Operating mistakes from a review of 2026-11-29: each is one line and the exit code a
supervisor can act on, never a traceback or a wrong message.

- A PostgreSQL URL with an option libpq does not know, or a value it refuses, exited 1 (a
  supervisor restarts for ever); it is a bad command line: exit 2.
- An empty ``--host`` (an unset variable in ``--host "$HOST"``) bound every interface.
- ``stations backup`` into the database's own WAL file wrote the copy there, SQLite deleted it
  when the source closed, and the command said "no database"."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests import clikit
from tests.clikit import failed


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("bogusopt=1", 'invalid connection option "bogusopt"'),
        ("sslmode=bogus", "invalid sslmode value"),
    ],
)
def test_a_postgresql_url_option_libpq_refuses_is_a_usage_error(query: str, said: str) -> None:
    proc = clikit.run(
        "serve", "--port", "1", "--db", f"postgresql://postgres@127.0.0.1:5432/test?{query}"
    )
    failed(proc, 2, "--db", said)


def test_an_empty_host_is_refused() -> None:
    proc = clikit.run("serve", "--port", "1", "--insecure", env={"STATIONS_HOST": ""})
    failed(proc, 2, "--host", "empty")


def test_a_backup_into_the_databases_own_files_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x)")
    for suffix in ("-wal", "-shm", "-journal"):
        proc = clikit.run("backup", "--db", f"sqlite:///{db}", f"{db}{suffix}")
        failed(proc, 1, "a file of the database itself")
        assert not Path(f"{db}{suffix}").exists()
