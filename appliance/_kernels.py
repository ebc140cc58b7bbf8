"""Numba kernels of the appliance's data path: the express ingress (appliance/_express.py).

``ingress`` takes a client's burst from the receive buffer to finished egress frames in one
call and runs the software NIC's own kernel inside it; the module docstring of
appliance/_express.py says what it does and when it declines. Arguments are arrays and
scalars only; numba infers their types (CONVENTIONS.md #4).
"""

from __future__ import annotations

import numba
import numpy as np

from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from nic_offload.model import MAX_EGRESS_PORT
from nic_offload.softnic import (
    RESULT_DESCRIPTORS,
    RESULT_FRAMES,
    RESULT_MESSAGES,
    DescriptorKind,
    MessageVerdict,
    run_burst,
)

QUEUES = ("clients-udp", "fabric", "clients-shm")
"""The out queues the kernel frames into, by index (appliance/dataplane.py's names)."""

# what an egress port is to the kernel
K_NONE = 0
"""No egress behind the port: counted ``no_port``."""
K_DELIVER = 1
"""Frame the message for (queue, peer, destination session)."""
K_SKIP = 2
"""A client port whose session is gone: nothing (as the general loop)."""
K_UNROUTABLE = 3
"""A destination appliance without a next hop: counted ``unroutable``."""
K_GENERAL = 4
"""Only the general loop delivers here (guaranteed egress, fabric group, ...)."""

# what the kernel returns (res[CODE])
DECLINED = 0
"""Nothing was done: the general loop takes the burst."""
DONE = 1
"""The burst is delivered; the caller adds the counts."""
NIC_ONLY = 2
"""The NIC ran the frames (res holds its counts); the general loop delivers them."""

CODE, FRAMES, MESSAGES, DESCRIPTORS, PUBLISHED, DENIED, NO_PORT, UNROUTABLE, HITS, \
    UNKNOWN = range(10)
"""Words of the result in ``ctl``."""
RESULT_WORDS = 10
QCOUNT, QCAPACITY, QMAX = RESULT_WORDS, RESULT_WORDS + 3, RESULT_WORDS + 6
"""Per out queue (3 words each, ``QUEUES`` order) in ``ctl``: frames queued (updated),
capacity, largest frame."""
CTL_WORDS = RESULT_WORDS + 9

_HDR = fl.FRAME_HEADER_BYTES
_MAGIC0, _MAGIC1 = fl.FRAME_MAGIC >> 8, fl.FRAME_MAGIC & 0xFF
_DATA = int(fl.FrameType.DATA)
_GROUP = int(DescriptorKind.GROUP)
_UNKNOWN_KEY = int(MessageVerdict.UNKNOWN_KEY)
_MAX_MESSAGES = ml.MAX_MESSAGES_PER_FRAME
PORTS = MAX_EGRESS_PORT + 1


@numba.njit(inline="always")
def _u32(buf: np.ndarray, at: int) -> int:
    return ((np.int64(buf[at]) << 24) | (np.int64(buf[at + 1]) << 16)
            | (np.int64(buf[at + 2]) << 8) | np.int64(buf[at + 3]))


@numba.njit(inline="always")
def _put_be(buf: np.ndarray, at: int, value: int, width: int) -> None:
    for b in range(width):
        buf[at + b] = np.uint8((value >> (8 * (width - 1 - b))) & 0xFF)


@numba.njit(inline="always")
def _member(allowed: np.ndarray, key: np.uint64) -> bool:
    lo = 0
    hi = allowed.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if allowed[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo < allowed.shape[0] and allowed[lo] == key


@numba.njit(inline="always")
def _fanout(kind: int, target: int, group_start: np.ndarray, group_len: np.ndarray
            ) -> tuple[int, int, bool]:
    """Where a descriptor's ports are: (first, count, True) = ``group_ports[first:][:count]``
    of multicast group ``target`` (none for a group the snapshot does not define), or
    (target, 1, False) for one port."""
    if kind == _GROUP:
        if target >= group_start.shape[0]:
            return 0, 0, True
        return group_start[target], group_len[target], True
    return target, 1, False


@numba.njit(inline="always")
def _finish(qbuf, qoff, qlen, slot, pos, count, src, dst, stream) -> None:
    """The header of a built frame (``_OutQueue._finish``: flags 0, send time 0)."""
    at = qoff[slot]
    b = qbuf
    b[at] = _MAGIC0
    b[at + 1] = _MAGIC1
    b[at + 2] = fl.PROTOCOL_VERSION
    b[at + 3] = _DATA
    b[at + 4] = 0
    b[at + 5] = 0
    _put_be(b, at + 6, count, 2)
    _put_be(b, at + 8, pos, 4)
    _put_be(b, at + 12, src, 4)
    _put_be(b, at + 16, dst, 4)
    _put_be(b, at + 20, stream, 4)
    for k in range(8):
        b[at + 24 + k] = 0
    qlen[slot] = pos


@numba.njit(cache=True, nogil=True)
def ingress(buf, offsets, lengths, peer_ids, n, peer, session_id, reliable_bit,
             probe_stream, node_id, allowed, ports, group_start, group_len, group_ports,
             b0, o0, l0, p0, b1, o1, l1, p1, b2, o2, l2, p2, ctl, hits,
             batch, status, frame_types, homes, values, acl_results, payloads, pending, slots,
             shift, class_root, groups, bound_lo, bound_result, fields_end, key_counts,
             counters, malformed, desc, verdicts, digests, digest_state, result):
    """See the module docstring. ``ports[port]`` = (kind, queue, peer, destination
    session); queue q's batch is (bq, oq, lq, pq): buffer, offsets, lengths, peer ids.
    ``ctl`` holds the result words (``CODE`` ...: code, frames, messages, descriptors,
    published, denied, no_port, unroutable, distinct ports delivered to, unknown keys) and
    per queue its frame count (updated), capacity and largest frame (``QCOUNT``,
    ``QCAPACITY``, ``QMAX``); ``hits[PORTS + k]`` lists the ports delivered to and
    ``hits[2 * PORTS + k]`` how many messages each (``hits[:PORTS]`` is scratch, zero between
    calls)."""
    res = ctl
    qcount = ctl[QCOUNT:QCOUNT + 3]
    qcapacity = ctl[QCAPACITY:QCAPACITY + 3]
    qmax = ctl[QMAX:QMAX + 3]
    port_kind = ports[:, 0]
    port_queue = ports[:, 1]
    port_peer = ports[:, 2]
    port_dst = ports[:, 3]
    for w in range(RESULT_WORDS):
        res[w] = 0
    if n < 1:
        return
    # 1. a plain burst of one session, or nothing is done
    for i in range(n):
        off = offsets[i]
        if lengths[i] < _HDR or peer_ids[i] != peer:
            return
        if buf[off] != _MAGIC0 or buf[off + 1] != _MAGIC1 or buf[off + 3] != _DATA:
            return
        if _u32(buf, off + 12) != session_id:
            return
        stream = _u32(buf, off + 20)
        if stream & reliable_bit or stream == probe_stream:
            return
    # 2. the software NIC
    run_burst(buf, offsets[:n], lengths[:n], True, n, 1, batch, status, frame_types, homes,
              values, acl_results, payloads, pending, slots, shift, class_root, groups,
              bound_lo, bound_result, fields_end, key_counts, counters, malformed, desc,
              verdicts, digests, digest_state, result)
    frames = result[RESULT_FRAMES]
    m = result[RESULT_MESSAGES]
    nd = result[RESULT_DESCRIPTORS]
    res[CODE] = NIC_ONLY
    res[FRAMES] = frames
    res[MESSAGES] = m
    res[DESCRIPTORS] = nd
    unknown = 0
    for j in range(m):
        if verdicts[j] == _UNKNOWN_KEY:
            unknown += 1
    res[UNKNOWN] = unknown
    if frames < n:
        return
    # 3. every egress is one the kernel frames for, with room in its queue
    need0 = 0
    need1 = 0
    need2 = 0
    for d in range(nd):
        length = np.int64(desc[d].length)
        first, count, is_group = _fanout(desc[d].kind, np.int64(desc[d].target), group_start,
                                         group_len)
        for g in range(count):
            port = group_ports[first + g] if is_group else first
            if port >= port_kind.shape[0]:
                continue
            kind = port_kind[port]
            if kind == K_GENERAL:
                return
            if kind == K_DELIVER:
                q = port_queue[port]
                if length + _HDR > qmax[q]:
                    return
                if q == 0:
                    need0 += 1
                elif q == 1:
                    need1 += 1
                else:
                    need2 += 1
    if (qcount[0] + need0 > qcapacity[0] or qcount[1] + need1 > qcapacity[1]
            or qcount[2] + need2 > qcapacity[2]):
        return
    # 4. entitlements, then framing in descriptor order; every open frame holds a slot, so
    # at most need0 + need1 + need2 are open at once
    room = need0 + need1 + need2 + 1
    open_q = np.empty(room, np.int64)
    open_peer = np.empty(room, np.int64)
    open_dst = np.empty(room, np.int64)
    open_slot = np.empty(room, np.int64)
    open_pos = np.empty(room, np.int64)
    open_count = np.empty(room, np.int64)
    n_open = 0
    published = 0
    denied = 0
    no_port = 0
    unroutable = 0
    n_hits = 0
    for d in range(nd):
        index = desc[d].index
        if not _member(allowed, batch[index].topic_key):
            denied += 1
            continue
        published += 1
        off = np.int64(desc[d].offset)
        length = np.int64(desc[d].length)
        first, count, is_group = _fanout(desc[d].kind, np.int64(desc[d].target), group_start,
                                         group_len)
        for g in range(count):
            port = group_ports[first + g] if is_group else first
            kind = port_kind[port] if port < port_kind.shape[0] else K_NONE
            if kind == K_NONE:
                no_port += 1
                continue
            if kind == K_UNROUTABLE:
                unroutable += 1
                continue
            if kind != K_DELIVER:
                continue
            q = port_queue[port]
            qpeer = port_peer[port]
            dst = port_dst[port]
            if q == 0:
                qbuf, qoff, qlen, qpeers = b0, o0, l0, p0
            elif q == 1:
                qbuf, qoff, qlen, qpeers = b1, o1, l1, p1
            else:
                qbuf, qoff, qlen, qpeers = b2, o2, l2, p2
            k = -1
            for o in range(n_open):
                if open_q[o] == q and open_peer[o] == qpeer and open_dst[o] == dst:
                    k = o
                    break
            if k >= 0 and (open_pos[k] + length > qmax[q] or open_count[k] >= _MAX_MESSAGES):
                _finish(qbuf, qoff, qlen, open_slot[k], open_pos[k], open_count[k], node_id,
                        dst, session_id)
                n_open -= 1
                open_q[k] = open_q[n_open]
                open_peer[k] = open_peer[n_open]
                open_dst[k] = open_dst[n_open]
                open_slot[k] = open_slot[n_open]
                open_pos[k] = open_pos[n_open]
                open_count[k] = open_count[n_open]
                k = -1
            if k < 0:  # a new frame (the room check left a slot for it)
                slot = qcount[q]
                qcount[q] = slot + 1
                qpeers[slot] = qpeer
                qlen[slot] = 0
                k = n_open
                n_open += 1
                open_q[k] = q
                open_peer[k] = qpeer
                open_dst[k] = dst
                open_slot[k] = slot
                open_pos[k] = _HDR
                open_count[k] = 0
            start = qoff[open_slot[k]] + open_pos[k]
            for b in range(length):
                qbuf[start + b] = buf[off + b]
            open_pos[k] += length
            open_count[k] += 1
            if hits[port] == 0:
                hits[PORTS + n_hits] = port
                n_hits += 1
            hits[port] += 1
    for k in range(n_hits):  # the counts beside the ports, the per-port scratch cleared
        port = hits[PORTS + k]
        hits[2 * PORTS + k] = hits[port]
        hits[port] = 0
    for o in range(n_open):
        q = open_q[o]
        if q == 0:
            _finish(b0, o0, l0, open_slot[o], open_pos[o], open_count[o], node_id,
                    open_dst[o], session_id)
        elif q == 1:
            _finish(b1, o1, l1, open_slot[o], open_pos[o], open_count[o], node_id,
                    open_dst[o], session_id)
        else:
            _finish(b2, o2, l2, open_slot[o], open_pos[o], open_count[o], node_id,
                    open_dst[o], session_id)
    res[CODE] = DONE
    res[PUBLISHED] = published
    res[DENIED] = denied
    res[NO_PORT] = no_port
    res[UNROUTABLE] = unroutable
    res[HITS] = n_hits


