"""Fixtures of the channel tests."""

from __future__ import annotations

import pytest

from tests.channels.helpers import Peer


@pytest.fixture
def peers():
    started: list[Peer] = []

    def start(*args: str, host=None) -> Peer:
        peer = Peer(*args, host=host)
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()
