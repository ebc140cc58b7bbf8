"""Frame builders and readers shared by the reliability unit tests."""

from datapath.protocol.admin_layout import SeqRange
from datapath.protocol.codec import decode_frame, encode_admin, encode_data_frame
from datapath.protocol.frame_layout import FrameType
from datapath.reliability import ReceiverConfig, ReliableReceiver
from datapath.reliability.sink import CollectingSink
from tests.datapath.reliability.simnet import Recorder

SENDER_SESSION = 7
STREAM = 3
RECEIVER_SESSION = 99
SENDER_ADDR = ("10.0.0.1", 47470)


def data(seqs, *, frame_type=FrameType.DATA, src=SENDER_SESSION, stream=STREAM,
         dest_session=0, payload=b"payload!", flags=0):
    return encode_data_frame(
        [{"topic_key": (1000 + s) % 2**64, "sequence": s, "payload": payload, "flags": flags}
         for s in seqs],
        frame_type=frame_type, source_session=src, stream_id=stream, dest_session=dest_session)


def nak(ranges, *, from_session, stream_session=SENDER_SESSION, stream=STREAM):
    return bytes(encode_admin(FrameType.NAK, [SeqRange(a, b) for a, b in ranges],
                              source_session=from_session, dest_session=stream_session,
                              stream_id=stream))


def loss(ranges, *, src=SENDER_SESSION, stream=STREAM):
    return bytes(encode_admin(FrameType.LOSS, [SeqRange(a, b) for a, b in ranges],
                              source_session=src, stream_id=stream))


def admin(frame):
    """(header, entries) of an admin frame."""
    parsed = decode_frame(frame)
    return parsed.header, parsed.admin()[1]


def sent_of(sink, frame_type):
    """Frames of ``frame_type`` a CollectingSink holds (and removes them all)."""
    return [(f, d) for f, d in sink.take() if f[3] == frame_type]


def nak_ranges(frames):
    return [(e.first_seq, e.last_seq) for f, _ in frames for e in admin(f)[1]]


def message_seqs(frame):
    return [m.sequence for m in decode_frame(frame).messages()]


def make_receiver(seed=1, **config):
    recorder, sink = Recorder(), CollectingSink()
    receiver = ReliableReceiver(recorder, sink, session_id=RECEIVER_SESSION,
                                config=ReceiverConfig(**config), seed=seed)
    return receiver, recorder, sink
