"""What the reliable transport tells its users: streams, loss events, delivery, counters.

A stream is (source_session, stream_id) of the DATA frames (docs/protocol.md). Messages reach
the application through a ``DeliveryHandler``; a range the transport gave up on reaches it as
an ``UnrecoverableLoss`` event, in sequence position for ordered streams, and the stream goes on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import NamedTuple, Protocol


class StreamKey(NamedTuple):
    """A sequenced stream: the sender's session and its stream id."""

    source_session: int
    stream_id: int


class LossReason(IntEnum):
    """Why a range was declared unrecoverable."""

    RECOVERY_TIMEOUT = 1
    """The gap was not repaired within the recovery bound (NAKs unanswered or lost)."""
    SENDER_LOSS = 2
    """The sender answered a NAK with LOSS: the range had left its retransmission buffer."""
    RESYNC = 3
    """The sender is more than a receive window ahead and nothing in the window progressed for
    the recovery bound: the receiver jumped forward to the sender's sequence numbers."""


@dataclass(frozen=True, slots=True)
class UnrecoverableLoss:
    """Messages first_seq..last_seq (inclusive) of ``stream`` will never be delivered."""

    stream: StreamKey
    first_seq: int
    last_seq: int
    reason: LossReason
    detected_ns: int
    """When the receiver first knew the range was missing."""
    declared_ns: int
    """When it gave up on it."""

    @property
    def messages(self) -> int:
        return self.last_seq - self.first_seq + 1


class DeliveryHandler(Protocol):
    """The application side of a ReliableReceiver (a subscriber queue, a forwarding stage)."""

    def on_message(self, stream: StreamKey, message: memoryview) -> bool:
        """One message (its 40-byte header, payload, topic, padding: the wire bytes).

        The view is valid only during the call. Return False to refuse it for now
        (back-pressure): the receiver keeps it and offers it again on a later duty cycle.
        """
        ...

    def on_loss(self, event: UnrecoverableLoss) -> None: ...


@dataclass(slots=True)
class ReceiverCounters:
    """What a ReliableReceiver did, summed over its streams."""

    frames: int = 0
    malformed: int = 0
    """Frames that failed validation (codec.decode_frame), dropped whole."""
    not_for_us: int = 0
    """Frames addressed to another session, or admin frames a receiver does not use."""
    streams_refused: int = 0
    """Message frames of a new stream beyond the stream limit, dropped."""
    messages: int = 0
    delivered: int = 0
    duplicates: int = 0
    beyond_window: int = 0
    """Messages too far ahead of the stream (forged, or a sender a window ahead), dropped."""
    refused_full: int = 0
    """In-window messages dropped because the gap limit or the reorder bytes were reached; they
    are NAKed later like lost ones."""
    recovered: int = 0
    """Messages that filled a gap (retransmitted or late)."""
    recovery_ns_max: int = 0
    recovery_ns_total: int = 0
    gaps_detected: int = 0
    nak_frames: int = 0
    nak_ranges: int = 0
    naks_suppressed: int = 0
    """Pending NAK ranges postponed because another receiver NAKed them on the group."""
    peer_nak_frames: int = 0
    loss_frames: int = 0
    loss_events: int = 0
    lost_messages: int = 0
    resyncs: int = 0
    acks_sent: int = 0
    flow_control_frames: int = 0
    streams_expired: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class SenderCounters:
    """What a ReliableSender did."""

    messages: int = 0
    frames: int = 0
    bytes: int = 0
    nak_frames: int = 0
    nak_ranges: int = 0
    nak_ranges_invalid: int = 0
    """Ranges with first > last or first below the first sequence: ignored."""
    nak_ranges_unsent: int = 0
    """Ranges (or their parts) above the highest sequence sent: ignored, never answered."""
    retransmitted: int = 0
    retransmitted_bytes: int = 0
    """Message bytes resent in answer to NAKs (headers included, frame overhead not)."""
    retransmit_frames: int = 0
    retransmits_lingering: int = 0
    """Messages asked for again within the linger time: not resent."""
    retransmits_capped: int = 0
    """Messages over the per-NAK cap: not resent (the receiver asks again)."""
    retransmits_limited: int = 0
    """Messages a NAK asked for beyond its requester's answer budget: not resent now."""
    nak_answers_limited: int = 0
    """NAKs answered only in part (or not at all) because the requester's budget ran out."""
    nak_ranges_acked: int = 0
    """Ranges (or their parts) at or below the requester's own cumulative ACK: it has them
    (a stale or forged NAK); ignored."""
    loss_frames: int = 0
    loss_messages: int = 0
    tail_probes: int = 0
    acks: int = 0
    flow_control_frames: int = 0
    not_for_us: int = 0
    malformed: int = 0
    offers_refused: int = 0
    """Offers refused while paused with the throttle policy and the pending queue full."""
    pending_dropped: int = 0
    """Pending messages evicted while paused (drop-oldest, or conflate with no key match)."""
    pending_conflated: int = 0
    """Pending messages replaced by a newer value of the same topic key while paused."""
    window_full: int = 0
    """Times an offer or duty cycle found the send window full (the slowest receiver's ACK
    was send_window_messages behind): new messages waited in the pending queue."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
