"""Fabric frames between appliances: keyed BLAKE2b MAC, bound to their link, replay window.

A sender signs every frame it sends to another appliance: admin frames to a neighbour
(``encode_admin(..., auth=next_auth())`` then ``sign``), and the guaranteed plane's
reliable-stream frames to their destination appliance (``signed_copy``: the frame with a
trailer appended). The MAC (BLAKE2b, ``digest_size=16``, keyed with the fabric key) covers
every byte of the frame before it, the header included, so it covers the **link** the frame
is for: ``source_session`` is the sender's node id and ``dest_session`` the receiver's node
id (a fabric group's id, ``group_link_id``, for a frame to a group). A receiver accepts a
frame only if its ``dest_session`` is its own node id (or the group's it arrived on): a frame
captured on one link is refused on every other (``wrong_link``). A sender that does not know
its neighbour's node id yet (it started, or restarted) sends a *discovery* HELLO, bound to
the neighbour's configured name instead (``hello_link_id``): it only tells the receiver which
node id to answer, never that the sender is up (liveness comes from HELLOs bound to the
receiver's node id only; control/fabric.py).

Replay: ``auth_seq`` is a per-sender counter that starts at the sender's **start time in
nanoseconds since the Unix epoch** and grows by one per frame. A restarted sender therefore
starts above everything its earlier incarnation sent (it would have to send more than one
frame per nanosecond of its life to catch up with the clock), and the counter never wraps
(2^64 ns is the year 2554). A receiver keeps one window per link (sender, receiver): a
sequence above the highest accepted is new, one within ``AUTH_REPLAY_WINDOW`` below it is new
when not seen yet, anything older is a replay. Once a sender's newer incarnation is heard,
its older one's frames are all replays. The trailer's ``epoch`` field carries the low 32 bits
of the sender's epoch (its start time in ms) for diagnostics; nothing is ordered by it, so
its wrap every 49.7 days changes nothing.

Incarnation of a reliable stream: the MAC of a reliable-stream frame also covers the epoch of
the stream's *receiving* appliance (``signed_copy(..., bind=)``, ``check_bytes(..., bind=)``:
the epoch is the BLAKE2b salt, never sent). The sender binds the destination's epoch it knew
when it made the stream; the destination checks with its own, and binds its NAKs and ACKs
with it too. A stream made for an earlier incarnation of the destination is therefore refused
by a restarted one (``bad_mac``) instead of being taken up in the middle, whose old numbering
would later make the new stream's first messages look like duplicates.

The start time comes from ``wall_clock_ns`` (replaced by tests that start an appliance at a
chosen time); a clock stepped back across a restart by more than the earlier incarnation's
uptime makes its neighbours take the new incarnation's frames for replays until the clock has
caught up (the same holds for any scheme ordered by time).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import time
from collections import Counter
from collections.abc import Callable

from appliance.config import AUTH_MAX_LINKS, AUTH_REPLAY_WINDOW, MAX_NODE_ID
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import Frame, set_mac

MAC_BYTES = fl.AUTH_MAC_BYTES
EPOCH_MASK = 0xFFFF_FFFF
"""The trailer's and the Hello entry's ``epoch`` fields carry this part of the epoch."""

wall_clock_ns: Callable[[], int] = time.time_ns
"""Where an appliance reads its start time (its epoch, the seed of its auth sequences)."""

_FLAGS_LOW = fl.FLAGS_OFFSET + 1
"""The byte of the frame flags that holds AUTH_TRAILER (bit 0 of a big-endian u16)."""
_U32 = struct.Struct(">I")
_TRAILER = fl.AUTH_TRAILER_STRUCT
_AUTH_FLAG = int(fl.FrameFlags.AUTH_TRAILER)
_MIN_SIGNED = fl.FRAME_HEADER_BYTES + fl.AUTH_TRAILER_BYTES


def mac_of(key: bytes, signed: bytes | memoryview, bind: int = 0) -> bytes:
    """The 16-byte MAC of ``signed`` under ``key``, bound to ``bind`` (a receiving
    appliance's epoch, for reliable streams; 0: bound to nothing more than the bytes)."""
    return hashlib.blake2b(signed, key=key, digest_size=MAC_BYTES,
                           salt=bind.to_bytes(16, "big")).digest()


def group_link_id(group: str) -> int:
    """The ``dest_session`` of frames to fabric group ``group`` (what binds them to it)."""
    digest = hashlib.blake2b(group.encode(), digest_size=4, person=b"topicwire-group").digest()
    return int.from_bytes(digest, "big") % MAX_NODE_ID + 1


def hello_link_id(name: str) -> int:
    """The ``dest_session`` of a discovery HELLO to the neighbour named ``name`` (whose node
    id the sender does not know yet)."""
    digest = hashlib.blake2b(name.encode(), digest_size=4, person=b"topicwire-hello").digest()
    return int.from_bytes(digest, "big") % MAX_NODE_ID + 1


def epoch_of(start_ns: int) -> int:
    """An appliance's epoch: its start time in ms since the Unix epoch (64 bits, no wrap)."""
    return start_ns // 1_000_000


class _Window:
    __slots__ = ("highest", "seen")

    def __init__(self, seq: int) -> None:
        self.highest = seq
        self.seen = {seq}


class FabricAuth:
    """Signs the frames one appliance sends to others and checks the ones it receives (one
    instance per thread: the control agent's admin frames, the data path's reliable
    streams; see the module docstring)."""

    def __init__(self, key: bytes | None, key_id: int, epoch: int,
                 start_ns: int | None = None) -> None:
        self.key = key
        self.key_id = key_id
        self.epoch = epoch & EPOCH_MASK
        self.incarnation = epoch
        """This appliance's whole epoch: what its reliable streams' MACs are bound to."""
        self._seq = wall_clock_ns() if start_ns is None else start_ns
        """The last auth sequence used (the next frame carries one more)."""
        self._windows: dict[tuple[int, int], _Window] = {}
        self.rejected: Counter[str] = Counter()
        self.accepted = 0

    # --- sending ------------------------------------------------------------------------------
    def next_auth(self) -> tuple[int, int, int]:
        """``auth=`` for the next ``encode_admin`` call."""
        self._seq += 1
        return self.key_id, self.epoch, self._seq

    def sign(self, frame: bytearray) -> bytearray:
        """Write the MAC into a frame built with ``auth=next_auth()``."""
        assert self.key is not None
        end = len(frame) - MAC_BYTES
        set_mac(frame, mac_of(self.key, memoryview(frame)[:end]))
        return frame

    def signed_copy(self, frame: memoryview | bytes, bind: int = 0) -> bytearray:
        """``frame`` (a whole frame without a trailer, e.g. a reliable sender's DATA or a
        receiver's NAK) with a signed trailer appended: its flag set, ``frame_len`` grown;
        the MAC bound to ``bind`` (the receiving appliance's epoch; module docstring)."""
        assert self.key is not None
        out = bytearray(frame)
        out[_FLAGS_LOW] |= _AUTH_FLAG
        _U32.pack_into(out, fl.FRAME_LEN_OFFSET, len(out) + fl.AUTH_TRAILER_BYTES)
        self._seq += 1
        out += _TRAILER.pack(self.key_id, self.epoch, self._seq)
        out += mac_of(self.key, out, bind)
        return out

    # --- receiving ----------------------------------------------------------------------------
    def check(self, frame: Frame, link: int | None = None, hello_link: int | None = None
              ) -> str | None:
        """None if ``frame`` is authentic, for ``link`` (its ``dest_session`` must be it, or
        ``hello_link`` when given) and new; else the reason it is rejected (counted)."""
        auth = frame.auth
        h = frame.header
        if auth is None:
            reason: str | None = "no_trailer"
        else:
            reason = self._verdict(auth.key_id, auth.auth_seq, auth.mac, frame.signed_bytes(),
                                   h.source_session, h.dest_session, link, hello_link)
        return self._count(reason)

    def check_bytes(self, buf: memoryview, source: int, dest: int, link: int,
                    bind: int = 0) -> str | None:
        """``check`` for a whole frame in ``buf`` whose header the caller has read (the data
        path's reliable frames: no decode before the MAC is known good), its MAC bound to
        ``bind`` (``signed_copy``)."""
        n = len(buf)
        if (n < _MIN_SIGNED or not buf[_FLAGS_LOW] & _AUTH_FLAG
                or _U32.unpack_from(buf, fl.FRAME_LEN_OFFSET)[0] != n):
            return self._count("no_trailer")
        key_id, _, seq = _TRAILER.unpack_from(buf, n - fl.AUTH_TRAILER_BYTES)
        end = n - MAC_BYTES
        return self._count(self._verdict(key_id, seq, buf[end:], buf[:end], source, dest,
                                         link, None, bind))

    def reject(self, reason: str) -> None:
        """Count a rejection decided elsewhere (malformed, unknown peer)."""
        self.rejected[reason] += 1

    def _count(self, reason: str | None) -> str | None:
        if reason is None:
            self.accepted += 1
        else:
            self.rejected[reason] += 1
        return reason

    def _verdict(self, key_id: int, seq: int, mac: bytes | memoryview, signed: memoryview,
                 source: int, dest: int, link: int | None, hello_link: int | None,
                 bind: int = 0) -> str | None:
        if self.key is None or key_id != self.key_id:
            return "unknown_key"
        if not hmac.compare_digest(mac_of(self.key, signed, bind), mac):
            return "bad_mac"
        if link is not None and dest != link and (hello_link is None or dest != hello_link):
            return "wrong_link"
        key = (source, dest)
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= AUTH_MAX_LINKS:
                return "links_full"
            self._windows[key] = _Window(seq)
            return None
        if seq > window.highest:
            window.highest = seq
            window.seen.add(seq)
            if len(window.seen) > 2 * AUTH_REPLAY_WINDOW:
                floor = seq - AUTH_REPLAY_WINDOW
                window.seen = {s for s in window.seen if s > floor}
            return None
        if seq <= window.highest - AUTH_REPLAY_WINDOW or seq in window.seen:
            return "replay"
        window.seen.add(seq)
        return None
