"""message_event: native messages become the events selectors read (schema fields, header
properties, application properties), and selectors subscribers registered match them."""

import numpy as np
import pytest

from datapath.protocol import codec
from datapath.protocol.batch import decode_frames, new_message_batch
from nic_offload.schema import Schema
from nic_offload.selectors import SelectorError, SelectorIndex, message_event

QUOTE = Schema.of("quote", 7, [("symbol", 0, "ascii", 4), ("price", 4, "u32"),
                               ("px", 8, "f64")])


def _frame(*messages):
    return codec.encode_data_frame(
        [{"topic_key": key, "sequence": seq, "schema_id": QUOTE.schema_id, "qos": qos,
          "payload": QUOTE.encode(values)} for key, seq, qos, values in messages])


def test_a_decoded_message_gives_its_fields_and_header_properties():
    frame = _frame((0x77, 9, 2, {"symbol": "IBM", "price": 150, "px": 1.5}))
    (view,) = codec.decode_frame(frame).messages()
    event = message_event(view.payload, QUOTE, view)
    assert event == {"symbol": "IBM", "price": 150, "px": 1.5, "tw_topic_key": 0x77,
                     "tw_sequence": 9, "tw_publish_ts_ns": 0, "tw_namespace_id": 0,
                     "tw_schema_id": 7, "tw_qos": 2}


def test_subscribers_selectors_pick_messages_of_a_decoded_batch():
    buf = np.frombuffer(_frame((1, 1, 0, {"symbol": "IBM", "price": 90}),
                               (1, 2, 2, {"symbol": "IBM", "price": 120}),
                               (1, 3, 0, {"symbol": "MSFT", "price": 500})), np.uint8)
    batch = new_message_batch(8)
    status, types = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
    result = decode_frames(buf, np.array([0]), np.array([len(buf)]), batch, status, types)
    assert result.messages == 3
    index = SelectorIndex()
    index.add("cheap-ibm", "symbol = 'IBM' AND price < 100")
    index.add("guaranteed", "tw_qos = 2")
    index.add("ib-prefix-or-expensive", "symbol LIKE 'IB%' OR price > 400")
    matched = []
    for rec in batch[:result.messages]:
        start = int(rec["payload_offset"])
        payload = buf[start:start + int(rec["payload_len"])].tobytes()
        matched.append(index.match(message_event(payload, QUOTE, rec)))
    assert matched == [{"cheap-ibm", "ib-prefix-or-expensive"},
                       {"guaranteed", "ib-prefix-or-expensive"}, {"ib-prefix-or-expensive"}]


def test_fields_the_payload_is_too_short_for_are_null():
    event = message_event(QUOTE.encode({"symbol": "IBM", "price": 5})[:8], QUOTE)
    assert event == {"symbol": "IBM", "price": 5}
    index = SelectorIndex()
    index.add("a", "px IS NULL")
    index.add("b", "px < 1 OR px >= 1")  # UNKNOWN for a NULL px
    assert index.match(event) == {"a"}


def test_application_properties_join_and_may_not_reuse_names():
    event = message_event(properties={"region": "eu"}, header={
        "topic_key": 1, "sequence": 2, "publish_ts_ns": 3, "namespace_id": 4, "schema_id": 0,
        "qos": 0})
    assert event["region"] == "eu" and event["tw_sequence"] == 2
    with pytest.raises(SelectorError, match="'tw_qos' is a reserved header property name"):
        message_event(properties={"tw_qos": 1})
    with pytest.raises(SelectorError, match="'price' is a field of schema 'quote'"):
        message_event(QUOTE.encode({"price": 1}), QUOTE, properties={"price": 2})
    shadow = Schema.of("s", 1, [("tw_qos", 0, "u8")])
    with pytest.raises(SelectorError, match="schema field 'tw_qos' hides"):
        message_event(b"\x01", shadow, header={name: 0 for name in (
            "topic_key", "sequence", "publish_ts_ns", "namespace_id", "schema_id", "qos")})
