"""Durable Streams subscriptions (PROTOCOL.md §6-7).

A subscription links streams (explicitly, or by a glob ``pattern``) and keeps one durable
cursor per stream. When a linked stream's tail passes its cursor and the subscription is idle,
a *wake* starts: a new ``generation`` and ``wake_id``. A webhook subscription's wake is POSTed
to its URL (retried with backoff until it is answered); a pull-wake subscription's wake is an
event appended to its wake stream, and a worker claims it. Callbacks, acks and releases carry a
token for one generation and wake; anything older is fenced.

- ``spec``: a subscription's definition as a request gives it, checked and normalized.
- ``urls``: which webhook URLs and addresses may be called at all (no internal networks).
- ``links``: which streams a subscription follows, their cursors, and its view.
- ``wakes``: the wake's life: start, delivery and retry, callbacks, claims, leases, fencing.
- ``keys``: Ed25519 signing of webhook bodies and of wake tokens.
- ``engine``: what runs them: wakes on appends, one timer per subscription's next deadline.
- ``outbound``: the slots webhook POSTs take, shared between endpoints so hung ones starve none.

Every function taking a ``Batch`` runs inside the writer's transaction, so a decision and its
rows commit together.
"""
