"""A guaranteed message an appliance hop cannot take is a declared loss, not a silent one.

Two GuaranteedPlanes (appliance A, node 1, sending to destination D, node 2) exchange their
frames in process; only the data path's queues are stood in for (``_DataPath``: the tables,
the sessions, ``queue_frame``), the reliable transport on both sides is the real one. A's
sender towards D is held off by flow control with a tiny pending queue, so ``_offer`` is
refused: D must then see the refused messages as one loss event and send a loss notice to its
guaranteed client, in sequence position after the messages A did take.
"""

import json

from appliance.control.auth import FabricAuth
from appliance.dataplane.agent import CLIENT_UDP, FABRIC, DpSession, ForwardingTables
from appliance.dataplane.guaranteed import LOSS_NOTICE_KEY, GuaranteedPlane
from datapath.protocol.admin_layout import FlowControl, FlowPolicy, FlowState
from datapath.protocol.codec import decode_frame, encode_data_frame
from datapath.protocol.frame_layout import FRAME_HEADER_BYTES, FRAME_HEADER_STRUCT, FrameType

A, D = 1, 2
PUBLISHER = 5
CLIENT = 77
MS = 1_000_000


class _DataPath:
    """What a GuaranteedPlane uses of its DataPlaneAgent; frames queue in ``out``."""

    def __init__(self, node_id, peer, *, client=None):
        ports = {1: ("gclient", client)} if client else {}
        self.node_id = node_id
        self.tables = ForwardingTables(node_id, ports=ports, next_hop={peer: peer},
                                       epochs={peer: peer})  # as _plane signs
        self.sessions = {client: DpSession(client, "c", CLIENT_UDP, 900)} if client else {}
        self.out: list[tuple[str, int, bytes]] = []

    def queue_frame(self, channel, dest, frame):
        self.out.append((channel, dest, bytes(frame)))


def _plane(dp, fabric_max_frame_bytes):
    """A GuaranteedPlane whose frames between appliances are signed and checked with the
    fabric key, as an appliance's are (control/auth.py)."""
    plane = GuaranteedPlane(dp, fabric_max_frame_bytes)
    plane.use_auth(FabricAuth(bytes(range(32)), 1, dp.node_id, 1_000_000 * dp.node_id))
    return plane


def _message(topic_key, payload):
    frame = encode_data_frame([{"topic_key": topic_key, "sequence": 1, "payload": payload}],
                              source_session=PUBLISHER)
    return bytes(frame), FRAME_HEADER_BYTES


def _exchange(a, d, now_ns):
    """Fabric frames each way (A's to D's plane, D's to A's); D's client frames are kept."""
    client = []
    for src, dst in ((a, d), (d, a)):
        out, src.dp.out = src.dp.out, []
        for channel, _, frame in out:
            if channel != FABRIC:
                client.append(frame)
                continue
            _, _, ftype, _, _, _, source, _, stream, _ = FRAME_HEADER_STRUCT.unpack_from(frame)
            dst.on_fabric_frame(memoryview(frame), ftype, source, stream, now_ns)
    return client


def test_messages_a_hop_refuses_reach_the_destination_as_a_loss_and_a_notice():
    a = _plane(_DataPath(A, D), 1_472)
    d = _plane(_DataPath(D, A, client=CLIENT), 1_472)
    now = 10 * MS
    a.to_node(D, PUBLISHER, *_message(100, b"first"), now)
    sender = a.senders[("n", D, PUBLISHER | 0x8000_0000)].sender
    sender.pending.capacity = 2
    sender.flow.on_signal(D, FlowControl(FlowState.ON, FlowPolicy.THROTTLE, 0, 10, 5), now)
    for i in range(6):  # two wait in the pending queue, four are refused
        a.to_node(D, PUBLISHER, *_message(101 + i, b"m%d" % i), now)
    assert a.counters["guaranteed_refused"] == 4
    sender.flow.on_signal(D, FlowControl(FlowState.OFF, FlowPolicy.THROTTLE, 0, 10, 5), now)
    to_client = []
    for _ in range(20):
        now += 2 * MS
        a.run_timers(now)
        a.flush(now)
        d.run_timers(now)
        d.flush(now)
        to_client += _exchange(a, d, now)
    delivered = [(stream.source_session, int.from_bytes(m[0:8])) for _, stream, m in
                 d.take_delivered()]
    assert delivered == [(A, 100), (A, 101), (A, 102)]
    assert d.counters["guaranteed_loss_events"] == 1
    assert d.counters["guaranteed_lost_messages"] == 4
    notices = [json.loads(bytes(m.payload)) for f in to_client
               for m in decode_frame(f).messages() if m.topic_key == LOSS_NOTICE_KEY
               and decode_frame(f).header.frame_type is FrameType.DATA]
    assert [(n["origin"], n["stream"], n["first"], n["last"], n["reason"]) for n in notices] \
        == [(A, PUBLISHER, 4, 7, "SENDER_LOSS")]
