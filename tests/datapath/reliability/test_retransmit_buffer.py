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


def test_a_growing_arena_holds_exactly_what_a_full_size_one_holds(monkeypatch):
    """The arena starts small and doubles: frame for frame it keeps and answers the same
    messages as one allocated at its bound, and stops growing there."""
    from datapath.reliability import retransmit

    rng = random.Random(5)
    full = RetransmitBuffer(capacity_bytes=20_000, capacity_messages=256)
    monkeypatch.setattr(retransmit, "INITIAL_ARENA_BYTES", 512)
    monkeypatch.setattr(retransmit, "INITIAL_LINGER_SLOTS", 4)
    grown = RetransmitBuffer(capacity_bytes=20_000, capacity_messages=256)
    assert grown.arena_bytes == 512 < full.arena_bytes == 20_000
    sizes = set()
    seq = 1
    for _ in range(600):
        count = rng.randrange(1, 8)
        body, _ = _frame_body(seq, count, rng)
        full.append(seq, count, body)
        grown.append(seq, count, body)
        seq += count
        sizes.add(grown.arena_bytes)
        assert grown.lowest_seq == full.lowest_seq
        a = rng.randrange(grown.lowest_seq, seq)
        assert [(s, bytes(m)) for s, m in grown.messages(a, seq - 1)] == [
            (s, bytes(m)) for s, m in full.messages(a, seq - 1)]
        assert grown.bytes_from(a) <= 20_000
    assert sizes >= {1024, 2048, 4096, 8192, 16384, 20_000} and grown.arena_bytes == 20_000
    assert grown.evicted_frames > 0


def test_linger_times_survive_the_growth_of_their_table(monkeypatch):
    from datapath.reliability import retransmit

    monkeypatch.setattr(retransmit, "INITIAL_LINGER_SLOTS", 4)
    buf = RetransmitBuffer(100_000, 64)
    assert not buf.lingering(3, now_ns=0, linger_ns=10)
    rng = random.Random(6)
    body, _ = _frame_body(1, 40, rng)
    buf.append(1, 40, body)  # 40 held: the table grows to 64 slots at the next look
    assert buf.lingering(3, now_ns=5, linger_ns=10)  # still remembered
    assert len(buf._retransmitted_ns) == 64
    # every sequence answers as before the growth: 35 shared 3's slot of 4, 36 did not
    assert buf.lingering(35, now_ns=5, linger_ns=10)
    assert not buf.lingering(36, now_ns=5, linger_ns=10)


def test_an_idle_stream_holds_little_memory():
    import os

    def rss() -> int:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = rss()
    bufs = [RetransmitBuffer(4 << 20, 1 << 16) for _ in range(100)]
    per = (rss() - before) / len(bufs)
    assert per < 256 * 1024, f"{per:.0f} bytes per idle buffer"  # was 4.6 MiB
    assert all(b.arena_bytes == 64 * 1024 for b in bufs)
