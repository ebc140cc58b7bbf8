"""Admin frames between appliances: keyed BLAKE2b MAC, epoch + sequence replay guard.

A sender signs every admin frame it sends to a neighbour: ``encode_admin(..., auth=(key_id,
epoch, auth_seq))`` then the MAC (BLAKE2b, ``digest_size=16``, keyed with the fabric key)
over ``Frame.signed_bytes()`` is written with ``codec.set_mac``. ``auth_seq`` increases by one
per frame; ``epoch`` is the sender process's start time (ms, 32 bits), so a restarted sender
starts a new epoch.

A receiver accepts a frame only if it has a trailer, a known key id, the right MAC, and an
(epoch, auth_seq) it has not accepted before from that source (the frame's
``source_session``): a newer epoch resets the source's window; within the current epoch a
sequence above the highest is new, one within ``AUTH_REPLAY_WINDOW`` below it is new when not
seen yet, anything older is a replay. Rejections are counted per reason.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter

from appliance.config import AUTH_REPLAY_WINDOW
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import Frame, set_mac

MAC_BYTES = fl.AUTH_MAC_BYTES


def mac_of(key: bytes, signed: bytes | memoryview) -> bytes:
    """The 16-byte MAC of ``signed`` under ``key``."""
    return hashlib.blake2b(signed, key=key, digest_size=MAC_BYTES).digest()


class _Window:
    __slots__ = ("epoch", "highest", "seen")

    def __init__(self, epoch: int, seq: int) -> None:
        self.epoch = epoch
        self.highest = seq
        self.seen = {seq}


class FabricAuth:
    """Signs outgoing admin frames and checks incoming ones for one appliance."""

    def __init__(self, key: bytes | None, key_id: int, epoch: int) -> None:
        self.key = key
        self.key_id = key_id
        self.epoch = epoch
        self._seq = 0
        self._windows: dict[int, _Window] = {}
        self.rejected: Counter[str] = Counter()
        self.accepted = 0

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

    def check(self, frame: Frame) -> str | None:
        """None if ``frame`` is authentic and new; else the reason it is rejected (counted)."""
        reason = self._verdict(frame)
        if reason is None:
            self.accepted += 1
        else:
            self.rejected[reason] += 1
        return reason

    def reject(self, reason: str) -> None:
        """Count a rejection decided elsewhere (malformed, unknown peer)."""
        self.rejected[reason] += 1

    def _verdict(self, frame: Frame) -> str | None:
        auth = frame.auth
        if auth is None:
            return "no_trailer"
        if self.key is None or auth.key_id != self.key_id:
            return "unknown_key"
        if not hmac.compare_digest(mac_of(self.key, frame.signed_bytes()), auth.mac):
            return "bad_mac"
        source = frame.header.source_session
        window = self._windows.get(source)
        if window is None or auth.epoch > window.epoch:
            self._windows[source] = _Window(auth.epoch, auth.auth_seq)
            return None
        if auth.epoch < window.epoch:
            return "stale_epoch"
        seq = auth.auth_seq
        if seq > window.highest:
            window.highest = seq
            window.seen.add(seq)
            floor = seq - AUTH_REPLAY_WINDOW
            if len(window.seen) > 2 * AUTH_REPLAY_WINDOW:
                window.seen = {s for s in window.seen if s > floor}
            return None
        if seq <= window.highest - AUTH_REPLAY_WINDOW or seq in window.seen:
            return "replay"
        window.seen.add(seq)
        return None
