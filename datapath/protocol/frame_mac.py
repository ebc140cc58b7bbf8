"""The MAC of plain DATA frames on a link: keyed BLAKE2b, bound to the link, replay window.

Every plain DATA frame one appliance sends another (published messages, frames in transit,
telemetry probes) carries the auth trailer (frame_layout: key_id u32, epoch u32, auth_seq
u64, mac 16 bytes; flag ``AUTH_TRAILER``; ``frame_len`` covers it). The MAC is BLAKE2b with
``digest_size`` 16, keyed with the fabric key, over every byte of the frame before the MAC
with ``send_ts_ns`` (header bytes 24..31) read as zero, with

- ``salt`` = the **link**: sender node id u32, receiver id u32 (a node id, or a fabric
  group's id for a frame sent to a group), 8 zero bytes, big-endian; the receiver
  computes it from the neighbour the frame came from and itself, so a frame captured on one
  link fails on every other (its header cannot bind the link: a frame in transit names its
  origin and destination, not the hop);
- ``person`` = ``PERSON``: a DATA MAC can never pass for an admin frame's MAC
  (control/auth.py, no salt or person) or the reverse.

The send time stays out of the MAC because each hop stamps it as it sends (telemetry reads
it); the signer stamps it itself, since a channel does not stamp a frame with a trailer.

Replay: ``auth_seq`` counts up from the sender's start time in ns (as control/auth.py's);
the receiver keeps a window per link: the highest sequence accepted and a bitmap of
``WINDOW_BITS`` (RFC 6479's layout: bit ``seq mod WINDOW_BITS``, words cleared as the window
slides, so at least ``WINDOW_BITS - 64`` sequences below the highest are remembered). A frame
below the window, or one seen, is a replay.

BLAKE2b is libsodium's ``crypto_generichash_blake2b_salt_personal`` (from PyNaCl's bundled
libsodium, so a pip install has it), called from the kernels at its address: no Python per
frame. The kernels (``sign_frames``, ``check_frames``, ``check_burst_frame``, the latter
inlined in the appliance's forwarding pipeline) are in datapath/protocol/_kernels.py with the
codec's; ``mac_py`` is the slow twin (hashlib's BLAKE2b) the tests compare them with.

Client sessions that logged in with a password (appliance/control/credentials.py) have a
per-session key both ends derived at login. Frames the client sends carry the trailer under
it as above (salt: session id, appliance node id; ``PERSON``). Frames the appliance sends
the session carry it too, under the same key with ``DOWN_PERSON`` and a zero salt (key id
and epoch 0): the key is the session's alone, so the personalisation only has to tell the
directions apart (a client's frame reflected back to it fails); the client can check from
the moment it made its proof, before it knows its session id. The appliance's sequence
counts up from its start time in ns over all its sessions; the client keeps one window.
``mac_down_py`` is that MAC's slow twin.
"""

from __future__ import annotations

import hashlib

import numpy as np

from datapath.protocol import frame_layout as fl

PERSON = b"topicwire-data\x00\x00"
"""BLAKE2b personalisation of DATA frame MACs (16 bytes)."""
DOWN_PERSON = b"topicwire-down\x00\x00"
"""BLAKE2b personalisation of the MACs of frames from an appliance to a client session."""
MAC_BYTES = fl.AUTH_MAC_BYTES
TRAILER_BYTES = fl.AUTH_TRAILER_BYTES
WINDOW_BITS = 1_024
"""Sequences remembered below the highest accepted per link (as control/auth.py's window)."""
WINDOW_WORDS = WINDOW_BITS // 64
MAX_KEY_BYTES = 64
"""BLAKE2b's largest key."""

# auth_bytes: one uint8 array per signer/checker
B_KEY, B_PERSON, B_SALT, B_MAC, B_TS, B_DOWN_PERSON, B_ZERO = 0, 64, 80, 96, 112, 120, 136
AUTH_BYTES = 152
"""``auth_bytes``: key (64, zero-padded), person (16), salt scratch (16), MAC scratch (16),
send-time scratch (8), ``DOWN_PERSON`` (16), a zero salt (16)."""

# auth_ctl: int64 words
(A_KEY_LEN, A_KEY_ID, A_EPOCH, A_NODE, A_SEQ, A_FN, A_ACCEPTED, A_NO_TRAILER, A_UNKNOWN_KEY,
 A_BAD_MAC, A_REPLAY, A_LINKS_FULL, A_SIGNED, A_UNSIGNED) = range(14)
AUTH_CTL_WORDS = 14
REASONS = ("accepted", "no_trailer", "unknown_key", "bad_mac", "replay", "links_full")
"""Names of the receive verdict counts ``auth_ctl[A_ACCEPTED:][:len(REASONS)]``."""

SESSION_KEY_AT = 8
"""A session key's row (``new_session_keys``): its length in byte 0, the key from here."""

OK, NOT_SUBJECT, REFUSED = 1, 0, 2
"""A received frame's verdict: checked and its trailer removed, not a plain DATA frame (its
own plane checks it), refused (counted by reason)."""

_TS = fl.SEND_TS_OFFSET


def _blake2b_address() -> int:
    import nacl.bindings  # noqa: F401  (runs sodium_init)
    from nacl._sodium import ffi, lib

    return int(ffi.cast("uintptr_t", lib.crypto_generichash_blake2b_salt_personal))


BLAKE2B_ADDRESS = _blake2b_address()
"""``crypto_generichash_blake2b_salt_personal(out, outlen, in, inlen, key, keylen, salt,
personal)``: where the kernels call it."""


def mac_py(key: bytes, signed: bytes, sender: int, receiver: int) -> bytes:
    """The MAC of ``signed`` (the frame before its MAC, send time as in the frame: zeroed
    here) on link (sender, receiver): the kernels' twin."""
    data = bytearray(signed)
    data[_TS:_TS + 8] = bytes(8)
    return hashlib.blake2b(bytes(data), key=key, digest_size=MAC_BYTES, person=PERSON,
                           salt=link_salt(sender, receiver)).digest()


def mac_down_py(key: bytes, signed: bytes) -> bytes:
    """The MAC of ``signed`` (as ``mac_py``) on a frame from an appliance to a client
    session under the session's key."""
    data = bytearray(signed)
    data[_TS:_TS + 8] = bytes(8)
    return hashlib.blake2b(bytes(data), key=key, digest_size=MAC_BYTES, person=DOWN_PERSON,
                           salt=bytes(16)).digest()


def link_salt(sender: int, receiver: int) -> bytes:
    return sender.to_bytes(4, "big") + receiver.to_bytes(4, "big") + bytes(8)


def new_state(key: bytes, key_id: int, epoch: int, node_id: int, start_seq: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """(auth_bytes, auth_ctl) for a signer/checker with ``key`` whose sequences start after
    ``start_seq``."""
    if not 1 <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"frame MAC: a key of 1 to {MAX_KEY_BYTES} bytes, not {len(key)}")
    b = np.zeros(AUTH_BYTES, np.uint8)
    b[B_KEY:B_KEY + len(key)] = np.frombuffer(key, np.uint8)
    b[B_PERSON:B_PERSON + 16] = np.frombuffer(PERSON, np.uint8)
    b[B_DOWN_PERSON:B_DOWN_PERSON + 16] = np.frombuffer(DOWN_PERSON, np.uint8)
    c = np.zeros(AUTH_CTL_WORDS, np.int64)
    c[A_KEY_LEN] = len(key)
    c[A_KEY_ID] = key_id
    c[A_EPOCH] = epoch & 0xFFFF_FFFF
    c[A_NODE] = node_id
    c[A_SEQ] = start_seq
    c[A_FN] = BLAKE2B_ADDRESS
    return b, c


def new_session_keys(rows: int) -> np.ndarray:
    """Room for ``rows`` session keys (``check_session_frame``): length 0, no key."""
    return np.zeros((rows, SESSION_KEY_AT + MAX_KEY_BYTES), np.uint8)


def new_windows(rows: int) -> np.ndarray:
    """Replay windows for ``rows`` links: column 0 the highest sequence (-1: none yet), then
    the bitmap's words."""
    w = np.zeros((rows, 1 + WINDOW_WORDS), np.int64)
    w[:, 0] = -1
    return w
