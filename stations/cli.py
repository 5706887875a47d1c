"""The ``stations`` command: ``stations serve``, ``stations pipeline`` and the management
commands of ``stations.commands`` (``station``, ``produce``, ``read``, ``tail``, ``group``, ``dls``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import ipaddress
import logging
import math
import os
import socket
import sys
from typing import Any, NoReturn

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4437
# Upper bounds of the numeric options (README "Limits and timeouts").
MAX_LONG_POLL_MS = 3_600_000  # 1 h
MAX_SSE_LIFETIME_MS = 86_400_000  # 24 h
MAX_ID_CACHE = 10_000_000  # ids per station in RAM
MAX_RECENT_IDS = 100_000_000
MAX_METRICS_STATIONS = 100_000


def _fail(message: str) -> NoReturn:
    print(f"stations: error: {message}", file=sys.stderr)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    """Usage mistakes are one ``stations: error: ...`` line, like every other refusal."""

    def error(self, message: str) -> NoReturn:
        _fail(f"{message} (see: {self.prog} --help)")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="run the Stations service",
        description="Run the Stations service: the HTTP API, the Durable Streams protocol at "
        "/v1/stream, the web console at /ui/ and Prometheus metrics at /metrics.",
    )
    p.add_argument(
        "--host",
        default=os.environ.get("STATIONS_HOST", DEFAULT_HOST),
        help="address to listen on; anything but loopback needs --tokens or --insecure "
        "(default: $STATIONS_HOST or %(default)s)",
    )
    # A string default goes through ``type`` too, so a bad STATIONS_PORT is a usage error.
    p.add_argument(
        "--port",
        type=int,
        default=os.environ.get("STATIONS_PORT", str(DEFAULT_PORT)),
        help="TCP port (default: $STATIONS_PORT or %(default)s)",
    )
    p.add_argument(
        "--db",
        default=os.environ.get("STATIONS_DB_URL"),
        help="SQLAlchemy URL, e.g. postgresql://user@host:5432/db (needs stations[postgresql]) "
        "(default: $STATIONS_DB_URL or SQLite under ./stations-data/)",
    )
    p.add_argument(
        "--long-poll-timeout-ms",
        type=int,
        default=30_000,
        help="how long a live=long-poll read waits for new data (default %(default)s)",
    )
    p.add_argument(
        "--sse-lifetime-ms",
        type=int,
        default=60_000,
        help="how long one SSE response lives before the client reconnects (default %(default)s)",
    )
    p.add_argument(
        "--tokens",
        help="tokens file (JSON) enabling bearer-token auth; without it only loopback is served",
    )
    p.add_argument(
        "--insecure", action="store_true", help="serve a non-loopback host without tokens"
    )
    p.add_argument(
        "--durability",
        choices=["fsync", "process"],
        default="fsync",
        help="fsync: an acknowledged write is on disk; process: it survives kill -9 of the "
        "server, not a power cut (default %(default)s)",
    )
    p.add_argument(
        "--webhooks-allow-loopback",
        action="store_true",
        help="let subscription webhooks target loopback addresses (development and tests)",
    )
    p.add_argument(
        "--id-cache-size",
        type=int,
        default=50_000,
        help="message ids per station cached in RAM in front of msg_ids (PostgreSQL; "
        "default %(default)s)",
    )
    p.add_argument(
        "--recent-ids",
        type=int,
        default=100_000,
        help="recent ids per station held in RAM and time-ordered blocks; older ones move to "
        "sorted runs (SQLite; default %(default)s)",
    )
    limits = p.add_argument_group(
        "limits and timeouts",
        "what keeps clients that hold connections open from pinning the server",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="open connections at most; beyond, a new one is answered 503 and closed "
        "(default: the file-descriptor limit, raised to its hard limit at start, minus 128)",
    )
    limits.add_argument(
        "--max-waiting-readers",
        type=int,
        default=None,
        help="long-poll and SSE reads and group fetches in progress at most; beyond, 503 with "
        "Retry-After (default: 90%% of --max-connections, so producers and /healthz always "
        "find a slot)",
    )
    limits.add_argument(
        "--read-budget-mb",
        type=float,
        default=64,
        help="memory for read pages held across all connections; reads wait for room, and "
        "answer 503 after 10 s (default %(default)s)",
    )
    limits.add_argument(
        "--head-timeout-s",
        type=float,
        default=10,
        help="a request head begun but not complete in time closes the connection "
        "(default %(default)s)",
    )
    limits.add_argument(
        "--body-timeout-s",
        type=float,
        default=60,
        help="a request body not complete in time is answered 408 (default %(default)s)",
    )
    limits.add_argument(
        "--idle-timeout-s",
        type=float,
        default=75,
        help="a connection with no request in progress closes after this long "
        "(default %(default)s)",
    )
    limits.add_argument(
        "--send-timeout-s",
        type=float,
        default=30,
        help="a client that stops reading a response is disconnected after this long "
        "(default %(default)s)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="grant cross-origin access to this origin (repeatable; * for any). Default: any "
        "origin with --tokens, only loopback origins without",
    )
    p.add_argument(
        "--metrics-stations",
        type=int,
        default=500,
        help="per-station and per-group series on /metrics for at most this many stations "
        "(by name), so their number stays bounded (default %(default)s)",
    )
    p.add_argument(
        "--access-log",
        nargs="?",
        const="-",
        metavar="FILE",
        help="log every request (client, request line, status, size, seconds) to FILE, "
        "or to stderr when no FILE is given (default: no access log)",
    )
    p.add_argument(
        "--log-level",
        type=str.lower,
        choices=["debug", "info", "warning", "error", "critical"],
        default="warning",
        help="log level of the server's messages on stderr (default %(default)s)",
    )


def _require_driver(url: str | None) -> None:
    """PostgreSQL's driver is the optional extra ``stations[postgresql]``: say so in one line."""
    if not url:
        return
    from stations.store.db import missing_driver

    if missing_driver(url) is not None:
        _fail(
            "--db is a PostgreSQL URL but the psycopg driver is not installed; "
            "install it with: pip install 'stations[postgresql]'"
        )


def serve(args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536:
        _fail(f"--port must be between 1 and 65535 (got {args.port})")
    if not 0 < args.long_poll_timeout_ms <= MAX_LONG_POLL_MS:
        _fail(f"--long-poll-timeout-ms must be from 1 to {MAX_LONG_POLL_MS}")
    if not 0 < args.sse_lifetime_ms <= MAX_SSE_LIFETIME_MS:
        _fail(f"--sse-lifetime-ms must be from 1 to {MAX_SSE_LIFETIME_MS}")
    if not 1 <= args.id_cache_size <= MAX_ID_CACHE:
        _fail(f"--id-cache-size must be from 1 to {MAX_ID_CACHE}")
    if not 2 <= args.recent_ids <= MAX_RECENT_IDS:
        _fail(f"--recent-ids must be from 2 to {MAX_RECENT_IDS}")
    if not 0 <= args.metrics_stations <= MAX_METRICS_STATIONS:
        _fail(f"--metrics-stations must be from 0 to {MAX_METRICS_STATIONS}")
    # nan passed "<= 0" and, as a timer, dropped every request whose head or body came in two
    # packets; inf turned the protection off; both crashed --read-budget-mb with a traceback.
    for option in ("head_timeout_s", "body_timeout_s", "idle_timeout_s", "send_timeout_s"):
        if not (math.isfinite(getattr(args, option)) and getattr(args, option) > 0):
            _fail(f"--{option.replace('_', '-')} must be a positive number of seconds")
    if not (math.isfinite(args.read_budget_mb) and args.read_budget_mb > 0):
        _fail("--read-budget-mb must be a positive number")
    for option in ("max_connections", "max_waiting_readers"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            _fail(f"--{option.replace('_', '-')} must be at least 1")
    if not args.tokens and not args.insecure and not _is_loopback(args.host):
        _fail(
            f"refusing to serve {args.host} without --tokens; "
            "give a tokens file, or --insecure to serve it open"
        )
    _require_driver(args.db)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.log_level != "debug":
        # APScheduler logs every job run at info: the id sweep alone would print every second.
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
        logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    args.access_logging = _access_log(args.access_log)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from aiohttp.web import GracefulExit

    # SIGTERM / SIGINT end the loop with GracefulExit after a clean shutdown: exit 0.
    with contextlib.suppress(GracefulExit, KeyboardInterrupt):
        asyncio.run(_serve(args))


ACCESS_LOG_FORMAT = '%a "%r" %s %b %Tf "%{User-Agent}i"'


def _access_log(target: str | None) -> dict[str, Any]:
    """aiohttp's access logger, on its own handler so it shows whatever --log-level says."""
    if target is None:
        return {"access_log": None}
    logger = logging.getLogger("stations.access")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        handler: logging.Handler = (
            logging.StreamHandler(sys.stderr) if target == "-" else logging.FileHandler(target)
        )
    except OSError as exc:
        _fail(f"--access-log: cannot open {target}: {exc.strerror}")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    return {"access_log": logger, "access_log_format": ACCESS_LOG_FORMAT}


async def _serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    from stations.api import make_app
    from stations.api.headers import CorsPolicy
    from stations.api.limits import CappedSite, Limits, default_max_connections, raise_nofile
    from stations.domain.service import Service
    from stations.store.db import ArgumentError, InUse, OperationalError, claim_file

    nofile = raise_nofile()
    max_connections = args.max_connections or default_max_connections(nofile)
    if max_connections > default_max_connections(nofile):
        print(
            f"stations: warning: --max-connections {max_connections} leaves fewer than 128 of "
            f"the {nofile} file descriptors for the database and files",
            file=sys.stderr,
        )
    limits = Limits(
        max_connections=max_connections,
        max_waiting_readers=args.max_waiting_readers or max(1, int(max_connections * 0.9)),
        head_timeout_s=args.head_timeout_s,
        body_timeout_s=args.body_timeout_s,
        idle_timeout_s=args.idle_timeout_s,
        send_timeout_s=args.send_timeout_s,
    )

    try:
        sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            _fail(f"port {args.port} on {args.host} is already in use")
        _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror}")
    tokens = None
    if args.tokens:
        from stations.api.auth import TokensFileError, load_tokens

        try:
            tokens = load_tokens(args.tokens)
        except TokensFileError as exc:
            _fail(str(exc))
    try:
        claim = claim_file(args.db)  # noqa: F841 - held until the process ends
    except InUse as exc:
        _fail(f"{exc}: SQLite is served by one process; use PostgreSQL for several")
    except ArgumentError as exc:
        _fail(f"--db is not a database URL: {exc}")
    except OSError as exc:
        _fail(f"--db: cannot lock the database file: {exc.strerror}")
    try:
        service = Service(
            args.db,
            durability=args.durability,
            id_cache_size=args.id_cache_size,
            recent_ids=args.recent_ids,
            read_budget_bytes=int(args.read_budget_mb * (1 << 20)),
        )
    except ArgumentError as exc:
        _fail(f"--db is not a database URL: {exc}")
    app = make_app(
        service,
        long_poll_timeout_ms=args.long_poll_timeout_ms,
        sse_lifetime_ms=args.sse_lifetime_ms,
        tokens=tokens,
        metrics_stations=args.metrics_stations,
        webhooks_allow_loopback=args.webhooks_allow_loopback,
        limits=limits,
        cors=CorsPolicy(
            origins=tuple(o.rstrip("/") for o in args.cors_origin),
            any_origin=tokens is not None,
            loopback_host_only=tokens is None and _is_loopback(args.host),
        ),
    )
    # A client that leaves cancels its handler: a parked fetch then leases nothing nobody will
    # get, and a waiting reader gives its slot back at once (aiohttp waits for the handler
    # to end by itself unless told).
    runner = web.AppRunner(
        app, handle_signals=True, handler_cancellation=True, **args.access_logging
    )
    try:
        await runner.setup()
    except OperationalError as exc:
        _fail(f"cannot reach the database: {str(exc.orig).strip().splitlines()[0]}")
    except Exception as exc:  # an unusable --db URL surfaces here (driver missing, bad path)
        _fail(f"cannot open the database: {exc}")
    site = CappedSite(runner, sock, limits, backlog=1024)
    await site.start()
    print(
        f"stations: serving http://{args.host}:{args.port} ({service.url.split(':')[0]})",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def commands_epilog() -> str:
    from stations.commands.base import EXIT_CODES_HELP

    return EXIT_CODES_HELP


def main(argv: list[str] | None = None) -> None:
    from stations import __version__

    parser = _Parser(
        prog="stations",
        description="Stations: durable, exactly-once HTTP message streams.",
        epilog=commands_epilog(),
    )
    parser.add_argument(
        "--version", action="version", version=f"stations {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser(sub)
    from stations.spark import pipeline  # light: PySpark is imported only when a job runs

    pipeline.add_parser(sub)
    from stations import commands  # light: the SDK is imported only when a command runs

    commands.add_parsers(sub)
    args = parser.parse_args(argv)
    if commands.is_management(args):
        sys.exit(commands.run(args))
    if args.command == "serve":
        serve(args)
    elif args.command == "pipeline":
        sys.exit(pipeline.run(args))


if __name__ == "__main__":
    main()
