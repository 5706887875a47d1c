"""The application's shared objects, each under a typed key (aiohttp's ``AppKey``: the type
checker knows what ``app[SERVICE]`` holds, and aiohttp warns of no string keys)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from stations.api.auth import Token
    from stations.api.drain import Drain
    from stations.api.headers import CorsPolicy
    from stations.api.limits import Limits, ReaderSlots, SlowClients
    from stations.api.metrics import Metrics
    from stations.api.webhooks import WebhookSender
    from stations.domain.service import Service
    from stations.domain.subscriptions.engine import SubscriptionEngine

SERVICE: web.AppKey[Service] = web.AppKey("service")
TOKENS: web.AppKey[list[Token] | None] = web.AppKey("tokens")  # None: no tokens asked for
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
METRICS_REFRESH: web.AppKey[tuple[Callable[[], Awaitable[None]], ...]] = web.AppKey(
    "metrics_refresh"
)
LIMITS: web.AppKey[Limits] = web.AppKey("limits")
CORS: web.AppKey[CorsPolicy] = web.AppKey("cors")
READERS: web.AppKey[ReaderSlots] = web.AppKey("readers")
SLOW_CLIENTS: web.AppKey[SlowClients] = web.AppKey("slow_clients")
DRAIN: web.AppKey[Drain] = web.AppKey("drain")
LONG_POLL_TIMEOUT_S: web.AppKey[float] = web.AppKey("long_poll_timeout_s")
SSE_LIFETIME_S: web.AppKey[float] = web.AppKey("sse_lifetime_s")
ACCESS_LOG: web.AppKey[logging.Logger | None] = web.AppKey("access_log")
WEBHOOKS_ALLOW_LOOPBACK: web.AppKey[bool] = web.AppKey("webhooks_allow_loopback")
WEBHOOK_SENDER: web.AppKey[WebhookSender] = web.AppKey("webhook_sender")
SUBSCRIPTIONS: web.AppKey[SubscriptionEngine] = web.AppKey("subscriptions")
