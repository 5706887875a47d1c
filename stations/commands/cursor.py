"""``stations cursor ls|show|set|delete``: a station's reader cursors, the positions readers
that keep their own progress (a Spark streaming query) commit, with their lag."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from stations.commands.base import (
    OFFSET,
    Usage,
    add_list_parser,
    naming_options,
    print_fields,
    print_json,
    print_table,
    read_pages,
)

if TYPE_CHECKING:
    from stations.client import Client, CursorInfo


def add_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    epilog: str,
) -> None:
    p = sub.add_parser(
        "cursor",
        help="list, show, set and delete reader cursors (positions readers commit)",
        epilog=epilog,
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    ls = add_list_parser(
        verbs,
        common,
        epilog,
        noun="cursor",
        help="a station's reader cursors with their offset and lag",
    )
    ls.set_defaults(handler=list_cursors)

    show = verbs.add_parser("show", parents=[common], help="one cursor", epilog=epilog)
    show.add_argument("station", help="station name")
    show.add_argument("cursor", help="cursor name")
    show.set_defaults(handler=show_cursor)

    put = verbs.add_parser(
        "set",
        parents=[common],
        help="commit a cursor's position (made on its first commit; it may move back)",
        description="Commit OFFSET as the cursor's position, as a reader does: the cursor is "
        "made on its first commit and may move back. OFFSET is an offset of the station, up to "
        "its tail, or -1 (nothing read yet). Needs a token that may consume.",
        epilog=epilog,
    )
    put.add_argument("station", help="station name")
    put.add_argument("cursor", help="cursor name")
    put.add_argument("offset", metavar="OFFSET", help="an offset token, or -1: nothing read yet")
    put.set_defaults(handler=set_cursor)

    delete = verbs.add_parser(
        "delete", parents=[common], help="forget a cursor (an admin token)", epilog=epilog
    )
    delete.add_argument("station", help="station name")
    delete.add_argument("cursor", help="cursor name")
    delete.set_defaults(handler=delete_cursor)


def _wire(cursor: CursorInfo) -> dict[str, Any]:
    """The cursor as the API gives it (its CursorView)."""
    updated = cursor.updated_at
    return {
        "name": cursor.name,
        "offset": cursor.offset,
        "lag": cursor.lag,
        "updatedAt": None
        if updated is None
        else updated.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


LIST_PAGE = 1000  # cursors a request of ``cursor ls`` asks for (the server's largest page)


async def list_cursors(args: argparse.Namespace, client: Client) -> int:
    if args.limit is not None and args.limit < 1:
        raise Usage("--limit must be at least 1")
    station = client.station(args.station)

    async def read(size: int, after: str | None) -> tuple[list[CursorInfo], str | None]:
        page = await station.cursor_page(size, after, prefix=args.prefix, contains=args.contains)
        return page.cursors, page.next

    cursors = await read_pages(read, limit=args.limit, after=args.after, page_size=LIST_PAGE)
    if args.json:
        print_json([_wire(c) for c in cursors])
        return 0
    print_table(
        ["NAME", "OFFSET", "LAG", "UPDATED"],
        [[c.name, c.offset, c.lag, c.updated_at] for c in cursors],
    )
    return 0


def _print_cursor(args: argparse.Namespace, cursor: CursorInfo) -> None:
    print_fields(
        [
            ("Name", cursor.name),
            ("Station", args.station),
            ("Offset", cursor.offset),
            ("Lag", cursor.lag),
            ("Updated", cursor.updated_at),
        ]
    )


async def show_cursor(args: argparse.Namespace, client: Client) -> int:
    cursor = await client.station(args.station).cursor(args.cursor)
    if args.json:
        print_json(_wire(cursor))
    else:
        _print_cursor(args, cursor)
    return 0


async def set_cursor(args: argparse.Namespace, client: Client) -> int:
    # An offset token, or -1 (the start): what the API's cursor commit takes.
    if args.offset != "-1" and not OFFSET.fullmatch(args.offset):
        raise Usage(
            f"OFFSET {args.offset!r} is not an offset (0000000000000042_0000000000000000) nor -1"
        )
    # The server names the JSON field: "offset is beyond the station's tail".
    cursor = await naming_options(
        client.station(args.station).commit_cursor(args.cursor, args.offset),
        {"offset": f"OFFSET {args.offset}"},
        it=True,
    )
    if args.json:
        print_json(_wire(cursor))
    else:
        print(f"cursor {args.cursor} on {args.station} at {cursor.offset} (lag {cursor.lag})")
    return 0


async def delete_cursor(args: argparse.Namespace, client: Client) -> int:
    # The server's DELETE of a missing cursor is a 404 (exit 3): no look-up first.
    await client.station(args.station).delete_cursor(args.cursor)
    if args.json:
        print_json({"deleted": args.cursor, "station": args.station})
    else:
        print(f"cursor {args.cursor} on {args.station} deleted")
    return 0
