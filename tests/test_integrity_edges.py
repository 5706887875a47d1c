"""Small data-integrity edges, each failing on the code before its fix: the SQLite one-server
lock under every spelling of the file."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine

from stations.store.db import database_file
from tests.harness import Server, free_port
from tests.test_cli import assert_one_line_error, run_cli

# -- the SQLite lock ---------------------------------------------------------------------------


def _spellings(path: Path) -> list[str]:
    """URLs SQLAlchemy and SQLite open as the file ``path`` (absolute, in ``path.parent``)."""
    return [
        f"sqlite:///{path}",
        f"sqlite:///file:{path}?mode=rwc&uri=true",
        f"sqlite:///file:{path}?uri=true",
        f"sqlite:///file://{path}?uri=1",
        f"sqlite:///file://localhost{path}?uri=true&cache=private",
        f"sqlite:///file:{path.parent}/./{path.name}?uri=true",
        f"sqlite:///file:{path.parent}/%2573tations.db?uri=true",  # %25 -> %, %73 -> s
        f"sqlite:///file:{path.name}?uri=true",  # relative to the working directory
    ]


def test_database_file_is_the_file_sqlite_opens(tmp_path: Path) -> None:
    path = tmp_path / "stations.db"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for url in _spellings(path):
            engine = create_engine(url)
            try:
                with engine.connect() as conn:
                    rows = conn.exec_driver_sql("PRAGMA database_list").fetchall()
            finally:
                engine.dispose()
            opened = next(row[2] for row in rows if row[1] == "main")
            assert opened == str(path), url
            assert database_file(url) == str(path), url
    finally:
        os.chdir(cwd)
    # Files SQLite does not keep: none to lock.
    for url in (
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:///file::memory:?uri=true",
        "sqlite:///file:db1?mode=memory&cache=shared&uri=true",
        "sqlite:///file:?uri=true",
    ):
        assert database_file(url) is None, url
    # Without uri=true SQLAlchemy opens a file literally named so, query dropped.
    assert database_file("sqlite:///file:x.db") == os.path.abspath("file:x.db")


def test_a_second_server_is_refused_whatever_spelling_names_the_file(tmp_path: Path) -> None:
    """A ``file:`` URI was not locked at all: a second server on the same file started, and
    each process's id cache would store a retried message id again."""
    path = tmp_path / "stations-data" / "stations.db"
    path.parent.mkdir()
    first = Server(f"sqlite:///file:{path}?mode=rwc&uri=true", tmp_path).start()
    assert first.proc is not None
    try:
        for url in (f"sqlite:///{path}", f"sqlite:///file://localhost{path}?uri=true"):
            proc = run_cli(["serve", "--port", str(free_port()), "--db", url], tmp_path)
            assert_one_line_error(proc, "another process", f"pid {first.proc.pid}")
    finally:
        first.kill()
    assert not (tmp_path / "file:").exists()  # the URI made a directory of its own scheme
    plain = Server(f"sqlite:///{path}", tmp_path).start()
    try:
        url = f"sqlite:///file:{path}?mode=rwc&uri=true"
        proc = run_cli(["serve", "--port", str(free_port()), "--db", url], tmp_path)
        assert_one_line_error(proc, "another process")
    finally:
        plain.kill()
