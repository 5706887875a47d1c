"""``stations read STATION``: messages from an offset until up to date; ``stations tail
STATION``: follow new messages (from now) until the station is closed or Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
from typing import TYPE_CHECKING

from stations.commands.base import cell, dumps, message_count

if TYPE_CHECKING:
    from stations.client import Client, Station, StoredMessage

PAGE = 500


def add_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    epilog: str,
) -> None:
    for name, follow, help_text in (
        ("read", False, "print a station's messages from an offset until up to date"),
        ("tail", True, "follow a station's new messages (until it is closed, or Ctrl-C)"),
    ):
        p = sub.add_parser(name, parents=[common], help=help_text, epilog=epilog)
        p.add_argument("station", help="station name")
        p.add_argument(
            "--from",
            dest="start",
            default="now" if follow else "-1",
            metavar="OFFSET",
            help="-1 for the beginning, an offset token, or now "
            f"(default {'now' if follow else '-1'})",
        )
        p.add_argument(
            "-n",
            "--limit",
            type=message_count,
            default=None,
            help="stop after this many messages (default: no limit)",
        )
        p.set_defaults(handler=tail if follow else read, follow=follow)


def _print(args: argparse.Namespace, message: StoredMessage) -> None:
    if args.json:
        view = {
            "offset": message.offset,
            "id": message.msg_id,
            "headers": dict(message.headers),
            "data": message.data,
            "time": message.time,
        }
        print(dumps(view), flush=True)
    else:
        data = message.data if isinstance(message.data, str) else dumps(message.data)
        print(f"{message.offset}  {cell(message.msg_id)}  {data}", flush=True)


async def _tail_offset(station: Station) -> str:
    return (await station.info()).stats.tail_offset


async def _wait_for_more(station: Station, offset: str) -> bool:
    """Wait (server long-poll, no sleeping here) until the station has data past ``offset``;
    False when the station was closed."""
    async with contextlib.aclosing(station.read(offset, live="long-poll")) as reader:
        async for batch in reader:
            if batch.items:
                return True
    return False


async def _messages(args: argparse.Namespace, client: Client) -> int:
    station = client.station(args.station)
    offset = args.start
    if offset == "now":
        offset = await _tail_offset(station)
    remaining = args.limit
    while remaining is None or remaining > 0:
        page = await station.browse(offset, PAGE if remaining is None else min(PAGE, remaining))
        for message in page.messages:
            _print(args, message)
        if remaining is not None:
            remaining -= len(page.messages)
        offset = page.next_offset
        caught_up = page.up_to_date and not page.messages
        if caught_up and (not args.follow or not await _wait_for_more(station, offset)):
            break
    return 0


async def read(args: argparse.Namespace, client: Client) -> int:
    return await _messages(args, client)


async def tail(args: argparse.Namespace, client: Client) -> int:
    return await _messages(args, client)
