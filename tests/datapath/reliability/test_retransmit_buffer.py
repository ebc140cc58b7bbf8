"""The retransmission buffer returns exactly the bytes sent, and forgets the oldest first."""

import random

from datapath.protocol.codec import encode_data_frame
from datapath.reliability.retransmit import RetransmitBuffer


def _frame_body(first_seq, count, rng):
    msgs = [{"topic_key": first_seq + i, "sequence": first_seq + i,
             "payload": bytes(rng.randrange(256) for _ in range(rng.randrange(0, 60)))}
            for i in range(count)]
    frame = encode_data_frame(msgs, stream_id=1, source_session=2)
    body = frame[32:]
    messages, pos = {}, 0
    for m in msgs:
        size = 40 + (len(m["payload"]) + 7) // 8 * 8
        messages[m["sequence"]] = body[pos : pos + size]
        pos += size
    return body, messages


def test_held_messages_come_back_byte_for_byte_across_wraparound():
    rng = random.Random(3)
    buf = RetransmitBuffer(capacity_bytes=4_000, capacity_messages=64)
    sent = {}
    seq = 1
    for _ in range(300):
        count = rng.randrange(1, 6)
        body, messages = _frame_body(seq, count, rng)
        buf.append(seq, count, body)
        sent.update(messages)
        seq += count
        low = buf.lowest_seq
        assert seq - low <= 64
        got = dict((s, bytes(m)) for s, m in buf.messages(low, seq - 1))
        assert list(got) == list(range(low, seq))
        assert all(got[s] == sent[s] for s in got)
        a = rng.randrange(low, seq)
        b = rng.randrange(a, seq)
        assert [s for s, _ in buf.messages(a, b)] == list(range(a, b + 1))
    assert buf.evicted_frames > 0 and buf.lowest_seq > 1


def test_the_byte_bound_evicts_the_oldest_frames():
    rng = random.Random(4)
    buf = RetransmitBuffer(capacity_bytes=1_000, capacity_messages=1 << 10)
    seq = 1
    for _ in range(20):
        body, _ = _frame_body(seq, 2, rng)
        buf.append(seq, 2, body)
        seq += 2
    held = list(buf.messages(1, seq))
    assert sum(len(m) for _, m in held) <= 1_000
    assert held[-1][0] == seq - 1 and held[0][0] == buf.lowest_seq > 1


def test_linger_refuses_a_second_retransmission_until_it_has_passed():
    buf = RetransmitBuffer(1_000, 16)
    assert not buf.lingering(5, now_ns=0, linger_ns=10)
    assert buf.lingering(5, now_ns=9, linger_ns=10)
    assert not buf.lingering(5, now_ns=10, linger_ns=10)
