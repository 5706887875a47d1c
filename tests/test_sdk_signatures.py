"""The SDK's factories name their options: ``station.producer()``, ``station.consumer()`` and
``SyncClient()`` take the options of what they make, with the same defaults, and refuse one they
would ignore (they took ``**options``: a ``token=`` given to a station's producer was dropped
without a word, the client's session and token being used instead)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from stations.client import Client, IdempotentProducer
from stations.client.client import Station
from stations.client.consumer import Consumer
from stations.client.sync import SyncClient


def _options(fn: Callable[..., Any], *leave_out: str) -> dict[str, Any]:
    """Keyword-only parameters and their defaults."""
    return {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is p.KEYWORD_ONLY and name not in leave_out
    }


def test_a_station_producer_takes_the_producer_options() -> None:
    made = _options(Station.producer)
    # A station's producer uses the client's session and token; its retry is the client's.
    own = _options(IdempotentProducer.__init__, "token", "headers")
    assert made.keys() == own.keys()
    assert made.pop("retry") is None
    own.pop("retry")
    assert made == own


def test_a_station_consumer_takes_the_consumer_options() -> None:
    assert _options(Station.consumer) == _options(Consumer.__init__)


def test_sync_client_takes_the_client_options_but_a_session() -> None:
    # An aiohttp session belongs to the loop it was made on: the sync client runs its own.
    assert _options(SyncClient.__init__) == _options(Client.__init__, "session")


async def test_an_option_a_station_would_ignore_is_refused() -> None:
    async with Client("http://127.0.0.1:9") as client:
        station = client.station("s")
        with pytest.raises(TypeError):
            station.producer("p", token="other")  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            station.consumer("g", batchsize=5)  # type: ignore[call-arg]
