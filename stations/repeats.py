"""Failures that repeat, logged like an operator wants them: in full once, then a line a minute
while they go on, and a line when the work succeeds again.

The scheduler's jobs run every second and the writer every batch: while the database is away,
a traceback each time wrote some 140 MB of log an hour and buried the first one, the one that
says what happened. Used by the domain's scheduler and the store's writer alike.
"""

from __future__ import annotations

import logging
import time

EVERY_S = 60.0


class Repeats:
    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        every_s: float = EVERY_S,
        *,
        level: int = logging.ERROR,
    ) -> None:
        self._logger = logger
        self._level = level  # of the first line of a run of failures
        self._what = what
        self._every_s = every_s
        self._since: float | None = None  # when the current run of failures began
        self._told = 0.0  # when it was last logged
        self._count = 0  # failures since then
        self._last = ""  # what the latest failure said

    def failed(
        self, exc: BaseException, *, traceback: bool = True, said: str | None = None
    ) -> None:
        """Log ``exc`` (with its traceback if ``traceback``) if it starts a run of failures,
        else count it and say how many now and then. ``said``: what to say of it instead of
        its first line (one cleared of a secret)."""
        now = time.monotonic()
        self._last = first_line(exc) if said is None else said
        if self._since is None:
            self._since, self._told, self._count = now, now, 0
            self._logger.log(
                self._level,
                "%s failed: %s: %s",
                self._what,
                type(exc).__name__,
                self._last,
                exc_info=exc if traceback else None,
            )
            return
        self._count += 1
        if now - self._told >= self._every_s:
            self._logger.warning(
                "%s still failing (%d more times in %.0f s): %s",
                self._what,
                self._count,
                now - self._told,
                self._last,
            )
            self._told, self._count = now, 0

    @property
    def failing(self) -> str | None:
        """What the latest failure said, while a run of failures goes on; else None."""
        return self._last if self._since is not None else None

    def succeeded(self) -> None:
        if self._since is not None:
            self._logger.warning(
                "%s works again, after %.0f s", self._what, time.monotonic() - self._since
            )
            self._since = None


def first_line(exc: BaseException) -> str:
    """The first line of what ``exc`` says, the driver's words where SQLAlchemy wraps them
    (its own message adds a second line, a link to its docs)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0][:200] if text else type(orig).__name__
