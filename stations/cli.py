"""The ``stations`` command: ``stations serve`` (and later ``stations pipeline``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import sys
from typing import NoReturn

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4437


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
    p = sub.add_parser("serve", help="run the Stations service")
    p.add_argument("--host", default=os.environ.get("STATIONS_HOST", DEFAULT_HOST))
    # A string default goes through ``type`` too, so a bad STATIONS_PORT is a usage error.
    p.add_argument("--port", type=int, default=os.environ.get("STATIONS_PORT", str(DEFAULT_PORT)))
    p.add_argument(
        "--db",
        default=os.environ.get("STATIONS_DB_URL"),
        help="SQLAlchemy URL (default: SQLite under ./stations-data/)",
    )
    p.add_argument("--long-poll-timeout-ms", type=int, default=30_000)
    p.add_argument("--sse-lifetime-ms", type=int, default=60_000)
    p.add_argument("--tokens", help="tokens file (JSON); without it only loopback is served")
    p.add_argument(
        "--insecure", action="store_true", help="serve a non-loopback host without tokens"
    )
    p.add_argument("--durability", choices=["fsync", "process"], default="fsync")
    p.add_argument(
        "--webhooks-allow-loopback",
        action="store_true",
        help="let subscription webhooks target loopback addresses (development and tests)",
    )
    p.add_argument(
        "--id-cache-size",
        type=int,
        default=50_000,
        help="message ids per station answered from RAM (default %(default)s)",
    )
    p.add_argument(
        "--recent-ids",
        type=int,
        default=100_000,
        help="ids per station kept in the recent-id table; older ones move to sorted runs "
        "(SQLite; default %(default)s)",
    )
    p.add_argument(
        "--log-level",
        type=str.lower,
        choices=["debug", "info", "warning", "error", "critical"],
        default="warning",
    )


def serve(args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536:
        _fail(f"--port must be between 1 and 65535 (got {args.port})")
    if args.long_poll_timeout_ms <= 0:
        _fail("--long-poll-timeout-ms must be positive")
    if args.sse_lifetime_ms <= 0:
        _fail("--sse-lifetime-ms must be positive")
    if args.id_cache_size < 1:
        _fail("--id-cache-size must be at least 1")
    if args.recent_ids < 2:
        _fail("--recent-ids must be at least 2")
    if not args.tokens and not args.insecure and not _is_loopback(args.host):
        _fail(
            f"refusing to serve {args.host} without --tokens; "
            "give a tokens file, or --insecure to serve it open"
        )
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from aiohttp.web import GracefulExit

    # SIGTERM / SIGINT end the loop with GracefulExit after a clean shutdown: exit 0.
    with contextlib.suppress(GracefulExit, KeyboardInterrupt):
        asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> None:
    from aiohttp import web
    from sqlalchemy.exc import ArgumentError, OperationalError

    from stations.api import make_app
    from stations.domain.service import Service

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
        service = Service(
            args.db,
            durability=args.durability,
            id_cache_size=args.id_cache_size,
            recent_ids=args.recent_ids,
        )
    except ArgumentError as exc:
        _fail(f"--db is not a database URL: {exc}")
    app = make_app(
        service,
        long_poll_timeout_ms=args.long_poll_timeout_ms,
        sse_lifetime_ms=args.sse_lifetime_ms,
        tokens=tokens,
        webhooks_allow_loopback=args.webhooks_allow_loopback,
    )
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    try:
        await runner.setup()
    except OperationalError as exc:
        _fail(f"cannot reach the database: {str(exc.orig).strip().splitlines()[0]}")
    except Exception as exc:  # an unusable --db URL surfaces here (driver missing, bad path)
        _fail(f"cannot open the database: {exc}")
    site = web.SockSite(runner, sock)
    await site.start()
    print(
        f"stations: serving http://{args.host}:{args.port} ({service.url.split(':')[0]})",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="stations")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser(sub)
    from stations import pipeline  # light: PySpark is imported only when a job runs

    pipeline.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args)
    elif args.command == "pipeline":
        sys.exit(pipeline.run(args))


if __name__ == "__main__":
    main()
