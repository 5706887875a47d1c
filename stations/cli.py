"""The ``stations`` command: ``stations serve``, ``stations pipeline`` and the management
commands of ``stations.commands`` (``station``, ``produce``, ``read``, ``tail``, ``group``, ``dls``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import faulthandler
import io
import ipaddress
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import ssl

    from stations.tokens import Token

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4437
# Upper bounds of the numeric options (README "Limits and timeouts").
MAX_LONG_POLL_MS = 3_600_000  # 1 h
MAX_SSE_LIFETIME_MS = 86_400_000  # 24 h
MAX_ID_CACHE = 10_000_000  # ids per station in RAM
MAX_RECENT_IDS = 100_000_000
MAX_METRICS_STATIONS = 100_000
MAX_PRODUCER_EXPIRY_MS = 100 * 365 * 86_400_000  # a century: "never" is 0


# serve's exit codes: a bad command line is 2, a start that failed on something outside it
# (a port in use, a database unreachable or held by another server) is 1, so a supervisor can
# restart on 1 and stop on 2 (systemd: RestartPreventExitStatus=2).
EXIT_USAGE = 2
EXIT_CANNOT_START = 1


def _say(message: str, *, err: bool = False) -> None:
    """A line on stdout (or stderr). A reader that went away (``stations serve | head -1``, a
    log shipper that died) must not stop the server: a BrokenPipeError here ended a drain
    half way, exit 1 with a traceback. The stream is pointed at /dev/null from then on, so
    nor does Python's own flush at exit complain."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(message, file=stream, flush=True)
    except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    _say(f"stations: error: {message}", err=True)
    sys.exit(code)


class _Parser(argparse.ArgumentParser):
    """Usage mistakes are one ``stations: error: ...`` line, like every other refusal."""

    def error(self, message: str) -> NoReturn:
        _fail(f"{message} (see: {self.prog} --help)")


def _public_url(value: str) -> str:
    """``--public-url``: an http(s) URL with a host, perhaps a path prefix (a proxy that mounts
    the server under one); no query or fragment. Kept without a trailing slash."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
    ):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an http(s) URL such as https://stations.example.com"
        )
    from yarl import URL  # aiohttp's, installed with the base package

    # As clients send it: a Location built on it must be a URI (its path percent-encoded), and
    # browsers name an international host in its IDNA form in Host and Origin.
    return str(URL(value)).rstrip("/")


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
        help="SQLite or PostgreSQL URL: sqlite:///PATH, or postgresql://user@host:5432/db "
        "(needs the extra stations-streams[postgresql]) (default: $STATIONS_DB_URL or "
        "sqlite:///stations-data/stations.db, relative to the working directory)",
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
        help="tokens file (JSON) enabling bearer-token auth (made and changed with `stations "
        "token`; SIGHUP reads it again); without it only loopback is served",
    )
    p.add_argument(
        "--insecure", action="store_true", help="serve a non-loopback host without tokens"
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this certificate (PEM, followed by its chain; SIGHUP reads it "
        "again, for a renewed one); without it, plain HTTP (put a TLS proxy in front)",
    )
    p.add_argument(
        "--tls-key",
        metavar="FILE",
        help="the certificate's private key (PEM; default: in the --tls-cert file)",
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
        "--public-url",
        type=_public_url,
        default=None,
        metavar="URL",
        help="the http(s) URL clients reach this server at (behind a TLS proxy, a proxy that "
        "mounts it under a path prefix and strips it, or several processes behind one "
        "address): a created stream's Location, webhook callback and JWKS URLs and "
        "/api/openapi.yaml's server are built on it; without --tokens, pages of its origin "
        "may write and its host name is an accepted Host (default: what each request reached)",
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
    p.add_argument(
        "--producer-expiry-ms",
        type=int,
        default=None,
        help="an idempotent producer (Producer-Id) that has written nothing to a station for "
        "this long is forgotten there: its next request must start an epoch at seq 0; 0 keeps "
        "every producer for ever (default: 604800000, 7 days)",
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
        "--max-waiting-readers-per-token",
        type=int,
        default=None,
        help="with --tokens: of those, what one token may hold; beyond, 503 with Retry-After "
        "(default: half of --max-waiting-readers)",
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
        help="a request head begun but not complete in time is answered 408 "
        "(request_timeout) and the connection closed (default %(default)s)",
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
    limits.add_argument(
        "--max-append-messages",
        type=int,
        default=524_288,
        help="messages one JSON append may carry (a top-level array's elements); beyond, "
        "the append is refused whole: 413 on /v1/stream, 400 on the management produce "
        "(field messages) and on a transaction's produced messages, all stations together "
        "(field produce); those two also keep their own limit of 10000 (default %(default)s)",
    )
    limits.add_argument(
        "--drain-timeout-s",
        type=float,
        default=10,
        help="on SIGTERM or SIGINT, how long requests in progress get to finish and be "
        "answered; waiting reads (long-poll, SSE, group fetches) answer at once as at their "
        "timeout and are closed if they have not a second later; a second signal stops at once "
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
        help="log every request (client, request line, status, size, seconds, user agent) "
        "to FILE, or to stderr when no FILE is given (default: no access log)",
    )
    p.add_argument(
        "--log-level",
        type=str.lower,
        choices=["debug", "info", "warning", "error", "critical"],
        default="warning",
        help="log level of the server's messages on stderr (default %(default)s)",
    )


def _refuse_bad_option(exc: BaseException, bad: Callable[[BaseException], bool]) -> None:
    """An option of the --db URL the driver does not know, or a value it refuses: no restart
    cures it, so exit 2 (a supervisor's RestartPreventExitStatus=2 relies on it), not 1."""
    if bad(exc):
        orig = getattr(exc, "orig", None) or exc
        _fail(f"--db: {str(orig).strip().splitlines()[0]}")


def _refuse_empty_db(url: str | None) -> None:
    """An empty ``--db`` (or ``$STATIONS_DB_URL``) is refused: it meant the default, a SQLite
    file in the working directory, so a deployment whose variable came out empty acknowledged
    writes into the wrong database."""
    if url is not None and not url.strip():
        _fail(
            "--db (or $STATIONS_DB_URL) is empty: give a database URL, or leave both out "
            "for the default sqlite:///stations-data/stations.db"
        )


def _require_driver(url: str | None) -> None:
    """PostgreSQL's driver is the optional extra ``stations-streams[postgresql]``: say so in one line.
    A database the store cannot use is named before anything is created."""
    _refuse_empty_db(url)
    if not url:
        return
    from stations.store.db import why_not_servable

    why = why_not_servable(url)
    if why is None:
        return
    if why.driver is not None:
        _fail(
            f"--db is a PostgreSQL URL but the {why.driver} driver is not installed; "
            "install it with: pip install 'psycopg[binary]>=3.2.4' (this package's "
            "postgresql extra)"
        )
    _fail(f"--db: {why.reason}")


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
    if args.producer_expiry_ms is not None and not (
        0 <= args.producer_expiry_ms <= MAX_PRODUCER_EXPIRY_MS
    ):
        _fail(f"--producer-expiry-ms must be from 0 to {MAX_PRODUCER_EXPIRY_MS}")
    if not 0 <= args.metrics_stations <= MAX_METRICS_STATIONS:
        _fail(f"--metrics-stations must be from 0 to {MAX_METRICS_STATIONS}")
    # nan passed "<= 0" and, as a timer, dropped every request whose head or body came in two
    # packets; inf turned the protection off; both crashed --read-budget-mb with a traceback.
    for option in (
        "head_timeout_s",
        "body_timeout_s",
        "idle_timeout_s",
        "send_timeout_s",
        "drain_timeout_s",
    ):
        if not (math.isfinite(getattr(args, option)) and getattr(args, option) > 0):
            _fail(f"--{option.replace('_', '-')} must be a positive number of seconds")
    # Counted in bytes: 1e308 MiB is no number of bytes (it crashed with a traceback).
    if not (math.isfinite(args.read_budget_mb) and 0 < args.read_budget_mb <= 1 << 33):
        _fail("--read-budget-mb must be a positive number, at most 8589934592 (8 PiB)")
    for option in (
        "max_connections",
        "max_waiting_readers",
        "max_waiting_readers_per_token",
        "max_append_messages",
    ):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            _fail(f"--{option.replace('_', '-')} must be at least 1")
    for option in ("tls_cert", "tls_key"):  # an unset variable in --tls-cert "$CERT": no TLS
        if getattr(args, option) == "":
            _fail(f"--{option.replace('_', '-')} is empty")
    if args.tls_key and not args.tls_cert:
        _fail("--tls-key needs --tls-cert")
    if not args.host.strip():
        # It bound every interface (an unset variable in --host "$HOST"), tokens or not.
        _fail("--host (or $STATIONS_HOST) is empty: give the address to listen on")
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
    # A fatal signal (SQLite's shared memory file unable to grow on a full disk raises
    # SIGBUS) ended the process without a word: this leaves one, and where it happened.
    faulthandler.enable()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_serve(args))  # SIGTERM / SIGINT: a drain, then exit 0 (see _serve)
    except KeyboardInterrupt:  # Ctrl-C while starting, or a second one while draining
        sys.exit(130)


def _access_log(target: str | None) -> dict[str, Any]:
    """The access log (``stations.api.access``), on its own handler so it shows whatever
    --log-level says."""
    from stations.api.access import AccessFile, AccessLogger

    if target is None:
        return {"access_log": None}
    logger = logging.getLogger("stations.access")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        # A file moved away by logrotate is noticed and opened anew at the next line.
        handler: logging.Handler = (
            logging.StreamHandler(sys.stderr) if target == "-" else AccessFile(target)
        )
    except OSError as exc:
        _fail(f"--access-log: cannot open {target}: {exc.strerror}")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    return {"access_log": logger, "access_log_class": AccessLogger}


async def _serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    from stations.api import keys, make_app
    from stations.api.drain import DRAIN, READER_GRACE_S, Drain
    from stations.api.headers import CorsPolicy
    from stations.api.limits import (
        READERS,
        CappedSite,
        Limits,
        default_max_connections,
        raise_nofile,
    )
    from stations.api.metrics import METRICS
    from stations.domain.service import Service
    from stations.repeats import first_line
    from stations.store.db import (
        ArgumentError,
        InUse,
        OperationalError,
        Unusable,
        bad_connection_option,
        claim_file,
        database_file,
        default_url,
        describe,
        refuse_foreign,
    )

    nofile = raise_nofile()
    max_connections = args.max_connections or default_max_connections(nofile)
    if max_connections > default_max_connections(nofile):
        _say(
            f"stations: warning: --max-connections {max_connections} leaves fewer than 128 of "
            f"the {nofile} file descriptors for the database and files",
            err=True,
        )
    if args.max_waiting_readers and args.max_waiting_readers >= max_connections:
        _fail(
            f"--max-waiting-readers must be below --max-connections ({max_connections}): "
            "waiting readers must leave slots for producers and /healthz"
        )
    max_waiting_readers = args.max_waiting_readers or max(1, int(max_connections * 0.9))
    per_token = args.max_waiting_readers_per_token
    if per_token is not None and per_token > max_waiting_readers:
        _fail(
            f"--max-waiting-readers-per-token may not exceed --max-waiting-readers "
            f"({max_waiting_readers})"
        )
    limits = Limits(
        max_connections=max_connections,
        max_waiting_readers=max_waiting_readers,
        max_waiting_readers_per_token=per_token,
        head_timeout_s=args.head_timeout_s,
        body_timeout_s=args.body_timeout_s,
        idle_timeout_s=args.idle_timeout_s,
        send_timeout_s=args.send_timeout_s,
        max_append_messages=args.max_append_messages,
    )

    try:
        sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            _fail(f"port {args.port} on {args.host} is already in use", EXIT_CANNOT_START)
        _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", EXIT_CANNOT_START)
    tls = None
    if args.tls_cert:
        from stations.api.tls import TlsFilesError, server_context

        try:
            tls = server_context(args.tls_cert, args.tls_key)
        except TlsFilesError as exc:
            _fail(str(exc))
    tokens = None
    if args.tokens:
        from stations.tokens import TokensFileError, load_tokens

        try:
            tokens = load_tokens(args.tokens)
        except TokensFileError as exc:
            _fail(str(exc))
    try:
        refuse_foreign(args.db)  # before the lock file beside it is made
        claim = claim_file(args.db)  # noqa: F841 - held until the process ends
    except Unusable as exc:
        _fail(str(exc), EXIT_CANNOT_START)
    except InUse as exc:
        _fail(
            f"{exc}: SQLite is served by one process; use PostgreSQL for several",
            EXIT_CANNOT_START,
        )
    except ArgumentError as exc:
        _fail(f"--db is not a database URL: {exc}")
    except OSError as exc:
        # Name the path: the default one is relative to wherever the service was started.
        _fail(
            f"--db: cannot create or lock {exc.filename or 'the database file'}: {exc.strerror}",
            EXIT_CANNOT_START,
        )
    try:
        service = Service(
            args.db,
            durability=args.durability,
            id_cache_size=args.id_cache_size,
            recent_ids=args.recent_ids,
            read_budget_bytes=int(args.read_budget_mb * (1 << 20)),
            producer_expiry_ms=args.producer_expiry_ms,
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
        public_url=args.public_url,
        limits=limits,
        cors=CorsPolicy(
            origins=tuple(o.rstrip("/") for o in args.cors_origin),
            any_origin=tokens is not None,
            loopback_host_only=tokens is None and _is_loopback(args.host),
        ),
    )
    app[keys.ACCESS_LOG] = args.access_logging.get("access_log")  # for lines aiohttp leaves out
    drain: Drain = app[DRAIN]
    # A client that leaves cancels its handler: a parked fetch then leases nothing nobody will
    # get, and a waiting reader gives its slot back at once (aiohttp waits for the handler
    # to end by itself unless told).
    runner = web.AppRunner(
        app,
        handle_signals=False,  # aiohttp's own cancelled every handler at once (see stations.api.drain)
        handler_cancellation=True,
        shutdown_timeout=READER_GRACE_S,
        **args.access_logging,
    )
    reloads: list[Callable[[], None]] = []
    if tokens is not None:
        reloads.append(_token_reloader(args.tokens, tokens, app[READERS].revoke))
    if tls is not None:
        reloads.append(_tls_reloader(tls, args.tls_cert, args.tls_key))

    def hangup() -> None:
        for reload in reloads:
            reload()

    stop = _on_signals(hangup)
    try:
        # A signal while the database does not answer yet stops the start (it waited forever).
        setup: asyncio.Future[None] = asyncio.ensure_future(runner.setup())
        waited: list[asyncio.Future[Any]] = [setup, stop]
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        if not setup.done():
            _say(f"stations: {stop.result()}: stopping before the database answered")
            os._exit(EXIT_CANNOT_START)  # its threads may be stuck connecting: not joined
        setup.result()
    except Unusable as exc:
        # Exit 1, not 2: installing the newer version (or granting writes) and restarting cures it.
        _fail(str(exc), EXIT_CANNOT_START)
    except OperationalError as exc:
        _refuse_bad_option(exc, bad_connection_option)
        # A server one reaches; a file one opens ("unable to open database file" is not a
        # network's fault).
        verb = "open" if database_file(args.db or default_url()) else "reach"
        _fail(
            f"cannot {verb} the database: {str(exc.orig).strip().splitlines()[0]}",
            EXIT_CANNOT_START,
        )
    except (ArgumentError, ImportError) as exc:  # an unusable --db URL (a driver missing)
        _fail(f"cannot open the database: {exc}")
    except Exception as exc:
        _refuse_bad_option(exc, bad_connection_option)
        # Anything else may pass (exit 1, a supervisor restarts): exit 2 says the command line
        # will never work, and a crash's recovery failing once kept a service down for good.
        orig = getattr(exc, "orig", None) or exc
        _fail(f"cannot start: {type(orig).__name__}: {first_line(exc)}", EXIT_CANNOT_START)
    site = CappedSite(runner, sock, limits, app[METRICS].closed, backlog=1024, ssl_context=tls)
    await site.start()
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address in a URL
    scheme = "http" if tls is None else "https"
    _say(f"stations: serving {scheme}://{host}:{args.port} ({describe(service.url)})")
    try:
        name = await stop
        _say(f"stations: {name}: stopping; finishing the requests in progress")
        await site.stop()  # no new connections
        cut = await drain.settle(args.drain_timeout_s)
        if cut:
            _say(
                f"stations: warning: {cut} requests were still in progress after "
                f"--drain-timeout-s {args.drain_timeout_s:g} and were closed unanswered",
                err=True,
            )
    finally:
        # Close idle connections and what is left, then the database: at most as long again
        # as the drain, as a database that stopped answering would hold the close for ever.
        try:
            await asyncio.wait_for(runner.cleanup(), max(args.drain_timeout_s, 5.0))
        except TimeoutError:
            _say(
                "stations: warning: the database did not answer while closing; exiting without "
                "it (acknowledged writes were committed before they were answered)",
                err=True,
            )
            os._exit(EXIT_CANNOT_START)


def _token_reloader(
    path: str, tokens: list[Token], end_waits: Callable[[Callable[[object], bool]], int]
) -> Callable[[], None]:
    """SIGHUP reads the tokens file again, so that a token is added or revoked without a
    restart (with several processes, each is sent its SIGHUP). A file that does not load
    leaves the tokens as they were, and says why. The waits (long-poll, SSE, group fetch) of
    a token no longer in the file as it was end at once (``end_waits``)."""
    from stations.tokens import TokensFileError, load_tokens

    log = logging.getLogger("stations.tokens")

    def reload() -> None:
        try:
            fresh = load_tokens(path)
        except TokensFileError as exc:
            log.error("SIGHUP: the tokens in use are kept: %s", exc)
            return
        tokens[:] = fresh  # the list the application holds: the next request sees them
        ended = end_waits(lambda token: token in fresh)
        log.info(
            "SIGHUP: %d token(s) read from %s; %d waiting request(s) of revoked tokens ended",
            len(fresh),
            path,
            ended,
        )

    return reload


def _tls_reloader(context: ssl.SSLContext, cert: str, key: str | None) -> Callable[[], None]:
    """SIGHUP reads the certificate and key again (a renewed certificate): connections made
    from then on get it. Files that do not load leave the ones in use, and say why."""
    from stations.api.tls import TlsFilesError, reload

    log = logging.getLogger("stations.tls")

    def reload_files() -> None:
        try:
            reload(context, cert, key)
        except TlsFilesError as exc:
            log.error("SIGHUP: the certificate in use is kept: %s", exc)
            return
        log.info("SIGHUP: certificate read from %s", cert)

    return reload_files


def _on_signals(hangup: Callable[[], None] | None = None) -> asyncio.Future[str]:
    """A future set to the name of the first SIGTERM or SIGINT. A second one takes the
    default action and ends the process at once (acknowledged writes are on disk already).
    ``hangup``: what SIGHUP does (read the tokens file and the TLS files again)."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[str] = loop.create_future()

    def received(sig: signal.Signals) -> None:
        for each in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(each)
            # The system's default, which ends the process: Python's own for SIGINT raises
            # KeyboardInterrupt, which a thread stuck on the database never lets through.
            signal.signal(each, signal.SIG_DFL)
        if not stop.done():
            stop.set_result(sig.name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, received, sig)
    # SIGHUP, which logrotate's scripts send to have logs opened anew, ended the process: the
    # access log follows its file by itself, so that needs nothing more.
    loop.add_signal_handler(signal.SIGHUP, hangup or (lambda: None))
    return stop


def backup_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "backup",
        help="copy the embedded database, while a server may run on it",
        description="Copy the embedded (SQLite) database into a new file, consistent and "
        "complete while a server runs on it (a plain copy of the database file misses what is "
        "still in its WAL). To restore: stop the server, put the copy in the database's place "
        "and remove the old file's -wal and -shm files. For PostgreSQL use pg_dump.",
    )
    p.add_argument("dest", metavar="DEST", help="the new file to write (it must not exist)")
    p.add_argument(
        "--db",
        default=os.environ.get("STATIONS_DB_URL"),
        help="the database, as stations serve takes it (default: $STATIONS_DB_URL or "
        "sqlite:///stations-data/stations.db)",
    )


def backup(args: argparse.Namespace) -> None:
    from stations.store import db

    _refuse_empty_db(args.db)
    if not args.dest:
        _fail("DEST is empty: give the new file to write")
    url = args.db or db.default_url()
    try:
        source = db.database_file(url)
        local = db.embedded(url)
    except db.ArgumentError as exc:  # it was a traceback
        _fail(f"--db is not a database URL: {exc}")
    if source is None and local:  # not "use pg_dump": it is no server's database
        _fail("--db is an in-memory (or temporary) SQLite database: it has nothing to back up")
    existed = os.path.lexists(args.dest)
    try:
        size = db.backup(url, args.dest)
    except ValueError:
        _fail("backup copies an embedded (SQLite) database; for PostgreSQL use pg_dump")
    except FileExistsError:
        _fail(f"{args.dest} exists: give a new file")
    except FileNotFoundError:
        _fail(f"no database at {source}", 1)
    except (OSError, db.BackupFailed) as exc:
        _fail(f"the backup failed: {exc}", 1)
    except KeyboardInterrupt:
        # A copy cut short is no backup: the file this command made goes (db.backup removes
        # it itself, unless Ctrl-C came between its making and the copy).
        if not existed:
            with contextlib.suppress(OSError):
                os.remove(args.dest)
        sys.exit(130)
    from stations.commands.base import OutputFailed, write_out

    try:
        write_out(f"copied {source} to {args.dest} ({size / 1e6:,.1f} MB)")
    except OutputFailed as exc:  # the copy is made and sound: only the report was lost
        _fail(f"{exc} (the copy was made)", exc.code)


def _require_server(command: str) -> None:
    """The server is the extra ``server`` (a base install is the SDK and the management
    commands): without it, ``serve`` and ``backup`` say so in one line, not a traceback."""
    try:
        import stations.api
        import stations.domain.service
        import stations.store.db  # noqa: F401
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if not missing or missing == "stations":
            raise
        _fail(
            f"stations {command} needs the server's packages ({missing} is not installed); "
            "install them with: pip install 'stations-streams[server]'"
        )


def commands_epilog() -> str:
    from stations.commands.base import EXIT_CODES_HELP

    return EXIT_CODES_HELP


def _streams() -> None:
    """Standard error closed (`2>&-`): its lines are dropped (the exit code still says what
    happened); print(file=None) wrote them on stdout, into a --json document. Text that the
    locale cannot encode (a payload in Japanese, LC_ALL=en_US.ISO-8859-1) is written escaped,
    not a UnicodeEncodeError traceback."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(ValueError):  # a stream already closed
                stream.reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> None:
    from stations import __version__

    _streams()

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
    backup_parser(sub)
    from stations.commands import token  # light: no server, no SDK until a command runs

    token.add_parser(sub)
    from stations.spark import pipeline  # light: PySpark is imported only when a job runs

    pipeline.add_parser(sub)
    from stations import commands  # light: the SDK is imported only when a command runs

    commands.add_parsers(sub)
    args = parser.parse_args(argv)
    if commands.is_management(args):
        sys.exit(commands.run(args))
    if args.command == "serve":
        _require_server("serve")
        serve(args)
    elif args.command == "backup":
        _require_server("backup")
        backup(args)
    elif args.command == "token":
        from stations.commands.base import OutputFailed, Refused, Usage, exit_code

        try:
            token.run(args, _say)
        except (Usage, Refused) as exc:
            _fail(str(exc), exit_code(exc))
        except OutputFailed as exc:
            _fail(str(exc), exc.code)
        except KeyboardInterrupt:  # Ctrl-C while it waited (on stdin, on the folder's lock)
            sys.exit(130)
    elif args.command == "pipeline":
        sys.exit(pipeline.run(args))


if __name__ == "__main__":
    main()
