"""Subscription errors: each carries the protocol's code; the HTTP layer maps the class to
a status."""

from __future__ import annotations

from stations.errors import BadRequest, Conflict, NotFound, StationsError


class SubscriptionError(StationsError):
    status = 400


class InvalidRequest(SubscriptionError, BadRequest):
    code = "INVALID_REQUEST"


class UrlRejected(SubscriptionError, BadRequest):
    code = "WEBHOOK_URL_REJECTED"


class SubscriptionNotFound(SubscriptionError, NotFound):
    code = "SUBSCRIPTION_NOT_FOUND"
    status = 404


class AlreadyExists(SubscriptionError, Conflict):
    code = "SUBSCRIPTION_ALREADY_EXISTS"
    status = 409


class Fenced(SubscriptionError, Conflict):
    code = "FENCED"
    status = 409


class AlreadyClaimed(SubscriptionError, Conflict):
    code = "ALREADY_CLAIMED"
    status = 409


class NoPendingWork(SubscriptionError, Conflict):
    code = "NO_PENDING_WORK"
    status = 409


class InvalidOffset(SubscriptionError, Conflict):
    code = "INVALID_OFFSET"
    status = 409


class TokenRefused(SubscriptionError):
    status = 401

    def __init__(self, code: str) -> None:
        super().__init__("the token is expired" if code == "TOKEN_EXPIRED" else "invalid token")
        self.code = code
