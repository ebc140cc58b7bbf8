"""Reliable transport over unreliable channels: sequence numbers, NAKs, retransmission, loss events.

A ``ReliableSender`` per stream sequences, batches and keeps what it sends and answers NAKs; a
``ReliableReceiver`` detects gaps, NAKs them (with suppression on multicast), delivers in order
and reports what cannot be recovered within the recovery bound as ``UnrecoverableLoss`` events.
Both are agents (``do_work(now_ns)``) and see frames only as bytes: the channel glue feeds
``on_frame`` and provides a ``FrameSink``. The wire behaviour is docs/reliability.md.
"""

from datapath.reliability.config import ReceiverConfig, SenderConfig
from datapath.reliability.errors import ReliabilityError
from datapath.reliability.events import (
    DeliveryHandler,
    LossReason,
    ReceiverCounters,
    SenderCounters,
    StreamKey,
    UnrecoverableLoss,
)
from datapath.reliability.receiver import ReliableReceiver
from datapath.reliability.sender import ReliableSender
from datapath.reliability.sink import CollectingSink, FrameSink

__all__ = [
    "CollectingSink",
    "DeliveryHandler",
    "FrameSink",
    "LossReason",
    "ReceiverConfig",
    "ReceiverCounters",
    "ReliabilityError",
    "ReliableReceiver",
    "ReliableSender",
    "SenderConfig",
    "SenderCounters",
    "StreamKey",
    "UnrecoverableLoss",
]
