"""Instants as the API reads and writes them: date-times with their zone, answered in UTC to
the millisecond. One reader for every field that takes one (``Stream-Expires-At``,
``createdAt``, a seek's or an offset lookup's ``time``, a lease's ``ackDeadline``), so each
refuses the same inputs with the same words and none goes through a float."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from stations.errors import BadRequest

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: later years take five digits
_US = timedelta(microseconds=1)
_MS = timedelta(milliseconds=1)
# RFC 3339's date-time, whose "T" and "Z" may be written in lower case, with any number of
# fraction digits. The Durable Streams protocol names this form for Stream-Expires-At.
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})"
)


_BARE_POINT = re.compile(r"[.,](?![0-9])")


class Instant(NamedTuple):
    us: int  # microseconds since the epoch
    finer: bool  # fraction digits past the microsecond were given: they are dropped

    @property
    def ms(self) -> int:
        return self.us // 1000

    @property
    def whole_ms(self) -> bool:
        return not self.finer and self.us % 1000 == 0


def parse(value: object, field: str, *, rfc3339: bool = False) -> Instant:
    """``value`` as an instant between 1970 and 9999, or a 400 naming ``field``. ISO 8601
    forms that say their zone are read (``2030-01-01T00:00Z``, ``+0100``) unless ``rfc3339``
    asks for that profile alone; without a zone the instant would be a guess."""
    example = "such as 2030-01-01T00:00:00Z"
    text = value.upper() if isinstance(value, str) and value.isascii() else None
    if text is None or (rfc3339 and _RFC3339.fullmatch(text) is None):
        form = "an RFC 3339 date-time" if rfc3339 else "a date and time with its zone"
        raise BadRequest(f"{field} must be {form}, {example}", field)
    if _BARE_POINT.search(text):  # "00:00:00.Z": Python reads it, ISO 8601 does not
        raise BadRequest(f"{field} must be a date and time with its zone, {example}", field)
    # Python keeps six fraction digits and refuses a seventh in some forms: cut them first.
    fraction = re.search(r"[.,]([0-9]+)", text)
    finer = fraction is not None and len(fraction.group(1)) > 6
    if finer and fraction is not None:
        text = text[: fraction.start(1) + 6] + text[fraction.end(1) :]
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            raise BadRequest(f"{field} needs its zone (Z or an offset such as +01:00)", field)
        us = (when - EPOCH) // _US
    except (ValueError, OverflowError):
        # A query's "+" reads as a space: the offset "+01:00" arrives as " 01:00".
        hint = " (a '+' in a URL's query is written %2B)" if " " in text else ""
        raise BadRequest(
            f"{field} {value!r} is not a valid date and time, {example}{hint}", field
        ) from None
    if not 0 <= us <= MAX_MS * 1000 + 999:
        raise BadRequest(f"{field} must lie between 1970 and 9999 (UTC)", field)
    return Instant(us, finer)


def format_ms(ms: int) -> str:
    """Epoch milliseconds as the API answers a time: ``2030-01-01T00:00:00.000Z``."""
    return (EPOCH + ms * _MS).isoformat(timespec="milliseconds").replace("+00:00", "Z")
