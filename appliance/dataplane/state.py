"""The data path's shared types and constants: the forwarding tables the control plane
installs, a client session as the data path sees it, the out queues that frame messages per
destination, and the frame constants every part of the data-path agent uses."""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.config import (
    DATAPATH_RECEIVE_FRAMES,
)
from channels.base import FrameBatch
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from nic_offload.model import DigestReason
from nic_offload.softnic.layout import DescriptorKind, MessageVerdict

log = logging.getLogger("topicwire.appliance")


_DATA = int(fl.FrameType.DATA)
_RETX = int(fl.FrameType.RETRANSMISSION)
_HEADER = fl.FRAME_HEADER_STRUCT
_GROUP = int(DescriptorKind.GROUP)
_UNKNOWN = int(MessageVerdict.UNKNOWN_KEY)
_U32 = struct.Struct(">I")
_KEY = struct.Struct(">Q")
_DIGEST_NAMES = {int(r): f"digests_{r.name.lower()}" for r in DigestReason}
_DIGEST_UNKNOWN_KEY = int(DigestReason.UNKNOWN_KEY)
UNKNOWN_KEYS_KEPT = 8
"""How many of the latest unknown topic keys the status snapshot shows."""
_PROBE = 0x7FFF_FFFF
_FEW = 16
"""Up to this many values, a Python list beats a numpy reduction."""
"""``stream_id`` of telemetry probes (appliance/ops/telemetry/config.py PROBE_STREAM_ID)."""


@dataclass(frozen=True)
class ForwardingTables:
    """What the data path forwards with; the control agent builds a new one on every change."""

    node_id: int
    ports: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Offload egress port -> ("client", session) or ("node", destination node id), or the
    guaranteed kinds ("gclient", session) and ("gnode", destination node id)."""
    next_hop: dict[int, int] = field(default_factory=dict)
    """Destination node -> fabric peer id of the next hop on path(self, destination)."""
    transit: dict[tuple[int, int], tuple[int, int | None]] = field(default_factory=dict)
    """(source, destination) through or to this node -> (the node before this one on the
    path, fabric peer id of the next hop, or None when this node is the destination)."""
    peer_node: dict[int, int] = field(default_factory=dict)
    """Fabric peer id -> node id of a neighbour that is up."""
    group_direct: dict[int, str] = field(default_factory=dict)
    """Destination node -> the group-tx channel that reaches it directly (a neighbour on a
    fabric group, heard on it, whose path from this node is the direct link)."""
    group_peers: dict[tuple[str, int], int] = field(default_factory=dict)
    """(group channel, peer id of a member's group sender) -> node id of that neighbour."""
    epochs: dict[int, int] = field(default_factory=dict)
    """Appliance -> the epoch of its advertised interest (a new epoch: it restarted)."""
    grace: dict[tuple[int, int], tuple[int, int | None, int]] = field(default_factory=dict)
    """(source, destination) whose path here changed -> (old previous hop, old next peer,
    until monotonic ns): the old path drains (appliance/control/route_apply.py)."""
    alt_transit: dict[tuple[int, int], tuple[int, int | None]] = field(default_factory=dict)
    """Like ``transit``, on the backup paths of duplicated pairs."""
    alt_next_hop: dict[int, int] = field(default_factory=dict)
    """Destination -> fabric peer of the first hop of this node's backup path to it."""
    dup_keys: frozenset[int] = frozenset()
    """Topic keys sent on both the current and the backup path (duplication mode)."""
    rendezvous: bool = False
    """Rendezvous content routing (``routing.content``): messages go to rendezvous cores,
    a core matches the registrations it holds and forwards, later copies of a message are
    dropped, and the express path is off (appliance/control/rendezvous.py)."""


OWN_PLAIN = 1
"""``DpSession.own_class`` bit: every best-effort subscription of the session was made with
``own_class``: a guaranteed message that also goes to the session's guaranteed egress is not
given to its best-effort egress."""
OWN_GUARANTEED = 2
"""``DpSession.own_class`` bit: likewise every guaranteed subscription: a best-effort or
last-value message that also goes to the session's best-effort egress is not given to its
guaranteed egress (the reliable stream)."""

ALL_SELECTORS: tuple[str, ...] = ()
"""A guard of every selector its session (or destination) holds: any one TRUE passes."""


@dataclass
class DpSession:
    """A client session as the data path sees it."""

    session_id: int
    identity: str
    channel: str
    """CLIENT_UDP or CLIENT_SHM."""
    dest: int
    """UDP peer id, or the session id for shared memory (its ring is ``tx``)."""
    tx: Any = None
    """The ShmChannel towards the client's ring (shared memory only), opened by the data
    path from ``ring``."""
    ring: str | None = None
    """The name of the client's ring (shared memory only)."""
    allowed: set[int] = field(default_factory=set)
    """Topic keys this session may publish (granted at registration)."""
    published: int = 0
    delivered: int = 0
    denied: int = 0
    key: bytes | None = None
    """The session's frame MAC key (a password login: appliance/control/credentials.py);
    None: its frames carry no MAC."""
    auth_slot: int = -1
    """Its row in the data path's SessionAuth (-1: no key)."""
    acl_class: int = 0
    """The content ACL class every message it publishes must pass (its identity's
    ``acl_class`` in P&M, numbered as ``pm.acl_class_ids``); 0: none. Its frames take the
    general loop, which applies the class (``Delivery._content_acl``)."""
    topics: dict[int, str] = field(default_factory=dict)
    """Topic of each key it may publish, kept for sessions with a class only (the audit
    line of a LOG names the topic)."""
    selectors: dict[int, tuple[str, ...]] | None = None
    """Topic key -> selector texts guarding its delivery here (one must be TRUE), for keys
    only its selector subscriptions match (``ALL_SELECTORS``: all it holds); None: no guard
    (``set_selectors``)."""
    selector_filtered: int = 0
    """Messages not delivered to it because no guarding selector was TRUE."""
    flow_policy: int = 1
    """Its flow-control policy (``FlowPolicy``; the control agent's ``set_flow_policy``,
    docs/flow-control.md); drop-oldest until told."""
    flow: Any = None
    """Its ``SessionFlow`` while its client holds it off or its queue drains (its messages
    take the general loop then); None: none."""
    own_class: int = 0
    """``OWN_PLAIN`` | ``OWN_GUARANTEED`` (the control agent's ``set_own_class``): each message
    that goes to both of its egresses is given to the one of its class only."""


class _OutQueue:
    """Frames being built and queued for one channel kind, in a preallocated batch.

    ``add_message`` appends a message to the open frame of its (dest, source, destination,
    stream); ``add_frame`` queues a whole frame. ``flush`` finishes open frames and sends.
    """

    def __init__(self, send: Callable[[FrameBatch], None], max_frame_bytes: int,
                 capacity: int = DATAPATH_RECEIVE_FRAMES, slot_bytes: int = 0) -> None:
        """``max_frame_bytes``: frames built here (``add_message``); ``slot_bytes``: the
        largest whole frame ``add_frame`` takes (admin frames may exceed the data MTU)."""
        self.batch = FrameBatch(capacity, fl.align8(max(max_frame_bytes, slot_bytes, 512)))
        self.too_large = 0
        self._view = memoryview(self.batch.buf)
        self.max_frame_bytes = max_frame_bytes
        self._send = send
        self._open: dict[tuple[int, int, int, int], list[int]] = {}

    def add_message(self, dest: int, src: int, dst: int, stream: int, buf: np.ndarray,
                    off: int, length: int) -> None:
        key = (dest, src, dst, stream)
        state = self._open.get(key)
        if state is not None and (state[1] + length > self.max_frame_bytes
                                  or state[2] >= ml.MAX_MESSAGES_PER_FRAME):
            self._finish(key, state)
            state = None
        if state is None:
            slot = self._new_slot(dest)
            state = self._open[key] = [slot, fl.FRAME_HEADER_BYTES, 0]
        slot, pos, _ = state
        start = int(self.batch.offsets[slot]) + pos
        self.batch.buf[start : start + length] = buf[off : off + length]
        state[1] = pos + length
        state[2] += 1

    def add_frame(self, dest: int, frame: bytes | bytearray | memoryview | np.ndarray) -> None:
        if len(frame) > self.batch.slot_bytes:
            self.too_large += 1
            return
        slot = self._new_slot(dest)
        start = int(self.batch.offsets[slot])
        data = frame if isinstance(frame, np.ndarray) else np.frombuffer(frame, np.uint8)
        self.batch.buf[start : start + len(data)] = data
        self.batch.lengths[slot] = len(data)

    def _new_slot(self, dest: int) -> int:
        if self.batch.count == self.batch.capacity:
            self.flush()
        slot = self.batch.count
        self.batch.count = slot + 1
        self.batch.peer_ids[slot] = dest
        self.batch.lengths[slot] = 0
        return slot

    def _finish(self, key: tuple[int, int, int, int], state: list[int]) -> None:
        slot, pos, count = state
        _dest, src, dst, stream = key
        _HEADER.pack_into(self._view, int(self.batch.offsets[slot]), fl.FRAME_MAGIC,
                          fl.PROTOCOL_VERSION, _DATA, 0, count, pos, src, dst, stream, 0)
        self.batch.lengths[slot] = pos
        del self._open[key]

    def flush(self) -> None:
        for key, state in list(self._open.items()):
            self._finish(key, state)
        if self.batch.count:
            self._send(self.batch)
            self.batch.count = 0
