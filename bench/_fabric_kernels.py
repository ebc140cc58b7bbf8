"""Numba kernels of ``topicwire bench fabric``'s publisher and subscriber (bench/fabric.py).

The measuring processes share the machine's cores with the hop they measure, so what they
do per message is kept to one compiled call: the publisher writes sequence numbers and
publish timestamps into its prebuilt frames (``stamp``), the subscriber accounts a decoded
burst (``account``: probes, duplicates, frames, latencies) instead of a dozen numpy steps.
"""

from __future__ import annotations

import numba
import numpy as np

from datapath.protocol._kernels import put_be64

(RECEIVED, DUPLICATES, PROBES, FRAMES, SAMPLES) = range(5)
"""Words of ``account``'s running totals."""
TOTAL_WORDS = 5


@numba.njit(cache=True, nogil=True)
def stamp(buf: np.ndarray, seq_at: np.ndarray, ts_at: np.ndarray, k: int, first_seq: int,
          ts_ns: int) -> None:
    """Messages 0..k: sequence ``first_seq + i`` at ``seq_at[i]``, ``ts_ns`` at ``ts_at[i]``
    (big-endian u64, as the message layout has them)."""
    for i in range(k):
        put_be64(buf, seq_at[i], first_seq + i)
        put_be64(buf, ts_at[i], ts_ns)


@numba.njit(cache=True, nogil=True)
def account(buf: np.ndarray, messages: np.ndarray, m: int, recv_ts_ns: np.ndarray,
            first_frame: int, seen: np.ndarray, latencies: np.ndarray,
            totals: np.ndarray) -> None:
    """Account ``messages[:m]`` (``decode_frames`` output of frames from ``first_frame`` of
    the receive batch): a message whose first payload byte is not 0 is a probe; a measured
    one with sequence s (0 < s < len(seen)) is received, a duplicate when ``seen[s]``; the
    distinct frames that carried measured messages are counted; with room in ``latencies``,
    its kernel receive time minus its publish time is appended (``totals[SAMPLES]`` of them
    so far)."""
    last_frame = -1
    for j in range(m):
        if buf[messages[j].payload_offset] != 0:
            totals[PROBES] += 1
            continue
        totals[RECEIVED] += 1
        frame = np.int64(messages[j].frame_index)
        if frame != last_frame:
            totals[FRAMES] += 1
            last_frame = frame
        s = np.int64(messages[j].sequence)
        if 0 < s < seen.shape[0]:
            if seen[s]:
                totals[DUPLICATES] += 1
            seen[s] = True
        at = totals[SAMPLES]
        if at < latencies.shape[0]:
            latencies[at] = recv_ts_ns[first_frame + frame] - np.int64(messages[j].publish_ts_ns)
            totals[SAMPLES] = at + 1
