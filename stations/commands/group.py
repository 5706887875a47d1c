"""``stations group ls|show|create|edit|seek|fetch|ack|extend|nack|dead-letter|delete``: a
station's consumer groups."""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from stations.commands.base import (
    OFFSET,
    Refused,
    Usage,
    add_list_parser,
    dumps,
    duration_ms,
    human_ms,
    in_chunks,
    message_count,
    naming_options,
    payload_text,
    print_fields,
    print_json,
    print_table,
    printable,
    read_pages,
)

if TYPE_CHECKING:
    from stations.client import Client, GroupInfo


def add_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    epilog: str,
) -> None:
    p = sub.add_parser(
        "group",
        help="list, show, create, edit, seek, fetch, ack, extend, nack, dead-letter and delete "
        "consumer groups",
        epilog=epilog,
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    ls = add_list_parser(
        verbs, common, epilog, noun="group", help="a station's groups with pending and lag"
    )
    ls.set_defaults(handler=list_groups)

    show = verbs.add_parser("show", parents=[common], help="one group", epilog=epilog)
    show.add_argument("station", help="station name")
    show.add_argument("group", help="group name")
    show.set_defaults(handler=show_group)

    create = verbs.add_parser(
        "create",
        parents=[common],
        help="create a group (the same limits again is not an error)",
        description="Create a consumer group. A group that exists with the limits given (or "
        "none given) is no error; with other limits it is exit 4 (change them with group "
        "edit). Consumers also create their group on start.",
        epilog=epilog,
    )
    create.add_argument("station", help="station name")
    create.add_argument("group", help="group name")
    create.add_argument(
        "--from",
        dest="start",
        metavar="WHERE",
        help="earliest, latest or an offset: where the group starts (default earliest)",
    )
    _limit_options(create, " (default: the station's consumer default)")
    create.set_defaults(handler=create_group)

    edit = verbs.add_parser(
        "edit",
        parents=[common],
        help="change a group's limits (only the options given)",
        epilog=epilog,
    )
    edit.add_argument("station", help="station name")
    edit.add_argument("group", help="group name")
    _limit_options(edit, "")
    edit.set_defaults(handler=edit_group)

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

    fetch = verbs.add_parser(
        "fetch",
        parents=[common],
        help="lease messages from a group and print them (with --ack, ack them)",
        description="Lease up to -n messages from a group, as a consumer's fetch does, and print "
        "them with their delivery count and ack deadline. Without --ack they stay leased until "
        "settled (group ack, nack or dead-letter) or until their lease expires (group extend "
        "keeps it). "
        "With --json each line is the message as the API gives it, which --leases-from takes: "
        "stations group fetch s g --json | stations group nack s g --leases-from -",
        epilog=epilog,
    )
    fetch.add_argument("station", help="station name")
    fetch.add_argument("group", help="group name")
    fetch.add_argument(
        "-n",
        "--limit",
        type=message_count,
        default=1,
        help="lease at most this many, up to 1000 (default %(default)s)",
    )
    fetch.add_argument(
        "--wait",
        type=duration_ms,
        default=0,
        metavar="DURATION",
        help="wait this long for a first message, at most 5m, e.g. 10s (default: answer at once)",
    )
    fetch.add_argument(
        "--consumer", default="cli", help="the consumer name the leases go to (default %(default)s)"
    )
    fetch.add_argument(
        "--ack", action="store_true", help="ack the messages once printed (as nats consumer next)"
    )
    fetch.set_defaults(handler=fetch_messages)

    ack = _settle_parser(
        verbs,
        common,
        epilog,
        "ack",
        "settle delivered messages as done (by offset)",
        "The API's ack names no delivery: whichever delivery of the message the group "
        "delivered and has not settled is acked, even after its lease expired, until the "
        "message is delivered again. Offsets the group does not have out are listed as "
        "unknown and do not change the exit code. --offsets-from takes the lines of group "
        "fetch --json: stations group fetch s g -n 10 --json | stations group ack s g "
        "--offsets-from -",
        by_lease=False,
    )
    ack.set_defaults(handler=ack_messages)

    extend = _settle_parser(
        verbs,
        common,
        epilog,
        "extend",
        "keep the leases of messages still being worked on (--lease-time)",
        "Each lease still held runs until --lease-time from now (sooner than it would have, "
        "if that is less than it had left); it is no delivery: the delivery count stays. By "
        "OFFSET, any delivery of the message the group has out is extended; by --lease, only "
        "the delivery a fetch answered. Leases that expired (their message may be on its way "
        "to another consumer), and offsets and deliveries the group does not have out, are "
        "listed as unknown and do not change the exit code.",
    )
    extend.add_argument(
        "--lease-time",
        type=duration_ms,
        metavar="DURATION",
        help="how long from now each lease runs, 100ms to 12h, e.g. 5m (default: the group's "
        "max ack time)",
    )
    extend.add_argument(
        "--consumer", help="extend only the leases this consumer holds (default: any consumer's)"
    )
    extend.set_defaults(handler=extend_leases)

    nack_parser = _settle_parser(
        verbs,
        common,
        epilog,
        "nack",
        "give leased messages back for redelivery (after --delay)",
        _SETTLED_HOW,
    )
    nack_parser.add_argument(
        "--delay",
        type=duration_ms,
        default=0,
        metavar="DURATION",
        help="redeliver after this long, at most 24h, e.g. 30s (default: at once)",
    )
    nack_parser.set_defaults(handler=nack)

    dead = _settle_parser(
        verbs,
        common,
        epilog,
        "dead-letter",
        "move leased messages to the dead-letter store (with --reason)",
        _SETTLED_HOW,
    )
    dead.add_argument("--reason", help="kept as the dead letter's error (at most 4096 characters)")
    dead.set_defaults(handler=dead_letter)

    delete = verbs.add_parser(
        "delete", parents=[common], help="delete a group and its leases", epilog=epilog
    )
    delete.add_argument("station", help="station name")
    delete.add_argument("group", help="group name")
    delete.set_defaults(handler=delete_group)


_SETTLED_HOW = (
    "By OFFSET, any delivery of the message the group has out is settled; by --lease, only "
    "the delivery a fetch answered (a lease that expired and went to another consumer is left "
    "alone, and listed as unknown). Offsets and deliveries the group does not have out are "
    "listed as unknown and do not change the exit code."
)


def _settle_parser(
    verbs: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    epilog: str,
    verb: str,
    help_text: str,
    how: str,
    *,
    by_lease: bool = True,
) -> argparse.ArgumentParser:
    """A verb that names leased messages: OFFSETs and, where the API takes them, the leases a
    fetch answered (``by_lease``), else ``--offsets-from``."""
    p: argparse.ArgumentParser = verbs.add_parser(
        verb,
        parents=[common],
        help=help_text,
        description=f"{help_text[0].upper()}{help_text[1:]}. {how}",
        epilog=epilog,
    )
    p.add_argument("station", help="station name")
    p.add_argument("group", help="group name")
    p.add_argument("offsets", nargs="*", metavar="OFFSET", help="message offsets")
    if not by_lease:
        p.add_argument(
            "--offsets-from",
            metavar="PATH",
            help="read offsets from this file, one per line: an offset, or a JSON object with "
            "an offset (a line of group fetch --json) (- for stdin)",
        )
    # ack takes them too, unlisted, only to refuse them saying what to give instead (argparse's
    # "unrecognized arguments" would not).
    p.add_argument(
        "--lease",
        action="append",
        default=[],
        metavar="LEASE",
        help="a delivery as its fetch answered it: OFFSET,DELIVERY-COUNT,ACK-DEADLINE or "
        'the JSON object {"offset": ..., "deliveryCount": ..., "ackDeadline": ...} (a '
        "fetched message as the API gives it) (repeatable)"
        if by_lease
        else argparse.SUPPRESS,
    )
    p.add_argument(
        "--leases-from",
        metavar="PATH",
        help="read leases from this file, one per line in either form of --lease (- for stdin)"
        if by_lease
        else argparse.SUPPRESS,
    )
    return p


def _limit_options(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--max-ack-time",
        type=duration_ms,
        metavar="DURATION",
        help="lease time before a message is delivered again, 100ms to 12h" + default,
    )
    p.add_argument(
        "--max-deliveries",
        type=int,
        metavar="N",
        help="deliveries before a message is dead-lettered, 1 to 1000" + default,
    )


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    """The limits given, checked here so that the error names the option (the server's names
    the JSON field, in milliseconds)."""
    limits: dict[str, Any] = {}
    if args.max_ack_time is not None:
        if not 100 <= args.max_ack_time <= 43_200_000:
            raise Usage("--max-ack-time must be from 100ms to 12h")
        limits["max_ack_time_ms"] = args.max_ack_time
    if args.max_deliveries is not None:
        if not 1 <= args.max_deliveries <= 1000:
            raise Usage("--max-deliveries must be from 1 to 1000")
        limits["max_msg_deliveries"] = args.max_deliveries
    return limits


async def create_group(args: argparse.Namespace, client: Client) -> int:
    from stations.client import Conflict, PreconditionFailed

    limits = _limits(args)
    if args.start is not None and not (
        args.start in ("earliest", "latest") or OFFSET.fullmatch(args.start)
    ):
        raise Usage(f"--from must be earliest, latest or an offset, not {args.start!r}")
    try:
        # If-None-Match: the server creates the group or leaves a standing one as it is, in
        # one write: a group another client makes meanwhile is never changed by this one.
        info = await naming_options(
            client.station(args.station).ensure_group(
                args.group, start_from=args.start, exists=False, **limits
            ),
            {"startFrom": f"--from {args.start}"},
            it=True,
        )
    except PreconditionFailed:
        info = await _find(client, args.station, args.group)
        differs = [
            (option, value)
            for key, option, value in (
                ("max_ack_time_ms", "--max-ack-time", human_ms(info.max_ack_time_ms)),
                ("max_msg_deliveries", "--max-deliveries", info.max_msg_deliveries),
            )
            if key in limits and limits[key] != getattr(info, key)
        ]
        if differs:
            option, value = differs[0]
            # A standing group keeps its limits (and place): change them with edit.
            raise Conflict(
                f"group {args.group} exists on {args.station} with {option} {value} "
                "(change it with: stations group edit)",
                status=409,
            ) from None
    if args.json:
        print_json({**_wire(info), "created": info.created})
    elif info.created:
        print(f"group {args.group} on {args.station} created at {info.cursor}")
    else:
        # --from places a new group only: a standing one stays where it is.
        where = " (--from places a new group only: see group seek)" if args.start else ""
        print(f"group {args.group} on {args.station} already exists with these limits{where}")
    return 0


async def edit_group(args: argparse.Namespace, client: Client) -> int:
    from stations.client import GroupNotFound, PreconditionFailed

    limits = _limits(args)
    if not limits:
        raise Usage("nothing to change: give --max-ack-time or --max-deliveries")
    try:
        # If-Match: a group deleted meanwhile is not made again by the edit.
        info = await client.station(args.station).ensure_group(args.group, exists=True, **limits)
    except PreconditionFailed:
        raise GroupNotFound(
            f"group {args.group} not found on station {args.station}", status=404
        ) from None
    if args.json:
        print_json(_wire(info))
    else:
        _print_group(args, info)
    return 0


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


LIST_PAGE = 1000  # groups a request of ``group ls`` asks for (the server's largest page)


async def list_groups(args: argparse.Namespace, client: Client) -> int:
    if args.limit is not None and args.limit < 1:
        raise Usage("--limit must be at least 1")
    station = client.station(args.station)

    async def read(size: int, after: str | None) -> tuple[list[GroupInfo], str | None]:
        page = await station.group_page(size, after, prefix=args.prefix, contains=args.contains)
        return page.groups, page.next

    groups = await read_pages(read, limit=args.limit, after=args.after, page_size=LIST_PAGE)
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

    # The first group by name that starts with the name is the group, if it exists: one row
    # read and counted, not every group of the station.
    for group in (await client.station(station).group_page(1, prefix=name)).groups:
        if group.name == name:
            return group
    raise GroupNotFound(f"group {name} not found on station {station}", status=404)


async def show_group(args: argparse.Namespace, client: Client) -> int:
    group = await _find(client, args.station, args.group)
    if args.json:
        print_json(_wire(group))
    else:
        _print_group(args, group)
    return 0


def _print_group(args: argparse.Namespace, group: GroupInfo) -> None:
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
    # The server names the JSON field: "to must be earliest, now or an offset".
    result = await naming_options(
        client.station(args.station).seek(args.group, _seek_target(args)),
        {"to": f"--to {args.to}", "time": f"--time {args.time}"},
    )
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


# The API's limits: an offset token, a request's items, a nack's delay.
MAX_ITEMS = 10_000
MAX_DELAY_MS = 86_400_000


def _lease(text: str, where: str) -> dict[str, Any]:
    """One ``--lease`` (or line of ``--leases-from``) as the API names a delivery; ``where``
    says which, for the error."""
    text = text.strip()
    where = f"{where} {text!r}"
    parts: list[Any]
    if text.startswith("{"):
        item = _json_line(text, where)
        # Other fields (a fetched message's data, id, headers) are left out.
        parts = [item.get("offset"), item.get("deliveryCount"), item.get("ackDeadline")]
    else:
        parts = text.split(",")
        if len(parts) != 3:
            raise Usage(f"{where} is not OFFSET,DELIVERY-COUNT,ACK-DEADLINE nor a JSON object")
    offset, count, deadline = (p.strip() if isinstance(p, str) else p for p in parts)
    if not (isinstance(offset, str) and OFFSET.fullmatch(offset)):
        raise Usage(f"{where}: {offset!r} is not an offset (0000000000000042_0000000000000000)")
    if isinstance(count, str) and count.isascii() and count.isdigit():
        count = int(count)
    if not (isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= 1_000_000):
        raise Usage(f"{where}: the delivery count must be a number from 1 to 1000000")
    if not (isinstance(deadline, str) and _aware(deadline)):
        raise Usage(f"{where}: {deadline!r} is not an ackDeadline as a fetch answers it")
    return {"offset": offset, "deliveryCount": count, "ackDeadline": deadline}


def _json_line(text: str, where: str) -> dict[str, Any]:
    """A line that is a JSON object (one of ``group fetch --json``)."""
    try:
        item = json.loads(text)
    except ValueError:
        item = None
    if not isinstance(item, dict):
        raise Usage(f"{where} is not a JSON object")
    return item


def _aware(text: str) -> bool:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).tzinfo is not None
    except ValueError:
        return False


def _offset_line(text: str, where: str) -> str:
    """One line of ``--offsets-from``: an offset, or a JSON object with one (a line of
    ``group fetch --json``); ``where`` says which line, for the error."""
    text = text.strip()
    where = f"{where} {text!r}"
    offset: Any = _json_line(text, where).get("offset") if text.startswith("{") else text
    if not (isinstance(offset, str) and OFFSET.fullmatch(offset)):
        raise Usage(f"{where}: {offset!r} is not an offset (0000000000000042_0000000000000000)")
    return offset


def _lines(path: str, option: str, what: str) -> Iterable[tuple[int, str]]:
    """The numbered lines that are not blank of ``path`` (``-``: stdin), given to ``option``
    as ``what`` (leases, offsets)."""
    if path == "-":
        if sys.stdin is None:  # started with its stdin closed (<&-)
            raise Usage(f"{option} -: stdin is closed; pipe the {what} in")
        if sys.stdin.isatty():  # it would wait, silent, for lines typed by hand
            raise Usage(f"{option} -: stdin is a terminal; pipe the {what} in")
    file: TextIO
    try:
        if path == "-":
            # Bytes decoded here, as the file is: in a strict UTF-8 locale stdin's own
            # decoding was a UnicodeDecodeError traceback.
            file = io.TextIOWrapper(io.BytesIO(sys.stdin.buffer.read()), encoding="utf-8")
        else:
            file = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
        with file:
            return [(n, line) for n, line in enumerate(file, 1) if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise Usage(f"{option} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _settle_items(args: argparse.Namespace) -> tuple[str, list[Any]]:
    """``("offsets", [...])`` or ``("leases", [...])``: the API takes one or the other."""
    leases = [_lease(text, "--lease") for text in args.lease]
    if args.leases_from is not None:
        leases += [
            _lease(line, f"--leases-from line {n}")
            for n, line in _lines(args.leases_from, "--leases-from", "leases")
        ]
    if (leases or args.leases_from is not None) and args.offsets:
        raise Usage("give OFFSETs or leases (--lease, --leases-from), not both")
    # An empty --leases-from is nothing to settle, not a mistake: a fetch that found the
    # group's queue empty piped nothing in (`group fetch --json | group nack --leases-from -`).
    if leases or args.leases_from is not None:
        return "leases", leases
    if not args.offsets:
        raise Usage("give the messages: OFFSETs, --lease or --leases-from")
    return "offsets", _offsets(args.offsets)


def _offsets(given: list[str]) -> list[str]:
    for offset in given:
        if not OFFSET.fullmatch(offset):
            raise Usage(f"OFFSET {offset!r} is not an offset (0000000000000042_0000000000000000)")
    return list(given)


def _ack_items(args: argparse.Namespace) -> tuple[str, list[Any]]:
    """ack's messages: OFFSETs and the lines of ``--offsets-from``, never leases."""
    if args.lease or args.leases_from is not None:
        # By lease a settlement is of that delivery only: an ack by offset is of any.
        raise Usage(
            "group ack names messages by offset (the API's ack takes no leases): give OFFSETs "
            "or --offsets-from, which takes the lines of group fetch --json too"
        )
    offsets = _offsets(args.offsets)
    if args.offsets_from is not None:
        listed = [
            _offset_line(line, f"--offsets-from line {n}")
            for n, line in _lines(args.offsets_from, "--offsets-from", "offsets")
        ]
        # Empty, it is nothing to ack (a fetch that found the queue empty piped nothing).
        offsets += listed
    if not offsets and args.offsets_from is None:
        raise Usage("give the messages: OFFSETs or --offsets-from")
    return "offsets", offsets


async def _settle(
    args: argparse.Namespace,
    client: Client,
    action: str,
    counted: str,
    extra: dict[str, Any],
    items: tuple[str, list[Any]] | None = None,
) -> int:
    """Send the settlement (``items``, else OFFSETs or leases) in requests of at most
    MAX_ITEMS and print what the API answered: how many were settled, the offsets it did not
    have out (``unknown``), and for extend until when the leases run."""
    from stations.client import GroupNotFound

    key, named = items or _settle_items(args)
    url = f"{client.station(args.station).group_url(args.group)}/{action}"
    unknown: list[str] = []
    until: list[str] = []  # extend's leaseUntil, one per request that extended any

    async def send(chunk: Sequence[Any]) -> int:
        # Sent once: a nack by offset sent again could settle a later delivery.
        reply = await client.http.call(
            "POST",
            url,
            {key: list(chunk), **extra},
            what=f"{action} on group {args.group}",
            not_found=GroupNotFound,
        )
        answer = reply.json()
        unknown.extend(answer.get("unknown") or [])
        if answer.get("leaseUntil"):
            until.append(answer["leaseUntil"])
        return int(answer.get(counted, 0))

    done = await in_chunks(
        named,
        MAX_ITEMS,
        send,
        # What earlier requests settled is said.
        lambda sent, settled: f"the first {sent} were sent before ({settled} settled)",
    )
    # Of several requests' leaseUntil the first is the soonest: every lease runs that long.
    lease_until = until[0] if until else None
    if args.json:
        if action == "extend":
            print_json({counted: done, "leaseUntil": lease_until, "unknown": unknown})
        else:
            print_json({counted: done, "unknown": unknown})
        return 0
    said = f"{done} of {len(named)} {_SAID[action]}"
    print(f"{said}, until {lease_until}" if lease_until else said)
    why = _UNKNOWN.get(action, "not out to the group, or that delivery is no longer out")
    if action == "extend" and args.consumer is not None:
        why += f", or --consumer {printable(args.consumer)} does not hold it"
    for offset in unknown:
        print(f"unknown: {offset} ({why})")
    return 0


_SAID = {
    "ack": "messages acked",
    "extend": "leases extended",
    "nack": "messages nacked",
    "dead-letter": "messages dead-lettered",
}
_UNKNOWN = {"extend": "its lease expired, or that delivery is not out to the group"}


async def ack_messages(args: argparse.Namespace, client: Client) -> int:
    return await _settle(args, client, "ack", "acked", {}, _ack_items(args))


MAX_LEASE_MS = 43_200_000  # extend's leaseMs, as a group's maxAckTimeMs: 100ms to 12h


async def extend_leases(args: argparse.Namespace, client: Client) -> int:
    extra: dict[str, Any] = {}
    if args.lease_time is not None:
        if not 100 <= args.lease_time <= MAX_LEASE_MS:
            raise Usage("--lease-time must be from 100ms to 12h")
        extra["leaseMs"] = args.lease_time
    if args.consumer is not None:
        if not 1 <= len(args.consumer) <= 256:
            raise Usage("--consumer must be 1 to 256 characters")
        extra["consumer"] = args.consumer
    return await _settle(args, client, "extend", "extended", extra)


async def nack(args: argparse.Namespace, client: Client) -> int:
    if not 0 <= args.delay <= MAX_DELAY_MS:
        raise Usage("--delay must be at most 24h")
    return await _settle(args, client, "nack", "nacked", {"delayMs": args.delay})


async def dead_letter(args: argparse.Namespace, client: Client) -> int:
    if args.reason is not None and (len(args.reason) > 4096 or "\x00" in args.reason):
        raise Usage("--reason must be at most 4096 characters, without NUL")
    extra = {} if args.reason is None else {"reason": args.reason}
    return await _settle(args, client, "dead-letter", "deadLettered", extra)


MAX_FETCH = 1000  # the API's limits of a fetch's max and waitMs
MAX_WAIT_MS = 300_000


async def fetch_messages(args: argparse.Namespace, client: Client) -> int:
    from stations.client import GroupNotFound
    from stations.client.models import message_data

    if args.limit > MAX_FETCH:
        raise Usage(f"--limit must be at most {MAX_FETCH}")
    if args.wait > MAX_WAIT_MS:
        raise Usage("--wait must be at most 5m")
    url = f"{client.station(args.station).group_url(args.group)}/fetch"
    body = {"max": args.limit, "waitMs": args.wait, "consumer": args.consumer}
    what = f"fetch from group {args.group}"
    # Sent once: a fetch sent again after a lost answer would lease other messages.
    reply = await client.http.request(
        "POST", url, json_body=body, read_timeout=args.timeout + args.wait / 1000
    )
    messages = client.http.checked(reply, what=what, not_found=GroupNotFound).json()["messages"]
    if args.json:
        for message in messages:
            print(dumps(message), flush=True)  # as the API gives it: --leases-from takes it
    elif messages:
        print_table(
            ["OFFSET", "DELIVERY", "ACK-DEADLINE", "ID", "DATA"],
            [
                [
                    m["offset"],
                    m["deliveryCount"],
                    m["ackDeadline"],
                    m.get("id"),
                    payload_text(message_data(m)),
                ]
                for m in messages
            ],
        )
    if args.ack and messages:
        acked = await client.http.call(
            "POST",
            f"{client.station(args.station).group_url(args.group)}/ack",
            {"offsets": [m["offset"] for m in messages]},
            what=f"ack on group {args.group}",
            not_found=GroupNotFound,
        )
        unknown = acked.json().get("unknown") or []
        if unknown:
            # Their leases expired before the ack: they will be delivered again.
            raise Refused(f"{len(unknown)} were no longer leased when acked: {' '.join(unknown)}")
    return 0
