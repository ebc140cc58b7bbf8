"""UDP unicast: batches between processes, replies by peer id, hostile datagrams, clear errors."""

import errno
import socket

import numpy as np
import pytest

from channels.base import EACH_SLOT, FrameBatch, decode_batch
from channels.errors import ChannelDeviceError, ChannelUserError
from channels.udp import UdpChannel, address_of_peer, peer_id_of
from datapath.protocol.batch import new_message_batch
from datapath.protocol.codec import decode_frame
from datapath.protocol.errors import MalformedReason, ProtocolError
from tests.channels.helpers import frames_batch
from tests.channels.peer import make_frame, without_ts


def test_batches_cross_between_two_processes_with_every_byte_intact(peers):
    receiver = peers("recv", "udp", "--count", "600")
    port = receiver.wait_ready()
    sender = peers("send", "udp", "--port", str(port), "--count", "600", "--key", "4",
                   "--pause-s", "0.002")
    assert sender.result()["sent"] == 600
    got = receiver.result()
    assert got["frames"] == 600 and got["content_ok"] and got["in_order"]
    assert got["by_key"] == {"4": 600} and got["malformed"] == 0
    assert got["latency_count"] == 600


def test_receive_records_the_source_and_a_reply_goes_back_by_peer_id():
    with UdpChannel() as a, UdpChannel() as b:
        batch = frames_batch(5)
        assert a.send(batch, dest=b.local_address) == 5
        got = FrameBatch(8, 2048)
        assert b.receive(got, timeout_ns=2_000_000_000) == 5
        assert set(got.peer_ids[:5].tolist()) == {peer_id_of(*a.local_address)}
        assert b.peer_address(int(got.peer_ids[0])) == a.local_address
        assert (got.recv_ts_ns[:5] > 0).all()
        assert b.send(got, dest=EACH_SLOT) == 5
        back = FrameBatch(8, 2048)
        assert a.receive(back, timeout_ns=2_000_000_000) == 5
        assert [without_ts(bytes(back.frame(i))) for i in range(5)] == \
            [without_ts(make_frame(1, i)) for i in range(5)]
        assert b.stats.frames_in == 5 and b.stats.frames_out == 5
        assert b.stats.bytes_in == int(batch.lengths[:5].sum())


def test_raw_buffers_send_without_a_batch_object():
    with UdpChannel() as a, UdpChannel(dest=None) as b:
        frames = [make_frame(2, i) for i in range(3)]
        buf = np.frombuffer(b"".join(frames), np.uint8).copy()
        lengths = np.array([len(f) for f in frames])
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        assert a.send((buf, offsets, lengths, 3), dest=b.local_address) == 3
        got = FrameBatch(4, 2048)
        assert b.receive(got, timeout_ns=2_000_000_000) == 3
        assert decode_frame(bytes(got.frame(2))).header.source_session == 2


def reference_reason(data: bytes) -> int:
    try:
        decode_frame(data)
        return 0
    except ProtocolError as exc:
        return int(exc.reason)


def test_hostile_datagrams_are_counted_as_the_decoder_says_and_the_channel_goes_on():
    good = make_frame(1, 1)
    hostile = [b"", b"garbage!" * 3, b"\x00" * 64, good[:-8], good + bytes(8),
               b"TW" + good[2:3] + b"\x63" + good[4:], good[:8] + (10**6).to_bytes(4, "big")
               + good[12:], bytes(70_000 - 70_000 % 8)[:65_000]]
    with UdpChannel(stamp_send_ts=False) as ch, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        for data in hostile:
            raw.sendto(data, ch.local_address)
        raw.sendto(good, ch.local_address)
        batch = FrameBatch(16, 2048)  # the 65,000-byte datagram does not fit a slot
        status, types = np.zeros(16, np.uint8), np.zeros(16, np.uint8)
        n = 0
        while n < len(hostile):
            got = ch.receive(batch, timeout_ns=2_000_000_000)
            assert got
            result = decode_batch(batch, new_message_batch(16), status, types, ch.stats)
            n += got
        assert result.messages == 1
        expected = np.zeros_like(ch.stats.malformed_by_reason)
        for data in hostile[:-1]:
            expected[reference_reason(data)] += 1
        expected[0] = 0
        assert ch.stats.malformed_by_reason.tolist() == expected.tolist()
        assert ch.stats.malformed == len(hostile) - 1
        assert ch.stats.drop_reasons == {"oversized": 1}
        assert expected[MalformedReason.LENGTH_MISMATCH] >= 1


def test_a_flood_of_garbage_does_not_stop_the_channel():
    with UdpChannel() as ch, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        for i in range(3000):
            raw.sendto(bytes([i & 0xFF]) * (8 + i % 300), ch.local_address)
        raw.sendto(make_frame(3, 9), ch.local_address)
        batch = FrameBatch(64, 2048)
        status, types = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
        valid = 0
        while ch.receive(batch, timeout_ns=500_000_000):
            result = decode_batch(batch, new_message_batch(64), status, types, ch.stats)
            valid += result.messages
        assert valid == 1
        assert ch.stats.malformed == ch.stats.frames_in - 1 > 0


def test_receive_with_no_wait_returns_at_once_with_nothing():
    with UdpChannel() as ch:
        batch = FrameBatch(4, 256)
        batch.count = 3
        assert ch.receive(batch) == 0 and batch.count == 0


def test_port_in_use_is_a_device_error_naming_channels():
    with UdpChannel() as first:
        with pytest.raises(ChannelDeviceError, match="^channels: binding UDP .*EADDRINUSE") \
                as info:
            UdpChannel(bind=first.local_address)
    assert info.value.errno == errno.EADDRINUSE


@pytest.mark.parametrize("bind", [("localhost", 0), ("300.1.1.1", 0), ("127.0.0.1", 70000),
                                  "127.0.0.1:80"])
def test_bad_addresses_are_user_errors(bind):
    with pytest.raises(ChannelUserError, match="^channels: "):
        UdpChannel(bind=bind)


def test_an_address_not_on_this_host_cannot_be_bound():
    with pytest.raises(ChannelDeviceError, match="EADDRNOTAVAIL"):
        UdpChannel(bind=("10.255.255.1", 0))


def test_send_without_a_destination_is_refused():
    with UdpChannel() as ch, pytest.raises(ChannelUserError, match="destination"):
        ch.send(frames_batch(1))


def test_peer_ids_round_trip():
    assert address_of_peer(peer_id_of("127.0.0.9", 47470)) == ("127.0.0.9", 47470)
