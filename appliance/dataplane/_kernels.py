"""Numba kernels of the appliance's data path: the forwarding pipeline
(appliance/dataplane/express.py).

``pipeline`` takes a received burst of one channel (the clients' UDP or shared memory, or
the fabric's unicast socket) from the receive buffer to finished egress frames in one call:
it classifies every frame by its header (a local client's publish, a neighbour's frame for
this node, a frame in transit, or a *punt* that Python handles: admin frames, reliable
streams, probes, strangers, frames off their path), copies transit frames whole towards
their next hop, runs the software NIC's own kernel over the rest, and frames what it
delivers per egress, splitting a burst that mixes sessions and origins by each frame's own
context. ``receive_forward`` wraps it between the clients' UDP socket's ``recvmmsg`` and the
``sendmmsg`` of the frames it built for UDP clients, so a cycle that forwards a client's
burst is one call.
The module docstring of appliance/dataplane/express.py says what they do and when they decline.
Arguments are arrays and scalars only; numba infers their types (CONVENTIONS.md #4).
The kernels compile in the code of those they call (the software NIC's ``run_burst``, the
mmsg and frame-header kernels); numba's cache follows this file only, so after a change to
one of those, touch this file (or clear its ``__pycache__``) to recompile.
"""

from __future__ import annotations

import numba
import numpy as np

from channels._mmsg import receive_datagrams, send_datagrams, wall_clock_ns
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol._kernels import (
    check_burst_frame,
    check_session_frame,
    sign_session_queue,
    sorted_index,
    write_frame_header,
)
from datapath.protocol.frame_mac import REFUSED
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

# what an egress port is for a neighbour's frame delivered here (``ports[:, P_LOCAL]``):
# K_DELIVER for a client, K_SKIP for destinations and guaranteed egresses (a neighbour's
# plain frame goes to this node's plain clients only), K_NONE, K_GENERAL as above
P_KIND, P_QUEUE, P_PEER, P_DST, P_LOCAL = range(5)
PORT_WORDS = 5
"""Columns of ``ports``: the kind for a local publisher's message, out queue, peer,
destination session, the kind for a neighbour's message."""

# what the kernel returns (res[CODE])
DECLINED = 0
"""Nothing was done: the general loop takes the burst."""
DONE = 1
"""The burst is delivered (and counted: see ``pipeline``)."""
NIC_ONLY = 2
"""Transit frames are queued and the NIC ran the other frames (res holds its counts); the
general loop delivers its results."""

CODE, FRAMES, MESSAGES, DESCRIPTORS, UNKNOWN = range(5)
"""Words of the result in ``ctl``."""
RESULT_WORDS = 5
QCOUNT, QCAPACITY, QMAX = RESULT_WORDS, RESULT_WORDS + 3, RESULT_WORDS + 6
"""Per out queue (3 words each, by queue index) in ``ctl``: frames queued (updated),
capacity, largest frame."""
SELECTED, PUNTED, QSLOT, SENT, RX_COUNT, RX_EXTRA = range(RESULT_WORDS + 9, RESULT_WORDS + 15)
"""More words of ``ctl``: frames the NIC was given (``sel_frame[:SELECTED]``), frames left to
Python (``punt``), the fabric queue's slot size (set by the caller: a transit frame larger
is Python's to refuse); ``receive_forward``'s: whether it sent queue 0 (``SENT_ALL``: every
frame went, the queue is empty; ``SENT_SOME``: the caller finishes the send from the result
in ``tx_out``) and what its ``recvmmsg`` returned (datagrams and truncated ones, or -1 and
errno)."""
SENT_NONE, SENT_SOME, SENT_ALL = range(3)
QSLOT0 = RESULT_WORDS + 15
"""The clients' UDP queue's slot size (set by the caller): room to sign its frames."""
CTL_WORDS = RESULT_WORDS + 16

SOURCE_CLIENTS, SOURCE_FABRIC, SOURCE_GROUP, SOURCE_GIVEN = 0, 1, 2, 3
"""What a burst came from (``pipeline``'s ``source``): the clients, the fabric's unicast
socket, a fabric group (multicast), or the agent itself (parked messages run again), whose
contexts the caller gives in ``fctx``."""
C_INGRESS, C_LOCAL = 0, 1
"""A NIC frame's context (``fctx[f, 0]``): a local client's publish (``fctx[f, 1]`` its
session row, ``fctx[f, 2]`` its session id) or a neighbour's frame for this node (its
origin and stream)."""

# what the kernels count (``totals``; ``Express.fold`` adds them to the agent's counters)
(T_BURSTS, T_RECEIVES, T_DENIED, T_NO_PORT, T_UNROUTABLE, T_TRANSIT, T_PUNTS, T_GROUP,
 T_SELECTED) = range(9)
T_FRAMES_SENT, T_BYTES_SENT = T_SELECTED + 4, T_SELECTED + 5
TOTAL_WORDS = T_SELECTED + 6
TOTAL_NAMES = ("express_bursts", "express_receives", "publish_denied", "no_port",
               "unroutable", "transit_frames", "pipeline_punts", "group_data_frames",
               "pipeline_client_frames", "pipeline_fabric_frames", "pipeline_group_frames",
               "pipeline_parked_frames")
"""The agent counters of the first totals (the sent frames and bytes are the channel's);
``T_SELECTED + source``: frames the NIC ran in the pipeline, by source."""

_HDR = fl.FRAME_HEADER_BYTES
_DATA = int(fl.FrameType.DATA)
_GROUP = int(DescriptorKind.GROUP)
_UNKNOWN_KEY = int(MessageVerdict.UNKNOWN_KEY)
_MAX_MESSAGES = ml.MAX_MESSAGES_PER_FRAME
_OQ, _OPEER, _ODST, _OSLOT, _OPOS, _OCOUNT, _OSRC, _OSTREAM = range(8)
"""Columns of an open frame's row in ``pipeline``."""
_MAGIC0, _MAGIC1 = fl.FRAME_MAGIC >> 8, fl.FRAME_MAGIC & 0xFF
PORTS = MAX_EGRESS_PORT + 1


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


@numba.njit(inline="always")
def _u32(buf: np.ndarray, at: int) -> int:
    return ((np.int64(buf[at]) << 24) | (np.int64(buf[at + 1]) << 16)
            | (np.int64(buf[at + 2]) << 8) | np.int64(buf[at + 3]))


@numba.njit(cache=True, nogil=True)
def pipeline(buf, offsets, lengths, peer_ids, n, source, cli_peers, cli_rows, sess_ids,
             sess_bounds, sess_keys, sess_slots, fab_peers, fab_nodes, fab_rows, auth_link,
             tr_keys, tr_prev, tr_next, reliable_bit, probe_stream, node_id, ports,
             group_start, group_len, group_ports, b0, o0, l0, p0, b1, o1, l1, p1, b2, o2, l2,
             p2, ctl, abytes, actl, windows, cab, cac, skeys, swindows, sel_off, sel_len,
             sel_frame,
             fctx, punt, sess_counts, port_delivered, totals, batch, status, frame_types,
             homes, values, acl_results, payloads, pending, slots, shift, class_root, groups,
             bound_lo, bound_result, fields_end, key_counts, counters, malformed, desc,
             verdicts, digests, digest_state, result):
    """See the module docstring; the steps:

    0. from the fabric or a group: every plain DATA frame of a neighbour (``fab_peers``) is
       checked (datapath/protocol/frame_mac.py ``check_burst_frame``: MAC on the link from
       its node to ``auth_link``, with its window ``fab_rows``, under ``abytes``/``actl``;
       its trailer removed); a refused one is dropped (``punt[i]`` = -1, counted in
       ``actl``); from the clients, a publish of a session with a key (``sess_slots[row]``
       >= 0) is checked under its key and window (``check_session_frame``: ``skeys``,
       ``swindows``, counted in ``cac``), refused ones dropped alike;
    1. classify the ``n`` frames of a burst from ``source``. From the clients: a plain DATA
       frame (no reliable stream, not ``probe_stream``) whose source session is the one its
       peer logged in as (``cli_peers`` sorted, their rows in ``cli_rows``; a row's session
       id is ``sess_ids[row]``) is a publish of that session. From the fabric: a plain DATA
       frame from a neighbour's peer (``fab_peers`` sorted, its node in ``fab_nodes``) whose
       (source, destination) is on its path through this node with that neighbour before
       it (``tr_keys`` = source << 32 | destination, sorted; ``tr_prev``, ``tr_next``: the
       node before, the next hop's peer or -1 here) is in transit (copied whole to its next
       hop) or, here, a delivery of its origin. From a fabric group (``fab_peers`` then
       the group's member senders): a plain DATA frame for every member (destination 0)
       whose source is the member that sent it and whose path to this node is the direct
       link is a delivery of that member. Anything else is punted (``punt[i]`` = 1):
       the caller's general loop handles it, as it always did. The NIC's frames are
       ``sel_frame[:ctl[SELECTED]]`` with their contexts in ``fctx`` (``C_INGRESS`` or
       ``C_LOCAL``, then session row and id, or origin and stream).
    2. room in the fabric queue for the transit frames, or nothing is done (``DECLINED``);
       they are queued;
    3. the software NIC runs the other frames (verdicts, counters, digests, descriptors);
    4. every egress port the descriptors name (a multicast group: each of its ports) must be
       one the kernel frames for with room in its queue, for the frame's context
       (``ports[:, P_KIND]`` for a publish, ``ports[:, P_LOCAL]`` for a neighbour's frame:
       K_DELIVER, K_NONE counted ``no_port``, K_SKIP, K_UNROUTABLE counted); else the
       caller delivers the NIC's results (``NIC_ONLY``);
    5. the publish entitlement of each message of a publish (a binary search in its
       session's sorted keys ``sess_keys[sess_bounds[row]:sess_bounds[row + 1]]``), then the
       messages are framed per (queue, peer, destination, source, stream) in descriptor
       order, exactly as ``_OutQueue.add_message`` and ``_finish`` frame them.

    ``ctl`` holds the result words (``CODE``, frames, messages, descriptors, unknown keys,
    ``SELECTED``, ``PUNTED``) and per queue its frame count (updated), capacity and largest
    frame (``QCOUNT``, ``QCAPACITY``, ``QMAX``), and ``QSLOT``. What is delivered is counted
    where the caller folds it later: messages published and denied per session row in
    ``sess_counts``, messages per egress port in ``port_delivered``, the agent's counts in
    ``totals``."""
    res = ctl
    for w in range(RESULT_WORDS):
        res[w] = 0
    res[SELECTED] = 0
    res[PUNTED] = 0
    if n < 1:
        return
    qcount = ctl[QCOUNT:QCOUNT + 3]
    qcapacity = ctl[QCAPACITY:QCAPACITY + 3]
    qmax = ctl[QMAX:QMAX + 3]
    qslot = ctl[QSLOT]
    # 1. classification (no side effect but the output arrays)
    nsel = 0
    npunt = 0
    ntransit = 0
    ngroup = 0
    for i in range(n):
        punt[i] = 1
        off = offsets[i]
        length = lengths[i]
        if source == SOURCE_GIVEN:  # the caller's frames with the caller's contexts
            punt[i] = 0
            sel_off[nsel] = off
            sel_len[nsel] = length
            sel_frame[nsel] = i
            nsel += 1
            continue
        if (length < _HDR or buf[off] != _MAGIC0 or buf[off + 1] != _MAGIC1
                or buf[off + fl.TYPE_OFFSET] != _DATA):
            npunt += 1
            continue
        if source == SOURCE_FABRIC or source == SOURCE_GROUP:
            if check_burst_frame(buf, offsets, lengths, peer_ids, i, reliable_bit, fab_peers,
                                 fab_nodes, fab_rows, auth_link, abytes, actl,
                                 windows) == REFUSED:
                punt[i] = -1
                continue
            length = lengths[i]
        src = _u32(buf, off + fl.SOURCE_SESSION_OFFSET)
        stream = _u32(buf, off + fl.STREAM_ID_OFFSET)
        if stream & reliable_bit or stream == probe_stream:
            npunt += 1
            continue
        if source == SOURCE_CLIENTS:
            r = sorted_index(cli_peers, peer_ids[i])
            if r < 0 or sess_ids[cli_rows[r]] != src:
                npunt += 1
                continue
            slot = sess_slots[cli_rows[r]]
            if slot >= 0:  # a session with a key: its frame MAC
                length = check_session_frame(buf, off, length, src, node_id, slot, cab, cac,
                                             skeys, swindows)
                if length < 0:
                    punt[i] = -1
                    continue
                lengths[i] = length
            kind = C_INGRESS
            a = cli_rows[r]
            b = src
        elif source == SOURCE_GROUP:  # sent once to the group by a neighbour, for here
            r = sorted_index(fab_peers, peer_ids[i])
            if r < 0 or src != fab_nodes[r] or _u32(buf, off + fl.DEST_SESSION_OFFSET) != 0:
                npunt += 1
                continue
            t = sorted_index(tr_keys, (src << 32) | node_id)
            if t < 0 or tr_prev[t] != src or tr_next[t] >= 0:
                npunt += 1
                continue
            ngroup += 1
            kind = C_LOCAL
            a = src
            b = stream
        else:
            r = sorted_index(fab_peers, peer_ids[i])
            if r < 0:
                npunt += 1
                continue
            dst = _u32(buf, off + fl.DEST_SESSION_OFFSET)
            t = sorted_index(tr_keys, (src << 32) | dst)
            if t < 0 or tr_prev[t] != fab_nodes[r]:
                npunt += 1
                continue
            if tr_next[t] >= 0:  # in transit: punt[i] = 2 + its path until it is queued
                if length > qslot:
                    npunt += 1
                    continue
                punt[i] = 2 + t
                ntransit += 1
                continue
            kind = C_LOCAL
            a = src
            b = stream
        punt[i] = 0
        sel_off[nsel] = off
        sel_len[nsel] = length
        sel_frame[nsel] = i
        fctx[nsel, 0] = kind
        fctx[nsel, 1] = a
        fctx[nsel, 2] = b
        nsel += 1
    # 2. transit frames, whole, to their next hop
    if ntransit:
        if qcount[FABRIC_Q] + ntransit > qcapacity[FABRIC_Q]:
            return
        for i in range(n):
            if punt[i] < 2:
                continue
            t = punt[i] - 2  # the path classification found
            punt[i] = 0
            off = offsets[i]
            length = lengths[i]
            slot = qcount[FABRIC_Q]
            qcount[FABRIC_Q] = slot + 1
            at = o1[slot]
            b1[at : at + length] = buf[off : off + length]
            l1[slot] = length
            p1[slot] = tr_next[t]
        totals[T_TRANSIT] += ntransit
    res[SELECTED] = nsel
    res[PUNTED] = npunt
    totals[T_PUNTS] += npunt
    totals[T_GROUP] += ngroup
    res[CODE] = DONE
    if nsel == 0:
        if ntransit:
            totals[T_BURSTS] += 1
        return
    totals[T_SELECTED + source] += nsel
    # 3. the software NIC
    run_burst(buf, sel_off[:nsel], sel_len[:nsel], True, nsel, 1, batch, status, frame_types,
              homes, values, acl_results, payloads, pending, slots, shift, class_root, groups,
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
    if frames < nsel:
        return
    # 4. every egress is one the kernel frames for, with room in its queue
    need = np.zeros(3, np.int64)  # new frames per queue, at most one per (message, port)
    for d in range(nd):
        length = np.int64(desc[d].length)
        column = P_KIND if fctx[batch[desc[d].index].frame_index, 0] == C_INGRESS else P_LOCAL
        first, count, is_group = _fanout(desc[d].kind, np.int64(desc[d].target), group_start,
                                         group_len)
        for g in range(count):
            port = group_ports[first + g] if is_group else first
            if port >= ports.shape[0]:
                continue
            kind = ports[port, column]
            if kind == K_GENERAL:
                return
            if kind == K_DELIVER:
                q = ports[port, P_QUEUE]
                if length + _HDR > qmax[q]:
                    return
                need[q] += 1
    for q in range(3):
        if qcount[q] + need[q] > qcapacity[q]:
            return
    # 5. entitlements, then framing in descriptor order; every open frame holds a slot, so
    # at most need.sum() are open at once: rows (queue, peer, destination, slot, bytes so
    # far, messages so far, source, stream)
    opens = np.empty((need.sum() + 1, 8), np.int64)
    n_open = 0
    denied = 0
    no_port = 0
    unroutable = 0
    last = -1
    ok = False
    for d in range(nd):
        index = desc[d].index
        f = batch[index].frame_index
        ingress = fctx[f, 0] == C_INGRESS
        if ingress:
            row = fctx[f, 1]
            if index != last:  # a message's descriptors are consecutive: checked once
                last = index
                ok = sorted_index(sess_keys[sess_bounds[row]:sess_bounds[row + 1]],
                               batch[index].topic_key) >= 0
                if ok:
                    sess_counts[row, 0] += 1
                else:
                    sess_counts[row, 1] += 1
                    denied += 1
            if not ok:
                continue
            src = node_id
            column = P_KIND
        else:
            src = fctx[f, 1]
            column = P_LOCAL
        stream = fctx[f, 2]
        off = np.int64(desc[d].offset)
        length = np.int64(desc[d].length)
        first, count, is_group = _fanout(desc[d].kind, np.int64(desc[d].target), group_start,
                                         group_len)
        for g in range(count):
            port = group_ports[first + g] if is_group else first
            kind = ports[port, column] if port < ports.shape[0] else K_NONE
            if kind == K_NONE:
                no_port += 1
                continue
            if kind == K_UNROUTABLE:
                unroutable += 1
                continue
            if kind != K_DELIVER:
                continue
            q = ports[port, P_QUEUE]
            qpeer = ports[port, P_PEER]
            dst = ports[port, P_DST]
            qbuf, qoff, qlen, qpeers = _queue(q, b0, o0, l0, p0, b1, o1, l1, p1, b2, o2, l2,
                                              p2)
            k = -1
            for o in range(n_open):
                if (opens[o, _OQ] == q and opens[o, _OPEER] == qpeer and opens[o, _ODST] == dst
                        and opens[o, _OSRC] == src and opens[o, _OSTREAM] == stream):
                    k = o
                    break
            if k >= 0 and (opens[k, _OPOS] + length > qmax[q]
                           or opens[k, _OCOUNT] >= _MAX_MESSAGES):
                _finish(qbuf, qoff, qlen, opens[k, _OSLOT], opens[k, _OPOS],
                        opens[k, _OCOUNT], src, dst, stream)
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
                opens[k, _OSRC] = src
                opens[k, _OSTREAM] = stream
            start = qoff[opens[k, _OSLOT]] + opens[k, _OPOS]
            qbuf[start : start + length] = buf[off : off + length]
            opens[k, _OPOS] += length
            opens[k, _OCOUNT] += 1
            port_delivered[port] += 1
    for o in range(n_open):
        qbuf, qoff, qlen, _ = _queue(opens[o, _OQ], b0, o0, l0, p0, b1, o1, l1, p1, b2, o2,
                                     l2, p2)
        _finish(qbuf, qoff, qlen, opens[o, _OSLOT], opens[o, _OPOS], opens[o, _OCOUNT],
                opens[o, _OSRC], opens[o, _ODST], opens[o, _OSTREAM])
    res[CODE] = DONE
    totals[T_BURSTS] += 1
    totals[T_DENIED] += denied
    totals[T_NO_PORT] += no_port
    totals[T_UNROUTABLE] += unroutable


@numba.njit(cache=True, nogil=True)
def receive_forward(prepare, rx_buf_addr, now_ns, rx_h, rx_iov, rx_names, rx_controls,
                    rx_h_addr, rx_names_addr, rx_controls_addr, fd, recv_fn, slot_bytes,
                    capacity, recv_ts_ns, buf, offsets, lengths, peer_ids, cli_peers, cli_rows,
                    sess_ids, sess_bounds, sess_keys, sess_slots, fab_peers, fab_nodes,
                    fab_rows, auth_link, tr_keys, tr_prev, tr_next, reliable_bit, probe_stream,
                    node_id, ports, group_start, group_len, group_ports, b0, o0, l0, p0, b1,
                    o1, l1, p1, b2, o2, l2, p2, ctl, abytes, actl, windows, cab, cac, skeys,
                    swindows, sel_off, sel_len, sel_frame,
                    fctx, punt, sess_counts, port_delivered,
                    totals, tx_h, tx_iov, tx_names, tx_h_addr, tx_names_addr, tx_buf_addr,
                    tx_fd, send_fn, errno_fn, clock_fn, clock, clock_addr, tx_out, batch,
                    status, frame_types, homes, values, acl_results, payloads, pending, slots,
                    shift, class_root, groups, bound_lo, bound_result, fields_end, key_counts,
                    counters, malformed, desc, verdicts, digests, digest_state, result):
    """One cycle's receive from the clients' UDP socket, its pipeline and the send of the UDP
    clients' queue (queue 0), in one call:

    0. ``receive_datagrams`` (channels/_mmsg.py: ``prepare``, ``rx_*``, ``fd``, the batch
       arrays ``buf`` ... ``recv_ts_ns``); ``ctl[RX_COUNT]``, ``ctl[RX_EXTRA]`` say what it
       returned; with no datagram, or a truncated one, nothing more is done;
    1. ``pipeline`` over the burst as one from the clients (``cli_peers``, ``cli_rows``: the
       UDP sessions' peer ids, sorted, and their rows); nothing more is done unless DONE;
    2. when queue 0 holds frames and ``tx_fd`` >= 0: every one to a UDP peer id, they are sent
       as ``channels._mmsg.send_datagrams`` does with destinations per slot and the send time
       (wall clock, ``clock_gettime`` at ``clock_fn``; 0: no stamp) in their headers, the
       result in ``tx_out``; all sent: queue 0 is emptied (``ctl[QCOUNT]`` = 0), the frames
       and bytes counted in ``totals`` and ``ctl[SENT]`` = ``SENT_ALL``, else ``SENT_SOME``
       (the caller's channel finishes the send). A datagram to a multicast group sends
       nothing (the caller's channel refuses it as any send would). Before the send, the
       frames to sessions with a key get their MAC (``sign_session_queue``: the UDP
       sessions' ``cli_peers``, ``cli_rows``, ``sess_slots``, keys ``skeys``; scratch,
       counts and sequence ``cab``, ``cac``; room ``ctl[QSLOT0]``), as
       ``SessionAuth.sign`` signs the queue when Python sends it.
    """
    ctl[SENT] = SENT_NONE
    ctl[SELECTED] = 0
    ctl[PUNTED] = 0
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
    pipeline(buf, offsets, lengths, peer_ids, n, SOURCE_CLIENTS, cli_peers, cli_rows, sess_ids,
             sess_bounds, sess_keys, sess_slots, fab_peers, fab_nodes, fab_rows, auth_link,
             tr_keys, tr_prev, tr_next, reliable_bit, probe_stream, node_id, ports,
             group_start, group_len, group_ports, b0, o0, l0, p0, b1, o1, l1, p1, b2, o2, l2,
             p2, ctl, abytes, actl, windows, cab, cac, skeys, swindows, sel_off, sel_len,
             sel_frame,
             fctx, punt, sess_counts, port_delivered, totals, batch, status, frame_types,
             homes, values, acl_results, payloads, pending, slots, shift, class_root, groups,
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
    sign_session_queue(b0, o0, l0, p0, count, ctl[QSLOT0], cli_peers, cli_rows, sess_slots,
                       now_ns, cab, cac, skeys)
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
