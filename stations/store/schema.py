"""Table definitions shared by the storage code and the Alembic migrations.

One schema for SQLite and PostgreSQL. Times are integer milliseconds since the epoch so both
engines compare them the same way.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

streams = Table(
    "streams",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(1024), nullable=False, unique=True),
    Column("content_type", String(255), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("ttl_seconds", BigInteger),
    Column("expires_at", BigInteger),
    Column("accessed_at", BigInteger, nullable=False),
    Column("closed", Boolean, nullable=False, default=False),
    # The producer request that closed the stream, so its retry is answered as a duplicate.
    Column("closer_id", String(256)),
    Column("closer_epoch", BigInteger),
    Column("closer_seq", BigInteger),
    Column("tail", BigInteger, nullable=False, default=0),
    # Positions at or below ``head`` were dropped by retention.
    Column("head", BigInteger, nullable=False, default=0),
    Column("fork_of", Integer),
    Column("fork_offset", BigInteger),
    Column("deleted", Boolean, nullable=False, default=False),
    Column("stream_seq", String(1024)),
    Column("msg_count", BigInteger, nullable=False, default=0),
    Column("byte_count", BigInteger, nullable=False, default=0),
    Column("config", Text, nullable=False),
    # The Durable Streams PUT that created it (TTL, expiry, fork), to answer a repeated PUT.
    Column("create_spec", Text),
    # Housekeeping reads these instead of every station's config, so its statements find what
    # is due without visiting idle stations (``stations.store.upkeep``). Copies of the config:
    # the id window, the count rules of retention, and when the time rules (retention's
    # maxAgeMs, the DLS's retentionMs) next need a look (NULL: the station has none).
    Column("id_window_ms", BigInteger, nullable=False, server_default="120000"),
    Column("max_messages", BigInteger),
    Column("max_bytes", BigInteger),
    Column("upkeep_at", BigInteger),
    # When a shrunk window last forgot ids for good: an id stored at or before it is gone,
    # whatever a process's cache of ids remembers (PostgreSQL: several processes, one table).
    Column("ids_forgotten_at", BigInteger),
    # A deleted station's id names it for ever (RAM state and other tables key by it): on
    # SQLite that needs AUTOINCREMENT, or the newest id deleted would be handed out again.
    sqlite_autoincrement=True,
)
Index("ix_streams_upkeep_at", streams.c.upkeep_at)
Index("ix_streams_max_messages", streams.c.max_messages)
Index("ix_streams_max_bytes", streams.c.max_bytes)

messages = Table(
    "messages",
    metadata,
    Column("stream_id", Integer, primary_key=True, autoincrement=False),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("data", LargeBinary, nullable=False),
    # One id, or on a multi-message row the ids of its messages joined by "\n" (so Text).
    Column("msg_id", Text),
    Column("headers", Text),
    Column("stored_at", BigInteger, nullable=False),
    # A row holds the messages at positions seq - span + 1 .. seq. A JSON append of many
    # messages stores one row per request, the messages joined by "\n" (compact JSON never
    # contains a raw newline), and their ids and headers, if any, joined by "\n" likewise
    # (an empty one: a message without); see ``stations.domain.log.pack``.
    Column("span", Integer, nullable=False, server_default="1"),
)

producers = Table(
    "producers",
    metadata,
    Column("stream_id", Integer, primary_key=True, autoincrement=False),
    Column("producer_id", String(1024), primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)
# Sessions idle past the producer expiry are found by time (``expire_sessions``).
Index("ix_producers_updated_at", producers.c.updated_at)

# The durable half of the Msg-Id window. It outlives the messages (retention may drop them)
# and is swept by the scheduler once ``stored_at + window`` has passed.
msg_ids = Table(
    "msg_ids",
    metadata,
    Column("stream_id", Integer, primary_key=True, autoincrement=False),
    Column("msg_id", String(256), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("stored_at", BigInteger, nullable=False),
)
Index("ix_msg_ids_stored_at", msg_ids.c.stream_id, msg_ids.c.stored_at)

# SQLite's recent ids (stations/store/idruns.py): the ids one commit stored in one station, in
# one row keyed by the first one's position, so a commit's ids are written as one sequential
# stretch. ``msg_ids`` holds them joined by "\n" (ids are printable ASCII without spaces),
# ``seqs`` their positions as native 64-bit integers.
id_blocks = Table(
    "id_blocks",
    metadata,
    Column("stream_id", Integer, primary_key=True, autoincrement=False),
    Column("seq0", BigInteger, primary_key=True, autoincrement=False),
    Column("stored_at", BigInteger, nullable=False),
    Column("ids", Integer, nullable=False),
    Column("msg_ids", LargeBinary, nullable=False),
    Column("seqs", LargeBinary, nullable=False),
)

# Older ids of a station, moved out of the blocks in sorted, immutable runs (SQLite; see
# stations/store/idruns.py). ``id_runs`` has one row per run, ``id_run_chunks`` its ids: rows of
# up to RUN_CHUNK (64) consecutive ids in order, keyed by the first (the ids joined by "\n", their
# positions and store times as native 64-bit integers), so a run is a few sequential rows.
id_runs = Table(
    "id_runs",
    metadata,
    Column("stream_id", Integer, primary_key=True, autoincrement=False),
    Column("run", BigInteger, primary_key=True, autoincrement=False),
    Column("ids", BigInteger, nullable=False),
    Column("oldest", BigInteger, nullable=False),  # smallest stored_at in the run
    Column("newest", BigInteger, nullable=False),  # largest stored_at in the run
)
id_run_chunks = Table(
    "id_run_chunks",
    metadata,
    Column("stream_id", Integer, primary_key=True, autoincrement=False),
    Column("run", BigInteger, primary_key=True, autoincrement=False),
    Column("first_id", String(256), primary_key=True),
    Column("ids", Integer, nullable=False),
    Column("msg_ids", LargeBinary, nullable=False),
    Column("seqs", LargeBinary, nullable=False),
    Column("stored_ats", LargeBinary, nullable=False),
)

# Consumer groups: a cursor over the log plus one ``deliveries`` row per message the group has
# taken from the log and not yet settled. A row with a consumer is leased until ``due``; a row
# without one is waiting (nacked with a delay, lease expired, or replayed) and is due at ``due``.
groups = Table(
    "groups",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stream_id", Integer, nullable=False),
    Column("name", String(256), nullable=False),
    Column("max_ack_time_ms", BigInteger, nullable=False),
    Column("max_msg_deliveries", Integer, nullable=False),
    Column("cursor", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    # Every lease handed out after a seek is due after this (the latest deadline it revoked):
    # a transaction tells a revoked lease from a new delivery of the message by its deadline.
    Column("lease_floor", BigInteger, nullable=False, server_default="0"),
    # Every lease name (fetched deadline) handed out before ``max_ack_time_ms`` was lowered is
    # at most this: a fence (a seek, a DLS replay) lifts ``lease_floor`` above it too.
    Column("names_bound", BigInteger, nullable=False, server_default="0"),
    sqlite_autoincrement=True,  # as streams: a deleted group's id is not handed out again
)
Index("ux_groups_stream_name", groups.c.stream_id, groups.c.name, unique=True)
# PostgreSQL also has ix_groups_stream_name_c on (stream_id, name COLLATE "C") (and the cursors
# ix_cursors_stream_name_c, the streams ix_streams_name_c on name COLLATE "C"): pages of names
# in code point order (migration 0018).

deliveries = Table(
    "deliveries",
    metadata,
    Column("group_id", Integer, primary_key=True, autoincrement=False),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("delivery_count", Integer, nullable=False),
    Column("consumer", String(256)),
    Column("due", BigInteger, nullable=False),
    # Times this message came back from the DLS by redrive (it carries over to a new entry).
    Column("redrives", Integer, nullable=False, server_default="0"),
    # The deadline the lease was fetched with, once an extension moved ``due``: still the
    # lease's name in a transaction (null: ``due`` is).
    Column("fetched_due", BigInteger),
)
Index("ix_deliveries_due", deliveries.c.group_id, deliveries.c.due)

# First deliveries of consecutive messages a fetch took from the log together, leased to one
# consumer until ``due``: one row per fetch instead of one ``deliveries`` row per message, which
# is what made fetch and ack cost a B-tree insert and delete per message in two indexes. Every
# position a row holds is open (delivered once, not settled); settling some of them leaves the
# rest as smaller rows, and anything beyond an ack (nack, expiry, dead-letter) first turns the
# row into ``deliveries`` rows (``stations.store.groups``). A position is in at most one of the
# two tables.
lease_ranges = Table(
    "lease_ranges",
    metadata,
    Column("group_id", Integer, primary_key=True, autoincrement=False),
    Column("first_seq", BigInteger, primary_key=True, autoincrement=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("consumer", String(256), nullable=False),
    Column("due", BigInteger, nullable=False),
)
Index("ix_lease_ranges_due", lease_ranges.c.due)

# The dead-letter store keeps its own copy of the message: retention may drop the original.
dls = Table(
    "dls",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stream_id", Integer, nullable=False),
    Column("group_id", Integer, nullable=False),
    Column("group_name", String(256), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("msg_id", String(256)),
    Column("headers", Text),
    Column("data", LargeBinary, nullable=False),
    Column("delivery_count", Integer, nullable=False),
    Column("reason", String(32), nullable=False),
    Column("error", Text),
    Column("dead_lettered_at", BigInteger, nullable=False),
    # Redrives so far, and when the station's redrive policy moves the entry back (null: never).
    Column("redrives", Integer, nullable=False, server_default="0"),
    Column("redrive_at", BigInteger),
    # Entry ids name one entry for ever (replay, drop and paging use them): on SQLite that
    # needs AUTOINCREMENT, or a deleted newest id would be handed out again.
    sqlite_autoincrement=True,
)
Index("ix_dls_stream", dls.c.stream_id, dls.c.id)
Index("ix_dls_redrive_at", dls.c.redrive_at)

# Durable Streams subscriptions (PROTOCOL.md §6-7; stations/domain/subscriptions/). One row
# per subscription holds its definition and its wake state (generation, wake, lease, retry
# schedule), so a restart or another process resumes exactly where delivery stood.
ds_subscriptions = Table(
    "ds_subscriptions",
    metadata,
    Column("id", String(256), primary_key=True),
    Column("type", String(16), nullable=False),
    Column("pattern", String(1024)),
    Column("webhook_url", Text),
    Column("wake_stream", String(1024)),
    Column("lease_ttl_ms", BigInteger, nullable=False),
    Column("description", Text),
    Column("config_hash", String(64), nullable=False),
    Column("base_url", Text, nullable=False),  # where callbacks and the JWKS are reached
    Column("created_at", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("wake_id", String(64)),
    Column("snapshot", Text),  # JSON {path: tail} of the wake as delivered or claimed
    Column("holder", String(256)),
    Column("lease_expires_at", BigInteger),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", BigInteger),
)

# One durable cursor per (subscription, stream): ``acked`` is the position acknowledged.
ds_subscription_streams = Table(
    "ds_subscription_streams",
    metadata,
    Column("subscription_id", String(256), primary_key=True),
    Column("path", String(1024), primary_key=True),
    Column("explicit", Boolean, nullable=False),
    Column("glob", Boolean, nullable=False),
    Column("acked", BigInteger, nullable=False),
)
Index("ix_ds_subscription_streams_path", ds_subscription_streams.c.path)

# Ed25519 keys that sign webhook deliveries and wake tokens; public halves are the JWKS.
ds_signing_keys = Table(
    "ds_signing_keys",
    metadata,
    Column("kid", String(128), primary_key=True),
    Column("private_pem", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)
