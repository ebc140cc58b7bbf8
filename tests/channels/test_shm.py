"""Shared-memory rings: SPSC and MPSC between processes, wrap-around, backpressure, torn data."""

import errno
import mmap
import os
import random
import threading
import time
import uuid

import pytest

from channels.base import FrameBatch
from channels.errors import ChannelDeviceError, ChannelUserError
from channels.shm import (
    BELL_SUFFIX,
    FILE_HEADER_BYTES,
    HEAD_OFFSET,
    PARKED_OFFSET,
    RING_HEADER_BYTES,
    TAIL_OFFSET,
    ShmChannel,
    ring_path,
)
from tests.channels.helpers import frames_batch
from tests.channels.peer import make_frame, without_ts


@pytest.fixture
def ring():
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    assert not os.path.exists(ring_path(name)), "the consumer must remove its ring on close"
    assert not os.path.exists(ring_path(name) + BELL_SUFFIX), "and its doorbell"


def test_spsc_moves_batches_between_two_processes(peers, ring):
    receiver = peers("recv", "shm", "--ring", ring, "--ring-bytes", "8192", "--count", "2000")
    receiver.wait_ready()
    sender = peers("send", "shm", "--ring", ring, "--count", "2000", "--key", "5")
    assert sender.result()["sent"] == 2000
    got = receiver.result()
    assert got["frames"] == 2000 and got["content_ok"] and got["in_order"]
    assert got["by_key"] == {"5": 2000} and got["latency_count"] == 2000


def test_mpsc_three_producer_processes_each_keep_their_order(peers, ring):
    receiver = peers("recv", "shm", "--ring", ring, "--producers", "3", "--ring-bytes",
                     "8192", "--count", "700")
    receiver.wait_ready()
    senders = [peers("send", "shm", "--ring", ring, "--count", "700", "--key", str(k))
               for k in (11, 12, 13)]
    for s in senders:
        assert s.result()["sent"] == 700
    got = receiver.result()
    assert got["frames"] == 2100 and got["content_ok"] and got["in_order"]
    assert got["by_key"] == {"11": 700, "12": 700, "13": 700}


def test_wrap_around_keeps_every_frame_whole(ring):
    with ShmChannel(rx=ring, ring_bytes=4096, max_frame_bytes=1024) as rx, \
            ShmChannel(tx=ring) as tx:
        got, one = FrameBatch(8, 2048), FrameBatch(1, 512)
        seen = []
        for i in range(300):  # sizes vary, so records meet the end at every offset
            one.clear()
            one.append(make_frame(1, i))
            assert tx.send(one) == 1
            assert rx.receive(got) == 1
            seen.append(without_ts(bytes(got.frame(0))))
        assert seen == [without_ts(make_frame(1, i)) for i in range(300)]
        assert rx.stats.drops == 0 and rx.stats.frames_in == 300
        assert tx.stats.bytes_out > 10 * 4096  # wrapped more than ten times


def test_a_full_ring_takes_fewer_frames_and_counts_backpressure(ring):
    with ShmChannel(rx=ring, ring_bytes=4096, max_frame_bytes=1024) as rx, \
            ShmChannel(tx=ring) as tx:
        batch = frames_batch(64)
        taken = tx.send(batch)
        assert 0 < taken < 64 and tx.stats.backpressure == 64 - taken
        got = FrameBatch(64, 2048)
        assert rx.receive(got) == taken
        assert [without_ts(bytes(got.frame(i))) for i in range(taken)] == \
            [without_ts(make_frame(1, i)) for i in range(taken)]
        assert got.peer_ids[:taken].tolist() == [0] * taken


def _ring_view(name):
    fd = os.open(ring_path(name), os.O_RDWR)
    mm = mmap.mmap(fd, os.fstat(fd).st_size)
    os.close(fd)
    return mm


def test_a_torn_record_is_counted_and_the_consumer_resyncs(ring):
    with ShmChannel(rx=ring, ring_bytes=4096, max_frame_bytes=1024) as rx, \
            ShmChannel(tx=ring) as tx:
        assert tx.send(frames_batch(3)) == 3
        mm = _ring_view(ring)
        data = FILE_HEADER_BYTES + RING_HEADER_BYTES
        mm[data : data + 4] = (50_000).to_bytes(4, "little")  # a length nobody wrote
        got = FrameBatch(8, 2048)
        assert rx.receive(got) == 0
        assert rx.stats.drop_reasons == {"torn_record": 1}
        assert tx.send(frames_batch(2)) == 2  # after the resync, frames flow again
        assert rx.receive(got) == 2
        mm.close()


def test_impossible_counters_fail_closed(ring):
    rx = ShmChannel(rx=ring, ring_bytes=4096)
    with ShmChannel(tx=ring) as tx:
        tx.send(frames_batch(1))
        mm = _ring_view(ring)
        at = FILE_HEADER_BYTES + TAIL_OFFSET
        mm[at : at + 8] = (10**9).to_bytes(8, "little")
        with pytest.raises(ChannelDeviceError, match="corrupt.*fail closed") as info:
            rx.receive(FrameBatch(4, 2048))
        assert info.value.errno == errno.EBADMSG and rx.closed
        mm[FILE_HEADER_BYTES + HEAD_OFFSET : FILE_HEADER_BYTES + HEAD_OFFSET + 8] = \
            (10**10).to_bytes(8, "little")
        with pytest.raises(ChannelDeviceError, match="corrupt"):
            tx.send(frames_batch(1))
        mm.close()
    rx.close()


def test_producer_slots_are_claimed_once_and_freed_when_the_producer_goes(ring):
    with ShmChannel(rx=ring, producers=2, ring_bytes=4096) as rx:
        a, b = ShmChannel(tx=ring), ShmChannel(tx=ring)
        assert {a.producer_slot, b.producer_slot} == {0, 1}
        assert sorted(rx.live_producers()) == [0, 1] and a.consumer_alive()
        with pytest.raises(ChannelDeviceError, match="producer slots .* taken") as info:
            ShmChannel(tx=ring)
        assert info.value.errno == errno.EBUSY
        freed = a.producer_slot
        a.close()
        assert rx.live_producers() == [1 - freed]
        with ShmChannel(tx=ring) as c:
            assert c.producer_slot == freed
        b.close()


def test_one_consumer_per_ring_and_clear_errors(ring):
    with ShmChannel(rx=ring, ring_bytes=4096):
        with pytest.raises(ChannelDeviceError, match="live consumer") as info:
            ShmChannel(rx=ring, ring_bytes=4096)
        assert info.value.errno == errno.EBUSY
    with pytest.raises(ChannelDeviceError, match="ENOENT.*start the ring's creator"):
        ShmChannel(tx=ring)
    with pytest.raises(ChannelUserError, match="power of two"):
        ShmChannel(rx=ring, ring_bytes=5000)
    with pytest.raises(ChannelUserError, match="rx=RING, tx=RING"):
        ShmChannel()


def test_a_stale_ring_of_a_dead_consumer_is_replaced(ring):
    path = ring_path(ring)
    with open(path, "wb") as stale:
        stale.write(b"left over by a crash")
    with ShmChannel(rx=ring, ring_bytes=4096) as rx, ShmChannel(tx=ring) as tx:
        assert tx.send(frames_batch(1)) == 1 and rx.receive(FrameBatch(2, 2048)) == 1


def test_frames_larger_than_the_slot_are_dropped_and_counted(ring):
    with ShmChannel(rx=ring, ring_bytes=8192) as rx, ShmChannel(tx=ring) as tx:
        batch = FrameBatch(2, 2048)
        batch.append(make_frame(1, 200))  # 280 bytes
        batch.append(make_frame(1, 1))
        assert tx.send(batch) == 2
        small = FrameBatch(2, 128)
        assert rx.receive(small) == 1 and rx.stats.drop_reasons == {"oversized": 1}
        rx.close()
        rx.close()


def _receive_in_thread(consumer, timeout_s):
    """Start ``consumer.receive`` (one frame at most) on a thread; its result list."""
    got = []

    def run():
        batch = FrameBatch(1, 256)
        got.append(consumer.receive(batch, int(timeout_s * 1e9)))

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


def test_a_consumer_blocked_on_the_doorbell_wakes_for_every_frame_and_none_is_missed(ring):
    # a lost wakeup would hold a receive for its whole 20 s and return 0: the test fails
    consumer = ShmChannel(rx=ring)
    producer = ShmChannel(tx=ring)
    frame = frames_batch(1)
    parked = producer._tx.words[PARKED_OFFSET // 4 : PARKED_OFFSET // 4 + 1]
    rng = random.Random(7)
    try:
        for i in range(400):
            thread, got = _receive_in_thread(consumer, 20.0)
            if i < 200:  # the consumer is asleep on the bell when the frame comes
                deadline = time.monotonic() + 20
                while not parked[0] and time.monotonic() < deadline:
                    time.sleep(0)
                assert parked[0], "the consumer never parked"
            else:  # the frame races the consumer's spin and its park
                end = time.perf_counter_ns() + rng.randrange(0, 60_000)
                while time.perf_counter_ns() < end:
                    pass
            assert producer.send(frame) == 1
            thread.join(30)
            assert got == [1], (i, got)
        assert consumer.bell_wakes >= 200 and producer.bells_rung >= 200
    finally:
        producer.close()
        consumer.close()


def test_a_ring_gives_its_doorbell_to_whoever_blocks_on_it(ring):
    consumer = ShmChannel(rx=ring)
    producer = ShmChannel(tx=ring)
    try:
        fds = consumer.wait_fds()  # armed: a frame published now rings it
        assert fds is not None and len(fds) == 1 and producer.wait_fds() is None
        assert producer.send(frames_batch(1, key=2)) == 1
        assert producer.bells_rung == 1
        batch = FrameBatch(4, 256)
        assert consumer.receive(batch) == 1
        # not armed: the producer writes to the ring alone (no system call)
        assert producer.send(frames_batch(1, key=3)) == 1
        assert producer.bells_rung == 1 and consumer.receive(batch) == 1
        # armed with a record already there: it rings itself, so a poll ends at once
        assert producer.send(frames_batch(1, key=4)) == 1
        assert consumer.bells_rung == 0
        consumer.wait_fds()
        assert consumer.bells_rung == 1 and consumer.receive(batch) == 1
    finally:
        producer.close()
        consumer.close()


def test_one_end_sends_on_one_thread_while_it_receives_on_another(ring):
    # a client publishes from the application's thread while its own thread receives: the
    # send and receive kernels release the interpreter, so they must not share scratch state
    back = f"{ring}-back"
    count = 3_000
    with ShmChannel(rx=ring, ring_bytes=1 << 16) as far, ShmChannel(rx=back) as near:
        near.connect(ring)
        far.connect(back)
        received: dict[str, list[bytes]] = {"near": [], "far": []}
        errors: list[BaseException] = []

        def send(channel, key):
            try:
                for i in range(count):
                    one = FrameBatch(1, 512)
                    one.append(make_frame(key, i))
                    deadline = time.monotonic() + 20
                    while channel.send(one) != 1:  # a full ring: the reader catches up
                        assert time.monotonic() < deadline, "the ring stayed full"
            except BaseException as exc:  # reported below
                errors.append(exc)

        def receive(channel, name):
            got = FrameBatch(64, 512)
            deadline = time.monotonic() + 30
            try:
                while len(received[name]) < count and time.monotonic() < deadline:
                    for i in range(channel.receive(got, 1_000_000)):
                        received[name].append(without_ts(bytes(got.frame(i))))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=send, args=(near, 7)),      # near: sends ...
                   threading.Thread(target=receive, args=(near, "near")),  # ... and receives
                   threading.Thread(target=send, args=(far, 9)),
                   threading.Thread(target=receive, args=(far, "far"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert received["far"] == [without_ts(make_frame(7, i)) for i in range(count)]
        assert received["near"] == [without_ts(make_frame(9, i)) for i in range(count)]
