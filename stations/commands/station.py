"""``stations station ls|show|create|edit|delete``: stations and their settings."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from stations.commands.base import (
    duration_ms,
    human_ms,
    naming_options,
    print_fields,
    print_json,
    print_table,
)

if TYPE_CHECKING:
    from stations.client import Client, StationInfo


def add_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    epilog: str,
) -> None:
    p = sub.add_parser(
        "station", help="list, show, create, edit and delete stations", epilog=epilog
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    ls = verbs.add_parser(
        "ls",
        aliases=["list"],  # nats takes both; ``stations --help`` says "list"
        parents=[common],
        help="list stations with their stats",
        epilog=epilog,
    )
    ls.set_defaults(handler=list_stations)

    show = verbs.add_parser(
        "show", parents=[common], help="a station's settings and stats", epilog=epilog
    )
    show.add_argument("name", help="station name")
    show.set_defaults(handler=show_station)

    create = verbs.add_parser(
        "create",
        parents=[common],
        help="create a station (the same settings again is not an error)",
        epilog=epilog,
    )
    create.add_argument("name", help="station name")
    create.add_argument(
        "--content-type",
        default="application/json",
        help="payload type, fixed at creation (default %(default)s)",
    )
    _settings_options(create, creating=True)
    create.set_defaults(handler=create_station)

    edit = verbs.add_parser(
        "edit",
        parents=[common],
        help="change a station's settings (only the options given)",
        epilog=epilog,
    )
    edit.add_argument("name", help="station name")
    _settings_options(edit, creating=False)
    edit.add_argument(
        "--created-at",
        metavar="TIME",
        help="only the station created then (its createdAt, as show --json gives it): one "
        "deleted and created again since is not changed (exit 4)",
    )
    edit.set_defaults(handler=edit_station)

    delete = verbs.add_parser(
        "delete",
        parents=[common],
        help="delete a station with its messages, groups and dead letters",
        epilog=epilog,
    )
    delete.add_argument("name", help="station name")
    delete.add_argument(
        "--created-at",
        metavar="TIME",
        help="only the station created then (its createdAt, as show --json gives it): one "
        "deleted and created again since is not deleted (exit 4)",
    )
    delete.set_defaults(handler=delete_station)


class _Remove:
    """The value ``none`` of a limit: JSON null, "no limit" (None is "not given" here)."""

    def __repr__(self) -> str:
        return "none"


REMOVE = _Remove()
T = TypeVar("T")


def _or_none(
    parse: Callable[[str], T], kind: str, examples: str = ""
) -> Callable[[str], T | _Remove]:
    """An argparse type that also takes ``none``, to remove a limit once set."""

    def convert(text: str) -> T | _Remove:
        if text == "none":
            return REMOVE
        try:
            return parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {kind} or none: {text!r} ({examples}none removes the limit)"
            ) from None

    return convert


def _station_or_none(text: str) -> str | _Remove:
    # No station is named "" (and one named "none" cannot be a target from here).
    return REMOVE if text in ("none", "") else text


def _settings_options(p: argparse.ArgumentParser, *, creating: bool) -> None:
    # Defaults are shown for create only: edit leaves an option it is not given unchanged.
    duration = duration_ms
    limit = _or_none(duration_ms, "a duration", "e.g. 500ms, 30s, 10m, 24h, 7d; ")
    count = _or_none(int, "a number")
    # "none" works on both; edit says so, create names the default it gives.
    unlimited = " (default: no limit)" if creating else " (none removes the limit)"
    p.add_argument(
        "--window",
        type=duration,
        help="idempotency window for message ids: 100ms to 24h, e.g. 10m"
        + (" (default 2m)" if creating else ""),
    )
    p.add_argument(
        "--max-age",
        type=limit,
        help="retention: drop messages older than this" + unlimited,
    )
    p.add_argument(
        "--max-messages",
        type=count,
        help="retention: keep at most this many messages" + unlimited,
    )
    p.add_argument(
        "--max-bytes",
        type=count,
        help="retention: keep at most this many bytes" + unlimited,
    )
    p.add_argument(
        "--dls-poison",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dead-letter messages that reach their group's delivery limit"
        + (" (default on)" if creating else ""),
    )
    p.add_argument(
        "--dls-forward-to",
        type=_station_or_none,
        metavar="STATION",
        help="also append dead letters to this station"
        + (" (default: none)" if creating else " (none: stop forwarding)"),
    )
    p.add_argument(
        "--dls-retention",
        type=limit,
        help="how long dead letters are kept"
        + (
            " (default: until replayed or dropped)"
            if creating
            else " (none: until replayed or dropped)"
        ),
    )
    p.add_argument(
        "--max-ack-time", type=duration, help="consumer default: lease time before redelivery"
    )
    p.add_argument(
        "--max-deliveries", type=int, help="consumer default: deliveries before dead-lettering"
    )


duration_ms.__name__ = "duration"  # argparse names the type in its error message


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if args.window is not None:
        settings["idempotency_window_ms"] = args.window
    retention = {
        "max_age_ms": args.max_age,
        "max_messages": args.max_messages,
        "max_bytes": args.max_bytes,
    }
    dls = {
        "poison": args.dls_poison,
        "forward_to": args.dls_forward_to,
        "retention_ms": args.dls_retention,
    }
    defaults = {"max_ack_time_ms": args.max_ack_time, "max_msg_deliveries": args.max_deliveries}
    for key, section in (("retention", retention), ("dls", dls), ("consumer_defaults", defaults)):
        # None: not given, left as it is; REMOVE: sent as null, which removes the limit.
        given = {k: None if v is REMOVE else v for k, v in section.items() if v is not None}
        if given:
            settings[key] = given
    return settings


def _describe(info: StationInfo) -> list[tuple[str, Any]]:
    return [
        ("Name", info.name),
        ("Content type", info.content_type),
        ("Idempotency window", human_ms(info.idempotency_window_ms)),
        ("Retention max age", human_ms(info.retention.max_age_ms)),
        ("Retention max messages", info.retention.max_messages),
        ("Retention max bytes", info.retention.max_bytes),
        ("DLS poison", info.dls.poison),
        ("DLS forward to", info.dls.forward_to),
        ("DLS retention", human_ms(info.dls.retention_ms)),
        ("Consumer max ack time", human_ms(info.consumer_defaults.max_ack_time_ms)),
        ("Consumer max deliveries", info.consumer_defaults.max_msg_deliveries),
        ("Created", info.created_at),
        ("Closed", info.closed),
        ("Messages", info.stats.messages),
        ("Bytes", info.stats.bytes),
        ("Tail offset", info.stats.tail_offset),
        ("Ids in window", info.stats.ids_in_window),
        ("Groups", info.stats.groups),
        ("Dead-lettered", info.stats.dead_lettered),
    ]


# The option of each setting the server names by its JSON field (in a 400 or 409): the error
# then names what was typed ("--window: idempotencyWindowMs must be between 100 and ...").
_OPTIONS = {
    "contentType": "--content-type",
    "idempotencyWindowMs": "--window",
    "retention.maxAgeMs": "--max-age",
    "retention.maxMessages": "--max-messages",
    "retention.maxBytes": "--max-bytes",
    "dls.poison": "--dls-poison",
    "dls.forwardTo": "--dls-forward-to",
    "dls.retentionMs": "--dls-retention",
    "consumerDefaults.maxAckTimeMs": "--max-ack-time",
    "consumerDefaults.maxMsgDeliveries": "--max-deliveries",
    "createdAt": "--created-at",
}


async def list_stations(args: argparse.Namespace, client: Client) -> int:
    stations = await client.list_stations()
    if args.json:
        print_json([dict(s.raw) for s in stations])
        return 0
    print_table(
        ["NAME", "TYPE", "MESSAGES", "BYTES", "IDS", "GROUPS", "DLS", "WINDOW"],
        [
            [
                s.name,
                s.content_type,
                s.stats.messages,
                s.stats.bytes,
                s.stats.ids_in_window,
                s.stats.groups,
                s.stats.dead_lettered,
                human_ms(s.idempotency_window_ms),
            ]
            for s in stations
        ],
    )
    return 0


async def show_station(args: argparse.Namespace, client: Client) -> int:
    info = await client.get_station(args.name)
    if args.json:
        print_json(dict(info.raw))
    else:
        print_fields(_describe(info))
    return 0


async def create_station(args: argparse.Namespace, client: Client) -> int:
    info = await naming_options(
        client.create_station(args.name, content_type=args.content_type, **_settings(args)),
        _OPTIONS,
    )
    if args.json:
        print_json({**info.raw, "created": info.created})
    elif info.created:
        print(f"station {info.name} created")
    else:
        print(f"station {info.name} already exists with these settings")
    return 0


async def edit_station(args: argparse.Namespace, client: Client) -> int:
    settings = _settings(args)
    if not settings:
        from stations.commands.base import Usage

        raise Usage("nothing to change: give at least one setting (see: stations station edit -h)")
    info = await naming_options(
        client.patch_station(args.name, **settings, created_at=args.created_at), _OPTIONS
    )
    if args.json:
        print_json(dict(info.raw))
    else:
        print_fields(_describe(info))
    return 0


async def delete_station(args: argparse.Namespace, client: Client) -> int:
    await naming_options(client.delete_station(args.name, created_at=args.created_at), _OPTIONS)
    if args.json:
        print_json({"deleted": args.name})
    else:
        print(f"station {args.name} deleted")
    return 0
