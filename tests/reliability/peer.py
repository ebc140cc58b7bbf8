"""One end of a reliable stream over the real channels, run as a process inside a test namespace.

    python -m tests.reliability.peer receive --bind 10.77.0.2 --expect 100000 [--group G]
    python -m tests.reliability.peer send --bind 10.77.0.1 --dest 10.77.0.2 --count 100000
    python -m tests.reliability.peer attack --bind 10.77.0.3 --receiver 10.77.0.2 --sender ...

This is the glue the appliance will own later: a channel's received batch is validated with
the batch decoder and fed to the transport agents as frames; their frames leave through a
``ChannelSink``. A receiver prints ``READY`` once bound, then one JSON line when every message
is accounted for (delivered in order, or named by a loss event); a sender prints its JSON line
when its receivers have acknowledged everything, on SIGTERM, or at its timeout.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import time
from collections import deque

import numpy as np

from channels import FrameBatch, MulticastChannel, UdpChannel
from channels.base import ChannelSink, decode_batch
from datapath.flow_control import SubscriberQueue
from datapath.protocol.admin_layout import FlowPolicy, SeqRange
from datapath.protocol.batch import new_message_batch
from datapath.protocol.codec import encode_admin, encode_data_frame
from datapath.protocol.frame_layout import FrameType
from datapath.reliability import ReceiverConfig, ReliableReceiver, ReliableSender, SenderConfig

PORT = 47470
BATCH = 64
SLOT_BYTES = 2_048
"""Our frames are at most 1,472 bytes; larger datagrams are dropped by the channel."""
PUBLISH_CHUNK = 64
"""Messages offered per loop turn before the sender polls for NAKs again."""


def payload_of(index: int, size: int) -> bytes:
    return index.to_bytes(8, "big") + bytes(max(size - 8, 0))


class Feeder:
    """Receives batches from channels and hands valid frames to an agent's on_frame."""

    def __init__(self, channels: list) -> None:
        self.channels = channels
        self.batch = FrameBatch(BATCH, SLOT_BYTES)
        self.view = memoryview(self.batch.buf)
        self.messages = new_message_batch(BATCH * 40)
        self.status = np.zeros(BATCH, np.uint8)
        self.types = np.zeros(BATCH, np.uint8)
        self.poller = select.poll()
        for ch in channels:
            self.poller.register(ch.fileno(), select.POLLIN)
        # compile (or load) the batch decoder now, not with the first frame on the clock
        warm = FrameBatch(1, SLOT_BYTES)
        warm.append(encode_data_frame([{"sequence": 1}]))
        decode_batch(warm, self.messages, self.status, self.types)

    def poll(self, on_frame, now_ns: int) -> int:
        total = 0
        batch, view = self.batch, self.view
        for ch in self.channels:
            n = ch.receive(batch, 0)
            if not n:
                continue
            total += n
            result = decode_batch(batch, self.messages, self.status, self.types, ch.stats)
            offsets, lengths, peers = batch.offsets, batch.lengths, batch.peer_ids
            for i in range(n):
                if i < result.frames and self.status[i]:
                    continue  # malformed: counted by decode_batch
                off = int(offsets[i])
                on_frame(view[off : off + int(lengths[i])], now_ns, int(peers[i]),
                         i < result.frames)
        return total

    def wait(self, timeout_ms: float) -> None:
        self.poller.poll(timeout_ms)


class DuplicatingSink:
    """Sends every DATA frame ``copies`` times: a network that floods duplicates."""

    def __init__(self, sink: ChannelSink, copies: int) -> None:
        self.sink = sink
        self.copies = copies

    def send_frame(self, frame: memoryview, dest: object) -> None:
        for _ in range(self.copies if frame[3] == FrameType.DATA else 1):
            self.sink.send_frame(frame, dest)

    def flush(self) -> int:
        return self.sink.flush()


# --- receiver ------------------------------------------------------------------------------

class Checker:
    """The application: checks order, content and loss accounting of what it consumes."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.expected = 1
        self.consumed = 0
        self.order_errors = 0
        self.content_errors = 0
        self.losses: deque = deque()
        self.loss_events: list = []

    def on_losses(self, events: list) -> None:
        self.losses.extend(events)
        self.loss_events.extend(events)

    def _skip_losses(self, upto: int) -> None:
        while self.expected < upto and self.losses and self.losses[0].first_seq == self.expected:
            self.expected = self.losses.popleft().last_seq + 1

    def on_message(self, message: bytes) -> None:
        seq = int.from_bytes(message[8:16], "big")
        self._skip_losses(seq)
        if seq != self.expected:
            self.order_errors += 1
        if message[40:48] != (seq - 1).to_bytes(8, "big"):
            self.content_errors += 1
        self.expected = seq + 1
        self.consumed += 1

    @property
    def done(self) -> bool:
        self._skip_losses(self.expect + 1)
        return self.expected > self.expect


def receive(args: argparse.Namespace) -> dict:
    if args.group:
        ch = MulticastChannel(args.group, PORT, interface=args.bind)
    else:
        ch = UdpChannel(bind=(args.bind, PORT))
    sink = ChannelSink(ch)
    queue = SubscriberQueue(policy=FlowPolicy[args.policy.upper()], capacity=args.capacity,
                            high_watermark=args.high, low_watermark=args.low)
    config = ReceiverConfig(multicast=bool(args.group),
                            nak_dest=(args.group, PORT) if args.group else None,
                            recovery_timeout_ns=int(args.recovery_ms * 1e6))
    rx = ReliableReceiver(queue, sink, session_id=args.session, config=config, seed=args.session)
    queue.signal = rx.send_flow_control
    feeder = Feeder([ch])
    checker = Checker(args.expect)
    print("READY", flush=True)

    def on_frame(frame, now_ns, peer, validated):
        rx.on_frame(frame, now_ns, peer, validated=validated)

    start = time.monotonic_ns()
    deadline = start + int(args.timeout_s * 1e9)
    stall_until = None
    stalled = False
    while not checker.done:
        now = time.monotonic_ns()
        if now > deadline:
            break
        got = feeder.poll(on_frame, now)
        work = rx.do_work(now) + queue.do_work(now)
        sink.flush()
        if args.stall_at and not stalled and checker.consumed >= args.stall_at:
            stalled, stall_until = True, now + int(args.stall_ms * 1e6)
        if stall_until is None or now >= stall_until:
            checker.on_losses(queue.take_losses())  # a loss precedes the messages after it
            for _, message in queue.drain(args.drain):
                checker.on_message(message)
        if not got and not work and not len(queue):
            feeder.wait(1)
    elapsed = (time.monotonic_ns() - start) / 1e9
    for _ in range(5):  # the final ACK, repeated: the sender finishes when it has one
        rx.send_acks(time.monotonic_ns())
        sink.flush()
        time.sleep(0.002)
    return {
        "done": checker.done, "consumed": checker.consumed, "expected_next": checker.expected,
        "order_errors": checker.order_errors, "content_errors": checker.content_errors,
        "losses": [[e.first_seq, e.last_seq, e.reason.name, e.declared_ns - e.detected_ns]
                   for e in checker.loss_events[:100]],
        "lost_messages": sum(e.messages for e in checker.loss_events),
        "elapsed_s": elapsed, "counters": rx.counters.as_dict(),
        "gate": [queue.gate.turned_on, queue.gate.turned_off],
        "queue_max_depth": queue.queue.max_depth, "queue_refused": queue.queue.refused,
        "channel_drops": ch.stats.snapshot().get("drops"),
    }


# --- sender --------------------------------------------------------------------------------

def send(args: argparse.Namespace) -> dict:
    if args.group:
        ch = MulticastChannel(args.group, PORT, interface=args.bind, join=False, loopback=False)
        group_ch = MulticastChannel(args.group, PORT, interface=args.bind, loopback=False)
        channels = [ch, group_ch]
    else:
        ch = UdpChannel(bind=(args.bind, PORT), dest=(args.dest, PORT))
        channels = [ch]
    sink = ChannelSink(ch)
    out = DuplicatingSink(sink, args.copies) if args.copies > 1 else sink
    config = SenderConfig(multicast=bool(args.group),
                          retransmit_buffer_messages=args.buffer_messages)
    tx = ReliableSender(out, session_id=args.session, stream_id=args.stream, config=config,
                        latency_budget_ns=int(args.budget_us * 1e3))
    feeder = Feeder(channels)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

    def on_frame(frame, now_ns, peer, validated):
        tx.on_frame(frame, now_ns, peer)

    start = time.monotonic_ns()
    deadline = start + int(args.timeout_s * 1e9)
    published = 0
    budget = 0.0
    last = start
    finished_ns = None
    paused_ns, last_loop_ns = 0, start
    while not stop and time.monotonic_ns() < deadline:
        now = time.monotonic_ns()
        offered = 0
        if published < args.count:
            if args.rate:
                budget = min(budget + (now - last) * args.rate / 1e9, PUBLISH_CHUNK)
            last = now
            chunk = int(budget) if args.rate else PUBLISH_CHUNK
            for _ in range(min(chunk, args.count - published)):
                if not tx.offer(published % 97 + 1, payload_of(published, args.payload), now):
                    break
                published += 1
                offered += 1
            budget -= offered
            if args.announce_at and published >= args.announce_at > published - offered:
                print(f"PUBLISHED {published}", flush=True)
            if published == args.count:
                tx.flush(now)
                finished_ns = now
        got = feeder.poll(on_frame, now)
        work = tx.do_work(now)
        sink.flush()
        if tx.paused:
            paused_ns += now - last_loop_ns
        last_loop_ns = now
        if (published == args.count and args.receivers and len(tx.acks) >= args.receivers
                and not tx.pending and not tx.batcher.count  # all sent (the window may hold some)
                and min(tx.acks.values()) >= tx.highest_sent):
            break
        if not offered and not got and not work:
            feeder.wait(1)
    end = time.monotonic_ns()
    return {
        "published": published, "elapsed_s": (end - start) / 1e9,
        "publish_s": ((finished_ns or end) - start) / 1e9, "counters": tx.counters.as_dict(),
        "messages_per_frame": tx.batcher.messages_per_frame,
        "max_batch_delay_ns": tx.batcher.max_delay_ns,
        "paused_episodes": tx.flow.paused_episodes, "paused_s": paused_ns / 1e9,
        "pending_max_depth": tx.pending.max_depth, "acks": {str(k): v for k, v in
                                                             tx.acks.items()},
    }


# --- attacker ------------------------------------------------------------------------------

def attack(args: argparse.Namespace) -> dict:
    """Forged DATA far ahead to the receiver; NAKs for unsent and impossible ranges to the
    sender; once a second a NAK for everything (makes the sender resend its buffer's head)."""
    ch = UdpChannel(bind=(args.bind, PORT))
    sent = {"forged_data": 0, "forged_naks": 0, "huge_naks": 0}
    end = time.monotonic() + args.duration_s
    i = 0
    next_huge = 0.0
    while time.monotonic() < end:
        far = 10**9 + i
        batch = FrameBatch(4, SLOT_BYTES)
        batch.append(encode_data_frame([{"topic_key": 1, "sequence": far,
                                         "payload": payload_of(far - 1, 16)}],
                                       source_session=args.session, stream_id=args.stream))
        ch.send(batch, (args.receiver, PORT))
        sent["forged_data"] += 1
        ranges = [SeqRange(10**12 + i, 10**12 + i + 1000), SeqRange(5, 2)]
        if time.monotonic() >= next_huge:
            ranges.append(SeqRange(1, 2**64 - 1))
            sent["huge_naks"] += 1
            next_huge = time.monotonic() + 1.0
        batch = FrameBatch(4, SLOT_BYTES)
        batch.append(encode_admin(FrameType.NAK, ranges, source_session=666,
                                  dest_session=args.session, stream_id=args.stream))
        ch.send(batch, (args.sender, PORT))
        sent["forged_naks"] += 1
        i += 1
        time.sleep(1 / args.rate)
    return sent


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.reliability.peer")
    p.add_argument("role", choices=["send", "receive", "attack"])
    p.add_argument("--bind", required=True)
    p.add_argument("--dest")
    p.add_argument("--group")
    p.add_argument("--session", type=int, default=5)
    p.add_argument("--stream", type=int, default=1)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--rate", type=float, default=0.0, help="messages (or attacks) per second")
    p.add_argument("--payload", type=int, default=16)
    p.add_argument("--budget-us", type=float, default=100.0, help="sender's latency budget")
    p.add_argument("--copies", type=int, default=1)
    p.add_argument("--announce-at", type=int, default=0,
                   help="print 'PUBLISHED n' once n messages have been offered")
    p.add_argument("--buffer-messages", type=int, default=1 << 20)
    p.add_argument("--receivers", type=int, default=1)
    p.add_argument("--policy", default="throttle")
    p.add_argument("--capacity", type=int, default=16_384)
    p.add_argument("--high", type=int, default=8_192)
    p.add_argument("--low", type=int, default=2_048)
    p.add_argument("--drain", type=int, default=4_096)
    p.add_argument("--stall-at", type=int, default=0)
    p.add_argument("--stall-ms", type=float, default=0.0)
    p.add_argument("--recovery-ms", type=float, default=2_000.0)
    p.add_argument("--receiver")
    p.add_argument("--sender")
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--timeout-s", type=float, default=120.0)
    args = p.parse_args(argv)
    result = {"send": send, "receive": receive, "attack": attack}[args.role](args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
