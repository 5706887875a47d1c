"""Stations: durable, exactly-once HTTP message streams.

Kept deliberately light: importing ``stations`` (or the SDK in ``stations.client``) must not
load SQLAlchemy or the server. The server lives in ``stations.domain.service`` and ``api``.
"""

__version__ = "0.1.0"
