"""Pages of a list by name (``limit``, ``after``, ``prefix``, ``contains``): the stations, a
station's consumer groups, its reader cursors. Without them the API answers a list whole, as the
contract has it; with any of them one page and the name the next one starts after.

What a page is and how its rows are gathered is decided here, once for every list; the SQL of
each list's page is its store module's (``stations.store.db.name_page``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

# Rows read at a time when some are left out after reading (a scoped token's, expired ones).
CHUNK = 1000

# ``order`` of a page of consumer groups: by name (the default), or furthest behind first.
BY_NAME = "name"
BY_LAG = "lag"

Row = TypeVar("Row")


@dataclass(frozen=True, slots=True)
class Page:
    """Which rows a list shows: those ``shown`` (a scoped token's), by name, after ``after``,
    starting with ``prefix`` and holding ``contains`` (ignoring case: ASCII letters' on SQLite),
    at most ``limit``. ``order``: ``lag`` (groups only) answers the ``limit`` groups furthest
    behind instead, with no ``after`` and no next page."""

    limit: int
    after: str | None = None
    prefix: str = ""
    contains: str = ""
    shown: Callable[[str], bool] | None = None
    order: str = BY_NAME


def collect(
    page: Page,
    read: Callable[[str | None, int], list[Row]],
    name: Callable[[Row], str],
    keep: Callable[[Row], bool] | None = None,
) -> list[Row]:
    """The page's rows, one more than its limit if there are (the caller tells from it whether
    a next page exists). ``read(after, size)`` reads up to ``size`` rows by name after
    ``after`` (filtered by the page's ``prefix`` and ``contains``); ``keep`` leaves rows out
    after reading, and then rows are read until the page is full."""
    if keep is None:  # every row read is shown: one read of exactly what the page needs
        return read(page.after, page.limit + 1)
    out: list[Row] = []
    after = page.after
    # Most rows pass (a scoped token leaves out others): read in chunks of at least a
    # thousand, not of the page's size, or a token covering few of 6,000 stations read
    # 3,000 pages of two to fill one (10 s on PostgreSQL).
    size = max(page.limit + 1, CHUNK)
    while len(out) <= page.limit:
        chunk = read(after, size)
        out += [row for row in chunk if keep(row)]
        if len(chunk) < size:
            break
        after = name(chunk[-1])
    return out[: page.limit + 1]
