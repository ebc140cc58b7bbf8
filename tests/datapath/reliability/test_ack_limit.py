"""A receiver's ``ack_limit`` holds its cumulative ACK back (the appliance's persisted
acknowledgements): the ACK never passes the limit nor what was delivered, and goes on when
the limit moves."""

from datapath.protocol.frame_layout import FrameType
from datapath.reliability import ReceiverConfig, ReliableReceiver, StreamKey
from datapath.reliability.sink import CollectingSink
from tests.datapath.reliability.frames import SENDER_ADDR, SENDER_SESSION, STREAM, admin, data
from tests.datapath.reliability.simnet import Recorder

MS = 1_000_000


def _acks(sink: CollectingSink) -> list[int]:
    out = []
    for frame, _ in sink.frames:
        header, entries = admin(bytes(frame))
        if header.frame_type == FrameType.ACK:
            out.extend(e.ack_seq for e in entries)
    return out


def test_the_ack_stops_at_the_limit_and_moves_with_it():
    limit = {"upto": 3}
    seen = []

    def ack_limit(stream, delivered):
        seen.append((stream, delivered))
        return min(delivered, limit["upto"])

    sink = CollectingSink()
    rx = ReliableReceiver(Recorder(), sink, session_id=99, config=ReceiverConfig(),
                          ack_limit=ack_limit)
    rx.on_frame(data(range(1, 11)), 0, reply_to=SENDER_ADDR)
    rx.do_work(10 * MS)
    assert _acks(sink) == [3]  # delivered 10, acknowledged 3
    assert seen[-1] == (StreamKey(SENDER_SESSION, STREAM), 10)
    sink.frames.clear()
    rx.do_work(20 * MS)
    assert _acks(sink) == []  # nothing moved: no ACK before the idle interval
    limit["upto"] = 50  # beyond what was delivered: the ACK is what was delivered
    rx.do_work(30 * MS)
    assert _acks(sink) == [10]
