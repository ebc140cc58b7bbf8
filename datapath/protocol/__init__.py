"""Native protocol v1: layouts (one module per layout), codec, numba batch kernels, scapy layer.

The wire specification is docs/protocol.md; the layout modules are its executable form.
"""

from datapath.protocol.errors import MalformedReason, ProtocolError
from datapath.protocol.frame_layout import FrameFlags, FrameType
from datapath.protocol.message_layout import MessageFlags, Qos

__all__ = [
    "FrameFlags",
    "FrameType",
    "MalformedReason",
    "MessageFlags",
    "ProtocolError",
    "Qos",
]
