"""meta.py alone: MQTT metadata to native headers and back, and what does not parse."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.meta import MessageMeta, MetadataTooLarge, from_headers, to_headers

UP = codec.PROP["user_property"]


def test_a_round_trip_keeps_user_property_order_and_repeats():
    props = [(codec.PROP["content_type"], "a/b"), (UP, ("k", "1")), (UP, ("x.y", "2")),
             (UP, ("k", "3")), (codec.PROP["payload_format_indicator"], 1)]
    meta = MessageMeta(props, time.monotonic() + 30, True)
    counts: Counter = Counter()
    back, qos = from_headers(to_headers(meta, 2), counts.update)
    assert qos == 2 and back is not None and back.retain and not counts
    assert [v for i, v in back.props if i == UP] == [("k", "1"), ("x.y", "2"), ("k", "3")]
    assert (codec.PROP["payload_format_indicator"], 1) in back.props
    assert 28 <= back.remaining_s(time.monotonic()) <= 30


def test_headers_that_do_not_parse_are_ignored_and_counted():
    counts: Counter = Counter()
    meta, qos = from_headers({"mqtt.qos": "7", "mqtt.user.x.k": "v", "mqtt.nope": "1",
                              "mqtt.payload_format": "2", "plain": b"\xff", "ok": "yes"},
                             lambda name: counts.update([name]))
    assert qos is None and meta is not None and meta.props == [(UP, ("ok", "yes"))]
    assert counts == {"headers_malformed": 4, "headers_not_mapped": 1}


@pytest.mark.parametrize("props", [
    [(UP, ("k", str(i))) for i in range(32)],            # 33 headers with mqtt.qos
    [(UP, ("n" * 250, "v"))],                            # a key over 255 bytes
    [(codec.PROP["correlation_data"], b"x" * 1_000)],    # a block over 1,024 bytes
])
def test_metadata_over_the_header_limits_is_refused(props):
    with pytest.raises(MetadataTooLarge):
        to_headers(MessageMeta(props), 1)
