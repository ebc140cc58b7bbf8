"""UDP unicast: batches between processes, replies by peer id, hostile datagrams, clear errors."""

import errno
import json
import logging
import socket
import subprocess
import sys
import uuid

import numpy as np
import pytest

from channels.base import EACH_SLOT, FrameBatch, decode_batch
from channels.errors import ChannelDeviceError, ChannelUserError
from channels.multicast import MulticastChannel
from channels.udp import (
    UDP_RCVBUF_BYTES,
    UdpChannel,
    address_of_peer,
    peer_id_of,
    rcvbuf_granted,
)
from datapath.protocol.batch import new_message_batch
from datapath.protocol.codec import decode_frame
from datapath.protocol.errors import MalformedReason, ProtocolError
from tests.channels.helpers import ROOT, frames_batch
from tests.channels.peer import make_frame, without_ts
from tests.netns import Host, requires_netns, rmem_max_at_least


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


FLOOD = 3_000
FLOOD_RCVBUF = UDP_RCVBUF_BYTES
"""The flood takes ~3 MB of socket memory at once (~1 KB per small datagram); the channel's
default ask (4 MiB, which the kernel doubles) holds it, Debian's default limit (~208 KiB)
does not."""
FLOOD_RUN = """
import json, socket, sys, time
import numpy as np
from channels.base import FrameBatch, decode_batch
from channels.udp import UdpChannel, rcvbuf_granted
from datapath.protocol.batch import new_message_batch
from tests.channels.peer import make_frame

with UdpChannel() as ch, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
    for i in range(int(sys.argv[1])):
        raw.sendto(bytes([i & 0xFF]) * (8 + i % 300), ch.local_address)
    raw.sendto(make_frame(3, 9), ch.local_address)  # the one valid frame, last
    batch = FrameBatch(64, 2048)
    status, types = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    valid, deadline = 0, time.monotonic() + 20
    while not valid and time.monotonic() < deadline:
        if ch.receive(batch, timeout_ns=100_000_000):
            valid += decode_batch(batch, new_message_batch(64), status, types,
                                  ch.stats).messages
    print(json.dumps({"valid": valid, "malformed": ch.stats.malformed,
                      "frames_in": ch.stats.frames_in, "rcvbuf": rcvbuf_granted(ch._sock)}))
"""


@requires_netns
def test_a_flood_of_garbage_does_not_stop_the_channel():
    # the whole flood waits in the socket at once: it runs in a namespace of its own whose
    # receive buffer limit is raised for it where the kernel allows (else it says why not)
    host = Host(f"twflood{uuid.uuid4().hex[:6]}")
    try:
        why = rmem_max_at_least(host, FLOOD_RCVBUF)
        if why is not None:
            pytest.skip(f"the garbage flood {why}")
        done = subprocess.run(["ip", "netns", "exec", host.name, sys.executable, "-c",
                               FLOOD_RUN, str(FLOOD)], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    finally:
        host.close()
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["rcvbuf"] >= FLOOD_RCVBUF
    # the valid frame came last, after every piece of garbage (the buffer held them all)
    assert got == {**got, "valid": 1, "malformed": FLOOD, "frames_in": FLOOD + 1}


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


def _rmem_max() -> int:
    with open("/proc/sys/net/core/rmem_max") as f:
        return int(f.read())


def test_a_receive_buffer_the_kernel_capped_is_logged_with_what_to_do(caplog):
    limit = _rmem_max()
    if limit >= 1 << 30:
        pytest.skip(f"net.core.rmem_max is {limit}: no larger receive buffer to ask for")
    asked = limit + 65_536
    with caplog.at_level(logging.WARNING, logger="topicwire.channels"):
        with UdpChannel(rcvbuf_bytes=asked) as ch:
            name, got = ch.name, rcvbuf_granted(ch._sock)
    assert got == limit  # the kernel's cap
    (record,) = [r for r in caplog.records if r.name == "topicwire.channels"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith(f"channels: {name}: ") and name.startswith("udp:127.0.0.1:")
    assert f"capped the socket receive buffer at {got} bytes (asked for {asked}" in message
    assert f"sysctl -w net.core.rmem_max={asked}" in message


def test_a_multicast_channel_says_so_too(caplog):
    asked = _rmem_max() + 65_536
    with caplog.at_level(logging.WARNING, logger="topicwire.channels"):
        MulticastChannel("239.77.0.9", 47030, interface="127.0.0.1", join=False,
                         rcvbuf_bytes=asked).close()
    assert [r.getMessage().split(": ")[1] for r in caplog.records] == [
        "mcast:239.77.0.9:47030@127.0.0.1"]


def test_a_receive_buffer_within_the_limit_is_not_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="topicwire.channels"):
        UdpChannel(rcvbuf_bytes=min(_rmem_max(), 65_536)).close()
    assert caplog.records == []
