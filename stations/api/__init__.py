"""The HTTP face of Stations (aiohttp). It maps HTTP to the domain in ``stations`` and back."""

from stations.api.app import make_app

__all__ = ["make_app"]
