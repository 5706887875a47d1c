"""The application's shared objects, each under a typed key (aiohttp's ``AppKey``: the type
checker knows what ``app[SERVICE]`` holds, and aiohttp warns of no string keys).

Here are the keys of objects no module of ``stations.api`` defines; the others live beside
their type, so that no import circle forms: ``auth.TOKENS``, ``drain.DRAIN``,
``headers.CORS``, ``limits.LIMITS`` / ``READERS`` / ``SLOW_CLIENTS``, ``metrics.METRICS`` /
``METRICS_REFRESH``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from stations.api.webhooks import WebhookSender
    from stations.domain.service import Service
    from stations.domain.subscriptions.engine import SubscriptionEngine

SERVICE: web.AppKey[Service] = web.AppKey("service")
LONG_POLL_TIMEOUT_S: web.AppKey[float] = web.AppKey("long_poll_timeout_s")
SSE_LIFETIME_S: web.AppKey[float] = web.AppKey("sse_lifetime_s")
ACCESS_LOG: web.AppKey[logging.Logger | None] = web.AppKey("access_log")
WEBHOOKS_ALLOW_LOOPBACK: web.AppKey[bool] = web.AppKey("webhooks_allow_loopback")
# Where clients reach this server (--public-url): webhook callback and JWKS URLs are built on it.
PUBLIC_URL: web.AppKey[str | None] = web.AppKey("public_url")
WEBHOOK_SENDER: web.AppKey[WebhookSender] = web.AppKey("webhook_sender")
SUBSCRIPTIONS: web.AppKey[SubscriptionEngine] = web.AppKey("subscriptions")
