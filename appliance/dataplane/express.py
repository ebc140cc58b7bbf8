"""The forwarding pipeline of the data-path agent: a received burst from the receive buffer
to finished egress frames in one compiled call, whatever it mixes.

The agent's general loop (appliance/dataplane/agent.py) spends a few microseconds of Python per
frame, per descriptor and per message framed, on top of a fixed cost per step; for a burst
of one frame that was ~100 us of a ~110 us duty cycle. ``Express.run`` does the same work in
one numba kernel (``appliance.dataplane._kernels.pipeline``), which runs the software NIC's
own kernel (``nic_offload.softnic.run_burst``) inside it, for every burst of the clients'
UDP socket, the clients' shared memory, the fabric's unicast socket and its groups, and for
the parked messages the agent runs again (``run_given``):

0. every plain DATA frame from a neighbour or a group member is checked: its MAC on its
   link and its replay window (appliance/dataplane/frame_auth.py); a refused one is dropped
   and counted, the trailer of a good one removed;
1. every frame is classified by its header: a plain DATA frame of a client session (from the
   peer the session logged in from, with its session id as the source) is that session's
   publish; a plain DATA frame from a neighbour, on the path of its (source, destination)
   through this node, is in transit (copied whole to its next hop) or delivered here, as
   is one a member neighbour sent once to a fabric group for every member; what
   is left (admin frames, reliable streams and their control, telemetry probes, strangers,
   frames off their path or duplicated, malformed frames) is *punted*: the agent's general
   loop takes those frames alone, after the call, as it always did. A burst that mixes
   sessions, peers and origins is split per frame by its own context inside the kernel;
2. the software NIC runs the frames (verdicts, counters, digests, descriptors as always);
3. every egress port the descriptors name (a multicast group: each of its ports) must be
   one the kernel can frame for: a UDP or shared-memory client, a destination appliance
   reached by unicast over its next hop, a port without an egress (counted ``no_port``), a
   client gone, a destination without a path (``unroutable``); guaranteed egresses, fabric
   groups, duplication mode and out queues without room are the general loop's, which then
   delivers the NIC's results (``DataPlaneAgent._deliver``) as it would have;
4. the publish entitlement of each message of a publish (a binary search in its session's
   sorted keys), then the messages are framed per (queue, peer, destination session,
   source, stream) in descriptor order into the out queues' batches, headers finished,
   exactly as ``_OutQueue.add_message`` and ``_finish`` frame them; the agent sends them at
   the end of its cycle as any other frame.

For the clients' UDP socket the agent's receive is itself part of the call
(``Express.receive``, kernel ``receive_forward``): the ``recvmmsg``, the steps above, and
the ``sendmmsg`` of the frames for UDP clients are one kernel call, so no Python runs
between a datagram's arrival and its forward's send. What the kernels deliver is counted in
arrays (per session row, per egress port, the agent's totals, the frames and bytes sent)
that ``Express.fold`` adds to the sessions, the counters and the channel's statistics before
the agent publishes its status, instead of Python after every burst.

The tables the kernel reads (``ExpressPlan``: per port its kinds, out queue, peer and
destination session, multicast groups flattened, the neighbours' peers and the transit
paths) are rebuilt when the forwarding tables, the sessions or the snapshot change, the
session table when the sessions or their keys do. ``ENABLED`` switches the pipeline off:
the general loop, which stays as its test oracle, then does everything (the differential
tests run the same traffic both ways and compare).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numba
import numpy as np

from appliance.dataplane._kernels import (
    C_INGRESS,
    C_LOCAL,
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
    P_LOCAL,
    PORT_WORDS,
    PORTS,
    PUNTED,
    QCAPACITY,
    QCOUNT,
    QMAX,
    QSLOT,
    QSLOT0,
    RESULT_WORDS,
    RX_COUNT,
    RX_EXTRA,
    SELECTED,
    SENT,
    SENT_SOME,
    SOURCE_CLIENTS,
    SOURCE_FABRIC,
    SOURCE_GIVEN,
    SOURCE_GROUP,
    T_BYTES_SENT,
    T_FRAMES_SENT,
    TOTAL_NAMES,
    TOTAL_WORDS,
    UNKNOWN,
    pipeline,
    receive_forward,
)
from appliance.dataplane.names import GROUP_RX
from appliance.dataplane.state import OWN_PLAIN
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
    """The tables the kernel reads, for one (tables, sessions, snapshot)."""

    ports: np.ndarray
    """(port, PORT_WORDS) int64: kind for a publish, out queue, peer, destination session,
    kind for a neighbour's frame delivered here."""
    owners: list
    """Port -> the DpSession it delivers to (its ``delivered`` count), else None."""
    group_start: np.ndarray
    group_len: np.ndarray
    group_ports: np.ndarray
    """Multicast group g's ports: ``group_ports[group_start[g]:][:group_len[g]]``."""
    fab_peers: np.ndarray
    """Sorted int64 fabric peer ids of the neighbours that are up ..."""
    fab_nodes: np.ndarray
    """... their node ids ..."""
    fab_rows: np.ndarray
    """... and the replay windows of their links to this node (frame_auth.DataAuth)."""
    tr_keys: np.ndarray
    """Sorted int64 (source << 32 | destination) of the paths through or to this node ..."""
    tr_prev: np.ndarray
    """... the node before this one on each ..."""
    tr_next: np.ndarray
    """... and the fabric peer of its next hop (-1: this node is the destination)."""
    group_peers: dict
    """Group channel -> (sorted int64 peer ids of the members' group senders, their nodes,
    their windows, the group's link id)."""


def _fill_row(dp: Any, tables: Any, queues: tuple[str, ...], ports: np.ndarray, owners: list,
              port: int, what: str, arg: int) -> None:
    """Port ``port``'s row of the plan (all zero: K_NONE before) and its owner."""
    row = ports[port]
    if what == "client":
        session = dp.sessions.get(arg)
        if session is None:
            row[0] = row[P_LOCAL] = K_SKIP
        elif session.selectors is not None or session.flow is not None:
            # the general loop applies its selectors, or its flow control
            row[0] = row[P_LOCAL] = K_GENERAL
        elif session.channel != queues[FABRIC_Q] and session.channel in queues:
            # one class per message: a neighbour's plain copy of a guaranteed message that
            # its guaranteed egress takes is the general loop's to leave out
            row[:] = (K_DELIVER, queues.index(session.channel), session.dest,
                      session.session_id,
                      K_GENERAL if session.own_class & OWN_PLAIN else K_DELIVER)
            owners[port] = session
        else:
            row[0] = row[P_LOCAL] = K_GENERAL
    elif what == "node" and not tables.group_direct.get(arg):
        hop = tables.next_hop.get(arg)
        if arg in dp.node_selectors:  # the general loop applies its selectors
            row[0] = K_GENERAL
        elif hop is None:
            row[0] = K_UNROUTABLE
        else:
            row[:4] = (K_DELIVER, FABRIC_Q, hop, arg)
        row[P_LOCAL] = K_SKIP  # a neighbour's frame goes to this node's clients only
    else:  # guaranteed egresses, destinations over a fabric group
        row[0] = K_GENERAL
        row[P_LOCAL] = K_SKIP  # (for a plain frame from a neighbour: nothing)


def build_plan(dp: Any, snapshot: Any, queues: tuple[str, ...]) -> ExpressPlan | None:
    """The plan for the agent's current tables and sessions and the NIC's ``snapshot``
    (``queues``: the out queues' names by the kernel's index), or None when the kernel may
    not run at all (duplication mode: the general loop sends those messages on two paths)."""
    tables = dp.tables
    if tables.dup_keys or tables.rendezvous:  # rendezvous: matched and deduplicated per message
        return None
    # rows up to the highest port the tables name (a port beyond is K_NONE to the kernels):
    # PORTS rows would be 2.6 MB per rebuild for an appliance that uses a few hundred ports
    rows = min(PORTS, 1 + max((p for p in tables.ports if p >= 0), default=0))
    ports = np.zeros((rows, PORT_WORDS), np.int64)  # kinds K_NONE
    owners: list = [None] * rows
    for port, (what, arg) in tables.ports.items():
        if 0 <= port < rows:
            _fill_row(dp, tables, queues, ports, owners, port, what, arg)
    groups = snapshot.entries.groups
    top = max((g.group_id for g in groups), default=0)
    start = np.zeros(top + 1, np.int64)
    count = np.zeros(top + 1, np.int64)
    flat: list[int] = []
    for g in groups:
        start[g.group_id] = len(flat)
        count[g.group_id] = len(g.ports)
        flat.extend(g.ports)
    auth = dp.data_auth
    fab_peers, fab_nodes, fab_rows, _ = auth.receive_arrays(tables, queues[FABRIC_Q])
    paths = sorted(((src << 32) | dst, prev, -1 if nxt is None else nxt)
                   for (src, dst), (prev, nxt) in tables.transit.items()
                   if 0 <= src < 1 << 31 and 0 <= dst < 1 << 31)
    return ExpressPlan(ports, owners, start, count, np.asarray(flat or [0], np.int64),
                       fab_peers, fab_nodes, fab_rows,
                       np.asarray([k for k, _, _ in paths], np.int64),
                       np.asarray([p for _, p, _ in paths], np.int64),
                       np.asarray([n for _, _, n in paths], np.int64),
                       {channel: auth.receive_arrays(tables, channel)
                        for channel in sorted({c for c, _ in tables.group_peers})})


@dataclass
class SessionTable:
    """The agent's client sessions by row: the kernels count per row, and find a client
    frame's session by its channel and peer id."""

    sessions: list
    """Row -> its DpSession."""
    rows: dict
    """Session id -> row."""
    ids: np.ndarray
    """Each row's session id."""
    bounds: np.ndarray
    """Row r's publishable keys are ``keys[bounds[r]:bounds[r + 1]]`` (sorted uint64)."""
    keys: np.ndarray
    peers: dict
    """Channel name -> (sorted int64 peer ids of the sessions logged in over it, their rows)."""
    counts: np.ndarray
    """(row, 2) int64: messages published and denied since the last ``Express.fold``."""
    slots: np.ndarray
    """Each row's key and window in the agent's SessionAuth (-1: the session has no key)."""


_NO_PEERS = (np.zeros(0, np.int64), np.zeros(0, np.int64))
_NO_MEMBERS = (*_NO_PEERS, np.zeros(0, np.int64), 0)


def allowed_keys(session: Any) -> np.ndarray:
    """The session's publishable keys as a sorted array (rebuilt when the set changes:
    ``DataPlaneAgent.revoke_keys`` drops the cached copy)."""
    cached = getattr(session, "_sorted_allowed", None)
    if cached is None or cached[0] != len(session.allowed):
        cached = (len(session.allowed), np.sort(np.fromiter(
            session.allowed, np.uint64, len(session.allowed))))
        session._sorted_allowed = cached
    return cached[1]


def keys_added(session: Any, fresh: np.ndarray) -> None:
    """The session's sorted publishable keys (``allowed_keys``) with ``fresh``, keys its set
    has just taken (none of them held before), merged in: a search and a move of the array,
    not a pass in Python over the whole set and a sort of it (1,000,000 keys: 0.1 s, at
    every frame of a batched registration). Rebuilt from the set when no copy is current."""
    cached = getattr(session, "_sorted_allowed", None)
    if cached is None or cached[0] != len(session.allowed) - len(fresh):
        session._sorted_allowed = None
        return
    add = np.sort(fresh)
    merged = np.insert(cached[1], np.searchsorted(cached[1], add), add)
    session._sorted_allowed = (len(session.allowed), merged)


def session_keys_changed(table: SessionTable, session: Any) -> SessionTable:
    """``table`` with the session's row holding its current publishable keys: that row's
    range of ``keys`` replaced and the later rows' bounds moved (no pass over the sessions)."""
    row = table.rows[session.session_id]
    keys = allowed_keys(session)
    lo, hi = int(table.bounds[row]), int(table.bounds[row + 1])
    bounds = table.bounds.copy()
    bounds[row + 1:] += len(keys) - (hi - lo)
    return SessionTable(table.sessions, table.rows, table.ids, bounds,
                        np.concatenate((table.keys[:lo], keys, table.keys[hi:])), table.peers,
                        table.counts, table.slots)


def build_sessions(dp: Any) -> SessionTable:
    """The table of the agent's sessions."""
    by_peer = sorted(((name, peer), session) for (name, peer), session in dp._by_peer.items())
    sessions = [session for _, session in by_peer]
    keys = [allowed_keys(session) for session in sessions]
    bounds = np.zeros(len(sessions) + 1, np.int64)
    bounds[1:] = np.cumsum([len(k) for k in keys], dtype=np.int64)
    peers: dict[str, list[tuple[int, int]]] = {}
    for row, ((name, peer), session) in enumerate(by_peer):
        if session.acl_class:  # a content ACL class: the general loop applies it
            continue
        peers.setdefault(name, []).append((peer, row))
    return SessionTable(
        sessions, {s.session_id: row for row, s in enumerate(sessions)},
        np.asarray([s.session_id for s in sessions], np.int64), bounds,
        np.concatenate(keys) if keys else np.zeros(0, np.uint64),
        {name: (np.asarray([p for p, _ in rows], np.int64),
                np.asarray([r for _, r in rows], np.int64)) for name, rows in peers.items()},
        np.zeros((len(sessions), 2), np.int64),
        np.asarray([s.auth_slot for s in sessions], np.int64))


def session_added(table: SessionTable, session: Any, name: str, peer: int) -> SessionTable:
    """``table`` with ``session`` (logged in from ``peer`` over channel ``name``) as a new
    last row: its list and dict grown in place (the old table is not used again), its
    arrays copied one row longer; no pass over the sessions in Python."""
    row = len(table.sessions)
    table.sessions.append(session)
    table.rows[session.session_id] = row
    keys = allowed_keys(session)
    peers = dict(table.peers)
    if not session.acl_class:  # a content ACL class: the general loop applies it
        have, rows = peers.get(name, _NO_PEERS)
        at = int(np.searchsorted(have, peer))
        peers[name] = (np.insert(have, at, peer), np.insert(rows, at, row))
    return SessionTable(
        table.sessions, table.rows, np.append(table.ids, session.session_id),
        np.append(table.bounds, table.bounds[-1] + len(keys)),
        np.concatenate((table.keys, keys)), peers,
        np.zeros((row + 1, 2), np.int64), np.append(table.slots, session.auth_slot))


def session_removed(table: SessionTable, session_id: int) -> SessionTable | None:
    """``table`` without the session: its row stays (counted to it, found by nobody: its
    peer goes), or None when the table should be built anew (it was not in it, or the rows
    of sessions gone outnumber the others)."""
    row = table.rows.get(session_id)
    if row is None or 2 * (len(table.sessions) - len(table.rows)) > len(table.sessions) + 64:
        return None
    rows = table.rows  # (in place: the old table is not used again)
    del rows[session_id]
    peers = {}
    for name, (have, at) in table.peers.items():
        keep = at != row
        peers[name] = (have, at) if keep.all() else (have[keep], at[keep])
    return SessionTable(table.sessions, rows, table.ids, table.bounds, table.keys, peers,
                        np.zeros_like(table.counts), table.slots)


class Express:
    """The forwarding pipeline of one data-path agent: its plan, session table, arrays and
    the kernels' compiled entry points.

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
        self._plan_for: tuple = (None, -1, None)
        """(tables, sessions version, snapshot version) the plan was built for."""
        self.sessions = build_sessions(dp)
        self._sessions_for: tuple = (dp.sessions_version, dp.allowed_version)
        """(sessions version, allowed keys version) the session table was built for."""
        self.ctl = np.zeros(CTL_WORDS, np.int64)
        self.port_delivered = np.zeros(1, np.int64)
        """Messages framed per egress port since the last fold (the plan's owners'); as
        many rows as the largest plan's ports (at most PORTS: 512 KiB)."""
        self.totals = np.zeros(TOTAL_WORDS, np.int64)
        self._queues = [dp._out[name] for name in queues]
        self._queue_arrays: list[np.ndarray] = []
        for i, q in enumerate(self._queues):
            b = q.batch
            self._queue_arrays += [b.buf, b.offsets, b.lengths, b.peer_ids]
            self.ctl[QCAPACITY + i] = b.capacity
            self.ctl[QMAX + i] = q.max_frame_bytes
        self.ctl[QSLOT] = self._queues[FABRIC_Q].batch.slot_bytes
        self.ctl[QSLOT0] = self._queues[0].batch.slot_bytes
        frames = max(batch.capacity for batch in dp._rx.values()) if dp._rx else 1
        self._sel = (np.zeros(frames, np.int64), np.zeros(frames, np.int64),
                     np.zeros(frames, np.int64), np.zeros((frames, 3), np.int64),
                     np.zeros(frames, np.int64))
        """The kernel's per-frame outputs: the NIC's frames (offsets, lengths, index in the
        burst), their contexts, and which frames were punted."""
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
        fan = (np.zeros((1, PORT_WORDS), np.int64), empty, empty, empty)
        counts = (np.zeros((1, 2), np.int64), self.port_delivered, self.totals)
        tables = (empty, empty, empty, empty, keys, empty, empty, empty, empty, 0, empty, empty,
                  empty)
        auth = self.dp.data_auth
        cred = (auth.abytes, auth.actl, auth.windows, *self._session_auth())
        args = (self._queue_arrays[0], empty, empty, empty, 0, 0, *tables, 0, 0, 0, *fan,
                *self._queue_arrays, self.ctl, *cred, *self._sel, *counts, *state)
        pipeline(*args)
        vec = _mmsg.MmsgVector(1)
        words = (vec.h64, vec.iov64, vec.names64, vec.controls64)
        fused = (0, 0, 0, *words, 0, 0, 0, -1, _mmsg.RECVMMSG_ADDRESS, 0, 0, empty,
                 self._queue_arrays[0], empty, empty.copy(), empty.copy(), *tables, 0, 0, 0,
                 *fan, *self._queue_arrays, self.ctl, *cred, *self._sel, *counts, *words[:3],
                 0, 0, 0, -1, _mmsg.SENDMMSG_ADDRESS, _mmsg.ERRNO_LOCATION_ADDRESS, 0,
                 self._clock, 0, vec.send_result, *state)
        receive_forward(*fused)
        return (pipeline.overloads[tuple(numba.typeof(a) for a in args)].entry_point,
                receive_forward.overloads[tuple(numba.typeof(a) for a in fused)].entry_point)

    def _session_auth(self) -> tuple:
        """The kernels' arguments of the agent's SessionAuth: scratch, counts, keys,
        windows."""
        sa = self.dp.session_auth
        return sa.abytes, sa.actl, sa.keys, sa.windows

    def reset(self) -> None:
        """Rebuild the plan and the fused call's arguments before the next burst (the
        agent's frame authentication changed)."""
        self.fold()
        self._plan_for = (None, -1, None)
        self._fused_for = ()

    def _current_plan(self, snapshot: Any) -> ExpressPlan | None:
        """The plan for the agent's tables, its sessions and the snapshot's multicast
        groups, rebuilt when one of them changed (not for every snapshot: a subscription
        that changes only topic rows leaves the plan as it is)."""
        dp = self.dp
        tables, sessions_version, groups = self._plan_for
        now_groups = snapshot.entries.groups
        if (tables is not dp.tables or sessions_version != dp.sessions_version
                or (now_groups is not groups and now_groups != groups)):
            self.fold()
            self.plan = build_plan(dp, snapshot, self.queues)
            self._plan_for = (dp.tables, dp.sessions_version, now_groups)
            if self.plan is not None and len(self.plan.ports) > len(self.port_delivered):
                # (folded: all zero) the kernels count per port of the plan
                self.port_delivered = np.zeros(len(self.plan.ports), np.int64)
        return self.plan

    def patch_ports(self, ports: Any, before: int | None = None) -> None:
        """Patch the plan's rows of ``ports`` (their entries in the agent's tables changed, or
        the sessions they lead to came or went) instead of building the plan anew at the next
        burst: one row each, so a login or logout does not cost a pass over every port.
        ``before``: the agent's sessions version before a session came or went (the plan, if
        it was current then, is current again after the patch). A plan that is not current
        is left to the next burst's rebuild."""
        dp = self.dp
        tables, version, groups = self._plan_for
        plan = self.plan
        if before is not None:
            if version != before:
                return
            self._plan_for = (tables, version := dp.sessions_version, groups)
        if plan is None or tables is not dp.tables or version != dp.sessions_version:
            return
        self.fold()  # what was counted goes to the rows' owners before they change
        top = max((p for p in ports if 0 <= p < PORTS), default=-1)
        if top >= len(plan.ports):
            size = min(PORTS, max(top + 1, 2 * len(plan.ports)))
            grown = np.zeros((size, PORT_WORDS), np.int64)  # rows beyond: K_NONE
            grown[:len(plan.ports)] = plan.ports
            plan = self.plan = replace(plan, ports=grown,
                                       owners=plan.owners + [None] * (size - len(plan.owners)))
            if size > len(self.port_delivered):  # (folded: all zero)
                self.port_delivered = np.zeros(size, np.int64)
        rows, owners, now = plan.ports, plan.owners, tables.ports
        for port in ports:
            if 0 <= port < len(rows):
                rows[port] = 0
                owners[port] = None
                what = now.get(port)
                if what is not None:
                    _fill_row(dp, tables, self.queues, rows, owners, port, *what)

    def session_added(self, session: Any, peer: tuple[str, int], before: tuple) -> None:
        """A session came: its row appended to the session table (``before``: the agent's
        (sessions version, allowed version) before it came; the table is left to be built
        anew when it was not current then)."""
        if self._sessions_for != before:
            return
        self.fold()
        self.sessions = session_added(self.sessions, session, *peer)
        self._sessions_for = (self.dp.sessions_version, self.dp.allowed_version)

    def keys_allowed(self, session: Any, before: tuple) -> None:
        """A session may publish more keys (``DataPlaneAgent.allow_keys``): its row of the
        session table patched (see ``session_added``)."""
        if self._sessions_for != before:
            return
        if session.session_id in self.sessions.rows:
            self.sessions = session_keys_changed(self.sessions, session)
        self._sessions_for = (self.dp.sessions_version, self.dp.allowed_version)

    def session_removed(self, session_id: int, before: tuple) -> None:
        """A session went: its peer out of the session table (see ``session_added``)."""
        if self._sessions_for != before:
            return
        self.fold()
        table = session_removed(self.sessions, session_id)
        if table is not None:
            self.sessions = table
            self._sessions_for = (self.dp.sessions_version, self.dp.allowed_version)

    def _current_sessions(self) -> SessionTable:
        dp = self.dp
        if self._sessions_for != (dp.sessions_version, dp.allowed_version):
            self.fold()
            self.sessions = build_sessions(dp)
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
            rows = self.plan.ports
            for port in np.flatnonzero(delivered).tolist():
                if owners[port] is not None:
                    owners[port].delivered += int(delivered[port])
                elif rows[port, 1] == FABRIC_Q:  # a destination appliance's port
                    self.dp.counters["messages_to_appliances"] += int(delivered[port])
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

    def _ready(self, now_ns: int, rerun: bool = True) -> tuple[Any, Any, ExpressPlan] | None:
        """(snapshot, NIC state, plan) when the kernel may run now, else None: no frame being
        built by the general loop (it keeps the order), parked messages rerun first on the
        snapshot the kernel uses (``rerun``), and a plan (not in duplication mode)."""
        dp = self.dp
        q0, q1, q2 = self._queues
        if q0._open or q1._open or q2._open:
            return None
        snap, state = dp.nic.burst_state()
        if rerun and dp.rerun_parked_before(snap.version, now_ns):
            if q0._open or q1._open or q2._open:
                # the rerun left frames open (a guarded or guaranteed egress, delivered by
                # the general loop): the kernel must not send or renumber the queue under
                # them, or those messages were counted delivered and never sent
                return None
            snap, state = dp.nic.burst_state()
            if dp._parked and snap.version != dp._parked_version:
                return None  # another snapshot meanwhile: the general loop sees to it
        plan = self._current_plan(snap)
        return None if plan is None else (snap, state, plan)

    def run(self, name: str, batch: Any, now_ns: int, reliable_bit: int, probe: int,
            deadline: int) -> list[int] | None:
        """Run a burst of channel ``name`` (the clients', the fabric's or a fabric group's)
        through the pipeline: the indexes of the frames it punted (the general loop's to handle), or
        None when the general loop must take the whole burst (nothing done)."""
        ready = self._ready(now_ns)
        if ready is None:
            return None
        snap, state, plan = ready
        table = self._current_sessions()
        dp = self.dp
        cli_peers, cli_rows = _NO_PEERS
        fab_peers, fab_nodes, fab_rows, link = (plan.fab_peers, plan.fab_nodes, plan.fab_rows,
                                                dp.node_id)
        if name == self.queues[FABRIC_Q]:
            source = SOURCE_FABRIC
        elif name.startswith(GROUP_RX):
            source = SOURCE_GROUP
            fab_peers, fab_nodes, fab_rows, link = plan.group_peers.get(name, _NO_MEMBERS)
        else:
            source = SOURCE_CLIENTS
            cli_peers, cli_rows = table.peers.get(name, _NO_PEERS)
        self._load_counts()
        auth = dp.data_auth
        self._call(batch.buf, batch.offsets, batch.lengths, batch.peer_ids, batch.count,
                   source, cli_peers, cli_rows, table.ids, table.bounds, table.keys,
                   table.slots, fab_peers, fab_nodes, fab_rows, link, plan.tr_keys, plan.tr_prev,
                   plan.tr_next, reliable_bit, probe, dp.node_id, plan.ports, plan.group_start,
                   plan.group_len, plan.group_ports, *self._queue_arrays, self.ctl,
                   auth.abytes, auth.actl, auth.windows, *self._session_auth(), *self._sel,
                   table.counts, self.port_delivered, self.totals, *state)
        return self._settle(table, snap, batch, now_ns, deadline,
                            checked=source != SOURCE_CLIENTS)

    def run_given(self, batch: Any, ctxs: list[tuple], now_ns: int, deadline: int) -> bool:
        """Run the agent's own burst (parked messages again, one frame each) with the general
        loop's contexts ``ctxs`` through the pipeline; False when the general loop must
        (nothing done): a context of the guaranteed class, of a session gone or of one with
        a content ACL class."""
        ready = self._ready(now_ns, rerun=False)
        if ready is None:
            return False
        snap, state, plan = ready
        table = self._current_sessions()
        auth = self.dp.data_auth
        fctx = self._sel[3]
        for i, (ingress, origin, stream, session, _, cls) in enumerate(ctxs):
            if cls:
                return False
            if ingress:
                row = table.rows.get(session.session_id)
                if row is None or session.acl_class:  # the general loop applies its class
                    return False
                fctx[i] = (C_INGRESS, row, session.session_id)
            else:
                fctx[i] = (C_LOCAL, origin, stream)
        self._load_counts()
        self._call(batch.buf, batch.offsets, batch.lengths, batch.peer_ids, batch.count,
                   SOURCE_GIVEN, *_NO_PEERS, table.ids, table.bounds, table.keys, table.slots,
                   plan.fab_peers, plan.fab_nodes, plan.fab_rows, self.dp.node_id,
                   plan.tr_keys, plan.tr_prev, plan.tr_next, 0, -1, self.dp.node_id,
                   plan.ports, plan.group_start, plan.group_len, plan.group_ports,
                   *self._queue_arrays, self.ctl, auth.abytes, auth.actl, auth.windows,
                   *self._session_auth(), *self._sel, table.counts, self.port_delivered,
                   self.totals, *state)
        return self._settle(table, snap, batch, now_ns, deadline, ctxs) is not None

    def _load_counts(self) -> None:
        ctl = self.ctl
        q0, q1, q2 = self._queues
        ctl[QCOUNT] = q0.batch.count
        ctl[QCOUNT + 1] = q1.batch.count
        ctl[QCOUNT + 2] = q2.batch.count

    def receive(self, channel: Any, batch: Any, now_ns: int, reliable_bit: int, probe: int,
                deadline: int) -> tuple[int, int, list[int]]:
        """The clients' UDP receive of a cycle: (frames received, ``TAKEN``, ``UNTRIED`` or
        ``DECLINED_BURST``, the frames the pipeline punted). With nothing in the way (see
        ``_ready``) the receive, the pipeline and the send of the UDP clients' queue are one
        call (``receive_forward``): after a datagram arrives no Python runs before its
        forward is sent. Else, or when the kernel declines the burst, the frames are left in
        ``batch`` for the general loop."""
        dp = self.dp
        q0 = self._queues[0]
        ready = None
        if not (channel.closed or channel.multicast_sender):
            ready = self._ready(now_ns)
        if ready is None:
            return channel.receive(batch, 0), UNTRIED, []
        snap, state, plan = ready
        table = self._current_sessions()
        made = self._fused_for
        if not (made and made[0] is plan and made[1] is table and made[2] is state
                and made[3] is channel and made[4] is batch):
            self._fused_args = self._fused_tail(channel, batch, plan, table, state,
                                                reliable_bit, probe)
            self._fused_for = (plan, table, state, channel, batch)
        self._load_counts()
        rx = self._rx
        prepare, rx_buf_addr = rx.receive_plan(batch.buf, batch.offsets, batch.slot_bytes,
                                               batch.capacity)
        self._fused(prepare, rx_buf_addr, time.time_ns(), *self._fused_args)
        ctl = self.ctl
        words = ctl.tolist()
        got = words[RX_COUNT]
        rx.received(got)
        n = channel.finish_receive(batch, got, words[RX_EXTRA])
        if not n:
            return n, DECLINED_BURST, []
        code, unknown, sent = words[CODE], words[UNKNOWN], words[SENT]
        if code == DONE and not unknown and not words[PUNTED] and sent != SENT_SOME:
            q0.batch.count = words[QCOUNT]  # all done (the common case)
            self._queues[1].batch.count = words[QCOUNT + 1]
            self._queues[2].batch.count = words[QCOUNT + 2]
            return n, TAKEN, []
        punts = self._settle(table, snap, batch, now_ns, deadline)
        if punts is None:
            return n, DECLINED_BURST, []
        if sent == SENT_SOME:  # the channel finishes the send (retries, errors, refusal)
            total, k, err = self._tx.send_result.tolist()
            if total < 0:  # a multicast destination: the channel's send refuses it
                q0.flush()
            else:
                dp.counted_udp_send(self.queues[0], q0.batch.count, channel.finish_send(
                    q0.batch.arrays(), self._tx, total, k, err))
                q0.batch.count = 0
        return n, TAKEN, punts

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
        cli_peers, cli_rows = table.peers.get(self.queues[0], _NO_PEERS)
        auth = self.dp.data_auth
        return (rx.h64, rx.iov64, rx.names64, rx.controls64, rx.hdr_addr, rx.names_addr,
                rx.controls_addr, channel.fileno(), _mmsg.RECVMMSG_ADDRESS, batch.slot_bytes,
                batch.capacity, batch.recv_ts_ns, batch.buf, batch.offsets, batch.lengths,
                batch.peer_ids, cli_peers, cli_rows, table.ids, table.bounds, table.keys,
                table.slots, plan.fab_peers, plan.fab_nodes, plan.fab_rows, self.dp.node_id,
                plan.tr_keys, plan.tr_prev, plan.tr_next, reliable_bit, probe, self.dp.node_id,
                plan.ports,
                plan.group_start, plan.group_len, plan.group_ports, *self._queue_arrays,
                self.ctl, auth.abytes, auth.actl, auth.windows, *self._session_auth(),
                *self._sel, table.counts, self.port_delivered, self.totals, tx.h64, tx.iov64,
                tx.names64, tx.hdr_addr, tx.names_addr, tx.pin(q0.batch.buf),
                channel.fileno(), _mmsg.SENDMMSG_ADDRESS, _mmsg.ERRNO_LOCATION_ADDRESS,
                _mmsg.CLOCK_GETTIME_ADDRESS if channel.stamp_send_ts else 0, self._clock,
                self._clock_addr, tx.send_result, *state)

    def _contexts(self, table: SessionTable, count: int, deadline: int) -> list[tuple]:
        """The general loop's per-frame contexts of the NIC's first ``count`` frames."""
        dp = self.dp
        ctxs = []
        for kind, a, b in self._sel[3][:count].tolist():
            if kind == C_INGRESS:
                ctxs.append(dp.ingress_ctx(table.sessions[a], deadline))
            else:
                ctxs.append((False, a, b, None, deadline, 0))
        return ctxs

    def _settle(self, table: SessionTable, snap: Any, batch: Any, now_ns: int,
                deadline: int, given: list[tuple] | None = None,
                checked: bool = False) -> list[int] | None:
        """After a kernel ran a burst: the general loop delivers what the NIC ran when the
        kernel left it that, the out queues take the counts of a delivered burst and its
        messages with unknown keys are parked (with the ``given`` contexts when the caller
        gave them: their parking deadlines stand); returns the punted frames' indexes, or
        None when nothing was done. A burst the kernel ``checked`` (from the fabric) and
        then declined is punted whole but for the frames it refused (the others' trailers
        are gone: the general loop must not check them again)."""
        dp = self.dp
        ctl = self.ctl
        words = ctl.tolist()
        code, frames, messages, descriptors, unknown = words[:RESULT_WORDS]
        if code == DECLINED:
            if checked:
                return np.flatnonzero(self._sel[4][:batch.count] >= 0).tolist()
            return None
        q0, q1, q2 = self._queues
        q0.batch.count, q1.batch.count, q2.batch.count = words[QCOUNT:QCOUNT + 3]
        selected = words[SELECTED]
        if code == NIC_ONLY:
            ctxs = given or self._contexts(table, selected, deadline)
            dp._deliver(batch.buf, BurstResult(snap.version, frames, messages, descriptors),
                        ctxs, now_ns)
            if 0 < frames < selected:
                dp._run(batch, self._sel[2][frames:selected].tolist(), ctxs[frames:], now_ns)
            dp.counters["express_to_general"] += 1
        elif unknown:
            dp._park_unknown(batch.buf, messages,
                             given or self._contexts(table, selected, deadline), now_ns)
        if not words[PUNTED]:
            return []
        return np.flatnonzero(self._sel[4][:batch.count] == 1).tolist()
