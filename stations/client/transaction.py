"""Transactions: settle leased messages and produce messages, across stations, atomically.

::

    async with consumer.transaction() as tx:
        tx.produce("invoices", {"order": msg.data["id"]}, msg_id=f"invoice-{msg.offset}")
        tx.ack(msg)

Nothing is sent until the block ends; then everything goes in one request
(``POST /api/transactions``) and commits in one database transaction, or none of it does. An
exception inside the block sends nothing (the leases stay; the messages come again once they
expire, or nack them). ``commit()`` raises ``Conflict`` when a lease expired or was delivered
again: nothing was produced, the message will come (or already came) again. Messages of other
consumers (other groups, other stations) may be settled in the same transaction.

Retries: a commit whose outcome is unknown is not retried. A 429, a 503 or a refused connection
says nothing was committed; those are retried (with backoff, honouring ``Retry-After``). When it
raises ``ConnectionFailed`` or ``ServerError`` the outcome is unknown, and that is safe: if it
committed, its leases are gone and the messages never come back; if it did not, they come back
after their lease. Either way each input is processed by exactly one committed transaction.
Such a transaction may be committed again only if every message it produces has a ``msg_id``;
else ``commit()`` raises ``RuntimeError``: they would be stored twice. If the first commit went
through, a second one that settles anything raises ``Conflict`` (its leases are gone) and
produces nothing; one that only produces reports its messages as duplicates.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from stations.client.errors import StationsError, may_have_acted
from stations.client.http import Http
from stations.client.retry import Backoff, RetryPolicy

# What a transaction needs of the SDK's Client, Station and Message: protocols, so this module
# imports none of them (they import it).


class _Client(Protocol):
    url: str
    http: Http
    retry: RetryPolicy


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _Consumer(Protocol):
    @property
    def station(self) -> _Named: ...

    @property
    def group(self) -> str: ...

    @property
    def name(self) -> str: ...


class _Message(Protocol):
    @property
    def offset(self) -> str: ...

    @property
    def delivery_count(self) -> int: ...

    @property
    def lease(self) -> str | None: ...

    @property
    def _consumer(self) -> _Consumer: ...


@dataclass(frozen=True)
class TxProduced:
    station: str
    offset: str | None
    duplicate: bool


@dataclass(frozen=True)
class TransactionResult:
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    produced: list[TxProduced] = field(default_factory=list)


def _lease(msg: _Message) -> dict[str, Any]:
    consumer = msg._consumer
    return {
        "station": consumer.station.name,
        "group": consumer.group,
        "offset": msg.offset,
        "deliveryCount": msg.delivery_count,
    } | ({"ackDeadline": msg.lease} if msg.lease else {})


class Transaction:
    """Collects settlements and messages; ``commit()`` (or the end of ``async with``) sends
    them as one atomic request."""

    def __init__(self, client: _Client, consumer: str | None = None) -> None:
        self.client = client
        self.consumer = consumer
        self._outcome_unknown = False  # a commit raised after the server may have acted
        self._body: dict[str, list[dict[str, Any]]] = {
            "ack": [],
            "nack": [],
            "deadLetter": [],
            "produce": [],
        }
        self.result: TransactionResult | None = None

    def produce(
        self,
        station: str | _Named,
        data: Any,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Produce ``data`` to ``station`` when the transaction commits; with ``msg_id`` it
        follows the station's idempotency window (a duplicate is reported, not stored)."""
        item: dict[str, Any] = {"station": station if isinstance(station, str) else station.name}
        if msg_id is not None:
            item["id"] = msg_id
        if headers:
            item["headers"] = dict(headers)
        if isinstance(data, bytes | bytearray | memoryview):
            item["dataBase64"] = base64.b64encode(bytes(data)).decode()
        else:
            item["data"] = data
        self._body["produce"].append(item)

    def ack(self, msg: _Message) -> None:
        self._body["ack"].append(self._lease(msg))

    def nack(self, msg: _Message, delay_ms: int = 0) -> None:
        self._body["nack"].append({**self._lease(msg), "delayMs": delay_ms})

    def dead_letter(self, msg: _Message, reason: str | None = None) -> None:
        item = self._lease(msg)
        if reason is not None:
            item["reason"] = reason
        self._body["deadLetter"].append(item)

    def _lease(self, msg: _Message) -> dict[str, Any]:
        # The request names one consumer, which must hold every lease it settles: with a
        # message of another consumer's it names none (each lease is told by its offset,
        # delivery count and deadline all the same).
        if msg._consumer.name != self.consumer:
            self.consumer = None
        return _lease(msg)

    def __len__(self) -> int:
        return sum(map(len, self._body.values()))

    async def commit(self) -> TransactionResult:
        """Send everything in one request; an empty transaction sends nothing."""
        if self.result is not None:
            raise RuntimeError("this transaction was already committed")
        if self._outcome_unknown and any("id" not in p for p in self._body["produce"]):
            # A settlement is refused the second time (its lease is gone), a message with an
            # id is answered as a duplicate, but one without would be stored twice.
            raise RuntimeError(
                "this transaction's first commit may have been carried out (its answer was "
                "lost) and it produces messages without msg_id: committing it again could store "
                "them twice"
            )
        body: dict[str, Any] = {k: v for k, v in self._body.items() if v}
        if not body:
            self.result = TransactionResult()
            return self.result
        if self.consumer is not None:
            body["consumer"] = self.consumer
        backoff = Backoff(self.client.retry)
        while True:
            try:
                reply = await self.client.http.call(
                    "POST", self.client.url + "/api/transactions", body, what="transaction"
                )
                break
            except StationsError as exc:
                if may_have_acted(exc):
                    self._outcome_unknown = True
                    raise  # unknown outcome: see the module's docstring
                await backoff.wait(exc)  # raises unless retryable
            except BaseException:  # cancelled (a timeout) after it may have been sent
                self._outcome_unknown = True
                raise
        answer = reply.json()
        self.result = TransactionResult(
            int(answer.get("acked", 0)),
            int(answer.get("nacked", 0)),
            int(answer.get("deadLettered", 0)),
            [
                TxProduced(p["station"], p.get("offset"), bool(p.get("duplicate")))
                for p in answer.get("produced", [])
            ],
        )
        return self.result

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            await self.commit()
