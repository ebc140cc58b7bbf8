"""The RDMA channel on a real RDMA device (soft-RoCE rxe0 <-> rxe1 in the VM harness).

Other processes are forked (multiprocessing's fork context) rather than started anew: under
emulation a fresh Python spends half a minute importing numpy and numba.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import time

import pytest

from channels.base import FrameBatch
from channels.errors import ChannelClosedError, ChannelUserError
from channels.rdma import (
    RdmaChannel,
    RdmaGidError,
    RdmaListener,
    RdmaNoDeviceError,
    RdmaPeerGoneError,
    RdmaPortDownError,
    RdmaReceiverNotReadyError,
)
from hwtests.rdma.base import PAIR_ADDRESSES, RdmaTestCase
from hwtests.rdma.frames import Frames, InOrderChecker

MIXED_MESSAGES = 100_000
"""Messages of the in-order test: 32 B to 2 KiB, log-uniform, and every 500th 8-64 KiB (cut
into segments); ~55 MB in all."""
SEND_CHUNK = 256
"""Frames offered per send call."""
RECEIVE_BATCH = 256
WAIT_NS = 60_000_000_000
"""Longest wait for anything the tests expect to happen (the emulated guest is slow)."""
PEER_MESSAGES = 50_000
REPORT_EVERY = 1_024
"""The sending child reports its count once per this many frames sent: ~50 reports, which
a pipe holds unread (one holds ~270 small messages; a report per send call while pushed back
filled it, and the child then hung in ``report.send`` instead of closing)."""
QUEUED_MESSAGES = 3_000
"""Frames of the queue-pair-in-error test: 47 packets (one per send call of 64), fewer than
the 64 the sender may send with no credits back, so it can finish before anything is read."""


def _stream(near: RdmaChannel, far: RdmaChannel, frames: Frames,
            rx: FrameBatch | None = None) -> InOrderChecker:
    """Send every frame from ``near`` while receiving on ``far`` in the same loop; check all."""
    rx = rx or FrameBatch(RECEIVE_BATCH, 65_504)
    checker = InOrderChecker(frames)
    sent = 0
    deadline = time.monotonic_ns() + 10 * WAIT_NS
    while checker.next < frames.count:
        if sent < frames.count:
            sent += near.send(frames.arrays(sent, SEND_CHUNK))
        if far.receive(rx, 0):
            checker.check(rx)
        assert time.monotonic_ns() < deadline, f"stuck at {checker.next} of {frames.count}"
    return checker


class TestRdmaChannel(RdmaTestCase):
    def test_100000_messages_of_mixed_sizes_arrive_intact_and_in_order(self):
        frames = Frames(MIXED_MESSAGES, seed=5, big_every=500)
        far, near = self.pair()
        with far, near:
            started = time.monotonic()
            _stream(near, far, frames)
            elapsed = time.monotonic() - started
            tx, rx = near.stats.snapshot(), far.stats.snapshot()
            assert tx["frames_out"] == rx["frames_in"] == MIXED_MESSAGES
            assert tx["bytes_out"] == rx["bytes_in"] == frames.total_bytes
            assert rx["drops"] == rx["errors"] == tx["drops"] == tx["errors"] == 0
            # every frame was stamped and timed (a guest's clock may step back now and then:
            # those few transits come out negative and are counted apart)
            assert rx["latency_count"] + rx["latency_out_of_range"] == MIXED_MESSAGES
            assert rx["latency_count"] > MIXED_MESSAGES // 2
            packets = near._packets_sent
        # many messages share one RDMA send; the large ones took several
        assert packets < MIXED_MESSAGES / 20
        print(f"\n{MIXED_MESSAGES} messages, {frames.total_bytes / 1e6:.0f} MB over "
              f"{self.ends.devices}: {elapsed:.1f} s, {MIXED_MESSAGES / elapsed:.0f} msg/s, "
              f"{packets} RDMA sends, one-way p50 {rx['latency_p50_ns'] / 1e3:.0f} us "
              f"({rx['latency_out_of_range']} transits out of range)")

    def test_frames_larger_than_one_packet_are_cut_and_put_back_together(self):
        from channels._rdma_layout import packets_for_frame

        packet = 4_096
        sizes = [65_504, 4_096, 4_073, 4_072, 4_071, 40, 12_000, 65_504, 32]
        frames = Frames(len(sizes), seed=6, exact=sizes)
        far, near = self.pair(packet_bytes=packet)
        with far, near:
            checker = _stream(near, far, frames, FrameBatch(4, 65_504))
            assert checker.next == len(sizes)
            assert far.stats.drops == far.stats.errors == 0
            # each large frame took several RDMA sends
            assert near._packets_sent >= sum(packets_for_frame(n, packet) for n in sizes
                                             if n > packet)

    def test_frames_flow_both_ways_at_once(self):
        a_frames, b_frames = Frames(3_000, seed=1), Frames(3_000, seed=2, big_every=300)
        far, near = self.pair()
        with far, near:
            a_rx, b_rx = FrameBatch(64, 65_504), FrameBatch(64, 65_504)
            a_check, b_check = InOrderChecker(b_frames), InOrderChecker(a_frames)
            a_sent = b_sent = 0
            deadline = time.monotonic_ns() + WAIT_NS
            while a_check.next < 3_000 or b_check.next < 3_000:
                a_sent += far.send(a_frames.arrays(a_sent, 64)) if a_sent < 3_000 else 0
                b_sent += near.send(b_frames.arrays(b_sent, 64)) if b_sent < 3_000 else 0
                if far.receive(a_rx):
                    a_check.check(a_rx)
                if near.receive(b_rx):
                    b_check.check(b_rx)
                assert time.monotonic_ns() < deadline

    def test_a_receiver_that_stops_taking_packets_pushes_back_and_loses_nothing(self):
        frames = Frames(20_000, seed=3, max_bytes=4_096)
        far, near = self.pair(recv_packets=16, send_packets=16)
        with far, near:
            sent = 0
            refused = 0
            deadline = time.monotonic_ns() + WAIT_NS
            while refused < 100:  # the receiver does not poll: credits run out
                taken = near.send(frames.arrays(sent, SEND_CHUNK))
                sent += taken
                refused += taken == 0
                assert time.monotonic_ns() < deadline
            # never more packets in flight than the receiver has receives posted
            assert near._packets_sent == 16
            assert near.stats.backpressure > 0 and near.stats.errors == 0
            assert 0 < sent < frames.count
            checker = InOrderChecker(frames)
            rx = FrameBatch(RECEIVE_BATCH, 65_504)
            while checker.next < frames.count:  # now it drains, and the sender goes on
                if sent < frames.count:
                    sent += near.send(frames.arrays(sent, SEND_CHUNK))
                if far.receive(rx, 0):
                    checker.check(rx)
                assert time.monotonic_ns() < deadline + WAIT_NS
            assert far.stats.drops == 0 and near.stats.errors == 0

    def test_a_peer_that_posts_no_receives_is_reported_as_receiver_not_ready(self):
        from channels import _rdma_verbs as verbs
        from channels import rdma

        with RdmaListener((self.ends.listen, 0)) as listener:
            address = listener.address

            def rogue() -> None:  # says it has 64 receives posted, posts none
                where = verbs.choose_port_gid(self.ends.listen)
                ep = verbs.Endpoint(where, packet_bytes=rdma.RDMA_PACKET_BYTES,
                                    send_packets=8, recv_packets=64)
                conn, _ = listener._sock.accept()
                hello = {"version": rdma._HELLO_VERSION, **ep.info().as_dict()}
                conn.sendall(json.dumps(hello).encode() + b"\n")
                peer = verbs.QpInfo(**{k: v for k, v in json.loads(
                    conn.makefile("rb").readline()).items() if k != "version"})
                ep.connect(peer, verbs.QpTimers(rdma.RDMA_ACK_TIMEOUT_EXP,
                                                rdma.RDMA_RETRY_COUNT, rdma.RDMA_RNR_RETRY, 1))
                conn.sendall(b"READY\n")
                hold.append((ep, conn))

            hold: list = []
            import threading

            thread = threading.Thread(target=rogue)
            thread.start()
            channel = RdmaChannel(connect=address, bind=self.ends.connect_from)
            thread.join()
        ep, conn = hold[0]
        try:
            frames = Frames(10, seed=4)
            with channel, pytest.raises(RdmaReceiverNotReadyError,
                                        match="no receive posted for our packets"):
                deadline = time.monotonic_ns() + WAIT_NS
                while time.monotonic_ns() < deadline:
                    channel.send(frames.arrays(0, 10))
                    time.sleep(0.01)
            assert channel.stats.error_reasons.get("send_ibv_wc_rnr_retry_exc_err", 0) == 1
        finally:
            conn.close()
            ep.close()

    def test_close_is_safe_twice_and_a_closed_channel_says_so(self):
        far, near = self.pair()
        with far:
            near.close()
            near.close()
            with pytest.raises(ChannelClosedError):
                near.send(Frames(1, seed=1).arrays(0, 1))
            with pytest.raises(ChannelClosedError):
                near.receive(FrameBatch(4, 64))
            with pytest.raises(RdmaPeerGoneError, match="closed the channel") as gone:
                far.receive(FrameBatch(4, 64), WAIT_NS)
            assert gone.value.orderly
        far.close()

    def test_an_rdma_channel_has_one_peer(self):
        far, near = self.pair()
        with far, near:
            batch = FrameBatch(4, 64)
            batch.append(bytes(40))
            assert near.send(batch, dest=near.peer_id) == 1
            with pytest.raises(ChannelUserError, match="one peer"):
                near.send(batch, dest=near.peer_id + 1)
            with pytest.raises(ChannelUserError, match="one peer"):
                near.send(batch, dest=("127.0.0.1", 1))


# --- the peer goes away ----------------------------------------------------------------------

def _peer_sender(address: tuple, bind: str, mode: str, messages: int, report: object) -> None:
    """Child process: connect, send ``messages`` frames; report how many went (each time
    another REPORT_EVERY went, and at the end). ``close``: then close the channel; ``hang``
    (sending paced): then wait to be killed."""
    frames = Frames(messages, seed=9, max_bytes=512)
    with RdmaChannel(connect=address, bind=bind) as channel:
        sent = reported = 0
        while sent < messages:
            sent += channel.send(frames.arrays(sent, 64))
            if sent // REPORT_EVERY > reported // REPORT_EVERY:
                report.send(sent)
                reported = sent
            if mode == "hang":
                time.sleep(0.005)  # slow enough to be killed mid-stream
        report.send(sent)
        if mode == "hang":
            time.sleep(3_600)


def _peer_receiver(address: tuple, bind: str, report: object) -> None:
    """Child process: connect, receive until killed."""
    with RdmaChannel(connect=address, bind=bind) as channel:
        batch = FrameBatch(64, 2_048)
        report.send("ready")
        while True:
            channel.receive(batch, 1_000_000)


def _warm_kernels() -> None:
    """Load the kernels a forked child sends with here, before forking: each child inherits
    them instead of loading them itself (~40 s under emulation, more on a busy host, inside
    the test's time limit when the PeerGone tests run first)."""
    from channels import base, rdma, stats

    base.warm_up()
    rdma.warm_up()
    stats.warm_up()


def _last_report(report: object) -> int:
    """The last count the sending child reported so far (0 before its first)."""
    sent = 0
    try:
        while report.poll():
            sent = report.recv()
    except EOFError:  # the last report was read: the child's end is closed
        pass
    return sent


class TestPeerGone(RdmaTestCase):
    def _start(self, target, *args):
        _warm_kernels()
        ctx = multiprocessing.get_context("fork")
        theirs, ours = ctx.Pipe()
        listener = RdmaListener((self.ends.listen, 0))
        proc = ctx.Process(target=target, args=(listener.address, self.ends.connect_from,
                                                *args, theirs), daemon=True)
        proc.start()
        theirs.close()  # the child's end: EOF here once the child is gone
        try:
            channel = listener.accept(timeout_ns=WAIT_NS)
        finally:
            listener.close()
        return proc, ours, channel

    def test_a_peer_killed_mid_stream_is_reported_after_every_frame_that_arrived(self):
        proc, report, channel = self._start(_peer_sender, "hang", PEER_MESSAGES)
        frames = Frames(PEER_MESSAGES, seed=9, max_bytes=512)
        checker = InOrderChecker(frames)
        batch = FrameBatch(RECEIVE_BATCH, 2_048)
        try:
            with channel, pytest.raises(RdmaPeerGoneError, match="went away without closing") \
                    as gone:
                deadline = time.monotonic_ns() + WAIT_NS
                while True:
                    if channel.receive(batch, 1_000_000):
                        checker.check(batch)
                    if checker.next >= 2_000 and proc.is_alive():
                        os.kill(proc.pid, signal.SIGKILL)
                        proc.join()
                    assert time.monotonic_ns() < deadline
        finally:
            if proc.is_alive():
                proc.kill()
        assert not gone.value.orderly
        sent = _last_report(report)
        assert 2_000 <= checker.next < PEER_MESSAGES  # stopped mid-stream...
        # ...with what it had sent delivered, in order (its last two sends may not have left
        # its queue pair before the kill)
        assert checker.next >= sent - 2 * 64
        assert channel.stats.error_reasons == {"peer_gone": 1}

    def test_a_peer_that_closes_is_reported_in_order_after_all_its_frames(self):
        proc, report, channel = self._start(_peer_sender, "close", PEER_MESSAGES)
        checker = InOrderChecker(Frames(PEER_MESSAGES, seed=9, max_bytes=512))
        batch = FrameBatch(RECEIVE_BATCH, 2_048)
        with channel, pytest.raises(RdmaPeerGoneError, match="closed the channel") as gone:
            deadline = time.monotonic_ns() + 3 * WAIT_NS
            while time.monotonic_ns() < deadline:
                if channel.receive(batch, 1_000_000):
                    checker.check(batch)
            pytest.fail(f"no goodbye: {checker.next} of {PEER_MESSAGES} frames received; the "
                        f"sender reported {_last_report(report)} sent and is "
                        f"{'still running' if proc.is_alive() else 'gone'}")
        proc.join(WAIT_NS / 1e9)
        assert gone.value.orderly and checker.next == PEER_MESSAGES
        assert _last_report(report) == PEER_MESSAGES and proc.exitcode == 0
        assert channel.stats.error_reasons == {"peer_gone": 1}

    def test_a_queue_pair_in_error_after_the_peer_closed_still_reports_the_close(self):
        # The credits that go back after a peer closed reach a queue pair that no longer
        # exists. An RC device retries the write, fails it (RETRY_EXC_ERR) and moves this
        # end's queue pair into error, which flushes every receive still posted. (soft-RoCE
        # in this kernel leaves such a write pending for ever instead, so the test moves the
        # queue pair into error itself.) That is the peer's close, not a second failure.
        proc, report, channel = self._start(_peer_sender, "close", QUEUED_MESSAGES)
        proc.join(WAIT_NS / 1e9)  # it sent everything, said goodbye and went
        assert proc.exitcode == 0 and _last_report(report) == QUEUED_MESSAGES
        checker = InOrderChecker(Frames(QUEUED_MESSAGES, seed=9, max_bytes=512))
        batch = FrameBatch(64, 2_048)
        errored = False
        with channel, pytest.raises(RdmaPeerGoneError, match="closed the channel") as gone:
            deadline = time.monotonic_ns() + WAIT_NS
            while time.monotonic_ns() < deadline:
                if channel.receive(batch, 1_000_000):
                    checker.check(batch)
                if checker.next and not errored:
                    ep = channel._ep
                    ep.qp.modify(ep.v.qp.QPAttr(qp_state=ep.v.enums.IBV_QPS_ERR),
                                 ep.v.enums.IBV_QP_STATE)
                    errored = True
            pytest.fail(f"no goodbye: {checker.next} of {QUEUED_MESSAGES} frames received")
        assert errored and gone.value.orderly and checker.next == QUEUED_MESSAGES
        assert channel.stats.error_reasons == {"peer_gone": 1}

    def test_a_sender_whose_peer_is_killed_gets_peer_gone(self):
        proc, report, channel = self._start(_peer_receiver)
        frames = Frames(1_000, seed=2)
        try:
            assert report.recv() == "ready"
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            with channel, pytest.raises(RdmaPeerGoneError):
                deadline = time.monotonic_ns() + WAIT_NS
                while time.monotonic_ns() < deadline:
                    channel.send(frames.arrays(0, 64))
                    time.sleep(0.001)
        finally:
            if proc.is_alive():
                proc.kill()


# --- set-up errors ---------------------------------------------------------------------------

class TestSetupErrors(RdmaTestCase):
    def _connect_expecting(self, error, match, *, listen=None, **options):
        """Connect with ``options`` on this end; the error must come from this end's set-up."""
        with RdmaListener((listen or self.ends.listen, 0)) as listener:
            with pytest.raises(error, match=match):
                RdmaChannel(connect=listener.address, bind=self.ends.connect_from,
                            connect_timeout_ns=WAIT_NS, **options)

    def test_an_unknown_device_is_named_with_the_ones_that_exist(self):
        self._connect_expecting(RdmaNoDeviceError, "no RDMA device named 'mlx9_9'.*devices:",
                                device="mlx9_9")

    def test_a_gid_index_that_is_empty_or_not_this_address_is_refused(self):
        self._connect_expecting(RdmaGidError, "GID index 200 .* is empty", gid_index=200)
        if self.ends.listen != self.ends.connect_from:
            # index 0 of rxe1 holds its link-local GID, not 192.168.200.2's
            self._connect_expecting(RdmaGidError, "not the GID of", gid_index=0)

    def test_an_address_without_an_rdma_device_is_refused_with_what_exists(self):
        with socket.socket() as s:  # a TCP set-up over loopback: 127.0.0.1 has no GID
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            with pytest.raises(RdmaGidError, match="no RDMA device has a GID for 127.0.0.1"):
                RdmaChannel(connect=s.getsockname(), bind="127.0.0.1")

    def test_a_port_that_is_down_is_reported_with_what_to_do(self):
        if self.ends.connect_from != PAIR_ADDRESSES[1]:
            pytest.skip("needs the provisioned veth pair (it takes one end down)")
        veth = "rdma-v1"
        subprocess.run(["ip", "link", "set", veth, "down"], check=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    self._connect_expecting(RdmaPortDownError, "not active.*ip link set")
                    break
                except (pytest.fail.Exception, RdmaGidError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)  # the port follows the netdev's state a moment later
        finally:
            subprocess.run(["ip", "link", "set", veth, "up"], check=True)
            _wait_port_active(PAIR_ADDRESSES[1])


def _wait_port_active(address: str) -> None:
    from channels import _rdma_verbs as verbs

    deadline = time.monotonic() + 30
    while True:
        try:
            verbs.choose_port_gid(address)
            return
        except (RdmaPortDownError, RdmaGidError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

