"""What every management command shares: exit codes, output (tables or JSON), durations."""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import re
import ssl
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from stations.client import StationsError

EXIT_OK = 0
EXIT_REFUSED = 1  # the server refused the request (bad input, 400/413/...)
EXIT_USAGE = 2  # a bad command line (argparse's convention)
EXIT_NOT_FOUND = 3  # no such station, group or cursor (404/410)
EXIT_CONFLICT = 4  # the station exists with other settings, the stream is closed (409)
EXIT_AUTH = 5  # no token, an unknown one, or one that does not reach the station (401/403)
EXIT_UNAVAILABLE = 6  # no answer, a server error (5xx) or overload (429)
EXIT_OUTPUT_FAILED = 7  # standard output could not be written (a full disk, say)
EXIT_STDOUT_CLOSED = 141  # stdout's reader left (`| head`): a shell's code for SIGPIPE

EXIT_CODES_HELP = (
    "exit codes: 0 ok, 1 request refused (bad input; also input refused after part of it "
    "was stored, which is listed), 2 usage error, 3 not found, "
    "4 conflict, 5 unauthorized or forbidden, 6 server error or unreachable, "
    "7 standard output could not be written, 130 interrupted (Ctrl-C), "
    "141 standard output closed by its reader (as SIGPIPE)"
)


def retold(exc: StationsError, message: str) -> StationsError:
    """``exc`` saying ``message`` instead: the same class and status, so the same exit code
    (what was done before it failed, or the option a refused field came from)."""
    told = copy.copy(exc)
    told.message = message
    told.args = (message,)
    return told


# An offset token as the API writes it (the CLI checks one before sending it).
OFFSET = re.compile(r"[0-9]{16}_[0-9]{16}")

T = TypeVar("T")
Item = TypeVar("Item")


async def naming_options(call: Awaitable[T], options: Mapping[str, str], *, it: bool = False) -> T:
    """``call``'s result. The server names a refused value by its JSON field
    ("idempotencyWindowMs must be ...", "startFrom is beyond the station's tail"), which the user
    never typed: a refusal whose field is in ``options`` (field -> the option as it was given,
    "--window" or "--from latest") is said of that option. ``it``: the field's name in the
    message becomes "it" ("--from X: it is beyond the station's tail")."""
    from stations.client import StationsError

    try:
        return await call
    except StationsError as exc:
        # A misbehaving server's field may be any JSON value (a list was a TypeError here).
        if not isinstance(exc.field, str):
            raise
        said = options.get(exc.field)
        if said is None:
            raise
        message = exc.message.replace(exc.field, "it", 1) if it else exc.message
        raise retold(exc, f"{said}: {message}") from None


async def in_chunks(
    items: Sequence[Item],
    size: int,
    send: Callable[[Sequence[Item]], Awaitable[int]],
    before: Callable[[int, int], str],
) -> int:
    """``send`` the items in requests of at most ``size`` (the API refuses more whole, and
    ``xargs`` may well give more); returns the sum of what ``send`` returned. A request refused
    after others went through says what they did: ``before(sent, done)`` is added to its
    message (each request is sent once: sent again, a settlement by offset could settle a
    later delivery)."""
    from stations.client import StationsError

    done = 0
    for start in range(0, len(items), size):
        try:
            done += await send(items[start : start + size])
        except StationsError as exc:
            if start == 0:
                raise
            raise retold(exc, f"{exc}; {before(start, done)}") from None
    return done


def add_list_parser(
    verbs: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    epilog: str,
    *,
    noun: str,
    help: str,
) -> argparse.ArgumentParser:
    """``<noun> ls STATION`` with the options that page and narrow a station's list of
    ``noun``s (groups and cursors: the server pages both alike, see ``read_pages``)."""
    ls: argparse.ArgumentParser = verbs.add_parser(
        "ls", aliases=["list"], parents=[common], help=help, epilog=epilog
    )
    ls.add_argument("station", help="station name")
    ls.add_argument("--prefix", help=f"only {noun}s whose names start with this")
    ls.add_argument("--contains", help=f"only {noun}s whose names hold this (ignoring case)")
    ls.add_argument(
        "-n",
        "--limit",
        type=int,
        help=f"at most this many, by name (default: every {noun}, read a page at a time)",
    )
    ls.add_argument(
        "--after", metavar=noun.upper(), help=f"the {noun}s after this one (the next page)"
    )
    return ls


async def read_pages(
    read: Callable[[int, str | None], Awaitable[tuple[Sequence[Item], str | None]]],
    *,
    limit: int | None,
    after: str | None,
    page_size: int,
    more_after: Callable[[str], str] = str,
) -> list[Item]:
    """Up to ``limit`` items (all with ``None``) read a page at a time: ``read(size, after)``
    gives a page and where the next one starts. When items were left out, says so on stderr
    and how to go on: a table alone would read as the whole list. ``more_after`` names the
    next page's start for people ("ID 42")."""
    items: list[Item] = []
    more = None  # where the items left out start, if some were
    while limit is None or len(items) < limit:
        size = page_size if limit is None else min(page_size, limit - len(items))
        page, more = await read(size, after)
        items += page
        if more is None or not page:
            break
        after = more
    if more is not None:
        print(
            f"stations: {len(items)} shown, more after {more_after(more)} "
            f"(--after {more}, or a larger --limit)",
            file=sys.stderr,
        )
    return items


class Usage(Exception):
    """A command line the server never sees: exit code 2."""


class OutputFailed(Exception):
    """Standard output could not be written: ``code`` is EXIT_OUTPUT_FAILED, or
    EXIT_STDOUT_CLOSED when its reader left."""

    def __init__(self, message: str, code: int = EXIT_OUTPUT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def stdout_to_devnull() -> None:
    """Python's own flush of stdout at exit would fail again (and print a traceback): it
    gets /dev/null."""
    if sys.stdout is None:
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # ValueError: a stream without a descriptor, or closed
        pass


def write_out(line: str) -> None:
    """``line`` on standard output, flushed at once: for output that must be known written
    before the command goes on (a token's secret before its entry is added to the file).
    Raises ``OutputFailed``; print() said nothing when stdout was closed (`>&-`)."""
    if sys.stdout is None:
        raise OutputFailed("cannot write the output: standard output is closed")
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_to_devnull()
        raise OutputFailed("cannot write the output: its reader left", EXIT_STDOUT_CLOSED) from None
    except (OSError, ValueError) as exc:  # a full disk (`>/dev/full`); ValueError: closed
        stdout_to_devnull()
        reason = getattr(exc, "strerror", None) or exc
        raise OutputFailed(f"cannot write the output: {reason}") from None


class Refused(Exception):
    """Input refused after part of it was sent and stored (the server did see the command),
    or a file the command could not use or change (``stations token``): exit code 1, not 2."""


def exit_code(exc: BaseException) -> int:
    if isinstance(exc, Refused):
        return EXIT_REFUSED
    if isinstance(exc, Usage):
        return EXIT_USAGE
    from stations.client import ConnectionFailed

    if isinstance(exc, ConnectionFailed):
        return EXIT_UNAVAILABLE
    status = getattr(exc, "status", None)
    if status == 404 and getattr(exc, "code", None) == "no_route":
        return EXIT_REFUSED  # no station is missing: the URL's path is wrong
    if status in (404, 410):
        return EXIT_NOT_FOUND
    if status == 409:
        return EXIT_CONFLICT
    if status in (401, 403):
        return EXIT_AUTH
    if status is None or status >= 500 or status == 429:
        return EXIT_UNAVAILABLE
    return EXIT_REFUSED


BINARY_MARK = "[binary, base64]"  # before a payload that is not UTF-8, in output for people


def payload_fields(data: Any) -> dict[str, Any]:
    """A payload as the API gives it: ``data``, or ``data`` null and ``dataBase64`` when the
    bytes are not UTF-8 (the SDK hands those over as bytes). Decoding them as text would
    replace bytes with U+FFFD, and the payload could not be had back."""
    if isinstance(data, bytes | bytearray):
        return {"data": None, "dataBase64": base64.b64encode(data).decode("ascii")}
    return {"data": data}


def payload_text(data: Any, *, quote: bool = False) -> str:
    """A payload for people: text as it is (JSON-quoted with ``quote``), a JSON value as
    JSON, and bytes that are not UTF-8 as base64 after ``BINARY_MARK``; control characters
    shown escaped (see ``printable``)."""
    if isinstance(data, bytes | bytearray):
        return f"{BINARY_MARK} {base64.b64encode(data).decode('ascii')}"
    if isinstance(data, str) and not quote:
        return printable(data)
    return printable(dumps(data))


# C0 and C1 controls, DEL, and the marks that reorder text (bidirectional controls).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\n``, ``\\x1b``, ``\\u202e``): whoever
    may produce to a station could otherwise send escape sequences to the terminal of whoever
    reads it (clear the screen, retitle the window, write the clipboard), and forge lines of
    the one-line-per-message output. ``--json`` output is exact."""
    return _CONTROLS.sub(_escape, text)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# The password of a URL's user information (``//user:secret@``): by pattern, so that a URL
# too broken to parse (``http://u:secret@[::1``) is shown without it too.
_PASSWORD = re.compile(r"//([^/@:\s]*):[^/@\s]*@")


def shown_url(text: str) -> str:
    """``text`` (a URL, or a message holding some) as the CLI prints it: a password
    (``http://user:secret@host``) is not shown."""
    return _PASSWORD.sub(r"//\1:***@", text)


def describe_error(exc: BaseException, url: str) -> str:
    """An SDK error in one line for stderr, without the password a URL may hold; with the
    SDK's notes (what became of the messages of a produce that failed)."""
    notes = [str(note) for note in getattr(exc, "__notes__", ())]
    return shown_url("; ".join([_describe_error(exc, url), *notes]))


def _describe_error(exc: BaseException, url: str) -> str:
    from stations.client import ConnectionFailed

    if isinstance(exc, ConnectionFailed):
        # "cannot reach URL (Connection refused)" rather than the whole client stack's words.
        cause = exc.__cause__
        os_error = getattr(cause, "os_error", None)
        # asyncio's strerror is "Connect call failed ('127.0.0.1', 4437)": the errno says why.
        errno = getattr(os_error, "errno", None)
        reason: str | None
        if isinstance(os_error, ssl.SSLError):
            # Its errno is OpenSSL's (1 for most): as an OS errno it read "Operation not
            # permitted" for an https URL to a plain-http server, or a bad certificate.
            reason = _tls_reason(os_error)
        elif isinstance(errno, int) and errno > 0:  # a resolver's (negative) has its own words
            reason = os.strerror(errno)
        else:
            reason = getattr(os_error, "strerror", None)
        if isinstance(cause, TimeoutError) or type(cause).__name__.endswith("Timeout"):
            reason = "no answer in time (--timeout)"
        return f"cannot reach {url} ({reason or _one_line(cause or exc)})"
    return _one_line(exc)


def _tls_reason(error: ssl.SSLError) -> str:
    verify = getattr(error, "verify_message", None)  # a certificate refused: which way
    if verify:
        return f"TLS: certificate {verify}"
    text = re.sub(r" \(_ssl\.c:[0-9]+\)", "", error.strerror or str(error))
    if error.reason == "WRONG_VERSION_NUMBER":
        text += "; is the server plain http?"
    return f"TLS: {text}"


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, bytes | bytearray):
        # Payloads go through payload_fields; any other bytes stay lossless and marked.
        return payload_text(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def dumps(value: Any) -> str:
    return json.dumps(value, default=_default, ensure_ascii=False, separators=(",", ":"))


def print_json(value: Any) -> None:
    print(json.dumps(value, default=_default, ensure_ascii=False, indent=2))


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds").replace("+00:00", "Z")
    if isinstance(value, str):
        return printable(value)
    return printable(dumps(value))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns padded to their widest cell, like ``kubectl get``; the last one is not padded."""
    text = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in text)]) for i, h in enumerate(headers)]
    for row in [list(headers), *text]:
        line = "  ".join(v.ljust(w) for v, w in zip(row[:-1], widths[:-1], strict=True))
        print(f"{line}  {row[-1]}" if line else row[-1])
    sys.stdout.flush()


def print_fields(fields: Sequence[tuple[str, Any]]) -> None:
    """``key: value`` lines, like ``kubectl describe``."""
    width = max(len(k) for k, _ in fields) + 1
    for key, value in fields:
        print(f"{key + ':':<{width}} {cell(value)}")


_DURATION = re.compile(r"([0-9]+)(ms|s|m|h|d)?")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1}


def message_count(text: str) -> int:
    """An argparse type: a number of messages, at least 1 (0 would read or send nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of messages: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def duration_ms(text: str) -> int:
    """``500ms``, ``30s``, ``10m``, ``24h``, ``7d``, or a plain number of milliseconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a duration: {text!r} (e.g. 500ms, 30s, 10m, 24h, 7d)")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def human_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
