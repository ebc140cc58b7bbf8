"""The native client's drop of MQTT QoS 2 publications an edge sent again after its crash
(appliance/client/exactly_once.py); end to end in tests/edge/test_exactly_once.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from appliance.client import connect
from appliance.client.errors import ClientError
from appliance.client.exactly_once import Republished


def _msg(origin: int, headers: dict) -> SimpleNamespace:
    return SimpleNamespace(origin=origin, headers=headers)


def test_a_qos2_publication_seen_again_is_dropped_and_counted():
    seen = Republished(4)
    first = _msg(7, {"mqtt.qos": "2", "mqtt.origin": "1001"})
    assert not seen.again(first)
    assert seen.again(_msg(7, {"mqtt.qos": "2", "mqtt.origin": "1001"}))
    assert seen.dropped == 1
    assert not seen.again(_msg(8, {"mqtt.qos": "2", "mqtt.origin": "1001"}))  # another edge


def test_only_qos2_publications_with_a_number_are_checked():
    seen = Republished(4)
    for _ in range(2):
        assert not seen.again(_msg(7, {"mqtt.qos": "1", "mqtt.origin": "5"}))  # at least once
        assert not seen.again(_msg(7, {"mqtt.qos": "2"}))  # an edge without a state store
        assert not seen.again(_msg(7, {"x": "y"}))
    assert seen.dropped == 0 and len(seen.ids) == 0


def test_the_window_forgets_the_oldest_and_zero_is_off():
    seen = Republished(2)
    for number in ("1", "2", "3"):
        assert not seen.again(_msg(7, {"mqtt.qos": "2", "mqtt.origin": number}))
    assert not seen.again(_msg(7, {"mqtt.qos": "2", "mqtt.origin": "1"}))  # forgotten
    assert seen.again(_msg(7, {"mqtt.qos": "2", "mqtt.origin": "3"}))
    off = Republished(0)
    for _ in range(2):
        assert not off.again(_msg(7, {"mqtt.qos": "2", "mqtt.origin": "1"}))


@pytest.mark.parametrize("window", [-1, 1_000_001, "many", True])
def test_connect_refuses_a_bad_window_naming_it(window):
    with pytest.raises(ClientError, match="republish_window"):
        connect("embedded:", republish_window=window)
