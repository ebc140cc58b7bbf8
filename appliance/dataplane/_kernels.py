"""Numba kernels of the appliance's data path: the express ingress (appliance/dataplane/express.py).

``ingress`` takes a client's burst from the receive buffer to finished egress frames in one
call and runs the software NIC's own kernel inside it; ``receive_forward`` wraps it between
the clients' UDP socket's ``recvmmsg`` and the ``sendmmsg`` of the frames it built for UDP
clients, so a cycle that forwards a client's burst is one call.
The module docstring of appliance/dataplane/express.py says what they do and when they decline.
Arguments are arrays and scalars only; numba infers their types (CONVENTIONS.md #4).
The kernels compile in the code of those they call (the software NIC's ``run_burst``, the
mmsg and frame-header kernels); numba's cache follows this file only, so after a change to
one of those, touch this file (or clear its ``__pycache__``) to recompile.
"""

from __future__ import annotations

import numba
import numpy as np

from appliance.dataplane.fastpath import _uniform_source
from channels._mmsg import receive_datagrams, send_datagrams, wall_clock_ns
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol._kernels import write_frame_header
from nic_offload.model import MAX_EGRESS_PORT
from nic_offload.softnic import (
    RESULT_DESCRIPTORS,
    RESULT_FRAMES,
    RESULT_MESSAGES,
    DescriptorKind,
    MessageVerdict,
    run_burst,
)

FABRIC_Q = 1
"""The kernel frames into three out queues by index: 0 the clients' UDP, 1 the fabric's, 2 the
clients' shared memory (``Express`` is given their names in that order)."""

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
"""The burst is delivered (and counted: see ``ingress``)."""
NIC_ONLY = 2
"""The NIC ran the frames (res holds its counts); the general loop delivers them."""

CODE, FRAMES, MESSAGES, DESCRIPTORS, UNKNOWN = range(5)
"""Words of the result in ``ctl``."""
RESULT_WORDS = 5
QCOUNT, QCAPACITY, QMAX = RESULT_WORDS, RESULT_WORDS + 3, RESULT_WORDS + 6
"""Per out queue (3 words each, by queue index) in ``ctl``: frames queued (updated),
capacity, largest frame."""
SESSION, SENT, RX_COUNT, RX_EXTRA = range(RESULT_WORDS + 9, RESULT_WORDS + 13)
"""``receive_forward``'s words in ``ctl``: the sender's row in the session table (-1: none),
whether it sent queue 0 (``SENT_ALL``: every frame went, the queue is empty; ``SENT_SOME``:
the caller finishes the send from the result in ``tx_out``) and what its ``recvmmsg``
returned (datagrams and truncated ones, or -1 and errno)."""
SENT_NONE, SENT_SOME, SENT_ALL = range(3)
CTL_WORDS = RESULT_WORDS + 13

# what the kernels count (``totals``; ``Express.fold`` adds them to the agent's counters)
T_BURSTS, T_RECEIVES, T_DENIED, T_NO_PORT, T_UNROUTABLE, T_FRAMES_SENT, T_BYTES_SENT = range(7)
TOTAL_WORDS = 7
TOTAL_NAMES = ("express_bursts", "express_receives", "publish_denied", "no_port",
               "unroutable")
"""The agent counters of the first totals (the sent frames and bytes are the channel's)."""

_HDR = fl.FRAME_HEADER_BYTES
_DATA = int(fl.FrameType.DATA)
_GROUP = int(DescriptorKind.GROUP)
_UNKNOWN_KEY = int(MessageVerdict.UNKNOWN_KEY)
_MAX_MESSAGES = ml.MAX_MESSAGES_PER_FRAME
_OQ, _OPEER, _ODST, _OSLOT, _OPOS, _OCOUNT = range(6)
"""Columns of an open frame's row in ``ingress``."""
PORTS = MAX_EGRESS_PORT + 1


@numba.njit(inline="always")
def _index_of(values: np.ndarray, value: int) -> int:
    """Index of ``value`` in the sorted ``values`` (a binary search), or -1."""
    lo = 0
    hi = values.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if values[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < values.shape[0] and values[lo] == value else -1


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
def _queue(q: int, b0: np.ndarray, o0: np.ndarray, l0: np.ndarray, p0: np.ndarray,
           b1: np.ndarray, o1: np.ndarray, l1: np.ndarray, p1: np.ndarray, b2: np.ndarray,
           o2: np.ndarray, l2: np.ndarray, p2: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Out queue ``q``'s batch arrays: buffer, offsets, lengths, peer ids."""
    if q == 0:
        return b0, o0, l0, p0
    if q == 1:
        return b1, o1, l1, p1
    return b2, o2, l2, p2


@numba.njit(inline="always")
def _finish(qbuf, qoff, qlen, slot, pos, count, src, dst, stream) -> None:
    """The header of a built frame (``_OutQueue._finish``: flags 0, send time 0)."""
    at = qoff[slot]
    write_frame_header(qbuf, at, at + pos, count, _DATA, src, dst, stream, 0)
    qlen[slot] = pos


@numba.njit(cache=True, nogil=True)
def ingress(buf, offsets, lengths, peer_ids, n, session_id, row, reliable_bit,
            probe_stream, node_id, allowed, ports, group_start, group_len, group_ports,
            b0, o0, l0, p0, b1, o1, l1, p1, b2, o2, l2, p2, ctl, sess_counts, port_delivered,
            totals, batch, status, frame_types, homes, values, acl_results, payloads,
            pending, slots, shift, class_root, groups, bound_lo, bound_result, fields_end,
            key_counts, counters, malformed, desc, verdicts, digests, digest_state, result):
    """See the module docstring. ``ports[port]`` = (kind, queue, peer, destination
    session); queue q's batch is (bq, oq, lq, pq): buffer, offsets, lengths, peer ids.
    ``ctl`` holds the result words (``CODE``, frames, messages, descriptors, unknown keys)
    and per queue its frame count (updated), capacity and largest frame (``QCOUNT``,
    ``QCAPACITY``, ``QMAX``). A delivered burst is counted where the caller folds it into
    its counters later: messages published and denied by the session in
    ``sess_counts[row]``, messages per egress port in ``port_delivered``, the agent's counts
    in ``totals`` (``T_BURSTS``, ``T_DENIED``, ``T_NO_PORT``, ``T_UNROUTABLE``)."""
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
    # 1. a plain burst of one session (from the peer it logged in from), or nothing is done
    if _uniform_source(buf, offsets, lengths, peer_ids, n, reliable_bit,
                       probe_stream) != session_id:
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
    need = np.zeros(3, np.int64)  # new frames per queue, at most one per (message, port)
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
                need[q] += 1
    for q in range(3):
        if qcount[q] + need[q] > qcapacity[q]:
            return
    # 4. entitlements, then framing in descriptor order; every open frame holds a slot, so
    # at most need.sum() are open at once: rows (queue, peer, destination, slot, bytes so
    # far, messages so far)
    opens = np.empty((need.sum() + 1, 6), np.int64)
    n_open = 0
    published = 0
    denied = 0
    no_port = 0
    unroutable = 0
    for d in range(nd):
        index = desc[d].index
        if _index_of(allowed, batch[index].topic_key) < 0:
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
            qbuf, qoff, qlen, qpeers = _queue(q, b0, o0, l0, p0, b1, o1, l1, p1, b2, o2, l2,
                                              p2)
            k = -1
            for o in range(n_open):
                if opens[o, _OQ] == q and opens[o, _OPEER] == qpeer and opens[o, _ODST] == dst:
                    k = o
                    break
            if k >= 0 and (opens[k, _OPOS] + length > qmax[q]
                           or opens[k, _OCOUNT] >= _MAX_MESSAGES):
                _finish(qbuf, qoff, qlen, opens[k, _OSLOT], opens[k, _OPOS],
                        opens[k, _OCOUNT], node_id, dst, session_id)
                n_open -= 1
                opens[k] = opens[n_open]
                k = -1
            if k < 0:  # a new frame (the room check left a slot for it)
                slot = qcount[q]
                qcount[q] = slot + 1
                qpeers[slot] = qpeer
                qlen[slot] = 0
                k = n_open
                n_open += 1
                opens[k, _OQ] = q
                opens[k, _OPEER] = qpeer
                opens[k, _ODST] = dst
                opens[k, _OSLOT] = slot
                opens[k, _OPOS] = _HDR
                opens[k, _OCOUNT] = 0
            start = qoff[opens[k, _OSLOT]] + opens[k, _OPOS]
            qbuf[start : start + length] = buf[off : off + length]
            opens[k, _OPOS] += length
            opens[k, _OCOUNT] += 1
            port_delivered[port] += 1
    for o in range(n_open):
        qbuf, qoff, qlen, _ = _queue(opens[o, _OQ], b0, o0, l0, p0, b1, o1, l1, p1, b2, o2,
                                     l2, p2)
        _finish(qbuf, qoff, qlen, opens[o, _OSLOT], opens[o, _OPOS], opens[o, _OCOUNT],
                node_id, opens[o, _ODST], session_id)
    res[CODE] = DONE
    sess_counts[row, 0] += published
    sess_counts[row, 1] += denied
    totals[T_BURSTS] += 1
    totals[T_DENIED] += denied
    totals[T_NO_PORT] += no_port
    totals[T_UNROUTABLE] += unroutable


@numba.njit(cache=True, nogil=True)
def receive_forward(prepare, rx_buf_addr, now_ns, rx_h, rx_iov, rx_names, rx_controls,
                    rx_h_addr, rx_names_addr, rx_controls_addr, fd, recv_fn, slot_bytes,
                    capacity, recv_ts_ns, buf, offsets, lengths, peer_ids, udp_peers, udp_rows,
                    sess_ids, sess_bounds, sess_keys, reliable_bit, probe_stream, node_id,
                    ports, group_start, group_len, group_ports, b0, o0, l0, p0, b1, o1, l1, p1,
                    b2, o2, l2, p2, ctl, sess_counts, port_delivered, totals, tx_h, tx_iov,
                    tx_names, tx_h_addr, tx_names_addr, tx_buf_addr, tx_fd, send_fn, errno_fn,
                    clock_fn, clock, clock_addr, tx_out, batch, status, frame_types, homes,
                    values, acl_results, payloads, pending, slots, shift, class_root, groups,
                    bound_lo, bound_result, fields_end, key_counts, counters, malformed, desc,
                    verdicts, digests, digest_state, result):
    """One cycle's receive from the clients' UDP socket, its express ingress and the send of
    the UDP clients' queue (queue 0), in one call:

    0. ``receive_datagrams`` (channels/_mmsg.py: ``prepare``, ``rx_*``, ``fd``, the batch
       arrays ``buf`` ... ``recv_ts_ns``); ``ctl[RX_COUNT]``, ``ctl[RX_EXTRA]`` say what it
       returned; with no datagram, or a truncated one, nothing more is done;
    1. the session the first frame's peer logged in as (``udp_peers`` sorted, its row in
       ``udp_rows``; a row's session id is ``sess_ids[row]``, its publishable keys
       ``sess_keys[sess_bounds[row]:sess_bounds[row + 1]]``, sorted; ``ctl[SESSION]`` = the
       row, -1: none and nothing is done), then ``ingress`` with it (the code in
       ``ctl[CODE]``; nothing more is done unless DONE);
    2. when queue 0 holds frames and ``tx_fd`` >= 0: every one to a UDP peer id, they are sent
       as ``channels._mmsg.send_datagrams`` does with destinations per slot and the send time
       (wall clock, ``clock_gettime`` at ``clock_fn``; 0: no stamp) in their headers, the
       result in ``tx_out``; all sent: queue 0 is emptied (``ctl[QCOUNT]`` = 0), the frames
       and bytes counted in ``totals`` and ``ctl[SENT]`` = ``SENT_ALL``, else ``SENT_SOME``
       (the caller's channel finishes the send). A datagram to a multicast group sends
       nothing (the caller's channel refuses it as any send would).
    """
    ctl[SESSION] = -1
    ctl[SENT] = SENT_NONE
    for w in range(RESULT_WORDS):
        ctl[w] = 0
    n, extra = receive_datagrams(rx_h, rx_iov, rx_names, rx_controls, rx_h_addr, rx_names_addr,
                                 rx_controls_addr, rx_buf_addr, offsets, slot_bytes, prepare,
                                 capacity, fd, lengths, peer_ids, recv_ts_ns, now_ns, recv_fn,
                                 errno_fn)
    ctl[RX_COUNT] = n
    ctl[RX_EXTRA] = extra
    if n <= 0 or extra != 0:
        return
    r = _index_of(udp_peers, peer_ids[0])
    if r < 0:
        return
    row = udp_rows[r]
    ctl[SESSION] = row
    ingress(buf, offsets, lengths, peer_ids, n, sess_ids[row], row, reliable_bit,
            probe_stream, node_id, sess_keys[sess_bounds[row]:sess_bounds[row + 1]], ports,
            group_start, group_len, group_ports, b0, o0, l0, p0, b1, o1, l1, p1, b2, o2, l2,
            p2, ctl, sess_counts, port_delivered, totals, batch, status, frame_types, homes,
            values, acl_results, payloads, pending, slots, shift, class_root, groups,
            bound_lo, bound_result, fields_end, key_counts, counters, malformed, desc,
            verdicts, digests, digest_state, result)
    if ctl[CODE] != DONE:
        return
    totals[T_RECEIVES] += 1
    count = ctl[QCOUNT]
    if count == 0 or tx_fd < 0:
        return
    for i in range(count):
        if p0[i] < 0 or p0[i] >> 48:
            return  # not a UDP peer: the channel's own send says so
    stamp = wall_clock_ns(clock_fn, clock, clock_addr) if clock_fn else 0
    send_datagrams(tx_h, tx_iov, tx_names, tx_h_addr, tx_names_addr, b0, tx_buf_addr, o0, l0,
                   count, 2, 0, 0, p0, False, stamp, tx_fd, send_fn, errno_fn, tx_out)
    if tx_out[1] == count:
        totals[T_FRAMES_SENT] += count
        totals[T_BYTES_SENT] += tx_out[0]
        ctl[QCOUNT] = 0
        ctl[SENT] = SENT_ALL
    else:
        ctl[SENT] = SENT_SOME
