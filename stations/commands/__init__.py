"""The management commands of ``stations``, on the SDK (``stations.client``, HTTP only), with
the conventions of ``nats`` and ``kubectl``: ``stations <noun> <verb>``, ``--url`` /
``STATIONS_URL`` and ``--token`` / ``STATIONS_TOKEN`` on every command, tables for people and
``--json`` for scripts, and exit codes scripts can rely on (``EXIT_CODES``).

One module per noun: ``station``, ``produce``, ``read`` (``read`` and ``tail``), ``group``,
``cursor``, ``dls``. Each adds its parsers and sets ``handler``: ``async (args, client) -> exit code``.
(``token`` works on a tokens file, not through a server: ``stations.cli`` runs it.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stations.commands import cursor, dls, group, produce, read, station
from stations.commands.base import (
    EXIT_CODES_HELP,
    EXIT_OUTPUT_FAILED,
    EXIT_STDOUT_CLOSED,
    OutputFailed,
    Refused,
    Usage,
    describe_error,
    exit_code,
    shown_url,
    stdout_to_devnull,
)

if TYPE_CHECKING:
    from stations.client import Client

DEFAULT_URL = "http://127.0.0.1:4437"
MODULES = (station, produce, read, group, cursor, dls)


def common_options() -> argparse.ArgumentParser:
    """Options every management command takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("STATIONS_URL", DEFAULT_URL),
        # Not %(default)s: that is $STATIONS_URL's value when it is set, which read as the
        # fallback ("$STATIONS_URL or http://other:1").
        help=f"the Stations server (default: $STATIONS_URL, else {DEFAULT_URL})",
    )
    token = common.add_mutually_exclusive_group()
    token.add_argument(
        "--token",
        default=os.environ.get("STATIONS_TOKEN"),
        help="bearer token, when the server runs with --tokens (default: $STATIONS_TOKEN); "
        "on a shared host prefer --token-file or the variable: other users see a command line",
    )
    token.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the bearer token from the first line of this file (it wins over "
        "$STATIONS_TOKEN)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        help="print JSON (one document, or one object per line for messages) for scripts",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for an answer (default %(default)s)",
    )
    return common


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    common = common_options()
    before = set(sub.choices)
    for module in MODULES:
        module.add_parser(sub, common, EXIT_CODES_HELP)
    for name, parser in sub.choices.items():
        if name not in before:
            _intermix(parser)


class _Intermixed(argparse.ArgumentParser):
    """A command's parser that takes options after its positional arguments, as ``nats`` and
    ``kubectl`` do: ``stations produce s --msg-id a 1`` was "unrecognized arguments: 1" (the
    ``DATA ...`` list was taken, empty, before the option)."""

    _mixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._mixing:  # Python 3.11's intermixed parse calls this again: the plain parse
            return super().parse_known_args(args, namespace)
        self._mixing = True
        try:
            parsed, extras = self.parse_known_intermixed_args(_escaped(args), namespace)
        finally:
            self._mixing = False
        _unescape(parsed)
        self._refuse_not_utf8(parsed)
        if extras:
            # Refused here rather than by ``stations``'s parser, so that the error points at
            # this command's help, not at "stations --help".
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def _refuse_not_utf8(self, parsed: argparse.Namespace) -> None:
        """An argument that is not UTF-8 (``$'\\xff'``) reaches Python as a string with lone
        surrogates, which no URL or JSON body can carry: it was a UnicodeEncodeError
        traceback. Refused naming the argument, except where bytes are meant (DATA, sent as
        bytes to a binary station) or a file's name (any bytes name a file)."""
        for action in self._actions:
            if action.dest in _BYTES_OR_PATHS:
                continue
            value = getattr(parsed, action.dest, None)
            for each in value if isinstance(value, list) else [value]:
                if isinstance(each, str) and not _is_utf8(each):
                    name = (
                        action.option_strings[-1]
                        if action.option_strings
                        else action.metavar or action.dest.upper()
                    )
                    # A token is not shown: a secret has no place in an error line.
                    shown = "it" if action.dest == "token" else repr(os.fsencode(each))[1:]
                    self.error(f"argument {name}: {shown} is not UTF-8 text")


# Arguments taken as bytes or as file names: not refused for not being UTF-8.
_BYTES_OR_PATHS = {"data", "token_file", "offsets_from", "leases_from"}


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# CPython's intermixed parse drops ``--`` when the first positional comes after it, so a
# station named ``-a`` (``stations station show -- -a``) was an unknown option. What follows
# ``--`` and looks like an option is marked with a NUL (no argv string can hold one), which
# takes it for a positional, and unmarked once parsed.
_MARK = "\0"


def _escaped(args: Sequence[str] | None) -> list[str]:
    given = list(sys.argv[1:] if args is None else args)
    if "--" not in given:
        return given
    cut = given.index("--")
    return given[:cut] + [_MARK + a if a.startswith("-") else a for a in given[cut + 1 :]]


def _unescape(parsed: argparse.Namespace) -> None:
    for key, value in vars(parsed).items():
        if isinstance(value, str) and value.startswith(_MARK):
            setattr(parsed, key, value[1:])
        elif isinstance(value, list):
            setattr(
                parsed,
                key,
                [v[1:] if isinstance(v, str) and v.startswith(_MARK) else v for v in value],
            )


def _intermix(parser: argparse.ArgumentParser) -> None:
    """Make the commands under ``parser`` (those without verbs of their own) ``_Intermixed``;
    argparse cannot intermix a parser whose positional is a choice of verbs."""
    verbs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not verbs:
        # The class comes from ``stations.cli`` (its ``error``): a subclass of it is made.
        parser.__class__ = type("Intermixed", (_Intermixed, type(parser)), {})
        return
    for each in verbs:
        for child in set(each.choices.values()):
            _intermix(child)


def is_management(args: argparse.Namespace) -> bool:
    return getattr(args, "handler", None) is not None


def token_of(args: argparse.Namespace) -> str | None:
    """The token ``--token-file`` names, else ``--token`` (or ``$STATIONS_TOKEN``); raises
    ``ValueError`` naming the option."""
    path = getattr(args, "token_file", None)
    if path is None:
        return args.token  # type: ignore[no-any-return]
    try:
        with open(path, encoding="utf-8") as file:
            token = file.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"token-file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not token:
        raise ValueError(f"token-file {path}: its first line is empty")
    return token


def run(args: argparse.Namespace) -> int:
    """Run a management command; every failure is one ``stations: error: ...`` line."""
    from stations.client.core import check_server

    try:
        args.token = token_of(args)
        check_server(args.url, args.token, args.timeout)
    except ValueError as exc:
        said = shown_url(str(exc))
        print(f"stations: error: --{said}", file=sys.stderr)
        return exit_code(Usage(said))
    empty = _empty_name(args)
    if empty is not None:
        print(f"stations: error: {empty}", file=sys.stderr)
        return exit_code(Usage(empty))
    if sys.stdout is None:
        # Started with standard output closed (`>&-`): Python drops every print then, and a
        # read or a fetch printed nothing and said 0 (a fetch leased what nobody saw).
        print(
            "stations: error: cannot write the output: standard output is closed", file=sys.stderr
        )
        return EXIT_OUTPUT_FAILED
    try:
        return asyncio.run(_run(args))
    except (Usage, Refused) as exc:
        print(f"stations: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except OutputFailed as exc:
        print(f"stations: error: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:
        # The reader of stdout left (`| head`): end quietly, as tools killed by SIGPIPE do.
        # (Network errors reach here wrapped by the SDK, never as a bare BrokenPipeError.)
        stdout_to_devnull()
        return EXIT_STDOUT_CLOSED
    except OSError as exc:
        # Writing stdout failed otherwise (a full disk: `> out.jsonl`); the SDK wraps its own
        # network errors, so a bare OSError here is the output's. It was a traceback, exit 1.
        print(f"stations: error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        stdout_to_devnull()
        return EXIT_OUTPUT_FAILED
    except Exception as exc:  # a StationsError from the SDK: its status says the exit code
        from stations.client import StationsError

        if not isinstance(exc, StationsError):
            raise
        said = describe_error(exc, args.url)
        if exc.status == 401:
            # The server's "a valid bearer token is required" does not say which it lacked.
            said += (
                "; no token was given (--token-file, $STATIONS_TOKEN or --token)"
                if not args.token
                else "; the server does not accept the token given"
            )
        print(f"stations: error: {said}", file=sys.stderr)
        return exit_code(exc)


# Names that go into a URL path, and --id-field: an empty one is no name. In a path it made
# another route ("Not Found", exit 3, or "Method Not Allowed", exit 1); --id-field '' was
# taken for none given.
_NAMES = {
    "station": "the station name",
    "name": "the station name",
    "group": "the group name",
    "cursor": "the cursor name",
    "id_field": "--id-field",
}


def _empty_name(args: argparse.Namespace) -> str | None:
    for attr, what in _NAMES.items():
        if getattr(args, attr, None) == "":
            return f"{what} is empty"
    return None


async def _run(args: argparse.Namespace) -> int:
    from stations.client import Client

    client: Client
    async with Client(args.url, args.token, timeout=args.timeout) as client:
        result: Any = await args.handler(args, client)
        return int(result or 0)
