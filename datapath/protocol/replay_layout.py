"""Replay page frames: how a cache's replay answer carries its messages (docs/protocol.md,
"Replay pages").

A page is ``frames`` DATA frames sent to the client's session before the REPLAY_RESULT
document that names it (``page``, ``frames``, ``count``). A page frame is an ordinary DATA
frame (every walker and the batch decoder take it unchanged) whose ``stream_id`` is
``REPLAY_STREAM_ID`` (the reliable-stream bit with session 0: no session is 0, so no live
stream has it), ``source_session`` the appliance's node id and ``dest_session`` the
client's session. Its messages are the kept messages as native message records (topic
key, the publisher's sequence, publish time, namespace, schema, qos, flags with
``RETRANSMITTED`` set, the payload region with its header block, and the topic inline
in ``topic_len`` bytes), followed by one last message, the page descriptor: topic key 0,
sequence 0, and as payload (big-endian)::

    request id u32, page u32, frame index u16, messages u16, reserved u32   (16 bytes)
    then per message before it: cache_seq u64, origin u32, stream u32          (16 bytes)

``page`` numbers the cache's answers (each answer a new one), so the frames of a repeated
request are never mixed with another answer's.
"""

from __future__ import annotations

import struct

import numpy as np

REPLAY_STREAM_ID = 0x8000_0000
"""The stream id of page frames (the reliable bit, session 0)."""
DESCRIPTOR_HEAD = struct.Struct(">IIHHI")
"""request id, page, frame index, messages, reserved."""
DESCRIPTOR_HEAD_BYTES = DESCRIPTOR_HEAD.size
DESCRIPTOR_ENTRY_DTYPE = np.dtype([("cache_seq", ">u8"), ("origin", ">u4"),
                                   ("stream", ">u4")])
DESCRIPTOR_ENTRY_BYTES = DESCRIPTOR_ENTRY_DTYPE.itemsize
MAX_PAGE_FRAMES = 64
"""A REPLAY_RESULT names at most this many frames (the appliance sends far fewer:
``cache.settings.REPLAY_PAGE_FRAMES``); a client keeps at most this many per request."""

assert DESCRIPTOR_HEAD_BYTES == DESCRIPTOR_ENTRY_BYTES == 16
