"""Reliability tunables (units in the names) and the sender/receiver settings built from them.

Defaults follow the models (Aeron, Ultra Messaging LBT-RM) scaled to a LAN and a Python data
path; docs/reliability.md explains each timer. These constants are meant to move to
``datapath/config.py`` with config keys (``reliability.*``) when the lead wires them.
"""

from __future__ import annotations

from dataclasses import dataclass

from datapath.protocol.frame_layout import FRAME_HEADER_BYTES
from datapath.protocol.message_layout import MESSAGE_HEADER_BYTES
from datapath.reliability.errors import ReliabilityError

FIRST_SEQUENCE = 1
"""Sequence numbers of a stream start here; 0 never names a message."""

# --- receiver ---------------------------------------------------------------------------------
RECEIVE_WINDOW_MESSAGES = 65_536
"""The hostile-input bound: a receiver accepts sequence numbers in [low, low + window) only,
where low is the first not yet delivered (ordered) or not yet received (unordered). Anything
further ahead is counted and dropped, never stored and never NAKed, so the reorder buffer and
every NAK range stay inside the window."""
REORDER_MAX_BYTES = 64 * 1024 * 1024
"""Bytes of out-of-order (or held-back) messages a stream may store."""
MAX_GAPS_PER_STREAM = 4_096
"""Missing ranges tracked per stream; a message that would open one more is dropped (and
recovered later by NAK once older gaps close)."""
MAX_STREAMS_PER_RECEIVER = 1_024
"""Streams (source_session, stream_id) one receiver tracks; frames of further streams are
counted and dropped."""
STREAM_IDLE_TIMEOUT_NS = 60_000_000_000
"""A stream with nothing outstanding and no frame for this long is forgotten (frees its slot)."""
NAK_UNICAST_DELAY_NS = 0
"""Unicast: NAK a gap at the end of the duty cycle that saw it (Aeron's immediate unicast NAK);
reordering inside one received batch is repaired before the NAK goes out."""
NAK_MULTICAST_MAX_DELAY_NS = 2_000_000
"""Multicast: the first NAK of a gap waits a uniform random delay in [0, this), so one receiver
usually NAKs first and the others see its NAK (or the retransmission) and stay quiet."""
NAK_RETRY_INITIAL_NS = 20_000_000
"""First NAK retry interval; doubles per retry (NAK_RETRY_BACKOFF_FACTOR) up to NAK_RETRY_MAX_NS."""
NAK_RETRY_MAX_NS = 200_000_000
NAK_RETRY_BACKOFF_FACTOR = 2
RECOVERY_TIMEOUT_NS = 2_000_000_000
"""The recovery bound: a gap not repaired this long after it was detected is declared lost
(an UnrecoverableLoss event naming the range) and the stream moves on (LBT-RM's NAK generation
interval)."""
MAX_NAK_RANGES_PER_FRAME = 64
"""SeqRange entries per NAK or LOSS frame (32 + 64 * 16 = 1,056 bytes: fits one Ethernet MTU)."""
ACK_INTERVAL_NS = 2_000_000
"""A receiver acknowledges progress (ACK: everything below low) at most this often per stream."""
ACK_IDLE_INTERVAL_NS = 200_000_000
"""...and repeats its last ACK this often without progress (Aeron's status-message interval),
so a lost ACK is not the sender's last word."""

# --- sender ----------------------------------------------------------------------------------
SENDER_MAX_FRAME_BYTES = 1_472
"""Frames a sender builds: one UDP datagram on a 1,500-byte Ethernet MTU, no IP fragments."""
RETRANSMIT_BUFFER_BYTES = 64 * 1024 * 1024
"""Message bytes a sender keeps for retransmission; older messages answer NAKs with LOSS."""
RETRANSMIT_BUFFER_MESSAGES = 1 << 20
"""Messages a sender keeps for retransmission (a power of two)."""
RETRANSMIT_LINGER_NS = 10_000_000
"""A message retransmitted less than this long ago is not retransmitted again (absorbs the
duplicate NAKs of several receivers); shorter than NAK_RETRY_INITIAL_NS so that a receiver's
retry after a lost retransmission is served."""
MAX_RETRANSMIT_MESSAGES_PER_NAK = 4_096
"""Messages one NAK frame can make a sender resend (bounds amplification by hostile NAKs)."""
NAK_ANSWER_BYTES_PER_S = 4 * 1024 * 1024
"""What NAKs from one requester can make senders resend, per second (``AnswerBudget``: a
token bucket shared by the streams towards that requester); beyond it the rest of a NAK is
not answered now (counted ``retransmits_limited``: the requester asks again later)."""
NAK_ANSWER_BURST_BYTES = 256 * 1024
"""...and at once (the bucket's depth): the most one NAK can make senders resend."""
TAIL_PROBE_DELAY_NS = 5_000_000
"""When a sender goes quiet, it resends its last message (a tail-loss probe, as a
RETRANSMISSION) after this delay, then backs off by doubling up to TAIL_PROBE_MAX_INTERVAL_NS:
a receiver that lost the tail of a burst sees the probe's sequence number and NAKs."""
TAIL_PROBE_MAX_INTERVAL_NS = 500_000_000
SENDER_PENDING_MESSAGES = 65_536
"""Messages a sender holds (behind a closed send window or a receiver's flow control) before
its policy applies (THROTTLE: further offers are refused)."""
SEND_WINDOW_MESSAGES = RECEIVE_WINDOW_MESSAGES // 2
"""A sender gets at most this many messages ahead of the slowest receiver's cumulative ACK
(Aeron's status-message window): a receiver that falls behind is never pushed past its
receive window, where it would drop frames unseen. 0 turns the window off."""
SEND_WINDOW_RECEIVER_TIMEOUT_NS = 1_000_000_000
"""A receiver that has not ACKed for this long stops holding the window (it left)."""
FRAMES_PER_DUTY_CYCLE = 64
"""Frames a sender writes per do_work while draining its pending queue (bounded duty cycle)."""


def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise ReliabilityError(f"{name} must be positive, got {value}; set a value above 0")


def _non_negative(name: str, value: int) -> None:
    if value < 0:
        raise ReliabilityError(f"{name} must not be negative, got {value}; use 0 to disable it")


@dataclass(frozen=True, slots=True)
class ReceiverConfig:
    """How a ReliableReceiver recovers and delivers; defaults are the module constants."""

    ordered: bool = True
    """Deliver in sequence order (reorder buffer); False delivers on arrival, still deduplicated."""
    multicast: bool = False
    """Randomized first NAK, and suppression by other receivers' NAKs seen on the group."""
    start_seq: int | None = FIRST_SEQUENCE
    """First sequence expected of a new stream (earlier messages are NAKed); None joins at the
    first sequence seen."""
    nak_dest: object = None
    """Where NAKs go; None: back to where the stream's frames come from (its reply address)."""
    window_messages: int = RECEIVE_WINDOW_MESSAGES
    reorder_max_bytes: int = REORDER_MAX_BYTES
    max_gaps: int = MAX_GAPS_PER_STREAM
    max_streams: int = MAX_STREAMS_PER_RECEIVER
    stream_idle_timeout_ns: int = STREAM_IDLE_TIMEOUT_NS
    nak_delay_ns: int = NAK_UNICAST_DELAY_NS
    nak_multicast_max_delay_ns: int = NAK_MULTICAST_MAX_DELAY_NS
    nak_retry_initial_ns: int = NAK_RETRY_INITIAL_NS
    nak_retry_max_ns: int = NAK_RETRY_MAX_NS
    nak_retry_backoff_factor: int = NAK_RETRY_BACKOFF_FACTOR
    recovery_timeout_ns: int = RECOVERY_TIMEOUT_NS
    max_nak_ranges_per_frame: int = MAX_NAK_RANGES_PER_FRAME
    ack_interval_ns: int = ACK_INTERVAL_NS
    ack_idle_interval_ns: int = ACK_IDLE_INTERVAL_NS

    def __post_init__(self) -> None:
        for name in ("window_messages", "reorder_max_bytes", "max_gaps", "max_streams",
                     "stream_idle_timeout_ns", "ack_idle_interval_ns", "nak_retry_initial_ns",
                     "nak_retry_max_ns", "nak_retry_backoff_factor", "recovery_timeout_ns",
                     "max_nak_ranges_per_frame"):
            _positive(name, getattr(self, name))
        for name in ("nak_delay_ns", "nak_multicast_max_delay_ns", "ack_interval_ns"):
            _non_negative(name, getattr(self, name))
        if self.start_seq is not None and self.start_seq < FIRST_SEQUENCE:
            raise ReliabilityError(f"start_seq {self.start_seq} names no message; use "
                                   f"{FIRST_SEQUENCE} or None (join at the first seen)")
        if self.nak_retry_max_ns < self.nak_retry_initial_ns:
            raise ReliabilityError("nak_retry_max_ns is below nak_retry_initial_ns; raise it")


@dataclass(frozen=True, slots=True)
class SenderConfig:
    """How a ReliableSender frames, keeps and resends; defaults are the module constants."""

    multicast: bool = False
    """A multicast sender keeps probing an idle tail (it cannot know every receiver has it);
    a unicast sender stops once its receiver's ACK covers the tail."""
    dest_session: int = 0
    """dest_session written on DATA frames (0: any / multicast)."""
    max_frame_bytes: int = SENDER_MAX_FRAME_BYTES
    retransmit_buffer_bytes: int = RETRANSMIT_BUFFER_BYTES
    retransmit_buffer_messages: int = RETRANSMIT_BUFFER_MESSAGES
    retransmit_linger_ns: int = RETRANSMIT_LINGER_NS
    max_retransmit_messages_per_nak: int = MAX_RETRANSMIT_MESSAGES_PER_NAK
    tail_probe_delay_ns: int = TAIL_PROBE_DELAY_NS
    tail_probe_max_interval_ns: int = TAIL_PROBE_MAX_INTERVAL_NS
    pending_messages: int = SENDER_PENDING_MESSAGES
    frames_per_duty_cycle: int = FRAMES_PER_DUTY_CYCLE
    max_nak_ranges_per_frame: int = MAX_NAK_RANGES_PER_FRAME
    send_window_messages: int = SEND_WINDOW_MESSAGES
    send_window_receiver_timeout_ns: int = SEND_WINDOW_RECEIVER_TIMEOUT_NS

    def __post_init__(self) -> None:
        _non_negative("send_window_messages", self.send_window_messages)
        _positive("send_window_receiver_timeout_ns", self.send_window_receiver_timeout_ns)
        for name in ("retransmit_buffer_bytes", "retransmit_buffer_messages",
                     "max_retransmit_messages_per_nak", "tail_probe_delay_ns",
                     "tail_probe_max_interval_ns", "pending_messages", "frames_per_duty_cycle",
                     "max_nak_ranges_per_frame"):
            _positive(name, getattr(self, name))
        _non_negative("retransmit_linger_ns", self.retransmit_linger_ns)
        smallest = FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES
        if self.max_frame_bytes < smallest or self.max_frame_bytes % 8:
            raise ReliabilityError(f"max_frame_bytes {self.max_frame_bytes} must be a multiple "
                                   f"of 8 and at least {smallest}; use the channel's MTU "
                                   "payload rounded down to 8")
        n = self.retransmit_buffer_messages
        if n & (n - 1):
            raise ReliabilityError(f"retransmit_buffer_messages {n} must be a power of two")
