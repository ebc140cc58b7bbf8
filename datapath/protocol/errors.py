"""The codec's one documented error and the reasons a frame is malformed.

A receiver never trusts a length it has not checked: every malformed case has a reason code,
the decoder raises ``ProtocolError`` carrying it (and the byte offset where decoding stopped),
and the batch kernels write the same code into a per-frame status array instead of raising.
Appliances count drops per reason.
"""

from __future__ import annotations

from enum import IntEnum

from datapath.errors import TopicwireError


class MalformedReason(IntEnum):
    """Why a frame was dropped. Values are stable: they appear in counters and kernels."""

    OK = 0
    TOO_SHORT = 1
    """Fewer bytes than a frame header (32)."""
    BAD_MAGIC = 2
    BAD_VERSION = 3
    UNKNOWN_TYPE = 4
    UNKNOWN_FLAGS = 5
    """A reserved frame or message flag bit is set."""
    BAD_FRAME_LENGTH = 6
    """frame_len below the header size, not a multiple of 8, above MAX_FRAME_BYTES or above
    the bytes available."""
    LENGTH_MISMATCH = 7
    """A datagram's length differs from the frame_len it declares."""
    BAD_COUNT = 8
    """msg_count is zero where messages are required, or above the per-frame bound."""
    MESSAGE_OVERRUN = 9
    """A message or entry (header or body) runs past the end of the frame body."""
    TRAILING_BYTES = 10
    """Bytes left in the body after the last declared message or entry."""
    BAD_QOS = 11
    BAD_FIELD = 12
    """An admin field out of its range (unknown enum value, text that is not UTF-8, ...)."""


class ProtocolError(TopicwireError):
    """A frame that violates docs/protocol.md. The only exception the decoder raises."""

    component = "protocol"

    def __init__(self, reason: MalformedReason, detail: str, offset: int = 0) -> None:
        self.reason = reason
        self.offset = offset
        super().__init__(
            f"malformed frame ({reason.name.lower()} at byte {offset}): {detail}; "
            "the frame is dropped and counted"
        )
