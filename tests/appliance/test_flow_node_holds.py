"""Throttle holds between appliances (appliance/dataplane/flow.py ``_signal_node`` and
``on_node_frame``), at the level of the data path's flow-control state: the frame one
appliance sends is the frame the other accepts; a forged, unknown or excess hold is refused
and counted; a hold not refreshed ends by itself. The end-to-end case (two appliances, a
publisher held off by a subscriber's appliance) is in test_flow_control.py."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from appliance.control.auth import FabricAuth
from appliance.dataplane import flow as flow_mod
from appliance.dataplane.flow import NODE_HOLD_EXPIRY_NS, SessionFlow, SessionFlows
from appliance.dataplane.names import FABRIC
from datapath.protocol import frame_layout as fl
from datapath.protocol.admin_layout import SESSION_FLOW_STREAM, FlowPolicy, FlowState
from datapath.protocol.codec import decode_frame

KEY = bytes(range(32))
PUBLISHER = 7
"""The publishing session's id at appliance 1."""


def _agent(node_id: int, key: bytes = KEY) -> SimpleNamespace:
    """The parts of a data-path agent that flow control uses (this is a unit test of
    ``SessionFlows``: the agent's queues are lists here)."""
    sent: list[tuple[str, int, bytes]] = []
    return SimpleNamespace(
        node_id=node_id, counters=Counter(), sent=sent, cycle_ns=0, sessions_version=0,
        sessions={PUBLISHER: SimpleNamespace(session_id=PUBLISHER, channel="clients-udp",
                                             dest=99)},
        guaranteed=SimpleNamespace(auth=FabricAuth(key, 1, 1_000 + node_id)),
        tables=SimpleNamespace(next_hop={1: 501, 2: 502}),
        queue_frame=lambda channel, dest, frame: sent.append((channel, dest, bytes(frame))))


def _hold_frame(sender: SimpleNamespace, state: FlowState) -> bytes:
    """What appliance ``sender``'s flow control sends appliance 1 about its PUBLISHER."""
    flows = SessionFlows(sender)
    flows._signal_node((1, PUBLISHER), state)
    channel, hop, frame = sender.sent.pop()
    assert (channel, hop) == (FABRIC, 501)
    return frame


def _header(frame: bytes):
    return decode_frame(frame).header


def test_a_signed_hold_from_another_appliance_holds_the_local_publisher_then_lets_it_go():
    far, near = _agent(2), _agent(1)
    flows = SessionFlows(near)
    on = _hold_frame(far, FlowState.ON)
    h = _header(on)
    assert (h.frame_type, h.source_session, h.dest_session, h.stream_id) == (
        fl.FrameType.FLOW_CONTROL, 2, 1, PUBLISHER)
    flows.on_node_frame(memoryview(on), 2, 1, PUBLISHER, now_ns=10)
    assert flows.node_holds == {(2, PUBLISHER): 10 + NODE_HOLD_EXPIRY_NS}
    assert flows.holding == {PUBLISHER: {("n", 2)}}
    channel, dest, signal = near.sent.pop()
    assert (channel, dest) == ("clients-udp", 99)
    assert _header(signal).stream_id == SESSION_FLOW_STREAM
    assert decode_frame(signal).admin()[1][0].state is FlowState.ON
    flows.on_node_frame(memoryview(_hold_frame(far, FlowState.OFF)), 2, 1, PUBLISHER, 20)
    assert flows.node_holds == {} and flows.holding == {}
    assert decode_frame(near.sent.pop()[2]).admin()[1][0].state is FlowState.OFF
    assert near.counters["flow_node_signals_received"] == 2


@pytest.mark.parametrize("what", ["forged", "replayed", "unsigned"])
def test_a_hold_that_is_not_authentic_holds_nothing(what):
    near = _agent(1)
    flows = SessionFlows(near)
    if what == "forged":
        frame = _hold_frame(_agent(2, key=bytes(32)), FlowState.ON)
    elif what == "replayed":
        frame = _hold_frame(_agent(2), FlowState.ON)
        flows.on_node_frame(memoryview(frame), 2, 1, PUBLISHER, 0)
        flows.on_node_frame(memoryview(_hold_frame(_agent(2), FlowState.OFF)), 2, 1,
                            PUBLISHER, 0)
        near.sent.clear()
    else:
        from datapath.protocol.admin_layout import FlowControl
        from datapath.protocol.codec import encode_admin
        frame = bytes(encode_admin(fl.FrameType.FLOW_CONTROL, [FlowControl(
            FlowState.ON, FlowPolicy.THROTTLE, 0, 1, 1)], stream_id=PUBLISHER,
            source_session=2, dest_session=1))
    refused = near.counters["flow_node_signals_refused"]
    flows.on_node_frame(memoryview(frame), 2, 1, PUBLISHER, 0)
    assert near.counters["flow_node_signals_refused"] == refused + 1
    assert flows.node_holds == {} and flows.holding == {} and near.sent == []


def test_a_hold_on_no_local_session_or_beyond_the_bound_is_refused(monkeypatch):
    near = _agent(1)
    flows = SessionFlows(near)
    far = _agent(2)
    stranger = SessionFlows(far)
    stranger._signal_node((1, 12345), FlowState.ON)
    flows.on_node_frame(memoryview(far.sent.pop()[2]), 2, 1, 12345, 0)
    assert near.counters["flow_node_holds_unknown"] == 1 and flows.node_holds == {}
    monkeypatch.setattr(flow_mod, "MAX_NODE_HOLDS", 0)
    flows.on_node_frame(memoryview(_hold_frame(far, FlowState.ON)), 2, 1, PUBLISHER, 0)
    assert near.counters["flow_node_holds_refused"] == 1 and flows.node_holds == {}


def test_a_hold_not_refreshed_expires_and_releases_the_publisher():
    near = _agent(1)
    flows = SessionFlows(near)
    flows.on_node_frame(memoryview(_hold_frame(_agent(2), FlowState.ON)), 2, 1, PUBLISHER, 0)
    near.sent.clear()
    flows._expire_node_holds(NODE_HOLD_EXPIRY_NS - 1)
    assert flows.node_holds and near.sent == []
    flows._expire_node_holds(NODE_HOLD_EXPIRY_NS)
    assert flows.node_holds == {} and flows.holding == {}
    assert decode_frame(near.sent.pop()[2]).admin()[1][0].state is FlowState.OFF
    assert near.counters["flow_node_holds_expired"] == 1


def test_a_throttle_queue_holds_remote_publishers_through_their_appliance():
    """The subscriber's side: a throttle queue past its high watermark holds the publishers
    of the messages it queued, a remote one by a frame to its appliance; below the low
    watermark it lets them go."""
    near = _agent(2)  # the subscriber's appliance
    flows = SessionFlows(near)
    session = SimpleNamespace(session_id=40, flow=None, channel="clients-udp", dest=98,
                              flow_policy=int(FlowPolicy.THROTTLE))
    session.flow = flows.flows[40] = SessionFlow(FlowPolicy.THROTTLE, sticky=True)
    payload = bytearray(64)
    import numpy as np
    buf = np.frombuffer(bytes(payload), np.uint8)
    for _ in range(flow_mod.FLOW_THROTTLE_HIGH_MESSAGES + 1):
        flows.offer(session, 5, 1, PUBLISHER, buf, 0, len(buf))
    assert flows.remote_holding == {(1, PUBLISHER): {40}}
    holds = [f for c, hop, f in near.sent if c == FABRIC]
    assert len(holds) == 1 and _header(holds[0]).stream_id == PUBLISHER
    assert decode_frame(holds[0]).admin()[1][0].state is FlowState.ON
    near.sent.clear()
    flows.forget(40)
    assert flows.remote_holding == {}
    assert decode_frame(near.sent.pop()[2]).admin()[1][0].state is FlowState.OFF
