"""Engines and schema upgrades for SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from sqlalchemy import Connection, Engine, Table, create_engine, event
from sqlalchemy.engine import make_url

DEFAULT_DATA_DIR = "stations-data"
# SQLite writer connection only (readers keep SQLite's defaults: 2 MiB cache each).
WRITER_CACHE_KIB = 32 * 1024  # its page cache: the upper levels of big indexes stay in it
WAL_AUTOCHECKPOINT_PAGES = 10_000  # checkpoint at ~40 MB of WAL instead of SQLite's ~4 MB


def default_url(data_dir: str = DEFAULT_DATA_DIR) -> str:
    return f"sqlite:///{Path(data_dir) / 'stations.db'}"


def normalize_url(url: str) -> str:
    """A plain ``postgresql://`` URL selects the psycopg 3 driver that Stations ships with."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def make_engine(url: str, *, durability: str = "fsync", writer: bool = False) -> Engine:
    """Build an engine. ``writer`` engines take SQLite's write lock when a transaction begins."""
    url = normalize_url(url)
    if is_sqlite(url):
        return _sqlite_engine(url, durability=durability, writer=writer)
    engine = create_engine(
        url,
        pool_size=1 if writer else 8,
        max_overflow=0 if writer else 8,
        pool_pre_ping=True,
    )
    if durability == "process":

        @event.listens_for(engine, "connect")
        def _async_commit(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            # The commit is in PostgreSQL's memory and WAL buffers: it survives a kill -9 of
            # this process, not a crash of the database host.
            with dbapi_conn.cursor() as cur:
                cur.execute("SET synchronous_commit TO off")
            dbapi_conn.commit()

    return engine


def _sqlite_engine(url: str, *, durability: str, writer: bool) -> Engine:
    database = make_url(url).database
    if database and database != ":memory:":
        os.makedirs(os.path.dirname(os.path.abspath(database)), exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": 30},
        pool_size=1 if writer else 8,
        max_overflow=0 if writer else 8,
    )
    synchronous = "FULL" if durability == "fsync" else "NORMAL"

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        # Take transaction control away from pysqlite so BEGIN is ours (SQLAlchemy's recipe).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        # WAL + FULL: every commit is fsynced before it is acknowledged.
        # WAL + NORMAL: the WAL is written on commit (survives kill -9) and fsynced at checkpoints.
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA busy_timeout=30000")
        if writer:
            # Appends with message ids dirty one random leaf of the msg_ids key index per new id.
            # Checkpointing ten times less often copies a page that many commits rewrote into
            # the database file once, with one fsync of it instead of ten.
            cur.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
            cur.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:  # type: ignore[no-untyped-def]
        # The writer takes the write lock up front, so it never has to upgrade a read lock.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN")

    return engine


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option(
        "script_location", str(Path(__file__).resolve().parent / "migrations")
    )
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


# -- what the store's queries ask of the engine (they never name the dialect) -----------------


def mark(conn: Connection) -> str:
    """The driver's positional parameter mark, for SQL sent to the driver's cursor."""
    return "?" if conn.dialect.paramstyle == "qmark" else "%s"


def shared(bind: Connection | Engine) -> bool:
    """Several processes may write this database at once (PostgreSQL): ids are looked up in
    the shared table, rows are locked, and commits are announced to the other processes."""
    return bind.dialect.name == "postgresql"


def row_lock(conn: Connection) -> str:
    """The clause that locks the rows a SELECT reads until the commit; empty where one process
    holds the database's write lock for the whole transaction (SQLite's BEGIN IMMEDIATE)."""
    return " FOR UPDATE" if shared(conn) else ""


def insert_many_sql(conn: Connection, table: Table) -> str | None:
    """One INSERT of many rows with one array parameter per column, for drivers that bind a
    list as an array (PostgreSQL): one round trip and one statement instead of one per row.
    None: insert row by row (executemany)."""
    if not shared(conn):
        return None
    casts = ", ".join(f"%s::{c.type.compile(dialect=conn.dialect)}[]" for c in table.columns)
    columns = ", ".join(c.name for c in table.columns)
    return f"INSERT INTO {table.name} ({columns}) SELECT * FROM unnest({casts})"


_DISK_ERRNOS = {errno.ENOSPC, errno.EIO, errno.EROFS, errno.EDQUOT}


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the database (or the disk under it) failed, so that the request
    was not decided and may be retried, rather than a bug or bad input. Statements run through
    SQLAlchemy raise its wrappers; the hot path's driver-level statements raise the driver's own."""
    import sqlite3

    from sqlalchemy import exc as sa

    if isinstance(exc, sa.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, sa.DBAPIError) and exc.orig is not None:
        exc = exc.orig
    failed = (
        sa.OperationalError,
        sa.InterfaceError,
        sa.DisconnectionError,
        sa.TimeoutError,  # no pooled connection came free in time
        sqlite3.OperationalError,  # disk full, I/O error, locked, read-only, cannot open
        sqlite3.InterfaceError,
    )
    if isinstance(exc, failed):
        return True
    try:
        import psycopg  # the optional PostgreSQL driver
    except ImportError:
        pass
    else:
        # server gone, shut down or refusing connections; connection closed
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return True
    return isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS


def ping(engine: Engine) -> None:
    """Raise unless the database answers a trivial query."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
