"""The Python SDK for Stations (asyncio, aiohttp; speaks only HTTP).

- ``Client``: station management; ``client.station(name)`` gives a ``Station`` handle.
- ``Station.produce`` / ``produce_many``: messages with Memphis-style ids (duplicates reported).
- ``IdempotentProducer``: batched, pipelined, exactly-once appends to any Durable Streams URL.
- ``Station.read`` / ``read_stream``: catch-up, long-poll and SSE readers that resume by offset.
- ``Station.consumer``: consumer groups with batched acks, nack and dead-letter.
- ``Station.cursors`` / ``cursor_page`` / ``commit_cursor``: reader cursors (committed positions).
- ``Consumer.transaction`` / ``Client.transaction``: settle and produce across stations atomically.

Importing this package loads neither SQLAlchemy nor the server, and its names load on first
use: the blocking transport (``stations.client.blocking``) needs no aiohttp.
"""

from typing import TYPE_CHECKING

from stations.client.lazy import lazy_getattr

if TYPE_CHECKING:
    from stations.client.client import Client, Station
    from stations.client.consumer import Consumer, Message
    from stations.client.errors import (
        BadRequest,
        BufferFull,
        Conflict,
        ConnectionFailed,
        ConsumerClosed,
        CursorNotFound,
        EpochInUse,
        Forbidden,
        Gone,
        GroupNotFound,
        NotFound,
        PayloadTooLarge,
        PreconditionFailed,
        ProducerClosed,
        ProducerFenced,
        RateLimited,
        SequenceGap,
        ServerError,
        StationNotFound,
        StationsError,
        StreamClosed,
        Unauthorized,
    )
    from stations.client.models import (
        ConsumerDefaults,
        CursorInfo,
        CursorPage,
        DeadLetter,
        DeadLetterPage,
        DeadLetterSettings,
        GroupInfo,
        GroupPage,
        MessagePage,
        NewMessage,
        Produced,
        RedrivePolicy,
        Retention,
        StationInfo,
        StationStats,
        StoredMessage,
    )
    from stations.client.producer import IdempotentProducer
    from stations.client.reader import ReadBatch, StreamReader, read_stream
    from stations.client.retry import RetryPolicy
    from stations.client.seek import SeekResult
    from stations.client.transaction import Transaction, TransactionResult, TxProduced

# Names load on first use (PEP 562): code that needs only part of the SDK, such as a Spark
# executor on the blocking transport, does not import aiohttp.
_LAZY = {
    "BadRequest": "stations.client.errors",
    "BufferFull": "stations.client.errors",
    "Client": "stations.client.client",
    "Conflict": "stations.client.errors",
    "ConnectionFailed": "stations.client.errors",
    "Consumer": "stations.client.consumer",
    "ConsumerClosed": "stations.client.errors",
    "ConsumerDefaults": "stations.client.models",
    "CursorInfo": "stations.client.models",
    "CursorPage": "stations.client.models",
    "DeadLetter": "stations.client.models",
    "DeadLetterPage": "stations.client.models",
    "DeadLetterSettings": "stations.client.models",
    "Forbidden": "stations.client.errors",
    "Gone": "stations.client.errors",
    "GroupInfo": "stations.client.models",
    "GroupPage": "stations.client.models",
    "CursorNotFound": "stations.client.errors",
    "GroupNotFound": "stations.client.errors",
    "IdempotentProducer": "stations.client.producer",
    "Message": "stations.client.consumer",
    "MessagePage": "stations.client.models",
    "NewMessage": "stations.client.models",
    "NotFound": "stations.client.errors",
    "EpochInUse": "stations.client.errors",
    "PayloadTooLarge": "stations.client.errors",
    "PreconditionFailed": "stations.client.errors",
    "Produced": "stations.client.models",
    "ProducerClosed": "stations.client.errors",
    "ProducerFenced": "stations.client.errors",
    "RateLimited": "stations.client.errors",
    "ReadBatch": "stations.client.reader",
    "RedrivePolicy": "stations.client.models",
    "Retention": "stations.client.models",
    "RetryPolicy": "stations.client.retry",
    "SeekResult": "stations.client.seek",
    "SequenceGap": "stations.client.errors",
    "ServerError": "stations.client.errors",
    "Station": "stations.client.client",
    "StationInfo": "stations.client.models",
    "StationNotFound": "stations.client.errors",
    "StationStats": "stations.client.models",
    "StationsError": "stations.client.errors",
    "StoredMessage": "stations.client.models",
    "StreamClosed": "stations.client.errors",
    "StreamReader": "stations.client.reader",
    "Transaction": "stations.client.transaction",
    "TransactionResult": "stations.client.transaction",
    "TxProduced": "stations.client.transaction",
    "Unauthorized": "stations.client.errors",
    "read_stream": "stations.client.reader",
}

__getattr__ = lazy_getattr(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BadRequest",
    "BufferFull",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Consumer",
    "ConsumerClosed",
    "ConsumerDefaults",
    "CursorInfo",
    "CursorPage",
    "DeadLetter",
    "DeadLetterPage",
    "DeadLetterSettings",
    "EpochInUse",
    "Forbidden",
    "Gone",
    "GroupInfo",
    "GroupPage",
    "CursorNotFound",
    "GroupNotFound",
    "IdempotentProducer",
    "Message",
    "MessagePage",
    "NewMessage",
    "NotFound",
    "PayloadTooLarge",
    "PreconditionFailed",
    "Produced",
    "ProducerClosed",
    "ProducerFenced",
    "RateLimited",
    "ReadBatch",
    "RedrivePolicy",
    "Retention",
    "RetryPolicy",
    "SeekResult",
    "SequenceGap",
    "ServerError",
    "Station",
    "StationInfo",
    "StationNotFound",
    "StationStats",
    "StationsError",
    "StoredMessage",
    "StreamClosed",
    "StreamReader",
    "Transaction",
    "TransactionResult",
    "TxProduced",
    "Unauthorized",
    "read_stream",
]
