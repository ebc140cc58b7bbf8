"""The express path of the data-path agent: a client's burst from the receive buffer to
finished egress frames in one compiled call.

The agent's general loop (appliance/dataplane.py) spends a few microseconds of Python per
frame, per descriptor and per message framed, on top of a fixed cost per step; for a burst
of one frame that was ~100 us of a ~110 us duty cycle, which capped how many one-message
frames an appliance forwards and put every message behind the ones before it. ``ingress``
does the same work in one numba kernel (``appliance._kernels.ingress``), which runs the
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

The egress tables the kernel reads (``ExpressPlan``: per port its kind, out queue, peer and
destination session; multicast groups flattened) are rebuilt when the forwarding tables,
the sessions or the snapshot change. ``ENABLED`` switches the path off (the tests run the
same traffic both ways and compare).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from appliance import _fastpath
from appliance._kernels import (
    CODE,
    CTL_WORDS,
    DECLINED,
    DENIED,
    DESCRIPTORS,
    FABRIC_Q,
    FRAMES,
    HITS,
    K_DELIVER,
    K_GENERAL,
    K_SKIP,
    K_UNROUTABLE,
    MESSAGES,
    NIC_ONLY,
    NO_PORT,
    PORTS,
    PUBLISHED,
    QCAPACITY,
    QCOUNT,
    QMAX,
    RESULT_WORDS,
    UNKNOWN,
    UNROUTABLE,
    ingress,
)
from nic_offload.softnic import BurstResult

ENABLED = True
"""False: the general loop does everything (tests compare both)."""

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


class Express:
    """The express path of one data-path agent: its plan, its arrays and the kernel's
    compiled entry point."""

    def __init__(self, dp: Any, queues: tuple[str, str, str]) -> None:
        """``queues``: the names of the agent's out queues for the clients' UDP, the fabric
        and the clients' shared memory, in that order (the kernel's queue indexes)."""
        self.dp = dp
        self.queues = queues
        self.plan: ExpressPlan | None = None
        self._plan_for: tuple = (None, -1, -1)
        """(tables, sessions version, snapshot version) the plan was built for."""
        self.ctl = np.zeros(CTL_WORDS, np.int64)
        self.hits = np.zeros(3 * PORTS, np.int64)
        self._queues = [dp._out[name] for name in queues]
        self._queue_arrays: list[np.ndarray] = []
        for i, q in enumerate(self._queues):
            b = q.batch
            self._queue_arrays += [b.buf, b.offsets, b.lengths, b.peer_ids]
            self.ctl[QCAPACITY + i] = b.capacity
            self.ctl[QMAX + i] = q.max_frame_bytes
        self._call = self._compile()

    def _compile(self) -> Any:
        """Compile (or load from numba's cache) the kernel for the agent's own array types
        (a call with no frames returns at once), and return that overload's entry point:
        called directly it skips the dispatcher's type matching (~half of the call's cost
        with 50 arguments); every later call passes the same arrays and kinds of scalar."""
        _snap, state = self.dp.nic.burst_state()
        empty = np.zeros(1, np.int64)
        args = (self._queue_arrays[0], empty, empty, empty, 0, 0, 0, 0, 0,
                np.zeros(0, np.uint64), np.zeros((1, 4), np.int64), empty, empty, empty,
                *self._queue_arrays, self.ctl, self.hits, *state)
        ingress(*args)
        signature = tuple(numba.typeof(a) for a in args)
        return ingress.overloads[signature].entry_point

    def _current_plan(self, snapshot: Any) -> ExpressPlan | None:
        dp = self.dp
        tables, sessions_version, snapshot_version = self._plan_for
        if (tables is not dp.tables or sessions_version != dp.sessions_version
                or snapshot_version != snapshot.version):
            self.plan = build_plan(dp, snapshot, self.queues)
            self._plan_for = (dp.tables, dp.sessions_version, snapshot.version)
        return self.plan

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
        if plan is None:
            return False
        ctl = self.ctl
        ctl[QCOUNT] = q0.batch.count
        ctl[QCOUNT + 1] = q1.batch.count
        ctl[QCOUNT + 2] = q2.batch.count
        self._call(batch.buf, batch.offsets, batch.lengths, batch.peer_ids, n,
                   session.session_id, reliable_bit, probe, dp.node_id,
                   _fastpath._allowed(session), plan.ports, plan.group_start, plan.group_len,
                   plan.group_ports, *self._queue_arrays, ctl, self.hits, *state)
        res = ctl[:RESULT_WORDS].tolist()
        code = res[CODE]
        if code == DECLINED:
            return False
        if code == NIC_ONLY:
            ctxs = [dp.ingress_ctx(session, deadline)] * n
            frames = res[FRAMES]
            dp._deliver(batch.buf, BurstResult(snap.version, frames, res[MESSAGES],
                                               res[DESCRIPTORS]), ctxs, now_ns)
            if 0 < frames < n:
                dp._run(batch, list(range(frames, n)), ctxs[frames:], now_ns)
            dp.counters["express_to_general"] += 1
            return True
        q0.batch.count, q1.batch.count, q2.batch.count = ctl[QCOUNT:QCOUNT + 3].tolist()
        session.published += res[PUBLISHED]
        counters = dp.counters
        counters["express_bursts"] += 1
        if res[DENIED]:
            session.denied += res[DENIED]
            counters["publish_denied"] += res[DENIED]
        if res[NO_PORT]:
            counters["no_port"] += res[NO_PORT]
        if res[UNROUTABLE]:
            counters["unroutable"] += res[UNROUTABLE]
        hits = self.hits
        owners = plan.owners
        n_hits = res[HITS]
        for port, count in zip(hits[PORTS : PORTS + n_hits].tolist(),
                               hits[2 * PORTS : 2 * PORTS + n_hits].tolist()):
            owner = owners[port]
            if owner is not None:
                owner.delivered += count
        if res[UNKNOWN]:
            ctxs = [dp.ingress_ctx(session, deadline)] * n
            dp._park_unknown(batch.buf, res[MESSAGES], ctxs, now_ns)
        return True
