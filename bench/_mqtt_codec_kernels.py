"""Compiled MQTT encoders that ``topicwire bench mqtt-codec`` measures against the edge's Python
encoders (codec.py): the edge does not use them (one call per packet costs more than the
Python it would replace; docs/mqtt.md, "Why a hand-written codec")."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def encode_acks(out: np.ndarray, first: int, packet_ids: np.ndarray, n: int) -> int:
    """``n`` acknowledgements (``first``: their first byte) into ``out``; the bytes written."""
    p = 0
    for i in range(n):
        pid = packet_ids[i]
        out[p] = first
        out[p + 1] = 2
        out[p + 2] = (pid >> 8) & 0xFF
        out[p + 3] = pid & 0xFF
        p += 4
    return p


@numba.njit(cache=True, nogil=True)
def encode_publish_head(out: np.ndarray, first: int, topic: np.ndarray, packet_id: int,
                        size: int) -> int:
    """A PUBLISH up to its payload (fixed header for a remaining length ``size``, topic
    length, topic, packet id when non-zero) into ``out``; returns the bytes written."""
    out[0] = first
    p = 1
    v = size
    while True:
        b = v & 0x7F
        v >>= 7
        out[p] = b | 0x80 if v else b
        p += 1
        if not v:
            break
    n = topic.shape[0]
    out[p] = (n >> 8) & 0xFF
    out[p + 1] = n & 0xFF
    p += 2
    out[p:p + n] = topic
    p += n
    if packet_id:
        out[p] = (packet_id >> 8) & 0xFF
        out[p + 1] = packet_id & 0xFF
        p += 2
    return p
