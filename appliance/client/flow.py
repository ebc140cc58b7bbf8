"""Flow control between a client and its appliance: the client's side (docs/flow-control.md).

``ReceiveFlow`` watches what the client has received and not yet handed to the application:
the queues of its subscriptions with a configured policy (messages not yet taken with
``get``/iteration; a subscription with the QoS's default keeps up to 1,000,000 in its own
queue, as before), the messages waiting for their topic's name (``resolve``), the burst
being handed over, plus what waits in
its UDP socket (the kernel's receive memory, as messages of ``SOCKET_BYTES_PER_MESSAGE``).
Above ``CLIENT_FLOW_HIGH_MESSAGES`` it sends its appliance FLOW_CONTROL "on" (stream
``SESSION_FLOW_STREAM``), refreshed every ``FLOW_CONTROL_REFRESH_INTERVAL_NS`` while it
lasts; below ``CLIENT_FLOW_LOW_MESSAGES`` "off", with its depth: the appliance sends at most
``high - depth`` queued messages per signal (its credit), so the client refreshes "off"
while frames come (when a subscription's policy was configured: only then does the
appliance wait for credit from the start) and for ``CLIENT_FLOW_LINGER_NS`` after its last
"on", at most every ``FLOW_CONTROL_REFRESH_INTERVAL_NS``; an idle client, or one taking
uncontrolled traffic in its stride, sends nothing. Over UDP the credit is also at most half
the room left in the client's socket (its receive memory, ``SO_RCVBUF``, less what waits in it, as
messages of ``SOCKET_BYTES_PER_MESSAGE``): a credit the socket cannot hold would be lost in
the kernel, under no policy. Such a credit is small where the kernel caps the socket
(Linux's default ``net.core.rmem_max``), so the client then gives the next one as soon as
its socket has drained below a quarter of that memory (at most every
``CLIENT_FLOW_DRAINED_INTERVAL_NS``) instead of waiting out the refresh interval. Between the
two watermarks nothing changes (hysteresis). What the appliance then does with the session's
messages is its policy (throttle, drop-oldest, conflate).

``PublishHold`` is the publisher's side of throttle: the appliance says "on" while a
throttling subscriber's queue holds this client's messages above its watermark; ``publish``
then waits (``Client.flow_wait_s``) and raises ``BackPressureError`` if it is not released.
An "on" not refreshed for ``FLOW_CONTROL_ON_EXPIRY_NS`` ends by itself. While its messages
go to a subscriber under flow control, the appliance gives a UDP publisher a credit (an "off"
with the bytes it may send, renewed while it reads): a spent credit holds ``publish`` as an
"on" does.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

from datapath.flow_control import (
    FLOW_CONTROL_ON_EXPIRY_NS,
    FLOW_CONTROL_REFRESH_INTERVAL_NS,
    WatermarkGate,
)
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.admin_layout import FlowControl, FlowPolicy, FlowState
from datapath.protocol.codec import ProtocolError, decode_frame

CLIENT_FLOW_HIGH_MESSAGES = 8_192
"""Messages received and not yet handed over above which the client asks its appliance to
hold its messages (flow control on)."""
CLIENT_FLOW_LOW_MESSAGES = 2_048
"""... below which it lets them come again (off)."""
CLIENT_FLOW_LINGER_NS = 5_000_000_000
"""After its last "on", the client repeats "off" (with its depth) this long."""
CLIENT_FLOW_DRAINED_INTERVAL_NS = 1_000_000
"""The shortest time between two "off" signals given because the socket drained."""
SOCKET_BYTES_PER_MESSAGE = 128
"""Kernel receive memory counted as one message (a 64-byte message takes ~100 bytes in a
frame, plus the socket buffer's overhead)."""
FLOW_WAIT_S = 10.0
"""How long a publish waits while the appliance holds the publisher off
(``Client.flow_wait_s``)."""
PUBLISH_CREDIT_EXPIRY_NS = 5_000_000_000
"""A publisher's credit (throttle) not renewed by its appliance for this long ends: no limit
again (the appliance renews it every ``FLOW_CREDIT_INTERVAL_NS`` while it is given)."""
_SO_MEMINFO = getattr(socket, "SO_MEMINFO", 55)
"""Linux's ``getsockopt(SOL_SOCKET, SO_MEMINFO)``: the socket's memory, receive first."""
_MEMINFO = struct.Struct("=I")


def socket_receive_bytes(sock: socket.socket | None) -> int:
    """``sock``'s receive memory (``SO_RCVBUF``, in the kernel's accounting; 0 where not
    known)."""
    if sock is None:
        return 0
    try:
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    except OSError:
        return 0


def socket_backlog_bytes(sock: socket.socket | None) -> int:
    """Bytes of datagrams waiting in ``sock``'s receive queue (0 where not known)."""
    if sock is None:
        return 0
    try:
        return _MEMINFO.unpack_from(sock.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, 64))[0]
    except (OSError, struct.error):
        return 0


class ReceiveFlow:
    """The subscriber's watermarks over what it holds unread (the client's thread)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.gate = WatermarkGate(CLIENT_FLOW_HIGH_MESSAGES, CLIENT_FLOW_LOW_MESSAGES)
        self._next_ns = 0
        self._last_on_ns = -CLIENT_FLOW_LINGER_NS
        self.signals_sent = 0
        self.send_failures = 0
        """Signals that could not be sent (the connection was gone)."""
        self.max_depth = 0
        self._rcvbuf: tuple[Any, int] = (None, 0)
        """(the socket, its receive memory): read once per channel."""
        self._received_ns = -FLOW_CONTROL_REFRESH_INTERVAL_NS
        self._signal_ns = -CLIENT_FLOW_DRAINED_INTERVAL_NS
        self._limited = False
        """The last signal's credit was cut to the socket's room."""

    def _socket(self) -> tuple[Any, int, int]:
        """(the channel's UDP socket or None, its receive memory, bytes waiting in it)."""
        sock = getattr(self.client.channel, "_sock", None)
        if sock is None:
            return None, 0, 0
        if self._rcvbuf[0] is not sock:
            self._rcvbuf = (sock, socket_receive_bytes(sock))
        return sock, self._rcvbuf[1], socket_backlog_bytes(sock)

    def _configured(self) -> bool:
        """Whether a subscription's policy was configured: its appliance then holds the
        session under flow control from the start and sends only what each "off" allows.
        Otherwise the appliance forwards freely until the client first says "on", and a
        refresh would tell it nothing."""
        return bool(self.client._flow_subs)

    def depth(self) -> int:
        client = self.client
        queued = 0
        polled = False
        for sub in client._flow_subs:  # (a default-policy subscription's queue absorbs)
            if sub.callback is None:
                if sub.poll_mode:
                    polled = True
                else:
                    queued += len(sub._queue) + len(sub._latest)
        pollq = client._pollq
        if polled and pollq is not None:  # the poll queue holds frames: counted as the
            queued += pollq.queued_bytes // SOCKET_BYTES_PER_MESSAGE  # socket's bytes are
        pending = client._pending  # messages whose topic the client is resolving
        if pending:
            queued += sum(len(msgs) for msgs in list(pending.values()))
        return queued + self._socket()[2] // SOCKET_BYTES_PER_MESSAGE

    def do_work(self, now_ns: int, received: int, arriving: int = 0) -> int:
        """After a receive of ``received`` frames: signal a change, or refresh.
        ``arriving``: messages received and not yet queued (counted in the depth)."""
        client = self.client
        gate = self.gate
        if received:
            self._received_ns = now_ns
        # a small credit was given lately and frames came since: look whether it is used up
        owed = self._limited and now_ns - self._received_ns < FLOW_CONTROL_REFRESH_INTERVAL_NS
        if not received and not gate.on and now_ns < self._next_ns and not owed:
            return 0
        if not client._subs or not client.session:
            return 0
        depth = self.depth() + arriving
        if depth > self.max_depth:
            self.max_depth = depth
        changed = gate.update(depth)
        if gate.on or (received and now_ns - self._last_on_ns <= CLIENT_FLOW_LINGER_NS):
            self._last_on_ns = now_ns  # held off lately, and what was held still comes
        due = now_ns >= self._next_ns and (
            gate.on or now_ns - self._last_on_ns <= CLIENT_FLOW_LINGER_NS
            or (received and self._configured()))
        advertised = depth
        limited = False
        sock, rcvbuf, backlog = self._socket()
        if sock is not None and rcvbuf:
            room = max(rcvbuf - backlog, 0) // SOCKET_BYTES_PER_MESSAGE // 2
            if gate.high - depth > room:  # the credit is what the socket can still hold
                advertised = gate.high - room
                limited = True
            if ((limited or self._limited) and not due and not gate.on
                    and backlog < rcvbuf // 4
                    and now_ns - self._signal_ns >= CLIENT_FLOW_DRAINED_INTERVAL_NS):
                due = True  # drained: the next credit now, not at the refresh
        if changed is None and not due:
            return 0
        self._next_ns = now_ns + FLOW_CONTROL_REFRESH_INTERVAL_NS
        self._signal_ns = now_ns
        self._limited = limited
        try:
            client._send(_encode(client.session, FlowControl(
                gate.state, FlowPolicy.THROTTLE, min(advertised, 2**32 - 1), gate.high,
                gate.low)))
        except Exception:  # the connection is gone: the client's liveness says so
            self.send_failures += 1
            return 0
        self.signals_sent += 1
        return 1


def _encode(session: int, entry: FlowControl) -> bytearray:
    from datapath.protocol.codec import encode_admin

    return encode_admin(fl.FrameType.FLOW_CONTROL, [entry], source_session=session,
                        stream_id=al.SESSION_FLOW_STREAM, send_ts_ns=time.time_ns())


class PublishHold:
    """Whether the appliance holds this client's publishes off (throttle), and the credit it
    gives them.

    An "on" holds the publisher until an "off" (or ``FLOW_CONTROL_ON_EXPIRY_NS`` without a
    refresh). An "off" whose ``queue_depth`` is not 0 is a *credit*: the bytes of frames
    this publisher may send before the appliance's next word (each grant replaces the last).
    Once it is spent, ``held`` is true (``publish`` waits) until the next grant: the
    appliance grants what its receive socket has room for, so a publisher cannot outrun an
    appliance that is slow to read (or not scheduled) and fill that socket, where the kernel
    would drop what it sent. An "off" with 0 ends the credit (no limit), as does a credit
    not renewed for ``PUBLISH_CREDIT_EXPIRY_NS``."""

    def __init__(self) -> None:
        self._until_ns = 0
        self._cond = threading.Condition()
        self.signals = 0
        self.waits = 0
        """Publishes that waited for the appliance to release the publisher."""
        self._credit: int | None = None
        """Bytes this publisher may still send (None: no credit given, no limit)."""
        self._granted_ns = 0
        self.grants = 0
        """Credits the appliance gave."""
        self.credit_waits = 0
        """Of ``waits``: those for a credit (the last one was spent)."""

    def _spent(self, now_ns: int) -> bool:
        if self._credit is None or self._credit > 0:
            return False
        if now_ns - self._granted_ns > PUBLISH_CREDIT_EXPIRY_NS:
            self._credit = None  # the appliance stopped granting: back to no limit
            return False
        return True

    @property
    def held(self) -> bool:
        now = time.monotonic_ns()
        return self._until_ns > now or (self._credit is not None and self._spent(now))

    def spend(self, nbytes: int) -> None:
        """A frame of ``nbytes`` was sent (under a credit: taken from it)."""
        if self._credit is not None:
            with self._cond:
                if self._credit is not None:
                    self._credit = max(self._credit - nbytes, 0)

    def on_frame(self, frame: memoryview) -> bool:
        """A FLOW_CONTROL frame from the appliance: True when it was the session's (stream
        ``SESSION_FLOW_STREAM``), not a reliable stream's."""
        if int.from_bytes(frame[fl.STREAM_ID_OFFSET : fl.STREAM_ID_OFFSET + 4], "big") != \
                al.SESSION_FLOW_STREAM:
            return False
        try:
            _, entries = decode_frame(frame).admin()
        except ProtocolError:
            return True
        with self._cond:
            for entry in entries:
                self.signals += 1
                now = time.monotonic_ns()
                if entry.state is FlowState.ON:
                    self._until_ns = now + FLOW_CONTROL_ON_EXPIRY_NS
                else:
                    self._until_ns = 0
                    if entry.queue_depth:
                        self._credit = int(entry.queue_depth)
                        self._granted_ns = now
                        self.grants += 1
                    else:
                        self._credit = None
            self._cond.notify_all()
        return True

    def wait(self, timeout_s: float) -> bool:
        """Wait until released (and, under a credit, granted more); False when still held
        after ``timeout_s``."""
        self.waits += 1
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self._credit is not None and self._spent(time.monotonic_ns()):
                self.credit_waits += 1
            while True:
                now = time.monotonic_ns()
                spent = self._credit is not None and self._spent(now)
                if self._until_ns <= now and not spent:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wake = (self._until_ns - now) / 1e9 if self._until_ns > now else \
                    (self._granted_ns + PUBLISH_CREDIT_EXPIRY_NS - now) / 1e9
                self._cond.wait(max(min(left, wake), 0.001))

    def release(self) -> None:
        with self._cond:
            self._until_ns = 0
            self._credit = None
            self._cond.notify_all()
