"""Seed inputs of the fuzzer: what a peer, a client or an operator could plausibly send.

Frames: the golden vectors (tests/datapath/protocol/golden/vectors.json), a frame of every
type built with the codec, a CONTROL entry of every kind with a good document and with
documents of the wrong shape, frames a neighbour signs with the fabric key (so that a
mutated frame signed again gets past the MAC and reaches the handlers), and random bytes.
Documents, configs, registry files and captures for the in-process decoders.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from appliance.control.auth import FabricAuth
from appliance.control.routing import Lsa
from appliance.control.state import _lsa_to_doc
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.admin_layout import ControlKind as K
from datapath.protocol.codec import encode_admin, encode_data_frame
from datapath.protocol.frame_layout import FrameType
from datapath.topics.registry import KeyRegistry

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "datapath" / "protocol" / "golden" / "vectors.json"
FABRIC_KEY = "11" * 32
"""The fabric key of the appliance the live fuzzer starts (the tests' key)."""
PROBE_STREAM = 0x7FFF_FFFF
"""``stream_id`` of telemetry probes (appliance/ops/telemetry/config.py)."""
RELIABLE = 0x8000_0000
DUP_DEST_BIT = 0x8000_0000

_KEYS = KeyRegistry()


def golden_frames() -> list[bytes]:
    return [bytes.fromhex(v["hex"]) for v in json.loads(GOLDEN.read_text())]


def good_documents(origin: int = 5, name: str = "core-1", self_id: int = 7) -> dict:
    """A document of every CONTROL kind as the appliances and the client library write it."""
    pm = {"pm": "core-1", "version": 1_700_000_000_000_000, "anonymous": False,
          "identities": {"feed": {"publish": ["#"], "subscribe": ["#"]}},
          "namespaces": [0], "schemas": [], "routes": []}
    return {
        K.LSA: _lsa_to_doc(Lsa(origin, name, 4_000_000_000, 12, ((self_id, 1), (6, 65_535)))),
        K.INTEREST: {"origin": origin, "epoch": 3, "seq": 9, "patterns": [[0, "a/#"], [2, "+/b"]],
                     "guaranteed": [[0, "g/#"]]},
        K.PM_UPDATE: pm,
        K.LOGIN: {"identity": "feed", "ring": None, "token": 2**63 - 1},
        K.LOGIN_RESULT: {"accepted": True, "session": 77, "node": "core-1", "node_id": 5,
                         "schemas": []},
        K.REQUEST_RESULT: {"request": "subscribe", "sub_id": 3, "pattern": "a/#",
                           "accepted": False, "reason": "identity 'x' may not subscribe"},
        K.RESOLVE: {"keys": [0, 2**64 - 1, _KEYS.key_of("fz/a")]},
        K.LOGOUT: {"reason": "client closed"},
        K.SUCCESSOR: {"op": "set", "req": 1, "successor": "b", "vendor": "acme"},
        K.ECHO: {"ts": 1_700_000_000_000_000_000},
        K.REMOTE_REPLAY: {"fid": 12, "session": 4, "identity": "feed",
                          "request": {"id": 9, "pattern": "a/#", "durable": "d", "ack": 17,
                                      "wait_ms": 1_000}},
        K.REMOTE_REPLAY_RESULT: {"fid": 12, "result": {"id": 9, "accepted": True,
                                                       "count": 0, "next_seq": 19,
                                                       "done": True}},
        K.REMOTE_REPLAY_PART: {"fid": 12, "page": 3, "frame": 0, "part": 0, "parts": 1,
                               "data": "AAECAwQF"},
    }


SHAPES = ["[]", "[1, 2]", '"x"', '""', "1", "-1", "1.5", "null", "true", "false", "{}", "{",
          "", "\x00", "NaN", '{"ts": NaN}', "[" * 3_000, '{"a":' * 500 + "1" + "}" * 500,
          '"' + "x" * 6_000 + '"', json.dumps(list(range(900))), '{"identity": "\\ud800"}',
          "\u20ac" * 300, '{"keys": [1e400]}', '{"ts": 1' + "0" * 5_000 + "}"]
"""Documents of the wrong shape: not objects, not JSON, nested past any schema, large
(the shapes that ended appliances before the schemas: lists and strings where an object
belongs)."""


def _control(entries: list[tuple[K, str]], session: int = 0, auth: FabricAuth | None = None,
             dest: int = 0) -> bytes:
    return frame(FrameType.CONTROL, [al.Control(k, t) for k, t in entries], session=session,
                 auth=auth, dest=dest)


def frame(ftype: FrameType, entries: list, *, session: int = 0, dest: int = 0,
          stream: int = 0, auth: FabricAuth | None = None,
          body_header: dict | None = None) -> bytes:
    """An admin frame, signed when ``auth`` is given."""
    out = encode_admin(ftype, entries, source_session=session, dest_session=dest,
                       stream_id=stream, body_header=body_header,
                       send_ts_ns=1_767_225_600_000_000_000,
                       auth=auth.next_auth() if auth is not None else None)
    return bytes(auth.sign(out) if auth is not None else out)


def probe_frame(session: int = 0) -> bytes:
    """A telemetry probe: a DATA frame of no message on the probe stream."""
    out = bytearray(fl.FRAME_HEADER_BYTES + 8)
    fl.FRAME_HEADER_STRUCT.pack_into(out, 0, fl.FRAME_MAGIC, fl.PROTOCOL_VERSION,
                                     FrameType.DATA, 0, 0, len(out), session, 0, PROBE_STREAM,
                                     1_767_225_600_000_000_000)
    return bytes(out)


def data_frames(session: int, dest: int = 0, topics: tuple[str, ...] = ("fz/a", "fz/b")
                ) -> list[bytes]:
    """DATA and RETRANSMISSION frames: plain, several messages, topics carried, every QoS,
    a reliable stream from its first sequence number."""
    keys = [_KEYS.key_of(t) for t in topics]
    one = [{"topic_key": keys[0], "sequence": 1, "payload": b"x" * 16}]
    many = [{"topic_key": keys[i % len(keys)], "sequence": i + 1, "payload": bytes([i]) * i,
             "qos": i % 3, "flags": i % 4, "topic": topics[i % len(topics)] if i % 2 else ""}
            for i in range(5)]
    out = [encode_data_frame(one, source_session=session, dest_session=dest, stream_id=session),
           encode_data_frame(many, source_session=session, dest_session=dest,
                             stream_id=session),
           encode_data_frame([{"topic_key": 0, "sequence": 1}], source_session=session,
                             dest_session=dest),
           encode_data_frame(one, frame_type=FrameType.RETRANSMISSION, source_session=session,
                             dest_session=dest, stream_id=session),
           encode_data_frame([{**one[0], "qos": 2}], source_session=session, dest_session=dest,
                             stream_id=session | RELIABLE),
           encode_data_frame([{**one[0], "qos": 2, "sequence": 2}], source_session=session,
                             dest_session=dest, stream_id=session | RELIABLE),
           probe_frame(session)]
    return out


def admin_frames(session: int, auth: FabricAuth | None = None, dest: int = 0,
                 node_name: str = "fuzzer") -> list[bytes]:
    """A frame of every admin type with plausible entries (signed when ``auth``)."""
    stream = session | RELIABLE
    topics = ["fz/a", "fz/b/c", "x" * 300]
    f = []
    for ftype in (FrameType.HELLO, FrameType.HEARTBEAT):
        f.append(frame(ftype, [al.Hello(session, 1, 100, al.NodeRole.CORE, 0, node_name)],
                       session=session, auth=auth, dest=dest))
    for ftype in (FrameType.SUBSCRIBE, FrameType.UNSUBSCRIBE):
        f.append(frame(ftype, [al.Subscription(1, 0, 0, 0, "fz/#"),
                               al.Subscription(2, 0, 2, 0, "fz/+/c"),
                               al.Subscription(3, 7, 1, 0, "#")],
                       session=session, auth=auth, dest=dest))
    f.append(frame(FrameType.REGISTRY_UPDATE,
                   [al.RegistryEntry(_KEYS.key_of(t), 0, t) for t in topics],
                   session=session, auth=auth, dest=dest, body_header={"version": 1}))
    f.append(frame(FrameType.NAK, [al.SeqRange(1, 3)], session=session, stream=stream,
                   auth=auth, dest=dest))
    f.append(frame(FrameType.LOSS, [al.SeqRange(1, 1)], session=session, stream=stream,
                   auth=auth, dest=dest))
    f.append(frame(FrameType.ACK, [al.Ack(1, 65_536)], session=session, stream=stream,
                   auth=auth, dest=dest))
    f.append(frame(FrameType.FLOW_CONTROL, [al.FlowControl(al.FlowState.ON,
                                                           al.FlowPolicy.CONFLATE, 9, 8, 2)],
                   session=session, stream=stream, auth=auth, dest=dest))
    f.append(frame(FrameType.SESSION_MOVE, [al.SessionMove(session, 1, 2, 3)],
                   session=session, auth=auth, dest=dest))
    f.append(frame(FrameType.SUCCESSOR, [al.Successor(al.SuccessorOp.SET_SUCCESSOR, "a", "b")],
                   session=session, auth=auth, dest=dest))
    return f


def control_frames(session: int, sender: str, auth: FabricAuth | None = None,
                   origin: int = 5, name: str = "fuzzer", self_id: int = 7,
                   dest: int = 0) -> list[bytes]:
    """A CONTROL frame of every kind with its good document, every kind with wrong shapes,
    and a frame of several entries."""
    docs = good_documents(origin, name, self_id)
    out = [_control([(k, json.dumps(d))], session, auth) for k, d in docs.items()]
    rng = random.Random(len(sender))
    for k in K:
        for text in rng.sample(SHAPES, 4):
            out.append(_control([(k, text)], session, auth, dest))
    if sender == "client":
        out.append(_control([(K.LOGIN, "[]")], session, auth, dest))
        out.append(_control([(K.LOGIN, '"feed"')], session, auth, dest))
        out.append(_control([(K.RESOLVE, json.dumps(docs[K.RESOLVE])),
                             (K.LOGOUT, "[]"), (K.LOGIN, "{}")], session, auth, dest))
    else:
        out.append(_control([(K.LSA, "[]"), (K.INTEREST, '"x"'),
                             (K.ECHO, json.dumps(docs[K.ECHO]))], session, auth, dest))
    return out


@dataclass
class FrameSeeds:
    """Seed frames per source of the live fuzzer."""

    anon: list[bytes]
    """From a client port peer (no session yet): also every golden vector."""
    session: list[bytes]
    """From a logged-in client: ``source_session`` is patched to its session when sent."""
    neighbour: list[bytes]
    """From the configured neighbour: admin frames signed (signed again after mutation)."""
    stranger: list[bytes]
    """At the fabric port from an address that is no neighbour."""


def frame_seeds(neighbour_id: int, appliance_id: int, auth: FabricAuth,
                neighbour_name: str = "fuzzer") -> FrameSeeds:
    golden = golden_frames()
    client = (admin_frames(0) + control_frames(0, "client") + data_frames(0))
    neighbour = (admin_frames(neighbour_id, auth, dest=appliance_id, node_name=neighbour_name)
                 + control_frames(neighbour_id, "neighbour", auth, origin=neighbour_id,
                                  name=neighbour_name, self_id=appliance_id, dest=appliance_id)
                 + data_frames(neighbour_id, appliance_id)
                 + data_frames(neighbour_id, appliance_id | DUP_DEST_BIT)
                 + data_frames(neighbour_id, appliance_id + 1))
    return FrameSeeds(anon=golden + client, session=client, neighbour=neighbour,
                      stranger=golden + admin_frames(neighbour_id, auth)
                      + data_frames(neighbour_id, appliance_id))


# --- documents, configs, registry files, captures ---------------------------------------------
def document_seeds() -> list[tuple[K, str]]:
    out = [(k, json.dumps(d)) for k, d in good_documents().items()]
    out += [(k, s) for k in K for s in SHAPES[:12]]
    return out


def config_seeds() -> list[dict]:
    """Config documents (as ``parse_config`` takes them) of every section."""
    return [
        {"appliance": {"name": "fz"}},
        {"appliance": {"name": "fz-core", "id": 9, "role": "edge", "idle": "busy",
                       "heartbeat_interval_ms": 50, "namespaces": [0, 3]},
         "fabric": {"listen": "127.0.0.1:47470", "key": FABRIC_KEY, "max_frame_bytes": 1472},
         "neighbours": [{"name": "b", "address": "127.0.0.1:47480", "cost": 3}],
         "clients": {"udp": "127.0.0.1:47471", "max_sessions": 4, "session_dead_ms": 3000},
         "pm": {"identities": {"feed": {"publish": ["#"], "subscribe": ["a/+", "#"]}},
                "schemas": {"quote": {"id": 7, "fields": [["price", 0, "u32"],
                                                          ["symbol", 4, "ascii", 8]]}}}},
        {"appliance": {"name": "fz-edge"}, "pm": {"mode": "remote"},
         "clients": {"shm": "fz-ring", "max_pending_requests": 3}},
    ]


def toml_of(doc: dict) -> str:
    """A TOML text of a config document (tables of scalars, lists and inline tables)."""
    lines: list[str] = []

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(type(v))

    for table, body in doc.items():
        if isinstance(body, list):
            for item in body:
                lines.append(f"[[{table}]]")
                lines += [f"{k} = {value(v)}" for k, v in item.items()]
        else:
            lines.append(f"[{table}]")
            lines += [f"{json.dumps(k)} = {value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def registry_seed() -> str:
    """A registry file as ``KeyRegistry.save`` writes it."""
    reg = KeyRegistry()
    for i, t in enumerate(["a/b", "a/c", "nyse/ibm", "\u20ac/x"]):
        reg.key_for(t, i % 2)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "reg.json"
        reg.save(path)
        return path.read_text()


def pcap_seed(port: int = 47470) -> bytes:
    """A classic pcap of a few native datagrams (golden vectors) on ``port``."""
    import struct

    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65_535, 1))  # Ethernet
    for i, payload in enumerate(golden_frames()[:6]):
        udp_len = 8 + len(payload)
        ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, i, 0, 64, 17, 0,
                         bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]))
        udp = struct.pack(">HHHH", 40_000 + i, port, udp_len, 0)
        eth = b"\x00" * 12 + b"\x08\x00"
        pkt = eth + ip + udp + payload
        out += struct.pack("<IIII", 1_700_000_000 + i, 0, len(pkt), len(pkt)) + pkt
    return bytes(out)


def mqtt_seeds() -> list[bytes]:
    """MQTT packets of the edge's hot path and beside it (both protocol levels), built with
    the edge's codec: PUBLISH at each QoS with and without 5.0 properties, a topic with
    multi-byte characters, a payload past a one-byte remaining length, each acknowledgement
    (5.0 reason codes and properties), CONNECT, SUBSCRIBE, PINGREQ, DISCONNECT."""
    from appliance.edge.mqtt import codec
    from appliance.edge.mqtt.codec import PacketType as P

    out = []
    for version in (codec.V311, codec.V5):
        for qos in (0, 1, 2):
            out.append(codec.encode_publish("sensors/é/€", b"v" * (20 + 60 * qos), qos, qos == 1,
                                            qos == 2, 300 + qos, version))
        for ptype in (P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP):
            out.append(codec.encode_ack(ptype, 77, version, 0x10 if version == codec.V5 and
                                        ptype in (P.PUBACK, P.PUBREC) else 0))
        out.append(codec.encode_subscribe(5, [("sensors/#", 1)], version))
        out.append(codec.encode_connect("fuzz", version=version))
    out.append(codec.encode_publish("t", b"p", 1, False, False, 9, codec.V5,
                                    [(0x23, 2), (0x26, ("k", "v")), (0x02, 30)]))
    out.append(codec.packet(P.PUBACK, 0, b"\x00\x08\x00\x03\x1f\x00\x00"))
    out.append(codec.packet(P.PINGREQ, 0, b""))
    out.append(codec.packet(P.DISCONNECT, 0, b""))
    return out
