"""``stations produce STATION [DATA ...]``: messages from the arguments, or one per stdin line,
with message ids (``--msg-id``, or ``--id-field`` of each JSON message). Duplicates of an id in
the station's window are reported, not stored."""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import os
import queue
import re
import sys
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from stations.client.errors import StationsError
from stations.commands.base import Refused, Usage, cell, dumps, message_count

if TYPE_CHECKING:
    from stations.client import Client, NewMessage, Produced

BATCH = 500  # stdin lines per request (one transaction each), unless --batch says otherwise
# The server's refusal of a produce of more messages than it takes in one request (the
# 10000 of the API, or its --max-append-messages if lower): 400, field "messages".
_TOO_MANY = re.compile(r"at most ([0-9]+) messages per request")


def add_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    epilog: str,
) -> None:
    p = sub.add_parser(
        "produce",
        parents=[common],
        help="produce messages, from arguments or one per stdin line",
        description="Produce messages to a station: each DATA argument is one message; "
        "without DATA, each line of stdin is one. On a JSON station every message must be "
        "JSON (quote strings: '\"text\"').",
        epilog=epilog,
    )
    p.add_argument("station", help="station name")
    p.add_argument("data", nargs="*", help="message payloads (default: stdin lines)")
    p.add_argument(
        "--msg-id",
        action="append",
        default=[],
        help="message id, once per message in order; a duplicate in the station's window is "
        "reported and not stored",
    )
    p.add_argument(
        "--id-field",
        help="take each JSON message's id from this top-level field (for stdin streams)",
    )
    p.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a header for every message (repeatable)",
    )
    p.add_argument(
        "--batch",
        type=message_count,
        default=BATCH,
        metavar="N",
        help="messages per request (default %(default)s); a request the server refuses for "
        "its number of messages (serve --max-append-messages) or its size (64 MiB) is sent "
        "again in smaller ones",
    )
    p.set_defaults(handler=produce)


def _fewer(exc: StationsError, sent: int) -> int | None:
    """How many messages to send per request after ``exc`` answered a request of ``sent``:
    fewer when the server refused it for its number of messages or for its size (a refusal
    stores none of them, so sending them again cannot store one twice), else None."""
    if sent < 2:
        return None
    if exc.status == 413 and exc.field == "body":  # over the server's 64 MiB per request
        return sent // 2
    if exc.status != 400 or exc.field != "messages":
        return None
    match = _TOO_MANY.search(exc.message)
    if match is None:
        return None
    most = int(match.group(1))
    return most if 1 <= most < sent else sent // 2


def _headers(pairs: list[str]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise Usage(f"--header must be KEY=VALUE (got {pair!r})")
        headers[key] = value
    return headers


def _payloads(lines: Iterable[bytes]) -> Iterator[tuple[int, str | bytes]]:
    """The messages of stdin's lines, numbered: a line's end (``\\n``, ``\\r\\n``) is not part
    of it, a blank line is none; a line that is not UTF-8 as its bytes (read as text, it was a
    traceback, or a lone surrogate the server refuses, in a strict UTF-8 locale)."""
    for number, raw in enumerate(lines, 1):
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")  # one line end, no more
        if not raw:
            continue
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError:
            yield number, raw


def _argument(text: str) -> str | bytes:
    """A DATA argument as a stdin line is taken: its bytes when they are not UTF-8 (Python
    holds them as lone surrogates, which the server refused as text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(text)
    return text


def _read_lines(fd: int) -> Iterator[bytes]:
    """The lines of ``fd``, read with ``os.read``: a thread blocked in ``sys.stdin``'s read
    holds its lock, and the interpreter aborted at exit (Ctrl-C) waiting for it."""
    pending: list[bytes] = []  # a line's pieces so far (a line may be longer than a read)
    while chunk := os.read(fd, 1 << 16):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending.append(chunk[start:end])
            yield b"".join(pending)
            pending = []
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:])
    if pending:
        yield b"".join(pending)


class _CommandEnded(Exception):
    pass


class _StdinLines:
    """Stdin's messages as they come, read by a thread of their own: read on the event loop,
    nothing was sent until ``--batch`` lines had come (``tail -f log | stations produce``
    stored nothing for minutes), and Ctrl-C was not heard until the next line.

    ``chunks`` yields what has arrived, at most ``size`` at a time, without waiting for more:
    lines that come while a request is under way go in the next one (Kafka's linger of 0).
    The queue is bounded, so a large file is not read into memory ahead of the requests."""

    def __init__(self, fd: int, bound: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._lines: queue.Queue[tuple[int, str | bytes] | None] = queue.Queue(bound)
        self._ready = asyncio.Event()
        self.failed: OSError | None = None  # why reading stdin stopped before its end
        self.ended = False  # its end was taken: the chunk yielded last is its last
        self.thread = threading.Thread(target=self._run, args=(fd,), daemon=True)
        self.thread.start()

    def _run(self, fd: int) -> None:
        try:
            try:
                for item in _payloads(_read_lines(fd)):
                    self._put(item)
            except OSError as exc:  # EIO, a non-blocking stdin's EAGAIN: not its end
                self.failed = exc
            self._put(None)
        except _CommandEnded:
            pass

    @property
    def waiting(self) -> int:
        """Messages read from stdin and not yet taken for a request."""
        return sum(1 for item in list(self._lines.queue) if item is not None)

    def _put(self, item: tuple[int, str | bytes] | None) -> None:
        self._lines.put(item)  # waits while the requests are behind
        if self._lines.qsize() <= 1 or item is None:  # the loop may be waiting: wake it
            try:
                self._loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:  # its event loop is closed: the command ended (an error)
                # Stdin read on is no one's: the thread stops without a word (it printed a
                # traceback after the command's own error).
                raise _CommandEnded from None

    async def chunks(self, size: int) -> AsyncIterator[list[tuple[int, str | bytes]]]:
        while True:
            await self._ready.wait()
            self._ready.clear()
            chunk: list[tuple[int, str | bytes]] = []
            while len(chunk) < size:
                try:
                    item = self._lines.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    # Its end, unless reading failed: then what came after is not known, and
                    # a --msg-id too many is no mistake of the command line's.
                    self.ended = self.failed is None
                    if chunk:
                        yield chunk
                    if self.failed is not None:
                        # What came before was sent; the rest is not known: not the end.
                        raise Usage(f"reading stdin failed: {self.failed}")
                    return
                chunk.append(item)
            if not self._lines.empty():
                self._ready.set()  # more than ``size`` had come
            if chunk:
                yield chunk


def _not_json(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"{literal} is beyond a double's range")
    return value


class _Messages:
    """Payloads made messages, one at a time (stdin's come in chunks): JSON parsed on a JSON
    station, message ids from ``--msg-id`` (one per message, in order) or ``--id-field``."""

    def __init__(self, args: argparse.Namespace, is_json: bool) -> None:
        self._args = args
        self._is_json = is_json
        self._headers = _headers(args.header) or None
        self._ids = list(args.msg_id)
        self._source = "argument" if args.data else "line"
        self.count = 0

    def __call__(self, number: int, text: str | bytes) -> NewMessage:
        from stations.client import NewMessage

        args, source = self._args, self._source
        index, self.count = self.count, self.count + 1
        data: Any = text  # bytes (not UTF-8) go as they are, base64 on the wire
        if self._is_json and isinstance(text, bytes):
            raise Usage(f"{source} {number} is not UTF-8 text and {args.station} is a JSON station")
        if self._is_json:
            try:
                # Python's json takes NaN, Infinity and 1e999 (infinite); JSON does not, nor
                # does the server: refused here, before anything of the input is sent.
                data = json.loads(text, parse_constant=_not_json, parse_float=_finite)
            except ValueError:
                raise Usage(
                    f"{source} {number} is not JSON and {args.station} is a JSON station "
                    f"(quote a string: '\"...\"')"
                ) from None
        msg_id = None
        if self._ids:
            if index >= len(self._ids):
                raise Usage(f"{len(self._ids)} --msg-id for more messages; give one per message")
            msg_id = self._ids[index]
        elif args.id_field:
            if not isinstance(data, dict) or data.get(args.id_field) is None:
                raise Usage(f"{source} {number} has no field {args.id_field!r}")
            value = data[args.id_field]
            msg_id = value if isinstance(value, str) else dumps(value)
        return NewMessage(data, msg_id, self._headers)

    def finish(self) -> None:
        if self._ids and len(self._ids) != self.count:
            raise _SurplusIds(
                f"{len(self._ids)} --msg-id for {self.count} messages; give one per message"
            )


class _SurplusIds(Usage):
    """More --msg-id than messages: found when the input ended."""


async def produce(args: argparse.Namespace, client: Client) -> int:
    if args.msg_id and args.id_field:
        raise Usage("give --msg-id or --id-field, not both")
    if not args.data and (sys.stdin is None or sys.stdin.isatty()):  # None: closed (<&-)
        raise Usage("no messages: give DATA arguments, or pipe one message per line on stdin")
    station = client.station(args.station)
    info = await station.info()
    # Each request's rows are printed as it is answered; only the count and the last offset
    # are kept (`tail -f app.log | stations produce logs` held every row, printed none).
    out = _Rows(args)
    batch: list[NewMessage] = []
    size = args.batch  # lowered for good when the server refuses a request of this many
    in_flight = 0  # messages of the request that failed, if one did

    async def send() -> None:
        nonlocal size, in_flight
        while batch:
            part = batch[:size]
            in_flight = len(part)
            try:
                results = await station.produce_many(part)
            except StationsError as exc:
                fewer = _fewer(exc, len(part))
                if fewer is None:
                    raise
                size = fewer
                continue
            del batch[: len(part)]
            out.stored(part, results)

    # Messages are checked before anything is sent when they come from the arguments; stdin
    # is sent as it arrives, what came meanwhile in the next request.
    convert = _Messages(args, info.is_json)
    stdin: _StdinLines | None = None
    try:
        if args.data:
            given = [_argument(text) for text in args.data]
            batch += [convert(number, text) for number, text in enumerate(given, 1)]
            convert.finish()
            await send()
        else:
            stdin = _StdinLines(sys.stdin.fileno(), 4 * size)
            async for chunk in stdin.chunks(size):
                batch += [convert(number, text) for number, text in chunk]
                if stdin.ended:  # a --msg-id too many is said before the last request is sent
                    convert.finish()
                await send()
            convert.finish()
    except asyncio.CancelledError:  # Ctrl-C: say what was stored, as a failure does
        stored = (
            f"the first {out.count} messages were stored (through offset {out.last})"
            if out.count
            else "no message was stored"
        )
        if batch:
            stored += f"; whether the next {len(batch)} were is not known"
        unsent = stdin.waiting if stdin is not None else 0
        if unsent > 0:
            stored += f"; {unsent} more lines read were not sent"
        print(f"stations: interrupted: {stored}", file=sys.stderr)
        raise
    except (Usage, StationsError) as exc:
        if not out.count:
            raise
        # What was stored before the failure is said, so that a run again (without ids it
        # would store those messages twice) can start after it.
        stored = f"the first {out.count} messages were stored (through offset {out.last})"
        if isinstance(exc, _SurplusIds) and not batch:
            # Found once every message was stored (stdin ended after the last request went
            # out): there is no rest to speak of.
            raise Refused(
                f"{exc}; all {out.count} messages were stored (through offset {out.last})"
            ) from None
        if isinstance(exc, Usage) or exc.status in (400, 413):
            raise Refused(f"{exc}; {stored}, the rest were not") from None
        if exc.status is None or exc.status >= 500:  # no answer: the batch may be stored too
            stored += f"; whether the next {in_flight} were is not known"
        else:
            stored += ", the rest were not"
        told = copy.copy(exc)  # same class and status, so the same exit code
        told.message = f"{exc}; {stored}"
        told.args = (told.message,)
        raise told from None
    if not out.count:
        raise Usage("no messages: give DATA arguments or lines on stdin")
    return 0


# Fixed column widths, as rows are printed before the next ones are known: an offset token's,
# and an id's (most are shorter; a longer one shifts its row's last column).
_OFFSET_WIDTH = 33
_ID_WIDTH = 20


class _Rows:
    """The rows of stored messages, printed as they are stored (a table, or JSON lines); only
    their count and the last offset are kept, for what a failure or Ctrl-C says."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._json: bool = args.json
        # With --msg-id every id is known: the column fits them. Without ids it holds "-".
        self._id_width = (
            max([2, *(len(cell(i)) for i in args.msg_id)])
            if args.msg_id or not args.id_field
            else _ID_WIDTH
        )
        self.count = 0
        self.last: str | None = None

    def stored(self, part: Sequence[NewMessage], results: Sequence[Produced]) -> None:
        lines = []
        for message, result in zip(part, results, strict=True):
            if self._json:
                line = {"offset": result.offset, "id": message.msg_id}
                lines.append(dumps({**line, "duplicate": result.duplicate}))
                continue
            if not self.count and not lines:
                lines.append(self._row("OFFSET", "ID", "DUPLICATE"))
            lines.append(
                self._row(result.offset, cell(message.msg_id), "yes" if result.duplicate else "no")
            )
        self.count += len(results)
        if results:
            self.last = results[-1].offset
        if lines:
            print("\n".join(lines), flush=True)

    def _row(self, offset: str, msg_id: str, duplicate: str) -> str:
        return f"{offset:<{_OFFSET_WIDTH}}  {msg_id:<{self._id_width}}  {duplicate}"
