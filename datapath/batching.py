"""Adaptive batching: as many messages per frame as the rate allows, within a latency budget.

Seed 002: the number of messages packed into one frame follows the message rate, and batching
must keep the time a message waits in the queue below an acceptable latency. The batcher
estimates the arrival rate (an exponentially decayed count over ``rate_window_ns``) and aims
a frame at the messages expected within the budget:

    target = clamp(floor(rate * latency_budget), 1, frame capacity)

A frame is flushed when it is full, when it holds ``target`` messages, or when its oldest
message has waited the budget, whichever comes first. At low rates the target is 1 (each
message leaves at once, no added delay); at high rates frames fill before the budget runs out.

The batcher only decides; the sender owns the frame buffer. It calls ``fits`` before
appending a message, ``on_append`` after (True: flush now), ``due`` from its duty cycle and
``on_flush`` when the frame has gone. ``deadline_ns`` lets a runner sleep until the next flush.
"""

from __future__ import annotations

import math

from datapath.errors import UserError
from datapath.protocol.frame_layout import FRAME_HEADER_BYTES
from datapath.protocol.message_layout import MAX_MESSAGES_PER_FRAME, MESSAGE_HEADER_BYTES

LATENCY_BUDGET_NS = 100_000
"""Longest a message may wait for its frame to fill (config key ``batching.latency_budget_ns``
when wired)."""
RATE_WINDOW_BUDGETS = 8
"""The rate estimate's time constant, in latency budgets. Above 1 so that a lone message
(estimated rate 1 / window) gets a target of 1: isolated messages are never held."""


class BatchingError(UserError):
    """A batching setting that cannot work ("batching: ...; what to do")."""

    component = "batching"


class AdaptiveBatcher:
    """Flush decisions for one stream's open frame; see the module docstring."""

    __slots__ = ("_decayed_count", "_last_arrival_ns", "budget_ns", "bytes", "count", "frames",
                 "max_body_bytes", "max_delay_ns", "max_messages", "messages", "open_ns",
                 "rate_window_ns")

    def __init__(self, latency_budget_ns: int = LATENCY_BUDGET_NS, *,
                 max_frame_bytes: int = 1_472, max_messages: int = MAX_MESSAGES_PER_FRAME,
                 rate_window_ns: int | None = None) -> None:
        if latency_budget_ns < 0:
            raise BatchingError(f"latency budget {latency_budget_ns} ns; use 0 (no batching) "
                                "or more")
        if max_frame_bytes < FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES:
            raise BatchingError(f"max_frame_bytes {max_frame_bytes} cannot hold one message")
        if not 1 <= max_messages <= MAX_MESSAGES_PER_FRAME:
            raise BatchingError(f"max_messages {max_messages}; use 1..{MAX_MESSAGES_PER_FRAME}")
        self.budget_ns = latency_budget_ns
        self.max_body_bytes = max_frame_bytes - FRAME_HEADER_BYTES
        self.max_messages = max_messages
        self.rate_window_ns = rate_window_ns or max(RATE_WINDOW_BUDGETS * latency_budget_ns, 1)
        self._decayed_count = 0.0
        self._last_arrival_ns = 0
        self.count = 0
        self.bytes = 0
        self.open_ns = 0
        self.frames = 0
        self.messages = 0
        self.max_delay_ns = 0
        """Longest wait of a frame's oldest message, over every flush."""

    def rate_per_ns(self, now_ns: int) -> float:
        """The estimated arrival rate at ``now_ns`` (messages per ns)."""
        elapsed = max(now_ns - self._last_arrival_ns, 0)
        return self._decayed_count * math.exp(-elapsed / self.rate_window_ns) / self.rate_window_ns

    def target(self, now_ns: int) -> int:
        """Messages the open frame aims for."""
        expected = int(self.rate_per_ns(now_ns) * self.budget_ns)
        return min(max(expected, 1), self.max_messages)

    def fits(self, size_bytes: int) -> bool:
        """Whether a message of ``size_bytes`` fits the open frame (an empty frame takes any)."""
        return self.count == 0 or (self.count < self.max_messages
                                   and self.bytes + size_bytes <= self.max_body_bytes)

    def on_append(self, size_bytes: int, now_ns: int) -> bool:
        """Record one appended message; True when the frame should be flushed now."""
        elapsed = now_ns - self._last_arrival_ns
        decayed = self._decayed_count
        if elapsed > 0:
            decayed *= math.exp(-elapsed / self.rate_window_ns)
            self._last_arrival_ns = now_ns
        self._decayed_count = decayed = decayed + 1.0
        count = self.count + 1
        if count == 1:
            self.open_ns = now_ns
        self.count = count
        self.bytes += size_bytes
        # the target (see target()) at this instant, inlined: this runs once per message
        expected = int(decayed * self.budget_ns / self.rate_window_ns)
        return (count >= self.max_messages or count >= expected
                or self.bytes + MESSAGE_HEADER_BYTES > self.max_body_bytes
                or now_ns - self.open_ns >= self.budget_ns)

    def full(self) -> bool:
        """True when the open frame can take no further message (count or bytes)."""
        return (self.count >= self.max_messages
                or self.bytes + MESSAGE_HEADER_BYTES > self.max_body_bytes)

    def due(self, now_ns: int) -> bool:
        """True when the open frame should be flushed (budget spent or target reached)."""
        return self.count > 0 and (now_ns - self.open_ns >= self.budget_ns
                                   or self.count >= self.target(now_ns))

    def deadline_ns(self) -> int | None:
        """When the open frame's oldest message runs out of budget (None: no open frame)."""
        return self.open_ns + self.budget_ns if self.count else None

    def on_flush(self, now_ns: int) -> int:
        """The open frame has been sent; returns how many messages it held."""
        count = self.count
        if count:
            self.frames += 1
            self.messages += count
            delay = now_ns - self.open_ns
            if delay > self.max_delay_ns:
                self.max_delay_ns = delay
        self.count = 0
        self.bytes = 0
        return count

    @property
    def messages_per_frame(self) -> float:
        return self.messages / self.frames if self.frames else 0.0
