"""Webhook URL safety (PROTOCOL.md §12.8): a subscription must not make this server call into
the networks it sits in. What can be refused without DNS is refused when the subscription is
made; the HTTP layer's resolver judges each resolved address again with ``address_refusal``."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from stations.domain.subscriptions.errors import UrlRejected
from stations.domain.subscriptions.spec import visible


def address_refusal(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_loopback: bool
) -> str | None:
    """Why a webhook must not reach ``address``, or None. Only globally routable unicast
    addresses pass (loopback too, with ``allow_loopback``); an IPv6 address that embeds an IPv4
    one (mapped, NAT64, 6to4) is judged by the IPv4 address inside."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped
        if embedded is None and address in ipaddress.IPv6Network("64:ff9b::/96"):
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is None and address.sixtofour is not None:
            embedded = address.sixtofour
        if embedded is not None:
            return address_refusal(embedded, allow_loopback)
    if address.is_loopback:
        return None if allow_loopback else "loopback addresses are refused"
    if address.is_link_local:
        return "link-local addresses are refused"
    # IPv6 site-local (fec0::/10) is deprecated (RFC 3879) but still local: Python 3.11 counts
    # it global.
    site_local = isinstance(address, ipaddress.IPv6Address) and address.is_site_local
    if (
        address.is_private
        or site_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
    ):
        return "private and local network addresses are refused"
    if not address.is_global:
        return "only globally routable addresses are accepted"
    return None


# A DNS label: letters, digits and hyphens, not at either end (underscores too, as service names
# use them); names a resolver can never answer are refused now rather than retried forever.
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


def _dns_name_refusal(host: str) -> str | None:
    """Why ``host`` (not an IP literal) cannot be a DNS name, or None."""
    try:
        ascii_name = host.encode("idna").decode("ascii").lower().rstrip(".")
    except UnicodeError:
        return "the host is not a valid domain name"
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return "the host is not a valid domain name"
    if labels[-1].isdigit():
        # URL parsers read an all-numeric last label as (part of) an IPv4 address
        return "the host is not a valid IPv4 address"
    return None


def _unmapped(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def check_webhook_url(url: str, allow_loopback: bool) -> tuple[str, bool]:
    """Refuse what can be refused without DNS; returns (host, is_ip_literal). ``http`` is only
    for loopback targets, which need ``--webhooks-allow-loopback``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # raises on a malformed port
    except ValueError:
        raise UrlRejected("webhook.url is not a valid URL", "webhook.url") from None
    if parts.scheme not in ("http", "https") or not host:
        raise UrlRejected("webhook.url must be an http(s) URL with a host", "webhook.url")
    if not visible(host):
        raise UrlRejected(
            "webhook.url: the host name holds control characters or spaces", "webhook.url"
        )
    if parts.username or parts.password:
        raise UrlRejected("webhook.url must not carry credentials", "webhook.url")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    bracketed = parts.netloc.rpartition("@")[2].startswith("[")
    if bracketed and not isinstance(address, ipaddress.IPv6Address):
        raise UrlRejected("webhook.url: brackets must hold an IPv6 address", "webhook.url")
    if address is None and (reason := _dns_name_refusal(host)):
        raise UrlRejected(f"webhook.url: {reason}", "webhook.url")
    if address is not None:
        reason = address_refusal(address, allow_loopback)
        if reason:
            raise UrlRejected(f"webhook.url: {reason}", "webhook.url")
        loopback = _unmapped(address).is_loopback
    else:
        loopback = host.lower().rstrip(".") == "localhost"
        if loopback and not allow_loopback:
            raise UrlRejected("webhook.url: loopback addresses are refused", "webhook.url")
    if parts.scheme == "http" and not loopback:
        raise UrlRejected("webhook.url must use https", "webhook.url")
    return host, address is not None


def endpoint_of(url: str | None) -> str:
    """``scheme://host:port`` of a webhook URL: the unit whose slowness is kept apart from the
    others' (``outbound``); "" when unknown."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        return url
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme.lower()}://{host}:{port}"
