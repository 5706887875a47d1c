"""``stations group ls|show|seek|delete``: a station's consumer groups."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING, Any

from stations.commands.base import Usage, human_ms, print_fields, print_json, print_table

if TYPE_CHECKING:
    from stations.client import Client, GroupInfo


def add_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    epilog: str,
) -> None:
    p = sub.add_parser("group", help="list, show, seek and delete consumer groups", epilog=epilog)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    ls = verbs.add_parser(
        "ls",
        aliases=["list"],
        parents=[common],
        help="a station's groups with pending and lag",
        epilog=epilog,
    )
    ls.add_argument("station", help="station name")
    ls.set_defaults(handler=list_groups)

    show = verbs.add_parser("show", parents=[common], help="one group", epilog=epilog)
    show.add_argument("station", help="station name")
    show.add_argument("group", help="group name")
    show.set_defaults(handler=show_group)

    seek = verbs.add_parser(
        "seek",
        parents=[common],
        help="move a group to an offset, a time, earliest or now (revokes its leases)",
        epilog=epilog,
    )
    seek.add_argument("station", help="station name")
    seek.add_argument("group", help="group name")
    target = seek.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--to", metavar="WHERE", help="earliest, now, or an offset token: deliver from there"
    )
    target.add_argument(
        "--time",
        metavar="WHEN",
        help="ISO 8601 time with a zone (2026-11-22T10:00:00Z) or epoch ms: deliver the "
        "messages stored from then on",
    )
    seek.set_defaults(handler=seek_group)

    delete = verbs.add_parser(
        "delete", parents=[common], help="delete a group and its leases", epilog=epilog
    )
    delete.add_argument("station", help="station name")
    delete.add_argument("group", help="group name")
    delete.set_defaults(handler=delete_group)


def _wire(group: GroupInfo) -> dict[str, Any]:
    return {
        "name": group.name,
        "maxAckTimeMs": group.max_ack_time_ms,
        "maxMsgDeliveries": group.max_msg_deliveries,
        "pending": group.pending,
        "inFlight": group.in_flight,
        "deadLettered": group.dead_lettered,
        "lag": group.lag,
        "cursor": group.cursor,
    }


async def list_groups(args: argparse.Namespace, client: Client) -> int:
    groups = await client.station(args.station).groups()
    if args.json:
        print_json([_wire(g) for g in groups])
        return 0
    print_table(
        ["NAME", "PENDING", "IN-FLIGHT", "LAG", "DLS", "MAX-ACK", "MAX-DELIVERIES", "CURSOR"],
        [
            [
                g.name,
                g.pending,
                g.in_flight,
                g.lag,
                g.dead_lettered,
                human_ms(g.max_ack_time_ms),
                g.max_msg_deliveries,
                g.cursor,
            ]
            for g in groups
        ],
    )
    return 0


async def _find(client: Client, station: str, name: str) -> GroupInfo:
    from stations.client import GroupNotFound

    for group in await client.station(station).groups():
        if group.name == name:
            return group
    raise GroupNotFound(f"group {name} not found on station {station}", status=404)


async def show_group(args: argparse.Namespace, client: Client) -> int:
    group = await _find(client, args.station, args.group)
    if args.json:
        print_json(_wire(group))
    else:
        print_fields(
            [
                ("Name", group.name),
                ("Station", args.station),
                ("Pending", group.pending),
                ("In flight", group.in_flight),
                ("Lag", group.lag),
                ("Dead-lettered", group.dead_lettered),
                ("Max ack time", human_ms(group.max_ack_time_ms)),
                ("Max deliveries", group.max_msg_deliveries),
                ("Cursor", group.cursor),
            ]
        )
    return 0


def _seek_target(args: argparse.Namespace) -> str | int | datetime:
    if args.to is not None:
        return str(args.to)
    text = args.time.strip()
    if text.isascii() and text.isdigit():  # ("²".isdigit() too, which int() refuses)
        return int(text)  # epoch milliseconds
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise Usage(
            f"--time must be an ISO 8601 time with a zone (2026-11-22T10:00:00Z) or epoch ms, not {text!r}"
        )
    return when


async def seek_group(args: argparse.Namespace, client: Client) -> int:
    result = await client.station(args.station).seek(args.group, _seek_target(args))
    if args.json:
        print_json({"cursor": result.cursor, "revoked": result.revoked, "dropped": result.dropped})
    else:
        print(
            f"group {args.group} on {args.station} now at {result.cursor} "
            f"({result.revoked} leases revoked, {result.dropped} redeliveries dropped)"
        )
    return 0


async def delete_group(args: argparse.Namespace, client: Client) -> int:
    await _find(client, args.station, args.group)  # the server's DELETE is idempotent
    await client.station(args.station).delete_group(args.group)
    if args.json:
        print_json({"deleted": args.group, "station": args.station})
    else:
        print(f"group {args.group} on {args.station} deleted")
    return 0
