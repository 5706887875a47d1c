"""Exponential backoff with jitter, honouring ``Retry-After``."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from stations.client.errors import RateLimited, ServerError, StationsError, is_retryable


@dataclass(frozen=True)
class RetryPolicy:
    """How to retry a request that got no answer, a 429 or a 5xx.

    The n-th delay is drawn uniformly from ``[d/2, d]`` with ``d = min(max_delay,
    initial_delay * multiplier**n)`` (jitter keeps many clients from retrying in lockstep after
    an outage); a ``Retry-After`` from the server is a floor. ``give_up_after`` bounds the time
    spent on one operation since its first failure (None: retry forever).
    """

    initial_delay: float = 0.05
    max_delay: float = 5.0
    multiplier: float = 2.0
    give_up_after: float | None = 120.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        # The exponent is capped: a patient retry (no give-up) counts attempts for ever, and a
        # float power overflows near the 1,024th (an hour into an outage).
        ceiling = min(self.max_delay, self.initial_delay * self.multiplier ** min(attempt, 64))
        delay = random.uniform(ceiling / 2, ceiling)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay


DEFAULT_RETRY = RetryPolicy()
# Readers and consumers lose nothing by waiting, so they keep trying through long outages.
PATIENT_RETRY = RetryPolicy(give_up_after=None)


class Backoff:
    """Retry state of one operation: ``await backoff.wait(exc)`` (or ``wait_blocking``) sleeps,
    or re-raises ``exc`` when it is not retryable or the policy gave up."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempt = 0
        self._since: float | None = None

    def reset(self) -> None:
        self.attempt = 0
        self._since = None

    def next_delay(self, exc: StationsError) -> float:
        """The pause before the next attempt (sans-IO: the caller sleeps its own way), or
        ``exc`` raised when it is not retryable or the policy gave up."""
        if not is_retryable(exc):
            raise exc
        now = time.monotonic()
        if self._since is None:
            self._since = now
        hint = exc.retry_after if isinstance(exc, RateLimited | ServerError) else None
        delay = self.policy.delay(self.attempt, hint)
        limit = self.policy.give_up_after
        if limit is not None and now + delay - self._since > limit:
            raise exc
        self.attempt += 1
        return delay

    async def wait(self, exc: StationsError) -> None:
        await asyncio.sleep(self.next_delay(exc))

    def wait_blocking(self, exc: StationsError) -> None:
        """``wait`` for code without an event loop (Spark executors, the blocking transport)."""
        time.sleep(self.next_delay(exc))
