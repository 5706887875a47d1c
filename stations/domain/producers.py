"""Idempotent producer sessions (Durable Streams §5.2.1, Kafka's idempotent producer).

The decision is a pure function of the stored session and the request, so it is easy to read and
to test; the log applies it inside the append's transaction.

A session is kept until its producer has written nothing for the producer expiry (``stations
serve --producer-expiry-ms``, 7 days by default, as the reference server and Kafka's
transactional ids; 0 keeps them for ever): a producer id per Spark query partition or per
short-lived process would otherwise leave a row each for good. An expired producer is a new
one: its next request must be seq 0 of an epoch (any other is refused as a gap, 409), so a
retry that comes later than the expiry is stored again only if it was its epoch's seq 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from stations.errors import BadRequest
from stations.store import streams as stored

if TYPE_CHECKING:
    from stations.store.writer import Batch

MAX_SAFE_INTEGER = 2**53 - 1
DEFAULT_EXPIRY_MS = 7 * 24 * 3600 * 1000
EXPIRE_CHUNK = 10_000  # sessions deleted per writer transaction (appends go between two)


class Verdict(Enum):
    ACCEPT = "accept"  # store it; the session moves to (epoch, seq)
    DUPLICATE = "duplicate"  # already stored: answer success, store nothing
    STALE_EPOCH = "stale_epoch"  # a zombie of an older epoch: fence it (403)
    GAP = "gap"  # ahead of its turn: an earlier request is missing (409, or wait for it)
    # A new epoch's request that is not its seq 0: 400, but pipelined after a restart it may
    # just have overtaken that seq 0, so it waits for it like a gap first.
    NEW_EPOCH_GAP = "new_epoch_gap"


@dataclass(frozen=True)
class Producer:
    id: str
    epoch: int
    seq: int


@dataclass
class Session:
    epoch: int
    last_seq: int


MAX_PRODUCER_ID = 256  # the closing producer's id is kept in a 256-character column
_NOT_TEXT = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")  # controls; bytes that were not UTF-8


def parse_headers(pid: str | None, epoch: str | None, seq: str | None) -> Producer | None:
    """The three producer headers come together or not at all."""
    headers = {"Producer-Id": pid, "Producer-Epoch": epoch, "Producer-Seq": seq}
    missing = [name for name, value in headers.items() if value is None]
    if len(missing) == 3:
        return None
    if missing:
        raise BadRequest(
            "Producer-Id, Producer-Epoch and Producer-Seq must be sent together", missing[0]
        )
    assert pid is not None and epoch is not None and seq is not None
    if pid == "":
        raise BadRequest("Producer-Id must not be empty", "Producer-Id")
    if len(pid) > MAX_PRODUCER_ID or _NOT_TEXT.search(pid):
        raise BadRequest(
            f"Producer-Id must be at most {MAX_PRODUCER_ID} characters of text", "Producer-Id"
        )
    return Producer(pid, _parse_int(epoch, "Producer-Epoch"), _parse_int(seq, "Producer-Seq"))


def _parse_int(value: str, field: str) -> int:
    if not value.isascii() or not value.isdigit() or (len(value) > 1 and value[0] == "0"):
        raise BadRequest(f"{field} must be a non-negative integer", field)
    # Compare the length first: int() of thousands of digits is slow, then refused.
    if len(value) > len(str(MAX_SAFE_INTEGER)) or int(value) > MAX_SAFE_INTEGER:
        raise BadRequest(f"{field} must be at most 2^53-1", field)
    return int(value)


def decide(session: Session | None, producer: Producer) -> Verdict:
    if session is None:
        # A new producer id may start at any epoch, but always at seq 0.
        if producer.seq != 0:
            return Verdict.GAP
        return Verdict.ACCEPT
    if producer.epoch < session.epoch:
        return Verdict.STALE_EPOCH
    if producer.epoch > session.epoch:
        return Verdict.ACCEPT if producer.seq == 0 else Verdict.NEW_EPOCH_GAP
    if producer.seq <= session.last_seq:
        return Verdict.DUPLICATE
    if producer.seq == session.last_seq + 1:
        return Verdict.ACCEPT
    return Verdict.GAP


def expected_seq(session: Session | None, producer: Producer) -> int:
    if session is None or producer.epoch > session.epoch:
        return 0
    return session.last_seq + 1


def expire_idle(batch: Batch, idle_ms: int) -> int:
    """A writer op: forget up to ``EXPIRE_CHUNK`` sessions whose producer has written nothing
    for ``idle_ms``; returns how many (a full chunk: run it again)."""
    return stored.expire_sessions(batch.conn, batch.now - idle_ms, EXPIRE_CHUNK)
