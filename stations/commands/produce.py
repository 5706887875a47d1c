"""``stations produce STATION [DATA ...]``: messages from the arguments, or one per stdin line,
with message ids (``--msg-id``, or ``--id-field`` of each JSON message). Duplicates of an id in
the station's window are reported, not stored."""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from stations.client.errors import StationsError
from stations.commands.base import Refused, Usage, dumps, message_count, print_table

if TYPE_CHECKING:
    from stations.client import Client, NewMessage

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


def _payloads(args: argparse.Namespace) -> Iterator[tuple[int, str | bytes]]:
    """The messages' text; a stdin line that is not UTF-8 as its bytes (read as text, it was
    a traceback, or a lone surrogate the server refuses, in a strict UTF-8 locale)."""
    if args.data:
        yield from enumerate(args.data, 1)
        return
    for number, raw in enumerate(sys.stdin.buffer, 1):
        raw = raw.rstrip(b"\n").rstrip(b"\r")
        if not raw:
            continue
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError:
            yield number, raw


def _messages(
    args: argparse.Namespace, is_json: bool, payloads: Iterable[tuple[int, str | bytes]]
) -> Iterator[NewMessage]:
    from stations.client import NewMessage

    headers = _headers(args.header) or None
    ids = list(args.msg_id)
    source = "argument" if args.data else "line"
    count = 0
    for index, (number, text) in enumerate(payloads):
        count += 1
        data: Any = text  # bytes (not UTF-8) go as they are, base64 on the wire
        if is_json and isinstance(text, bytes):
            raise Usage(f"{source} {number} is not UTF-8 text and {args.station} is a JSON station")
        if is_json:
            try:
                data = json.loads(text)
            except ValueError:
                raise Usage(
                    f"{source} {number} is not JSON and {args.station} is a JSON station "
                    f"(quote a string: '\"...\"')"
                ) from None
        msg_id = None
        if ids:
            if index >= len(ids):
                raise Usage(f"{len(ids)} --msg-id for more messages; give one per message")
            msg_id = ids[index]
        elif args.id_field:
            if not isinstance(data, dict) or data.get(args.id_field) is None:
                raise Usage(f"{source} {number} has no field {args.id_field!r}")
            value = data[args.id_field]
            msg_id = value if isinstance(value, str) else dumps(value)
        yield NewMessage(data, msg_id, headers)
    if ids and len(ids) != count:
        raise Usage(f"{len(ids)} --msg-id for {count} messages; give one per message")


async def produce(args: argparse.Namespace, client: Client) -> int:
    if args.msg_id and args.id_field:
        raise Usage("give --msg-id or --id-field, not both")
    if not args.data and sys.stdin.isatty():
        raise Usage("no messages: give DATA arguments, or pipe one message per line on stdin")
    station = client.station(args.station)
    info = await station.info()
    rows: list[tuple[str, str | None, bool]] = []
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
            for message, result in zip(part, results, strict=True):
                rows.append((result.offset, message.msg_id, result.duplicate))
                if args.json:
                    line = {"offset": result.offset, "id": message.msg_id}
                    print(dumps({**line, "duplicate": result.duplicate}), flush=True)
            del batch[: len(part)]

    # Messages are checked before anything is sent when they come from the arguments; stdin
    # is sent in batches as it arrives.
    messages = _messages(args, info.is_json, _payloads(args))
    if args.data:
        messages = iter(list(messages))
    try:
        for message in messages:
            batch.append(message)
            if len(batch) >= size:
                await send()
        if batch:
            await send()
    except (Usage, StationsError) as exc:
        if not rows:
            raise
        # What was stored before the failure is said, so that a run again (without ids it
        # would store those messages twice) can start after it.
        _print_rows(args, rows)
        stored = f"the first {len(rows)} messages were stored (through offset {rows[-1][0]})"
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
    if not rows:
        raise Usage("no messages: give DATA arguments or lines on stdin")
    _print_rows(args, rows)
    return 0


def _print_rows(args: argparse.Namespace, rows: list[tuple[str, str | None, bool]]) -> None:
    if not args.json:
        print_table(
            ["OFFSET", "ID", "DUPLICATE"], [[o, i, "yes" if d else "no"] for o, i, d in rows]
        )
