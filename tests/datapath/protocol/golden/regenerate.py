"""Write vectors.json from the codec. Run only when the protocol changes (with a version bump):
the stored bytes are the contract the codec AND the scapy layer are tested against.

    .venv/bin/python tests/datapath/protocol/golden/regenerate.py
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from datapath.protocol import admin_layout as al
from datapath.protocol.codec import encode_admin, encode_data_frame
from datapath.protocol.extensions import encode_headers, encode_segment
from datapath.protocol.frame_layout import FrameType

HERE = Path(__file__).parent
TS = 1_767_225_600_123_456_789  # 2026-01-01T00:00:00.123456789Z

MESSAGE_VECTORS = {
    "data_one_message": dict(
        frame_type=FrameType.DATA, source_session=1, stream_id=7, send_ts_ns=TS,
        messages=[dict(topic_key=0x1122334455667788, sequence=1, publish_ts_ns=TS - 500,
                       namespace_id=3, schema_id=42, qos=0, flags=0, payload=b"\x00\x00\x00\x2a"
                       b"IBM\x00price=101.25")]),
    "data_batch_with_topic_and_padding": dict(
        frame_type=FrameType.DATA, source_session=0xDEADBEEF, dest_session=2, stream_id=1,
        send_ts_ns=TS, messages=[
            dict(topic_key=1, sequence=100, publish_ts_ns=TS, namespace_id=0, schema_id=0,
                 qos=2, flags=0, payload=b"", topic="nyse/rtf/ibm"),
            dict(topic_key=2, sequence=101, publish_ts_ns=TS + 1, namespace_id=0, schema_id=1,
                 qos=1, flags=2, payload=b"x"),
            dict(topic_key=0xFFFFFFFFFFFFFFFF, sequence=2**64 - 1, publish_ts_ns=2**64 - 1,
                 namespace_id=2**32 - 1, schema_id=65535, qos=0, flags=0,
                 payload=bytes(range(17)), topic="a/\u00e9/c")]),
    "retransmission": dict(
        frame_type=FrameType.RETRANSMISSION, source_session=5, stream_id=9, send_ts_ns=TS,
        messages=[dict(topic_key=77, sequence=12, publish_ts_ns=TS - 10, namespace_id=1,
                       schema_id=0, qos=2, flags=1, payload=b"again")]),
    # extensions (docs/protocol.md, "Headers and segments"): added without a version change,
    # the vectors above stay byte-identical
    "data_with_headers": dict(
        frame_type=FrameType.DATA, source_session=1, stream_id=7, send_ts_ns=TS,
        messages=[dict(topic_key=0x1122334455667788, sequence=2, publish_ts_ns=TS - 400,
                       namespace_id=3, schema_id=0, qos=0, flags=4, payload=b"101.25"
                       + encode_headers({"trace-id": "abc123", "bin": b"\x00\xff"}))]),
    "guaranteed_segment_with_headers": dict(
        frame_type=FrameType.DATA, source_session=3, stream_id=0x80000003, send_ts_ns=TS,
        messages=[dict(topic_key=9, sequence=40, publish_ts_ns=TS - 300, qos=2, flags=12,
                       payload=b"first-chunk" + encode_headers({"k": "v"})
                       + encode_segment(5, 3000, 0, 0, 3))]),
}

ADMIN_VECTORS = {
    "hello": (FrameType.HELLO, [al.Hello(0x0102030405060708, 1, 100, al.NodeRole.CORE, 250,
                                          "core-a")], None, None),
    "heartbeat": (FrameType.HEARTBEAT, [al.Hello(9, 2, 100, al.NodeRole.EDGE, 0, "")], None,
                  None),
    "subscribe_two_patterns": (FrameType.SUBSCRIBE, [
        al.Subscription(1, 0, 2, 0, "nyse/+/ibm"), al.Subscription(2, 3, 0, 0, "#/trades")],
        None, None),
    "unsubscribe": (FrameType.UNSUBSCRIBE, [al.Subscription(1, 0, 0, 0, "nyse/+/ibm")], None,
                    None),
    "registry_update": (FrameType.REGISTRY_UPDATE, [
        al.RegistryEntry(0xA1B2C3D4E5F60718, 0, "nyse/rtf/ibm"),
        al.RegistryEntry(5, 1, "sensors/plant-1/temp")], {"version": 17}, None),
    "nak_two_ranges": (FrameType.NAK, [al.SeqRange(10, 12), al.SeqRange(20, 20)], None, None),
    "loss": (FrameType.LOSS, [al.SeqRange(1, 9)], None, None),
    "flow_control_on": (FrameType.FLOW_CONTROL, [al.FlowControl(
        al.FlowState.ON, al.FlowPolicy.CONFLATE, 9000, 8192, 2048)], None, None),
    "session_move": (FrameType.SESSION_MOVE, [al.SessionMove(44, 1, 2, 1000)], None, None),
    "successor_set": (FrameType.SUCCESSOR, [al.Successor(al.SuccessorOp.SET_SUCCESSOR,
                                                         "client-1", "client-2")], None, None),
    "ack": (FrameType.ACK, [al.Ack(123456, 65536)], None, None),
    "subscribe_authenticated": (FrameType.SUBSCRIBE, [al.Subscription(7, 0, 2, 0, "a/#")], None,
                                (3, 1, 99)),
    "control_lsa": (FrameType.CONTROL, [al.Control(
        al.ControlKind.LSA, '{"origin":1,"seq":5,"links":[[2,1],[3,1]]}')], None, None),
    "control_login_authenticated": (FrameType.CONTROL, [al.Control(
        al.ControlKind.LOGIN, '{"identity":"md-feed"}')], None, (1, 7, 12)),
}


def _jsonable(value: object) -> object:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    return int(value) if isinstance(value, int) else value


def main() -> None:
    vectors = []
    for name, spec in MESSAGE_VECTORS.items():
        spec = dict(spec)
        messages = spec.pop("messages")
        data = encode_data_frame(messages, **spec)
        vectors.append({"name": name, "header": {k: int(v) for k, v in spec.items()},
                        "messages": [{k: _jsonable(v) for k, v in m.items()} for m in messages],
                        "hex": data.hex()})
    for name, (ftype, entries, body_header, auth) in ADMIN_VECTORS.items():
        data = encode_admin(ftype, entries, body_header=body_header, source_session=4,
                            stream_id=6, send_ts_ns=TS, auth=auth)
        vectors.append({
            "name": name,
            "header": {"frame_type": int(ftype), "source_session": 4, "stream_id": 6,
                       "send_ts_ns": TS},
            "body_header": body_header,
            "auth": list(auth) if auth else None,
            "entries": [{k: _jsonable(v) for k, v in dataclasses.asdict(e).items()}
                        for e in entries],
            "hex": bytes(data).hex(),
        })
    (HERE / "vectors.json").write_text(json.dumps(vectors, indent=1) + "\n")


if __name__ == "__main__":
    main()
