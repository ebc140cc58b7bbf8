"""TCP: frames delimited by frame_len across processes, partial reads, hostile streams."""

import errno
import socket
import time

import pytest

from channels.base import EACH_SLOT, FrameBatch
from channels.errors import ChannelDeviceError, ChannelUserError
from channels.tcp import TcpChannel
from tests.channels.helpers import frames_batch
from tests.channels.peer import make_frame, without_ts


def receive_until(channel, batch, want, limit_s=10.0):
    """Collected frames (bytes, peer id) until ``want`` arrived or ``limit_s`` passed."""
    out = []
    deadline = time.monotonic() + limit_s
    while len(out) < want and time.monotonic() < deadline:
        n = channel.receive(batch, timeout_ns=50_000_000)
        out += [(bytes(batch.frame(i)), int(batch.peer_ids[i])) for i in range(n)]
    return out


def test_frames_cross_between_two_processes(peers):
    receiver = peers("recv", "tcp", "--count", "1500")
    port = receiver.wait_ready()
    sender = peers("send", "tcp", "--port", str(port), "--count", "1500", "--key", "7")
    assert sender.result()["sent"] == 1500
    got = receiver.result()
    assert got["frames"] == 1500 and got["content_ok"] and got["in_order"]


def test_a_frame_dribbled_byte_by_byte_arrives_once_and_whole():
    frame = make_frame(2, 150)
    with TcpChannel(listen=("127.0.0.1", 0)) as srv, \
            socket.create_connection(srv.local_address) as raw:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        batch = FrameBatch(4, 2048)
        got = []
        for i, byte in enumerate(frame + frame[:5]):
            raw.send(bytes([byte]))
            if i % 16 == 0 or i == len(frame) - 2:
                srv.receive(batch, timeout_ns=1_000_000)
                got += [bytes(batch.frame(k)) for k in range(batch.count)]
                if i < len(frame) - 1:
                    assert got == [], "nothing may come out before the last byte"
        got += [f for f, _ in receive_until(srv, batch, 1 - len(got))]
        assert got == [frame]
        raw.send(frame[5:])
        assert [f for f, _ in receive_until(srv, batch, 1)] == [frame]


def test_replies_reach_each_client_by_connection_id():
    with TcpChannel(listen=("127.0.0.1", 0)) as srv, \
            TcpChannel(connect=srv.local_address) as a, \
            TcpChannel(connect=srv.local_address) as b:
        assert a.send(frames_batch(3, key=1)) == 3 and b.send(frames_batch(2, key=2)) == 2
        batch = FrameBatch(8, 2048)
        got = receive_until(srv, batch, 5)
        by_peer = {}
        for frame, peer in got:
            by_peer.setdefault(int.from_bytes(frame[12:16], "big"), set()).add(peer)
        assert len(by_peer[1]) == len(by_peer[2]) == 1 and by_peer[1] != by_peer[2]
        assert sorted(srv.peers()) == sorted(by_peer[1] | by_peer[2])
        replies = FrameBatch(2, 2048)
        replies.append(make_frame(1, 77), peer_id=next(iter(by_peer[1])))
        replies.append(make_frame(2, 88), peer_id=next(iter(by_peer[2])))
        assert srv.send(replies, dest=EACH_SLOT) == 2
        for client, want in ((a, make_frame(1, 77)), (b, make_frame(2, 88))):
            (frame, _), = receive_until(client, FrameBatch(2, 2048), 1)
            assert without_ts(frame) == without_ts(want)
        with pytest.raises(ChannelUserError, match="2 connections"):
            srv.send(frames_batch(1))


def test_a_garbage_stream_closes_only_its_connection():
    with TcpChannel(listen=("127.0.0.1", 0)) as srv, \
            TcpChannel(connect=srv.local_address) as good, \
            socket.create_connection(srv.local_address) as bad:
        good.send(frames_batch(1))
        batch = FrameBatch(4, 2048)
        assert len(receive_until(srv, batch, 1)) == 1
        assert len(srv.peers()) == 2
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(32))
        receive_until(srv, batch, 1, limit_s=0.5)
        assert srv.stats.drop_reasons == {"bad_stream": 1} and len(srv.peers()) == 1
        assert bad.recv(10) == b""  # the server closed it
        good.send(frames_batch(2))
        assert len(receive_until(srv, batch, 2)) == 2


def test_an_impossible_frame_len_fails_closed_and_a_cut_frame_is_counted():
    frame = make_frame(1, 1)
    huge = frame[:8] + (1 << 30).to_bytes(4, "big") + frame[12:]
    with TcpChannel(listen=("127.0.0.1", 0)) as srv:
        batch = FrameBatch(4, 2048)
        with socket.create_connection(srv.local_address) as raw:
            raw.sendall(huge)
            receive_until(srv, batch, 1, limit_s=0.5)
        with socket.create_connection(srv.local_address) as raw:
            raw.sendall(frame[:50])
            receive_until(srv, batch, 1, limit_s=0.3)
        receive_until(srv, batch, 1, limit_s=0.3)
        assert srv.stats.drop_reasons == {"bad_stream": 1, "truncated_stream": 1}
        assert srv.peers() == []


def test_a_client_that_does_not_read_backpressures_the_sender():
    with TcpChannel(listen=("127.0.0.1", 0)) as srv, \
            TcpChannel(connect=srv.local_address) as client:
        client.send(frames_batch(1))
        assert len(receive_until(srv, FrameBatch(2, 2048), 1)) == 1
        big = frames_batch(64)
        for _ in range(5000):  # the socket and the channel's buffer fill up, then it refuses
            taken = srv.send(big)
            if taken < 64:
                break
        assert taken < 64 and srv.stats.backpressure > 0
        assert srv.pending_bytes() > 0


def test_clear_errors_for_refused_connections_ports_in_use_and_bad_arguments():
    with TcpChannel(listen=("127.0.0.1", 0)) as srv:
        port = srv.local_address[1]
        with pytest.raises(ChannelDeviceError, match="EADDRINUSE") as info:
            TcpChannel(listen=("127.0.0.1", port))
        assert info.value.errno == errno.EADDRINUSE
    with pytest.raises(ChannelDeviceError, match="ECONNREFUSED.*start the peer"):
        TcpChannel(connect=("127.0.0.1", port))
    with pytest.raises(ChannelUserError, match="exactly one"):
        TcpChannel()
    with pytest.raises(ChannelUserError, match="IPv4"):
        TcpChannel(connect=("example.org", 80))


def test_close_twice_is_safe():
    srv = TcpChannel(listen=("127.0.0.1", 0))
    client = TcpChannel(connect=srv.local_address)
    client.close()
    client.close()
    srv.close()
    srv.close()
    assert srv.closed and client.closed
