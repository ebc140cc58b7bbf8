"""Frame builders shared by the protocol tests."""

from datapath.protocol.codec import encode_data_frame

TS = 1_767_225_600_000_000_000


def data_frame(n=3, payload_size=5, topic=""):
    return encode_data_frame(
        [{"topic_key": 100 + i, "sequence": i, "publish_ts_ns": TS + i,
          "payload": bytes([i % 256]) * (payload_size + i), "topic": topic, "qos": i % 3}
         for i in range(n)], source_session=1, stream_id=2, send_ts_ns=TS)


def patched(frame, offset, value_bytes):
    b = bytearray(frame)
    b[offset:offset + len(value_bytes)] = value_bytes
    return bytes(b)
