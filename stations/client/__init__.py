"""The Python SDK for Stations (asyncio, aiohttp; speaks only HTTP).

- ``Client``: station management; ``client.station(name)`` gives a ``Station`` handle.
- ``Station.produce`` / ``produce_many``: messages with Memphis-style ids (duplicates reported).
- ``IdempotentProducer``: batched, pipelined, exactly-once appends to any Durable Streams URL.
- ``Station.read`` / ``read_stream``: catch-up, long-poll and SSE readers that resume by offset.
- ``Station.consumer``: consumer groups with batched acks, nack and dead-letter.
- ``Consumer.transaction`` / ``Client.transaction``: settle and produce across stations atomically.

Importing this package loads neither SQLAlchemy nor the server.
"""

from stations.client.client import Client, Station
from stations.client.consumer import Consumer, Message
from stations.client.errors import (
    BadRequest,
    BufferFull,
    Conflict,
    ConnectionFailed,
    Forbidden,
    Gone,
    GroupNotFound,
    NotFound,
    PayloadTooLarge,
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
    DeadLetter,
    DeadLetterPage,
    DeadLetterSettings,
    GroupInfo,
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

__all__ = [
    "BadRequest",
    "BufferFull",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Consumer",
    "ConsumerDefaults",
    "DeadLetter",
    "DeadLetterPage",
    "DeadLetterSettings",
    "Forbidden",
    "Gone",
    "GroupInfo",
    "GroupNotFound",
    "IdempotentProducer",
    "Message",
    "MessagePage",
    "NewMessage",
    "NotFound",
    "PayloadTooLarge",
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
