"""The express path of the data-path agent: a client's burst from the receive buffer to
finished egress frames in one compiled call.

The agent's general loop (appliance/dataplane/agent.py) spends a few microseconds of Python per
frame, per descriptor and per message framed, on top of a fixed cost per step; for a burst
of one frame that was ~100 us of a ~110 us duty cycle, which capped how many one-message
frames an appliance forwards and put every message behind the ones before it. ``ingress``
does the same work in one numba kernel (``appliance.dataplane._kernels.ingress``), which runs the
software NIC's own kernel (``nic_offload.softnic.run_burst``) inside it, so a burst costs
one call:

1. the burst must be plain DATA frames of one client session (every frame from the peer
   the session logged in from, with its session id as the source, none on a reliable stream
   or a telemetry probe); otherwise nothing is done and the general loop takes it;
2. the software NIC runs the frames (verdicts, counters, digests, descriptors as always);
3. every egress port the descriptors name (a multicast group: each of its ports) must be
   one the kernel can frame for: a UDP or shared-memory client, a destination appliance
   reached by unicast over its next hop, a port without an egress (counted ``no_port``), a
   client gone, a destination without a path (``unroutable``); guaranteed egresses, fabric
   groups, duplication mode and out queues without room are the general loop's, which then
   delivers the NIC's results (``DataPlaneAgent._deliver``) as it would have;
4. the publish entitlement of each forwarded message (a binary search in the session's
   sorted keys), then the messages are framed per (queue, peer, destination session) in
   descriptor order into the out queues' batches, headers finished, exactly as
   ``_OutQueue.add_message`` and ``_finish`` frame them; the agent sends them at the end of
   its cycle as any other frame.

For the clients' UDP socket the agent's receive is itself part of the call
(``Express.receive``, kernel ``receive_forward``): the ``recvmmsg``, the lookup of the
sender's session by its peer id (``SessionTable``), the steps above, and the ``sendmmsg``
of the frames for UDP clients are one kernel call, so no Python runs between a datagram's
arrival and its forward's send. What the kernels deliver is counted in arrays (per session
row, per egress port, the agent's totals, the frames and bytes sent) that ``Express.fold``
adds to the sessions, the counters and the channel's statistics before the agent publishes
its status, instead of Python after every burst.

The egress tables the kernel reads (``ExpressPlan``: per port its kind, out queue, peer and
destination session; multicast groups flattened) are rebuilt when the forwarding tables,
the sessions or the snapshot change, the session table when the sessions or their keys do.
``ENABLED`` switches the path off (the tests run the same traffic both ways and compare).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from appliance.dataplane import fastpath as _fastpath
from appliance.dataplane._kernels import (
    CODE,
    CTL_WORDS,
    DECLINED,
    DONE,
    FABRIC_Q,
    K_DELIVER,
    K_GENERAL,
    K_SKIP,
    K_UNROUTABLE,
    NIC_ONLY,
    PORTS,
    QCAPACITY,
    QCOUNT,
    QMAX,
    RESULT_WORDS,
    RX_COUNT,
    RX_EXTRA,
    SENT,
    SENT_SOME,
    SESSION,
    T_BYTES_SENT,
    T_FRAMES_SENT,
    TOTAL_NAMES,
    TOTAL_WORDS,
    UNKNOWN,
    ingress,
    receive_forward,
)
from channels import _mmsg
from nic_offload.softnic import BurstResult

ENABLED = True
"""False: the general loop does everything (tests compare both)."""

UNTRIED, TAKEN, DECLINED_BURST = range(3)
"""What ``Express.receive`` did with the frames it received: not tried them (the general loop
may try ``Express.ingress``), delivered them all, or declined them (the general loop takes
them as they are)."""


@dataclass
class ExpressPlan:
    """The egress tables the kernel reads, for one (tables, sessions, snapshot)."""

    ports: np.ndarray
    """(port, 4) int64: kind, out queue, peer, destination session."""
    owners: list
    """Port -> the DpSession it delivers to (its ``delivered`` count), else None."""
    group_start: np.ndarray
    group_len: np.ndarray
    group_ports: np.ndarray
    """Multicast group g's ports: ``group_ports[group_start[g]:][:group_len[g]]``."""


def build_plan(dp: Any, snapshot: Any, queues: tuple[str, ...]) -> ExpressPlan | None:
    """The plan for the agent's current tables and sessions and the NIC's ``snapshot``
    (``queues``: the out queues' names by the kernel's index), or None when the kernel may
    not run at all (duplication mode: the general loop sends those messages on two paths)."""
    tables = dp.tables
    if tables.dup_keys:
        return None
    ports = np.zeros((PORTS, 4), np.int64)  # kind K_NONE
    owners: list = [None] * PORTS
    for port, (what, arg) in tables.ports.items():
        if not 0 <= port < PORTS:
            continue
        row = ports[port]
        if what == "client":
            session = dp.sessions.get(arg)
            if session is None:
                row[0] = K_SKIP
            elif session.channel != queues[FABRIC_Q] and session.channel in queues:
                row[:] = (K_DELIVER, queues.index(session.channel), session.dest,
                          session.session_id)
                owners[port] = session
            else:
                row[0] = K_GENERAL
        elif what == "node" and not tables.group_direct.get(arg):
            hop = tables.next_hop.get(arg)
            if hop is None:
                row[0] = K_UNROUTABLE
            else:
                row[:] = (K_DELIVER, FABRIC_Q, hop, arg)
        else:  # guaranteed egresses, destinations over a fabric group
            row[0] = K_GENERAL
    groups = snapshot.entries.groups
    top = max((g.group_id for g in groups), default=0)
    start = np.zeros(top + 1, np.int64)
    count = np.zeros(top + 1, np.int64)
    flat: list[int] = []
    for g in groups:
        start[g.group_id] = len(flat)
        count[g.group_id] = len(g.ports)
        flat.extend(g.ports)
    return ExpressPlan(ports, owners, start, count, np.asarray(flat or [0], np.int64))


@dataclass
class SessionTable:
    """The agent's client sessions by row: the kernels count per row, and ``receive_forward``
    finds a UDP burst's sender by its peer id."""

    sessions: list
    """Row -> its DpSession."""
    rows: dict
    """Session id -> row."""
    ids: np.ndarray
    """Each row's session id."""
    bounds: np.ndarray
    """Row r's publishable keys are ``keys[bounds[r]:bounds[r + 1]]`` (sorted uint64)."""
    keys: np.ndarray
    udp_peers: np.ndarray
    """Sorted int64 peer ids of the sessions logged in over the clients' UDP channel ..."""
    udp_rows: np.ndarray
    """... and their rows."""
    counts: np.ndarray
    """(row, 2) int64: messages published and denied since the last ``Express.fold``."""


def build_sessions(dp: Any, udp_channel: str) -> SessionTable:
    """The table of the agent's sessions (``udp_channel``: the clients' UDP channel)."""
    by_peer = sorted(((name, peer), session) for (name, peer), session in dp._by_peer.items())
    sessions = [session for _, session in by_peer]
    keys = [_fastpath._allowed(session) for session in sessions]
    bounds = np.zeros(len(sessions) + 1, np.int64)
    bounds[1:] = np.cumsum([len(k) for k in keys], dtype=np.int64)
    udp = [(peer, row) for row, ((name, peer), _) in enumerate(by_peer) if name == udp_channel]
    return SessionTable(
        sessions, {s.session_id: row for row, s in enumerate(sessions)},
        np.asarray([s.session_id for s in sessions], np.int64), bounds,
        np.concatenate(keys) if keys else np.zeros(0, np.uint64),
        np.asarray([peer for peer, _ in udp], np.int64),
        np.asarray([row for _, row in udp], np.int64),
        np.zeros((len(sessions), 2), np.int64))


class Express:
    """The express path of one data-path agent: its plan, session table, arrays and the
    kernels' compiled entry points.

    The kernels count what they deliver in arrays (per session row, per egress port, and
    the agent's totals) instead of handing the counts back per burst; ``fold`` adds them to
    the sessions, the agent's counters and the channel's statistics (the agent calls it
    before it publishes its status; a plan or table about to be replaced is folded first).
    """

    def __init__(self, dp: Any, queues: tuple[str, str, str]) -> None:
        """``queues``: the names of the agent's out queues for the clients' UDP, the fabric
        and the clients' shared memory, in that order (the kernel's queue indexes)."""
        self.dp = dp
        self.queues = queues
        self.plan: ExpressPlan | None = None
        self._plan_for: tuple = (None, -1, -1)
        """(tables, sessions version, snapshot version) the plan was built for."""
        self.sessions = build_sessions(dp, queues[0])
        self._sessions_for: tuple = (dp.sessions_version, dp.allowed_version)
        """(sessions version, allowed keys version) the session table was built for."""
        self.ctl = np.zeros(CTL_WORDS, np.int64)
        self.port_delivered = np.zeros(PORTS, np.int64)
        """Messages framed per egress port since the last fold (the plan's owners')."""
        self.totals = np.zeros(TOTAL_WORDS, np.int64)
        self._queues = [dp._out[name] for name in queues]
        self._queue_arrays: list[np.ndarray] = []
        for i, q in enumerate(self._queues):
            b = q.batch
            self._queue_arrays += [b.buf, b.offsets, b.lengths, b.peer_ids]
            self.ctl[QCAPACITY + i] = b.capacity
            self.ctl[QMAX + i] = q.max_frame_bytes
        self._clock = np.zeros(2, np.int64)
        self._clock_addr, self._clock_keep = _mmsg.address_of(self._clock)
        self._fused_args: tuple = ()
        self._fused_for: tuple = ()
        """The arguments of ``receive_forward`` after its first three, and (plan, session
        table, NIC state, channel, batch) they were made for (rebuilt when any changes)."""
        self._rx: Any = None
        self._tx: Any = None
        self._tx_channel: Any = None
        self._call, self._fused = self._compile()

    def _compile(self) -> tuple[Any, Any]:
        """Compile (or load from numba's cache) the kernels for the agent's own array types
        (a call with no frames returns at once), and return those overloads' entry points:
        called directly they skip the dispatcher's type matching (~half of the call's cost
        with 50 arguments); every later call passes the same arrays and kinds of scalar."""
        _snap, state = self.dp.nic.burst_state()
        empty = np.zeros(1, np.int64)
        keys = np.zeros(0, np.uint64)
        fan = (np.zeros((1, 4), np.int64), empty, empty, empty)
        counts = (self.ctl, np.zeros((1, 2), np.int64), self.port_delivered, self.totals)
        args = (self._queue_arrays[0], empty, empty, empty, 0, 0, 0, 0, 0, 0, keys, *fan,
                *self._queue_arrays, *counts, *state)
        ingress(*args)
        vec = _mmsg.MmsgVector(1)
        words = (vec.h64, vec.iov64, vec.names64, vec.controls64)
        fused = (0, 0, 0, *words, 0, 0, 0, -1, _mmsg.RECVMMSG_ADDRESS, 0, 0, empty,
                 self._queue_arrays[0], empty, empty.copy(), empty.copy(), empty, empty,
                 empty, empty, keys, 0, 0, 0, *fan, *self._queue_arrays, *counts, *words[:3],
                 0, 0, 0, -1, _mmsg.SENDMMSG_ADDRESS, _mmsg.ERRNO_LOCATION_ADDRESS, 0,
                 self._clock, 0, vec.send_result, *state)
        receive_forward(*fused)
        return (ingress.overloads[tuple(numba.typeof(a) for a in args)].entry_point,
                receive_forward.overloads[tuple(numba.typeof(a) for a in fused)].entry_point)

    def _current_plan(self, snapshot: Any) -> ExpressPlan | None:
        dp = self.dp
        tables, sessions_version, snapshot_version = self._plan_for
        if (tables is not dp.tables or sessions_version != dp.sessions_version
                or snapshot_version != snapshot.version):
            self.fold()
            self.plan = build_plan(dp, snapshot, self.queues)
            self._plan_for = (dp.tables, dp.sessions_version, snapshot.version)
        return self.plan

    def _current_sessions(self) -> SessionTable:
        dp = self.dp
        if self._sessions_for != (dp.sessions_version, dp.allowed_version):
            self.fold()
            self.sessions = build_sessions(dp, self.queues[0])
            self._sessions_for = (dp.sessions_version, dp.allowed_version)
        return self.sessions

    def fold(self) -> None:
        """Add what the kernels counted to the sessions, the plan's owners, the agent's
        counters and the UDP channel's statistics, and start counting from zero."""
        table = self.sessions
        counts = table.counts
        if counts.any():
            for row in np.flatnonzero(counts.any(axis=1)).tolist():
                session = table.sessions[row]
                session.published += int(counts[row, 0])
                session.denied += int(counts[row, 1])
            counts[:] = 0
        delivered = self.port_delivered
        if self.plan is not None and delivered.any():
            owners = self.plan.owners
            for port in np.flatnonzero(delivered).tolist():
                if owners[port] is not None:
                    owners[port].delivered += int(delivered[port])
        delivered[:] = 0
        totals = self.totals
        if totals.any():
            counters = self.dp.counters
            for name, value in zip(TOTAL_NAMES, totals.tolist()):
                if value:
                    counters[name] += value
            if totals[T_FRAMES_SENT] and self._tx_channel is not None:
                self._tx_channel.stats.on_send(int(totals[T_FRAMES_SENT]),
                                               int(totals[T_BYTES_SENT]))
            totals[:] = 0

    def ingress(self, name: str, batch: Any, now_ns: int, reliable_bit: int, probe: int,
                deadline: int) -> bool:
        """Run a client burst the express way; False when the general loop must take it
        (nothing done)."""
        dp = self.dp
        n = batch.count
        peer = int(batch.peer_ids[0])
        session = dp._by_peer.get((name, peer))
        if session is None:
            return False
        queues = self._queues
        q0, q1, q2 = queues
        if q0._open or q1._open or q2._open:
            return False  # a frame the general loop is building: it keeps the order
        snap, state = dp.nic.burst_state()
        if dp.rerun_parked_before(snap.version, now_ns):  # on the snapshot the kernel uses
            snap, state = dp.nic.burst_state()
            if dp._parked and snap.version != dp._parked_version:
                return False  # another snapshot meanwhile: the general loop sees to it
        plan = self._current_plan(snap)
        table = self._current_sessions()
        row = table.rows.get(session.session_id)
        if plan is None or row is None:
            return False
        ctl = self.ctl
        ctl[QCOUNT] = q0.batch.count
        ctl[QCOUNT + 1] = q1.batch.count
        ctl[QCOUNT + 2] = q2.batch.count
        self._call(batch.buf, batch.offsets, batch.lengths, batch.peer_ids, n,
                   session.session_id, row, reliable_bit, probe, dp.node_id,
                   table.keys[table.bounds[row]:table.bounds[row + 1]], plan.ports,
                   plan.group_start, plan.group_len, plan.group_ports, *self._queue_arrays,
                   ctl, table.counts, self.port_delivered, self.totals, *state)
        return self._settle(session, snap, batch, now_ns, deadline)

    def receive(self, channel: Any, batch: Any, now_ns: int, reliable_bit: int, probe: int,
                deadline: int) -> tuple[int, int]:
        """The clients' UDP receive of a cycle: (frames received, ``TAKEN``, ``UNTRIED`` or
        ``DECLINED_BURST``). With nothing in the way (no frame being built, no parked
        message to rerun first, a plan) the receive, the express ingress and the send of
        the UDP clients' queue are one call (``receive_forward``): after a datagram arrives
        no Python runs before its forward is sent. Else, or when the kernel declines the
        burst, the frames are left in ``batch`` for the general loop."""
        dp = self.dp
        q0, q1, q2 = self._queues
        plan = None
        if not (channel.closed or q0._open or q1._open or q2._open
                or channel.multicast_sender):
            snap, state = dp.nic.burst_state()
            # parked messages (keys unknown) would park again on this snapshot: later
            # bursts may go on (as in the general loop); on a newer one they run first
            if not dp._parked or snap.version == dp._parked_version:
                plan = self._current_plan(snap)
        if plan is None:
            return channel.receive(batch, 0), UNTRIED
        table = self._current_sessions()
        made = self._fused_for
        if not (made and made[0] is plan and made[1] is table and made[2] is state
                and made[3] is channel and made[4] is batch):
            self._fused_args = self._fused_tail(channel, batch, plan, table, state,
                                                reliable_bit, probe)
            self._fused_for = (plan, table, state, channel, batch)
        ctl = self.ctl
        ctl[QCOUNT] = q0.batch.count
        ctl[QCOUNT + 1] = q1.batch.count
        ctl[QCOUNT + 2] = q2.batch.count
        rx = self._rx
        prepare, rx_buf_addr = rx.receive_plan(batch.buf, batch.offsets, batch.slot_bytes,
                                               batch.capacity)
        self._fused(prepare, rx_buf_addr, time.time_ns(), *self._fused_args)
        words = ctl.tolist()
        got = words[RX_COUNT]
        rx.received(got)
        n = channel.finish_receive(batch, got, words[RX_EXTRA])
        code, unknown, row, sent = words[CODE], words[UNKNOWN], words[SESSION], words[SENT]
        q0.batch.count, q1.batch.count, q2.batch.count = words[QCOUNT:QCOUNT + 3]
        if not n or row < 0:
            return n, DECLINED_BURST
        if code == DONE and not unknown and sent != SENT_SOME:  # all done (the common case)
            return n, TAKEN
        if not self._settle(table.sessions[row], snap, batch, now_ns, deadline):
            return n, DECLINED_BURST
        if sent == SENT_SOME:  # the channel finishes the send (retries, errors, refusal)
            total, k, err = self._tx.send_result.tolist()
            if total < 0:  # a multicast destination: the channel's send refuses it
                q0.flush()
            else:
                dp.counted_udp_send(self.queues[0], q0.batch.count, channel.finish_send(
                    q0.batch.arrays(), self._tx, total, k, err))
                q0.batch.count = 0
        return n, TAKEN

    def _fused_tail(self, channel: Any, batch: Any, plan: ExpressPlan, table: SessionTable,
                    state: tuple, reliable_bit: int, probe: int) -> tuple:
        """``receive_forward``'s arguments after its first three; ``_rx``, ``_tx`` := the I/O
        vectors of the receive batch and of the UDP clients' queue (only ever sent from)."""
        q0 = self._queues[0]
        if channel is not self._tx_channel:
            self.fold()  # the sent frames so far are the old channel's
        rx = self._rx = channel.io_vector(batch)
        tx = self._tx = channel.io_vector(q0.batch)
        self._tx_channel = channel
        tx.sending()
        return (rx.h64, rx.iov64, rx.names64, rx.controls64, rx.hdr_addr, rx.names_addr,
                rx.controls_addr, channel.fileno(), _mmsg.RECVMMSG_ADDRESS, batch.slot_bytes,
                batch.capacity, batch.recv_ts_ns, batch.buf, batch.offsets, batch.lengths,
                batch.peer_ids, table.udp_peers, table.udp_rows, table.ids, table.bounds,
                table.keys, reliable_bit, probe, self.dp.node_id, plan.ports,
                plan.group_start, plan.group_len, plan.group_ports, *self._queue_arrays,
                self.ctl, table.counts, self.port_delivered, self.totals, tx.h64, tx.iov64,
                tx.names64, tx.hdr_addr, tx.names_addr, tx.pin(q0.batch.buf),
                channel.fileno(), _mmsg.SENDMMSG_ADDRESS, _mmsg.ERRNO_LOCATION_ADDRESS,
                _mmsg.CLOCK_GETTIME_ADDRESS if channel.stamp_send_ts else 0, self._clock,
                self._clock_addr, tx.send_result, *state)

    def _settle(self, session: Any, snap: Any, batch: Any, now_ns: int,
                deadline: int) -> bool:
        """After a kernel ran a burst of ``session``: the general loop delivers what the NIC
        ran when the kernel left it that (True), the out queues take the counts of a
        delivered burst and its messages with unknown keys are parked (True), or nothing was
        done (False)."""
        dp = self.dp
        n = batch.count
        ctl = self.ctl
        code, frames, messages, descriptors, unknown = ctl[:RESULT_WORDS].tolist()
        if code == DECLINED:
            return False
        if code == NIC_ONLY:
            ctxs = [dp.ingress_ctx(session, deadline)] * n
            dp._deliver(batch.buf, BurstResult(snap.version, frames, messages, descriptors),
                        ctxs, now_ns)
            if 0 < frames < n:
                dp._run(batch, list(range(frames, n)), ctxs[frames:], now_ns)
            dp.counters["express_to_general"] += 1
            return True
        q0, q1, q2 = self._queues
        q0.batch.count, q1.batch.count, q2.batch.count = ctl[QCOUNT:QCOUNT + 3].tolist()
        if unknown:
            ctxs = [dp.ingress_ctx(session, deadline)] * n
            dp._park_unknown(batch.buf, messages, ctxs, now_ns)
        return True
