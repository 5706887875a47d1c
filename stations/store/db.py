"""Engines and schema upgrades for SQLite (embedded default) and PostgreSQL.

This is the store's engine code: the one place that asks which database it is talking to.
The store's queries ask it for what differs (a parameter mark, a row lock, an advisory lock),
never for the dialect's name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Executable,
    Table,
    create_engine,
    event,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.engine import make_url as _make_url

# What a bad --db URL or an unreachable database raises, for the CLI's one-line errors.
from sqlalchemy.exc import ArgumentError as ArgumentError
from sqlalchemy.exc import OperationalError as OperationalError

DEFAULT_DATA_DIR = "stations-data"
# SQLite writer connection only (readers keep SQLite's defaults: 2 MiB cache each).
WRITER_CACHE_KIB = 32 * 1024  # its page cache: the upper levels of big indexes stay in it
# Checkpoint at ~40 MB of WAL instead of SQLite's ~4 MB: by a thread of its own (see
# stations.store.checkpoints), or by SQLite inside the writer's commits if that cannot start.
WAL_AUTOCHECKPOINT_PAGES = 10_000
# PostgreSQL: what the planner charges for a random page read, against 1.0 for a sequential
# one. The default (4.0) models cold spinning disks; the store's hot key ranges (recent ids,
# recent messages, leases) are in cache, where an index probe costs about a sequential read.
RANDOM_PAGE_COST = 1.1
# PostgreSQL statistics are refreshed (``analyze_grown``) once a table has changed by this many
# rows plus this fraction of its size since its last ANALYZE, like autoanalyze's defaults.
ANALYZE_ROWS, ANALYZE_FRACTION = 200, 0.1


def make_url(url: str | URL) -> URL:
    """SQLAlchemy's ``make_url``, whose ``ValueError`` for a port that is no number (it crashed
    ``stations serve`` with a traceback) is an ``ArgumentError`` like any other malformed URL."""
    try:
        return _make_url(url)
    except ValueError as exc:
        raise ArgumentError(f"malformed URL ({exc})") from None


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


def snapshot_options(url: str) -> dict[str, Any]:
    """Execution options of a read transaction whose statements must see one state of the
    database. SQLite's read transaction does; PostgreSQL's default, READ COMMITTED, gives each
    statement the commits made before it: another process's retention committed between a
    read's bounds and its rows (a catch-up read answered 200 from later messages, not 410),
    and a group deleted between a listing's rows and their figures failed /metrics with a
    500. REPEATABLE READ takes one snapshot per transaction, and a read-only one never fails
    to serialize (psycopg sets it on the connection object: no statement more)."""
    return {} if is_sqlite(url) else {"isolation_level": "REPEATABLE READ"}


@dataclass(frozen=True)
class NotServable:
    """Why Stations cannot serve the database a URL names: ``reason`` in one line, and
    ``driver``, the package to install when a missing driver is the reason (PostgreSQL's is
    the optional extra ``stations-streams[postgresql]``)."""

    reason: str
    driver: str | None = None


def why_not_servable(url: str) -> NotServable | None:
    """Why Stations cannot store on the database a URL names, or None: its SQL is SQLite's and
    PostgreSQL's (another database failed on connecting, with a message about a driver or a
    setting), SQLite needs a file (in memory, each connection would see a database of its
    own), and PostgreSQL needs its driver. None too for no URL at all, which the service
    reports as "--db is not a database URL"."""
    import importlib.util

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    # From the name alone, before anything loads a dialect (one SQLAlchemy does not know fails).
    backend = parsed.drivername.partition("+")[0]
    if backend == "sqlite":
        if database_file(url) is None:
            return NotServable(
                "an in-memory SQLite database cannot be served (each connection would see one "
                "of its own): give a file, e.g. sqlite:///data/stations.db"
            )
        return None
    if backend not in ("postgresql", "postgres"):
        return NotServable(f"Stations stores on SQLite or PostgreSQL, not {backend}")
    if importlib.util.find_spec("psycopg") is None:  # either spelling: normalize_url picks it
        return NotServable("the psycopg driver is not installed", driver="psycopg")
    return None


def describe(url: str) -> str:
    """Where the data goes, for the start-up line: the SQLite file's absolute path (a relative
    URL, the default one included, depends on the working directory), or PostgreSQL's
    ``user@host:port/database`` without the password."""
    parsed = make_url(normalize_url(url))
    backend = parsed.get_backend_name()
    path = database_file(url)
    if path is not None:
        return f"{backend}: {path}"
    user = f"{parsed.username}@" if parsed.username else ""
    host = parsed.host or parsed.query.get("host") or "localhost"  # ?host=/run/postgresql
    host = host if isinstance(host, str) else ",".join(host)
    return f"{backend}: {user}{host}:{parsed.port or 5432}/{parsed.database}"


def embedded(url: str) -> bool:
    """One process owns the database (SQLite): process-local indexes of stored data are safe.
    Otherwise several ``stations serve`` processes may write it at once."""
    return is_sqlite(normalize_url(url))


def listen_dsn(url: str) -> str | None:
    """Where to LISTEN for other processes' commits, or None when no other process writes."""
    if embedded(url):
        return None
    from psycopg.conninfo import make_conninfo  # only PostgreSQL has other processes

    # The parameters the engine's own connections use, quoted for libpq. The URL rendered
    # again spelled a space as "+", which libpq does not decode: with options=-c ... in the
    # URL every LISTEN failed, and waiters slept out their timeouts.
    parsed = make_url(normalize_url(url))
    args, params = parsed.get_dialect()().create_connect_args(parsed)
    return make_conninfo(*args, **params)


class Tx(Protocol):
    """An open transaction as the domain holds it: a token handed back to the store's queries
    (a reader's connection, or the writer's ``Batch.conn``). Only the store looks inside."""


def conn_of(tx: Tx) -> Connection:
    return cast(Connection, tx)


def _postgresql(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def greatest(conn: Connection) -> str:
    """The SQL function of the largest of its arguments."""
    return "GREATEST" if _postgresql(conn) else "max"


def by_code_point(conn: Connection, column: Any) -> Any:
    """``column`` compared and ordered by code point on both engines: SQLite's BINARY
    collation does, a PostgreSQL database's linguistic one (ICU, en_US) does not."""
    return column.collate("C") if _postgresql(conn) else column


def name_page(
    conn: Connection,
    query: Any,
    column: Any,
    after: str | None,
    prefix: str,
    contains: str,
    limit: int,
) -> Any:
    """``query`` (a select) narrowed to one page of a list by name: up to ``limit`` rows, by
    ``column`` in code point order, after ``after`` (see ``name_filter``)."""
    name = by_code_point(conn, column)
    if after is not None:
        query = query.where(name > after)
    return name_filter(conn, query, column, prefix, contains).order_by(name).limit(limit)


def name_filter(conn: Connection, query: Any, column: Any, prefix: str, contains: str) -> Any:
    """``query`` narrowed to the names in ``column`` that start with ``prefix`` (exactly) and
    hold ``contains`` (ignoring case: ASCII letters' on SQLite, all on PostgreSQL; a % or _ is
    a character). The prefix is also a range of names in code point order, so an index on the
    name (after the columns ``query`` fixes, such as the station's) seeks to it and stops past
    it, instead of reading every name after it."""
    if prefix:
        name = by_code_point(conn, column)
        query = query.where(func.substr(column, 1, len(prefix)) == prefix, name >= prefix)
        beyond = _past_prefix(prefix)
        if beyond is not None:
            query = query.where(name < beyond)
    if contains:
        query = query.where(column.icontains(contains, autoescape=True))
    return query


def _past_prefix(prefix: str) -> str | None:
    """The first name in code point order after every name that starts with ``prefix`` (its
    last character's successor; a surrogate is no character, so after U+D7FF comes U+E000),
    or None when there is none (the prefix is all U+10FFFF)."""
    for end in range(len(prefix) - 1, -1, -1):
        point = ord(prefix[end]) + 1
        if point == 0xD800:
            point = 0xE000
        if point <= 0x10FFFF:
            return prefix[:end] + chr(point)
    return None


def lock_name(conn: Connection, name: str) -> None:
    """Serialize, until the commit, every process's transactions that take this name (a create
    of one stream name). One process alone (SQLite's single writer) needs no lock."""
    if _postgresql(conn):
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(name, 0))))


def analyze(conn: Connection, tables: list[str] | None = None) -> None:
    """Refresh the planner's statistics, so plans never depend on the server's autoanalyze
    (PostgreSQL with autovacuum off has none on new tables, and its planner then scans every
    stored id of a station instead of probing the primary key). SQLite's planner prefers the
    key without statistics."""
    if _postgresql(conn):
        conn.execute(text("ANALYZE " + ", ".join(tables) if tables else "ANALYZE"))


def analyze_grown(engine: Engine) -> list[str]:
    """ANALYZE the store's tables that were never analyzed or changed enough since their last
    ANALYZE (PostgreSQL; the scheduler calls this at start and now and then); returns their
    names."""
    if engine.dialect.name != "postgresql":
        return []
    from stations.store.schema import metadata

    with engine.connect() as conn:
        grown = list(
            conn.execute(
                text(
                    "SELECT relname FROM pg_stat_user_tables "
                    "WHERE schemaname = current_schema() AND relname = ANY(:names) "
                    "AND (n_mod_since_analyze > :rows + :fraction * GREATEST(n_live_tup, 0) "
                    "OR (last_analyze IS NULL AND last_autoanalyze IS NULL)) "
                    "ORDER BY relname"
                ),
                {
                    "names": sorted(metadata.tables),
                    "rows": ANALYZE_ROWS,
                    "fraction": ANALYZE_FRACTION,
                },
            ).scalars()
        )
        if grown:
            # Names from the schema, not from outside: safe to splice.
            analyze(conn, grown)
            conn.commit()
    return grown


PG_CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # ms: data sent and never acknowledged
}


# How long a statement may wait for a lock on PostgreSQL (see ``make_engine``): far beyond
# what one Stations process holds another's up (a batch's milliseconds).
LOCK_TIMEOUT_MS = 10_000


def make_engine(url: str, *, durability: str = "fsync", writer: bool = False) -> Engine:
    """Build an engine. ``writer`` engines take SQLite's write lock when a transaction begins."""
    url = normalize_url(url)
    if is_sqlite(url):
        return _sqlite_engine(url, durability=durability, writer=writer)
    # libpq's defaults wait for ever on a database host that went silent (a partition, a
    # dead host): connecting gives up, and an idle or busy connection is found dead, in
    # seconds. The URL's own settings win.
    given = make_url(url).query
    connect_args = {k: v for k, v in PG_CONNECT_DEFAULTS.items() if k not in given}
    engine = create_engine(
        url,
        pool_size=1 if writer else 8,
        max_overflow=0 if writer else 8,
        pool_pre_ping=True,
        connect_args=connect_args,
    )
    settings = [f"SET random_page_cost TO {RANDOM_PAGE_COST}"]
    if durability == "process":
        # The commit is in PostgreSQL's memory and WAL buffers: it survives a kill -9 of
        # this process, not a crash of the database host.
        settings.append("SET synchronous_commit TO off")

    @event.listens_for(engine, "connect")
    def _settings(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        with dbapi_conn.cursor() as cur:
            for statement in settings:
                cur.execute(statement)
            # A lock another session holds (an open transaction's LOCK TABLE, a VACUUM FULL,
            # a migration) stopped the writer, and with it every station's writes, for as long
            # as it was held: no answer, no log line. Waits end after LOCK_TIMEOUT_MS (a 503
            # the clients retry) unless the URL, the role or the database set a limit.
            cur.execute("SHOW lock_timeout")
            row = cur.fetchone()
            if row is not None and row[0] == "0":
                cur.execute(f"SET lock_timeout TO {int(LOCK_TIMEOUT_MS)}")
        dbapi_conn.commit()

    return engine


def make_data_dir(database: str) -> None:
    """The directory of an embedded database, made private (0700, as PostgreSQL insists on for
    its own) when it has to be made: the database, its WAL and lock hold users' messages. One
    that exists keeps the mode its owner gave it, so the database file is made private too
    (0600; SQLite gives its WAL and shared-memory files the database's mode): in a directory
    that already existed (``/var/lib/stations``) the umask's 0644 let every local account read
    the messages and the webhook signing key."""
    _make_private_dirs(os.path.dirname(database) or ".")
    _create_private(database)


def _make_private_dirs(path: str) -> None:
    """``os.makedirs`` with 0700 for every directory it makes: makedirs gives the mode to the
    last one only, its parents the umask's (``newdir/sub``: ``newdir`` was 0755)."""
    missing: list[str] = []
    while path and not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            os.mkdir(directory, 0o700)


def _create_private(path: str) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (an empty file is an empty
    SQLite database); one that exists keeps its mode. What fails here fails again, and is told
    better, where the file is opened."""
    with contextlib.suppress(OSError):
        _new_private_file(path)


def _new_private_file(path: str) -> None:
    """Create ``path`` empty with mode 0600; raises ``FileExistsError`` if it exists."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _sqlite_engine(url: str, *, durability: str, writer: bool) -> Engine:
    database = database_file(url)
    if database is not None:
        make_data_dir(database)
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
        _record.info["synchronous"] = synchronous
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


def database_file(url: str) -> str | None:
    """The file an embedded database lives in (None: a server database, or one in memory or
    temporary), however the URL spells it: a path, or a SQLite URI (``file:...?uri=true``)."""
    parsed = make_url(normalize_url(url))
    if parsed.get_backend_name() != "sqlite":
        return None
    # The very name the driver opens, as SQLAlchemy builds it from the URL: without
    # ``uri=true`` a ``file:`` name is a plain (relative) file name, query dropped.
    (filename, *_), options = parsed.get_dialect()().create_connect_args(parsed)
    if options.get("uri") and filename and filename.startswith("file:"):
        return _uri_file(filename)
    if filename in (None, "", ":memory:"):
        return None
    return os.path.abspath(filename)


class BackupFailed(Exception):
    """The database could not be copied (see ``backup``)."""


def backup(url: str, dest: str) -> int:
    """Copy the embedded database ``url`` names into the new file ``dest`` (made 0600), while a
    server may be writing to it; return the copy's size in bytes. The copy holds every
    transaction committed when it began, WAL included (SQLite's online backup reads inside one
    read transaction; with WAL the server's writes go on meanwhile). A plain copy of the
    database file of a running server misses what is still in its WAL: all of it, until a
    checkpoint. Raises ``ValueError`` for a server database, ``FileNotFoundError`` for a
    database that does not exist, ``FileExistsError`` for a ``dest`` that does, and
    ``BackupFailed`` when the database cannot be read or the copy is not sound."""
    import sqlite3

    path = database_file(url)
    if path is None:
        raise ValueError("only an embedded (SQLite) database is copied this way")
    # os.stat, not isfile: a data directory this user may not enter is a PermissionError
    # (an OSError, "the backup failed: ... Permission denied"), not "no database".
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "no database file", path) from None
    if not stat.S_ISREG(found.st_mode):
        raise FileNotFoundError(errno.ENOENT, "no database file", path)
    # The database's own companions: a copy written into its WAL was deleted by SQLite when
    # the source closed, and the command said "no database".
    real = os.path.realpath(path)
    if os.path.realpath(dest) in {
        real + suffix for suffix in ("-wal", "-shm", "-journal", ".lock")
    }:
        raise BackupFailed(f"{dest} is a file of the database itself: give a new file elsewhere")
    try:
        _new_private_file(dest)
    except FileNotFoundError as exc:  # the database is there: DEST's folder is not
        folder = os.path.dirname(os.path.abspath(dest))
        if dest and not os.path.isdir(folder):
            raise BackupFailed(f"cannot create {dest}: no folder {folder}") from None
        raise BackupFailed(f"cannot create {dest!r}: {exc.strerror}") from None
    try:
        source = sqlite3.connect(path, timeout=30)
        try:
            copy = sqlite3.connect(dest)
            try:
                source.backup(copy)
                (check,) = copy.execute("PRAGMA quick_check").fetchone()
                if check != "ok":
                    said = "; ".join(
                        line.strip() for line in str(check).splitlines() if line.strip()
                    )
                    raise BackupFailed(f"the copy failed its check: {said}")
            finally:
                copy.close()
        finally:
            source.close()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.remove(dest)
        if isinstance(exc, sqlite3.Error):
            raise BackupFailed(str(exc)) from exc
        raise
    return os.path.getsize(dest)


def _uri_file(uri: str) -> str | None:
    """The file a SQLite URI opens, read as SQLite reads it (sqlite.org/uri.html): the path
    ends at ``?`` or ``#`` and is %-decoded; an authority may only be empty or localhost."""
    from urllib.parse import parse_qs, unquote

    rest, _, query = uri[len("file:") :].partition("#")[0].partition("?")
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        if authority not in ("", "localhost"):
            raise ArgumentError(f"SQLite URI authority {authority!r} is not localhost")
        rest = slash + path
    path = unquote(rest)
    if path in ("", ":memory:") or "memory" in parse_qs(query).get("mode", []):
        return None
    return os.path.abspath(path)


class InUse(Exception):
    """Another process serves this embedded database."""


def claim_file(url: str) -> Any:
    """Make this process the only server of an embedded database: an exclusive lock on a file
    beside it, held until the returned file is closed (or the process ends, ``kill -9``
    included). Each process keeps recent message ids in its own RAM, so a second process on
    one SQLite file would store a retried id again. None for a server database (PostgreSQL
    serves many processes); raises ``InUse`` naming the holder's pid."""
    import fcntl

    path = database_file(url or default_url())
    if path is None:
        return None
    make_data_dir(path)
    path = os.path.realpath(path)  # one lock per file, whatever name (symlink) it is given by
    with contextlib.suppress(FileNotFoundError):
        links = os.stat(path).st_nlink
        if links > 1:
            # The lock is named after the path: a server started on another name would take
            # a lock of its own and serve the same file beside this one, each with its own WAL
            # and message ids (SQLite's "How To Corrupt" names hard links too).
            raise Unusable(
                f"{path} has {links - 1} other hard link(s): a server started on another name "
                "would not see this one's lock and would serve the same file beside it; remove "
                "the other names, or make them symbolic links"
            )
    _create_private(path + ".lock")
    lock = open(path + ".lock", "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise InUse(f"{path} is served by another process (pid {holder})") from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def checkpoint_in_commits(conn: Connection, pages: int) -> None:
    """SQLite: whether this connection's commits checkpoint the WAL once it holds ``pages``
    frames (0: never; another connection does, see stations.store.checkpoints)."""
    raw = conn.connection.dbapi_connection
    assert raw is not None
    # On the driver's connection, outside any transaction: SQLAlchemy would open one.
    raw.cursor().execute(f"PRAGMA wal_autocheckpoint={int(pages)}")


class Unusable(Exception):
    """A database this process cannot serve, whatever the command line: a schema this version
    does not know, or no right to write."""


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision, and make sure this process may write:
    raises ``Unusable`` for a schema revision it does not know (left untouched), another
    application's SQLite file, or a database that refuses writes."""
    from sqlalchemy.exc import DBAPIError

    refuse_foreign(str(engine.url))
    try:
        _migrate(engine)
    except DBAPIError as exc:
        # A read-only database that still needs its migrations (or, SQLite, its WAL mode)
        # said "cannot reach the database", the words of an outage: say what it is.
        if disk_full(exc):
            # Said "cannot reach the database", pointing at the network, not at the disk.
            where = database_file(str(engine.url)) or "the database"
            raise Unusable(
                f"cannot write to the database: the disk holding {where} is full ({_reason(exc)})"
            ) from None
        if not _refused_as_read_only(exc):
            raise
        raise Unusable(f"cannot write to the database (is it read-only?): {_reason(exc)}") from None


def disk_full(exc: Any) -> bool:
    """SQLite's SQLITE_FULL (PostgreSQL's disk_full, 53100, too)."""
    import sqlite3

    orig = getattr(exc, "orig", exc)
    if isinstance(orig, sqlite3.OperationalError):
        return getattr(orig, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or (
            "disk is full" in str(orig)
        )
    return getattr(orig, "sqlstate", None) == "53100"


def refuse_foreign(url: str | None) -> None:
    """Raise ``Unusable`` for a path that is no SQLite database (a folder, another kind of
    file) or is another application's SQLite file (see ``_foreign_tables``): before
    anything, the lock file beside it included, is done to it."""
    path = database_file(url or default_url())
    try:
        mode = os.stat(path).st_mode if path is not None else None
    except OSError:  # none yet (it is made), or unreadable (the engine's start says why)
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise Unusable(f"{path} is a folder: give --db a database file (a new one is made)")
    if mode is not None and not stat.S_ISREG(mode):
        # A named pipe would block the start for ever at its first read.
        raise Unusable(f"{path} is not a regular file: give --db a database file")
    if path is not None and not _sqlite_or_empty(path):
        raise Unusable(
            f"{path} is not an SQLite database (it does not begin as one): give --db a new "
            "file, or restore this one from a backup"
        )
    found = _foreign_tables(path)
    if found:
        raise Unusable(
            f"the file holds tables ({', '.join(found[:5])}{', ...' if len(found) > 5 else ''}) "
            "but no Stations schema: it is another application's database; give --db a new file"
        )


def _sqlite_or_empty(path: str) -> bool:
    """Whether ``path`` is an SQLite database file (by its header), an empty file or none;
    one that cannot be read counts as one (the engine's start says why)."""
    try:
        with open(path, "rb") as file:
            head = file.read(16)
    except OSError:
        return True
    return not head or head == b"SQLite format 3\x00"


def _foreign_tables(path: str | None) -> list[str]:
    """The tables of an SQLite file that has no schema revision: another application's, which
    the migrations would add Stations' tables to. Read through a read-only connection of its
    own, before the engine's first connection switches the file to WAL. (A PostgreSQL database
    may be shared with other applications' tables; a name both use fails the migration.)"""
    import sqlite3

    if path is None or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.Error:  # no database at all, or unreadable: the engine's start says which
        return []
    names = {str(name) for (name,) in rows}
    if "alembic_version" in names:
        return []
    return sorted(name for name in names if not name.startswith("sqlite_"))


MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def newest_revision() -> str:
    """The newest migration's revision, from the file names: each revision is its file's
    number (tests/test_migrations.py holds the chain to that)."""
    return max(p.name.split("_", 1)[0] for p in (MIGRATIONS / "versions").glob("[0-9]*_*.py"))


def _schema_revision(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return None if revision is None else str(revision)


def _migrate(engine: Engine) -> None:
    from sqlalchemy.exc import DBAPIError

    with engine.begin() as conn:
        # A process starting while another migrates waits for it however long it takes
        # (LOCK_TIMEOUT_MS is for serving; this start would fail and be restarted).
        _wait_for_locks_at_most(conn, 0)
        # A database at the newest revision (every start but a new database's or an
        # upgrade's) is not handed to Alembic: importing it is 0.4 s of CPU, about a third of
        # a restart after a crash. One migrating meanwhile shows its old revision here (its
        # transaction has not committed), so this start goes on to wait for it in Alembic.
        before = _schema_revision(conn)
        if before != newest_revision():
            _upgrade(conn, before)
        # A read-only database (a file the service's user may not write, a hot standby) was
        # served as healthy while every write failed: try one write now.
        try:
            probe_write(conn)
        except DBAPIError as exc:
            raise Unusable(
                f"cannot write to the database (is it read-only?): {_reason(exc)}"
            ) from None


def _upgrade(conn: Connection, before: str | None) -> None:
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    script = ScriptDirectory.from_config(cfg)
    if before is not None and before not in {r.revision for r in script.walk_revisions()}:
        raise Unusable(
            f"the database's schema is at revision {before}, which this version of "
            f"Stations (schema revision {script.get_current_head()}) does not know: a newer "
            "version of Stations upgraded it (run that version), or it is another "
            "application's database"
        )
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")
    if MigrationContext.configure(conn).get_current_revision() != before:
        # New or changed tables: statistics before the first statement plans on them.
        # Otherwise start-up is not held up; the scheduler refreshes what grew.
        analyze(conn)


def _reason(exc: Any) -> str:
    return str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)


def _refused_as_read_only(exc: Any) -> bool:
    """PostgreSQL's read_only_sql_transaction (a hot standby, default_transaction_read_only),
    or SQLite's "attempt to write a readonly database"."""
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) == "25006" or "readonly database" in str(orig)


# -- what the store's queries ask of the engine (they never name the dialect) -----------------


def mark(conn: Connection) -> str:
    """The driver's positional parameter mark, for SQL sent to the driver's cursor."""
    return "?" if conn.dialect.paramstyle == "qmark" else "%s"


def int_list_match(conn: Connection, column: str) -> str:
    """A clause matching ``column`` against a list of integers sent as ONE parameter (see
    ``int_list``), so a statement costs the same whatever the list's length."""
    if _postgresql(conn):
        return f"{column} = ANY(%s::bigint[])"
    return f"{column} IN (SELECT value FROM json_each(?))"


def int_list(conn: Connection, values: list[int]) -> Any:
    """The parameter of ``int_list_match``."""
    return list(values) if _postgresql(conn) else "[" + ",".join(map(str, values)) + "]"


def int_rows(conn: Connection) -> str:
    """A row source ``(a)`` of integers sent as ONE parameter (see ``int_list``), for a
    statement that probes an index once per integer of any number of them."""
    if _postgresql(conn):
        return "SELECT * FROM unnest(%s::bigint[]) AS p (a)"
    return "SELECT value AS a FROM json_each(?)"


def int_pairs_rows(conn: Connection) -> str:
    """A row source ``(a, b)`` of integer pairs sent as two parameters on PostgreSQL, one on
    SQLite (see ``int_pairs``), for an INSERT ... SELECT of any number of rows in one
    statement. SQLite takes one JSON array of pairs: two arrays joined on their keys compared
    every key with every other (0.5 s for 2,500 pairs)."""
    if _postgresql(conn):
        return "SELECT * FROM unnest(%s::bigint[], %s::bigint[]) AS p (a, b)"
    return (
        "SELECT json_extract(value, '$[0]') AS a, json_extract(value, '$[1]') AS b "
        "FROM json_each(?)"
    )


def int_pairs(conn: Connection, pairs: list[tuple[int, int]]) -> tuple[Any, ...]:
    """The parameters of ``int_pairs_rows``."""
    if not _postgresql(conn):
        return ("[" + ",".join(f"[{a},{b}]" for a, b in pairs) + "]",)
    return [a for a, _ in pairs], [b for _, b in pairs]


@contextlib.contextmanager
def relaxed_transaction(conn: Connection) -> Iterator[None]:
    """A transaction whose commit need not wait for the disk: its writes survive a crash of
    this process (they are in the operating system's hands) but not a power cut. SQLite: WAL +
    NORMAL for this commit (set before BEGIN, as SQLite requires, and restored after it; the
    next fsync, of any commit or checkpoint, covers it); PostgreSQL: ``synchronous_commit =
    off`` for this transaction."""
    if _postgresql(conn):
        with conn.begin():
            conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            yield
        return
    pooled = conn.connection
    if pooled.info.get("synchronous") != "FULL":  # --durability process: never waits anyway
        with conn.begin():
            yield
        return
    # On the driver's connection, outside any transaction: a statement through SQLAlchemy
    # would open one.
    raw = pooled.dbapi_connection
    assert raw is not None
    raw.cursor().execute("PRAGMA synchronous=NORMAL")
    try:
        with conn.begin():
            yield
    finally:
        try:
            raw.cursor().execute("PRAGMA synchronous=FULL")
        except Exception:
            # A connection that might still skip fsyncs must never write again.
            conn.invalidate()
            raise


def modifying_ctes(conn: Connection) -> bool:
    """Whether a statement may carry an INSERT or DELETE in a WITH clause (PostgreSQL), so two
    writes cost one round trip."""
    return _postgresql(conn)


def arrays(conn: Connection) -> bool:
    """Whether the database has arrays that ``unnest`` turns into rows and the driver binds a
    Python list as an array (PostgreSQL with psycopg), so that any number of rows goes in one
    statement with one parameter per column."""
    return _postgresql(conn)


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
    if not arrays(conn):
        return None
    casts = ", ".join(f"%s::{c.type.compile(dialect=conn.dialect)}[]" for c in table.columns)
    columns = ", ".join(c.name for c in table.columns)
    return f"INSERT INTO {table.name} ({columns}) SELECT * FROM unnest({casts})"


_DISK_ERRNOS = {errno.ENOSPC, errno.EIO, errno.EROFS, errno.EDQUOT}


def connection_lost(conn: Connection, exc: BaseException) -> bool:
    """Whether ``exc`` left ``conn`` unusable: SQLAlchemy invalidated it, or (a driver-level
    statement of the hot path, which SQLAlchemy does not watch) the driver says it is."""
    if conn.invalidated:
        return True
    if not unavailable(exc):
        return False
    try:
        dbapi = conn.connection.dbapi_connection
    except Exception:
        return True
    lost = bool(getattr(dbapi, "broken", False) or getattr(dbapi, "closed", False))
    if lost:
        conn.invalidate()
    return lost


def transaction_id(conn: Connection) -> int | None:
    """PostgreSQL: the id of the transaction open on ``conn``, to learn its outcome should the
    connection be lost while it commits (``outcome``). None on SQLite, whose commit is local: it
    happened or it raised."""
    if not _postgresql(conn):
        return None
    cursor = conn.connection.cursor()
    try:
        # None for a transaction that wrote nothing: its outcome changes nothing either.
        cursor.execute("SELECT txid_current_if_assigned()")
        row = cursor.fetchone()
    finally:
        cursor.close()
    return int(row[0]) if row and row[0] is not None else None


def end_backend(conn: Connection, pid: int) -> None:
    """Signal PostgreSQL server process ``pid`` (one of this role's own connections) to end."""
    with conn.begin():
        conn.exec_driver_sql("SELECT pg_terminate_backend(%s)", (pid,))


def outcome(conn: Connection, xid: int) -> str | None:
    """What became of PostgreSQL transaction ``xid``: ``committed``, ``aborted``, ``in
    progress``, or None when the server no longer knows (far older than any commit in doubt)."""
    with conn.begin():
        status = conn.exec_driver_sql("SELECT txid_status(%s)", (xid,)).scalar()
    return None if status is None else str(status)


def rows_changed(conn: Connection | None) -> int | None:
    """SQLite: the rows ``conn`` has changed since it was opened; None elsewhere, or without a
    usable connection."""
    if conn is None or conn.closed or conn.invalidated or _postgresql(conn):
        return None
    return int(conn.connection.dbapi_connection.total_changes)  # type: ignore[union-attr]


def lock_timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL's lock_timeout (55P03): a lock another session holds."""
    return getattr(getattr(exc, "orig", exc), "sqlstate", None) == "55P03"


# What each op of a batch that a lock timeout failed waits for a lock when it runs alone: the
# batch waited LOCK_TIMEOUT_MS already; this pass only tells the ops the lock holds up (503)
# from the others (answered), not another LOCK_TIMEOUT_MS each.
SORTING_LOCK_TIMEOUT_MS = 100


def wait_briefly_for_locks(conn: Connection) -> None:
    """This transaction waits at most SORTING_LOCK_TIMEOUT_MS for a lock (PostgreSQL)."""
    _wait_for_locks_at_most(conn, SORTING_LOCK_TIMEOUT_MS)


def _wait_for_locks_at_most(conn: Connection, ms: int) -> None:
    """This transaction's lock_timeout on PostgreSQL (0: no limit); SQLite's single writer
    waits for no row lock."""
    if _postgresql(conn):
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {int(ms)}")


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
        # A database turned read-only while serving (a primary demoted to a standby,
        # default_transaction_read_only): an InternalError, which answered 500 with a
        # traceback per request.
        if getattr(exc, "sqlstate", None) == "25006":
            return True
    # A damaged SQLite file (SQLITE_CORRUPT, SQLITE_NOTADB): no bug of the request's, and no
    # traceback per request; readiness says writes fail, the log says so once.
    # The primary code: SQLite reports an extended one (SQLITE_CORRUPT_INDEX is 779).
    code = getattr(exc, "sqlite_errorcode", None)
    if (
        isinstance(exc, sqlite3.DatabaseError)
        and isinstance(code, int)
        and code & 0xFF
        in (
            sqlite3.SQLITE_CORRUPT,
            sqlite3.SQLITE_NOTADB,
        )
    ):
        return True
    return isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS


def bad_connection_option(exc: BaseException) -> bool:
    """Whether ``exc`` is libpq refusing the URL's own settings (an option it does not know,
    a value it does not take): ``invalid connection option "x"``, ``invalid sslmode value``,
    ``invalid integer value "x" for connection option "port"``."""
    said = str(getattr(exc, "orig", None) or exc)
    return bool(re.search(r"invalid (connection option|\w+ value|integer value)", said))


def probe_write(conn: Connection) -> None:
    """A write that changes one row and nothing else: whether the database takes writes."""
    conn.execute(text("UPDATE alembic_version SET version_num = version_num"))


def ping(engine: Engine) -> None:
    """Raise unless the database answers a trivial query."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")


def lock_table(conn: Connection, table: Table) -> None:
    """Serialize, until the commit, every process's transactions that lock this table (an
    insert-if-empty two processes may race). One process alone (SQLite's single writer, whose
    BEGIN IMMEDIATE already holds the database's write lock) needs no lock."""
    if shared(conn):
        conn.exec_driver_sql(f"LOCK TABLE {table.name} IN EXCLUSIVE MODE")


def upsert(
    conn: Connection,
    table: Table,
    values: Mapping[str, Any],
    keys: Sequence[Column[Any]],
    changes: Mapping[str, Any],
) -> Executable:
    """INSERT ... ON CONFLICT (keys) DO UPDATE SET changes."""
    statement = _insert(conn, table).values(dict(values))
    return statement.on_conflict_do_update(index_elements=list(keys), set_=dict(changes))


def insert_if_absent(
    conn: Connection, table: Table, values: Mapping[str, Any], keys: Sequence[Column[Any]]
) -> bool:
    """INSERT ... ON CONFLICT (keys) DO NOTHING; whether the row went in (by RETURNING: the
    driver's rowcount says -1 here). Where another process's transaction inserts the same
    key, PostgreSQL waits for it to end first."""
    statement = _insert(conn, table).values(dict(values))
    statement = statement.on_conflict_do_nothing(index_elements=list(keys))
    return conn.execute(statement.returning(*keys)).first() is not None


def _insert(conn: Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT that can say ON CONFLICT: both dialects speak it, each under its own
    SQLAlchemy construct."""
    return postgresql.insert(table) if _postgresql(conn) else sqlite.insert(table)
