"""The idempotent producer's protocol state, without I/O (Durable Streams §5.2.1).

A ``ProducerSession`` knows the producer id, its current epoch and next sequence number, the
headers a request carries, and what an answer means: stored, a duplicate of a request already
stored, fenced by a newer epoch, or an error. It sends nothing: the asyncio
``IdempotentProducer`` and the blocking ``BlockingProducer`` (Spark executors) drive it over
their own transports, so the rules live once.
"""

from __future__ import annotations

from dataclasses import dataclass

from stations.client.core import Reply
from stations.client.errors import ProducerFenced, StationsError, error_for


@dataclass(frozen=True)
class Appended:
    """A 2xx to an append: ``stored`` False when the server had this (epoch, seq) already."""

    stored: bool
    offset: str | None


class ProducerSession:
    """``(producer_id, epoch, next_seq)`` and the stream's content type."""

    def __init__(
        self, producer_id: str, *, epoch: int = 0, content_type: str | None = None
    ) -> None:
        if not producer_id:
            raise ValueError("producer_id must not be empty")
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        self.producer_id = producer_id
        self.epoch = epoch
        self.next_seq = 0
        self.content_type = content_type

    def take_seq(self) -> tuple[int, int]:
        """The (epoch, seq) of the next request, and move past it."""
        seq = self.next_seq
        self.next_seq += 1
        return self.epoch, seq

    def claim_after(self, fenced_epoch: int) -> int:
        """Move to the epoch after ``fenced_epoch`` (auto-claim), sequences from 0 again."""
        self.epoch = max(self.epoch, fenced_epoch) + 1
        self.next_seq = 0
        return self.epoch

    def headers(
        self, epoch: int, seq: int, *, close: bool = False, body: bool = True
    ) -> dict[str, str]:
        headers = {
            "Producer-Id": self.producer_id,
            "Producer-Epoch": str(epoch),
            "Producer-Seq": str(seq),
        }
        if body:
            headers["Content-Type"] = self.content_type or "application/octet-stream"
        if close:
            headers["Stream-Closed"] = "true"
        return headers

    def outcome(self, reply: Reply, epoch: int, seq: int, *, what: str = "append") -> Appended:
        """What the answer to the request (epoch, seq) means; errors are raised, a fence as
        ``ProducerFenced`` naming both epochs."""
        if reply.status in (200, 204):
            return Appended(reply.status == 200, reply.header("Stream-Next-Offset"))
        raise self.error(reply, epoch, seq, what=what)

    def error(self, reply: Reply, epoch: int, seq: int, *, what: str = "append") -> StationsError:
        error = error_for(reply.status, reply.headers, reply.body, what=what)
        if isinstance(error, ProducerFenced):
            fenced = ProducerFenced(
                f"producer {self.producer_id} epoch {epoch} was fenced by epoch "
                f"{error.current_epoch}: a newer instance of this producer took over",
                current_epoch=error.current_epoch,
                status=error.status,
                code=error.code,
                field=error.field,
                headers=error.headers,
            )
            fenced.__cause__ = error
            return fenced
        return error
