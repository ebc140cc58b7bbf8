"""The RDMA channel's control stream: what a peer says on the set-up TCP connection once both
ends are READY (``BYE <packets>``, then end of stream), parsed as TCP delivers it.

No RDMA device is needed: this is the byte stream ``channels.rdma._PeerControl`` reads. The
last test runs it over a real loopback TCP connection, cut the way a slow sender cuts it.
"""

import errno
import socket
import time

import pytest

from channels.rdma import RdmaDeviceError, _PeerControl

GOODBYE = b"BYE 51234\n"


def _fed(*chunks: bytes) -> _PeerControl:
    control = _PeerControl(("192.168.200.2", 40000))
    for chunk in chunks:
        control.feed(chunk)
    return control


def test_a_goodbye_says_how_many_packets_the_peer_sent():
    control = _fed(GOODBYE)
    assert control.said_bye and control.gone and not control.ended
    assert control.packets_sent == 51_234


@pytest.mark.parametrize("cut", range(1, len(GOODBYE)))
def test_a_goodbye_cut_in_two_anywhere_is_still_a_goodbye(cut):
    first = _fed(GOODBYE[:cut])
    assert not first.gone  # half a goodbye is not one yet
    first.feed(GOODBYE[cut:])
    assert first.said_bye and first.packets_sent == 51_234


def test_a_goodbye_that_comes_one_byte_at_a_time_is_still_a_goodbye():
    control = _fed(*(GOODBYE[i:i + 1] for i in range(len(GOODBYE))))
    assert control.said_bye and control.packets_sent == 51_234


def test_end_of_stream_after_a_goodbye_keeps_the_goodbye():
    control = _fed(GOODBYE, b"")
    assert control.said_bye and control.ended and control.packets_sent == 51_234


def test_end_of_stream_without_a_goodbye_is_a_peer_gone_without_closing():
    control = _fed(b"")
    assert control.gone and control.ended and not control.said_bye
    assert control.packets_sent == 0


def test_end_of_stream_in_the_middle_of_a_goodbye_is_no_goodbye():
    control = _fed(b"BYE 12", b"")
    assert control.ended and not control.said_bye


@pytest.mark.parametrize("chunks", [
    (b"HELLO\n",),
    (b"BYE\n",),  # set-up version 1's goodbye, without the count
    (b"BYE twelve\n",),
    (b"BYE 5\nBYE 5\n",),
    (GOODBYE, b"x"),
    (b"B" * 100,),  # a line that never ends is not buffered for ever
], ids=["other message", "no count", "count not a number", "two goodbyes",
        "bytes after the goodbye", "endless line"])
def test_anything_but_one_goodbye_is_a_protocol_error_naming_what_belongs(chunks):
    with pytest.raises(RdmaDeviceError, match=r"rdma: the peer at .*40000.* sent .*"
                                              r"only 'BYE <packets>' belongs") as raised:
        _fed(*chunks)
    assert raised.value.errno == errno.EPROTO


def test_a_goodbye_cut_by_a_real_tcp_connection_is_read_as_the_channel_reads_it():
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
    with sender, receiver:
        sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        receiver.setblocking(False)
        control = _PeerControl(receiver.getpeername())
        pieces = [GOODBYE[:2], GOODBYE[2:7], GOODBYE[7:]]
        deadline = time.monotonic() + 10
        while not control.ended:
            if pieces:
                sender.sendall(pieces.pop(0))
                if not pieces:
                    sender.shutdown(socket.SHUT_WR)
            try:  # what RdmaChannel._read_control does: every recv's bytes, as they come
                control.feed(receiver.recv(4096))
            except BlockingIOError:
                time.sleep(0.01)
            assert time.monotonic() < deadline, "the goodbye never came through"
        assert control.said_bye and control.packets_sent == 51_234
