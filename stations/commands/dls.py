"""``stations dls ls|replay|drop``: a station's dead-letter store."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from stations.commands.base import (
    Usage,
    duration_ms,
    payload_fields,
    payload_text,
    print_json,
    print_table,
    read_pages,
)

if TYPE_CHECKING:
    from stations.client import Client, DeadLetter, Station


def add_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    epilog: str,
) -> None:
    p = sub.add_parser("dls", help="list, replay and drop dead letters", epilog=epilog)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    ls = verbs.add_parser(
        "ls", aliases=["list"], parents=[common], help="dead letters, oldest first", epilog=epilog
    )
    ls.add_argument("station", help="station name")
    ls.add_argument("--group", help="only this group's dead letters")
    ls.add_argument(
        "-n", "--limit", type=int, default=100, help="at most this many (default %(default)s)"
    )
    ls.add_argument("--after", metavar="ID", help="the entries after this one (the next page)")
    ls.set_defaults(handler=list_dls)

    for name, help_text in (
        ("replay", "send dead letters back to their group with a fresh delivery count"),
        ("drop", "delete dead letters for good"),
    ):
        verb = verbs.add_parser(name, parents=[common], help=help_text, epilog=epilog)
        verb.add_argument("station", help="station name")
        verb.add_argument("ids", nargs="*", metavar="ID", help="entry ids (see dls ls)")
        verb.add_argument("--all", action="store_true", help="every entry instead of IDs")
        if name == "replay":
            verb.add_argument("--group", help="with --all: only this group's entries")
            verb.add_argument(
                "--delay",
                type=duration_ms,
                default=0,
                metavar="DURATION",
                help="the replayed messages are due this long after the replay, at most 7d, "
                "e.g. 10m (default: at once)",
            )
        verb.set_defaults(handler=replay if name == "replay" else drop)


def _wire(entry: DeadLetter) -> dict[str, Any]:
    return {
        "id": entry.id,
        "group": entry.group,
        "offset": entry.offset,
        "msgId": entry.msg_id,
        "headers": dict(entry.headers),
        **payload_fields(entry.data),  # dataBase64 for bytes that are not UTF-8, as the API
        "deliveryCount": entry.delivery_count,
        "reason": entry.reason,
        "error": entry.error,
        "deadLetteredAt": entry.dead_lettered_at,
    }


async def list_dls(args: argparse.Namespace, client: Client) -> int:
    if args.limit < 1:
        raise Usage("--limit must be at least 1")
    station = client.station(args.station)
    await _group_exists(args, station)
    after = args.after
    if after is not None and not after.isdigit():
        raise Usage(f"--after takes a dead letter's ID (a number), not {after!r}")

    async def read(size: int, after: str | None) -> tuple[list[DeadLetter], str | None]:
        page = await station.dead_letters(group=args.group, limit=size, after=after)
        return page.entries, page.next

    entries = await read_pages(
        read, limit=args.limit, after=after, page_size=1000, more_after="ID {}".format
    )
    if args.json:
        print_json([_wire(e) for e in entries])
        return 0
    print_table(
        ["ID", "GROUP", "OFFSET", "DELIVERIES", "REASON", "ERROR", "DATA"],
        [
            [
                e.id,
                e.group,
                e.offset,
                e.delivery_count,
                e.reason,
                e.error,
                payload_text(e.data, quote=True),
            ]
            for e in entries
        ],
    )
    return 0


async def _group_exists(args: argparse.Namespace, station: Station) -> None:
    """A group's dead letters go with it: an empty table, or "0 dead letters replayed", would
    hide a misspelt name."""
    if args.group and args.group not in {g.name for g in await station.groups()}:
        from stations.client import GroupNotFound

        raise GroupNotFound(f"group {args.group} not found on station {args.station}")


_ENTRY_ID = re.compile(r"[0-9]{1,20}")  # as dls ls gives them


def _selection(args: argparse.Namespace) -> None:
    if args.all == bool(args.ids):
        raise Usage("give entry IDs or --all (not both)")
    if getattr(args, "group", None) and not args.all:
        raise Usage("--group goes with --all")
    for entry in args.ids:
        # The server's refusal named the JSON field ("ids.0 is not a DLS entry id").
        if not _ENTRY_ID.fullmatch(entry):
            raise Usage(f"ID {entry!r} is not a DLS entry id (a number, see: stations dls ls)")


MAX_REPLAY_DELAY_MS = 604_800_000  # the API's limit of delayMs: 7 days


async def replay(args: argparse.Namespace, client: Client) -> int:
    _selection(args)
    if args.delay > MAX_REPLAY_DELAY_MS:
        raise Usage("--delay must be at most 7d")
    station = client.station(args.station)
    await _group_exists(args, station)
    # The SDK sends any number of IDs, in requests of as many as the API takes.
    n = await station.replay_dead_letters(
        args.ids or None, all=args.all, group=args.group, delay_ms=args.delay
    )
    if args.json:
        print_json({"replayed": n})
    else:
        print(f"{n} dead letters replayed")
    return 0


async def drop(args: argparse.Namespace, client: Client) -> int:
    _selection(args)
    station = client.station(args.station)
    n = await station.drop_dead_letters(args.ids or None, all=args.all)
    if args.json:
        print_json({"dropped": n})
    else:
        print(f"{n} dead letters dropped")
    return 0
