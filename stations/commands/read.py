"""``stations read STATION``: messages from an offset until up to date; ``stations tail
STATION``: follow new messages (from now) until the station is closed or Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import TYPE_CHECKING

from stations.client.errors import (  # light: no aiohttp
    ConnectionFailed,
    StationsError,
    is_retryable,
)
from stations.client.retry import PATIENT_RETRY, Backoff, RetryPolicy
from stations.commands.base import (
    cell,
    describe_error,
    dumps,
    duration_ms,
    human_ms,
    message_count,
    payload_fields,
    payload_text,
    retold,
    shown_url,
)

if TYPE_CHECKING:
    from stations.client import Client, Station, StoredMessage

PAGE = 500
# The reader's own retries would hide an outage from the user: the first failure comes back
# here at once (a policy that gives up straight away), and _Outage retries and says so.
FAIL_AT_ONCE = RetryPolicy(give_up_after=0.0)


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
        if follow:
            p.add_argument(
                "--give-up-after",
                type=duration_ms,
                default=None,
                metavar="DURATION",
                help="when the server cannot be reached (or fails, 5xx/429), retry for this "
                "long, then exit 6, e.g. 2m (default: retry until it is back; "
                "stderr says when it is lost and when it is back)",
            )
        p.set_defaults(handler=tail if follow else read, follow=follow)


def _print(args: argparse.Namespace, message: StoredMessage) -> None:
    if args.json:
        view = {
            "offset": message.offset,
            "id": message.msg_id,
            "headers": dict(message.headers),
            **payload_fields(message.data),
            "time": message.time,
        }
        print(dumps(view), flush=True)
    else:
        data = payload_text(message.data)
        print(f"{message.offset}  {cell(message.msg_id)}  {data}", flush=True)


class _Outage:
    """``tail`` through a server outage: one line on stderr when the server is lost, one when
    it is back, retrying in between (with backoff) for ever or for ``--give-up-after``.

    ``read`` does not retry: it stops at once with exit 6, as every other command does."""

    def __init__(self, url: str, give_up_after_ms: int | None) -> None:
        self.url = url
        self.give_up_after_ms = give_up_after_ms
        policy = PATIENT_RETRY
        if give_up_after_ms is not None:
            policy = RetryPolicy(give_up_after=give_up_after_ms / 1000)
        self._backoff = Backoff(policy)
        self._since: float | None = None
        # A server never reached is an error at once (a wrong --url is not an outage).
        self._reached = False

    async def wait(self, exc: StationsError) -> None:
        """Sleep before the next attempt; ``exc`` raised when it is not worth retrying (a 404
        when the station was deleted, a 401...), the server was never reached, or the time
        given is up."""
        if not (self._reached and is_retryable(exc)):
            raise exc
        if self._since is None:
            self._since = time.monotonic()
            until = (
                "until it is back"
                if self.give_up_after_ms is None
                else f"for up to {human_ms(self.give_up_after_ms)}"
            )
            _say(f"{describe_error(exc, self.url)}; reconnecting {until} (Ctrl-C to stop)")
        await self._backoff.wait(exc)

    def over(self) -> None:
        """A request was answered: say so if it ends an outage."""
        self._reached = True
        if self._since is not None:
            lost = round(time.monotonic() - self._since)
            _say(f"reconnected to {shown_url(self.url)} after {lost}s")
            self._since = None
            self._backoff.reset()


def _say(line: str) -> None:
    print(f"stations: {line}", file=sys.stderr, flush=True)


async def _tail_offset(station: Station) -> str:
    return (await station.info()).stats.tail_offset


async def _wait_for_more(station: Station, offset: str) -> bool:
    """Wait (server long-poll, no sleeping here) until the station has data past ``offset``;
    False when the station was closed."""
    reader = station.read(offset, live="long-poll", retry=FAIL_AT_ONCE)
    async with contextlib.aclosing(reader):
        async for batch in reader:
            if batch.items:
                return True
    return False


async def _messages(args: argparse.Namespace, client: Client) -> int:
    station = client.station(args.station)
    offset = args.start
    outage = _Outage(client.url, getattr(args, "give_up_after", None))
    if offset == "now":
        offset = await _tail_offset(station)
        outage.over()
    remaining = args.limit
    first = True
    while remaining is None or remaining > 0:
        try:
            page = await station.browse(offset, PAGE if remaining is None else min(PAGE, remaining))
        except StationsError as exc:
            if exc.field == "offset" and exc.status in (400, 410):
                raise _offset_refused(exc, args.start if first else None, offset) from None
            if not args.follow:
                raise
            await outage.wait(exc)
            continue
        first = False
        outage.over()
        for message in page.messages:
            _print(args, message)
        if remaining is not None:
            remaining -= len(page.messages)
        offset = page.next_offset
        caught_up = page.up_to_date and not page.messages
        if not caught_up:
            continue
        if not args.follow:
            break
        try:
            more = await _wait_for_more(station, offset)
        except StationsError as exc:
            if _timed_out(exc):
                # A server that holds a long-poll longer than the SDK waits for it (serve
                # --long-poll-timeout-ms above 75 s) has no data yet: that is no outage. The
                # next browse, with --timeout, says whether the server is there.
                continue
            await outage.wait(exc)
            continue  # the next browse says whether the server is back
        if not more:
            break
    return 0


def _timed_out(exc: StationsError) -> bool:
    """Whether ``exc`` is a read that got no answer in time (the connection was made)."""
    cause = exc.__cause__
    return isinstance(exc, ConnectionFailed) and (
        isinstance(cause, TimeoutError) or type(cause).__name__.endswith("Timeout")
    )


def _offset_refused(exc: StationsError, start: str | None, offset: str) -> StationsError:
    """An offset the server refused: on the first request it is --from's ("malformed offset
    'x'", "offset is beyond the tail"); later it is where the read had got to, which
    retention dropped before it was read (the read was slower than the station's limits)."""
    if start is not None:
        return retold(exc, f"--from {start}: {exc.message}")
    return retold(
        exc, f"the read reached offset {offset} after retention dropped it: {exc.message}"
    )


async def read(args: argparse.Namespace, client: Client) -> int:
    return await _messages(args, client)


async def tail(args: argparse.Namespace, client: Client) -> int:
    return await _messages(args, client)
