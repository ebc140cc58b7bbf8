"""Flow control towards client sessions: the appliance's side (docs/flow-control.md).

A subscribing client tells its appliance the state of its receive queue with FLOW_CONTROL
frames on stream ``SESSION_FLOW_STREAM`` (on above its high watermark, refreshed while on;
off below its low one, with its depth: how much the appliance may send before it hears
again). From the first "on", the session's messages leave the forwarding pipeline for the
general loop (``express.build_plan``: a session with ``flow`` set is ``K_GENERAL``), which
puts them in the session's ``SessionFlow`` queue, and the queue applies the session's
policy while the client holds it off:

- ``THROTTLE``: nothing is dropped. Above ``FLOW_THROTTLE_HIGH_MESSAGES`` queued, the
  publishers whose messages are queued are held off (FLOW_CONTROL "on", refreshed; "off"
  below ``FLOW_THROTTLE_LOW_MESSAGES``): their ``publish`` waits. A local publisher gets the
  signal from this appliance; a publisher on another appliance through its appliance: this
  one sends the publisher's appliance (the message's origin) a FLOW_CONTROL frame on the
  fabric, addressed to that node, its ``stream_id`` the publisher's session id there,
  signed with the fabric key like the reliable streams' frames, and carried by transit
  appliances like them (``on_node_frame`` at the far end, which holds its publisher off
  for as long as the hold is refreshed: ``NODE_HOLD_EXPIRY_NS``). A queue that still
  reaches ``FLOW_THROTTLE_QUEUE_MESSAGES`` (what was in flight, or a fabric without a key)
  drops what does not fit, counted ``flow_dropped_throttle`` and reported.

Whatever the policy, the publishers whose messages go to sessions under flow control are
held off the same way while the appliance's clients' or fabric UDP socket fills faster than
the data path reads it (``FLOW_INGRESS_HIGH_BYTES``): the kernel would drop what they
publish unseen. This is the appliance as a receiver: its own ingress queue's watermarks
hold the senders off, local or remote, as a client's do.
- ``DROP_OLDEST``: at most ``FLOW_QUEUE_MESSAGES`` queued; the oldest goes first.
- ``CONFLATE``: a message whose topic key is queued replaces it in place (the one replaced
  counts as ``conflate``); a full queue drops its oldest (counted as ``drop-oldest``).

Every message dropped or conflated is counted per reason (``flow_dropped_drop_oldest``,
``flow_dropped_conflate``, ``flow_dropped_throttle``) and
reported to the session in a CONTROL ``POLICY_DROPS`` frame (topic key, policy, count),
sent in order with its messages, so the subscriber's statistics account for every message.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import numpy as np

from appliance.dataplane.names import CLIENT_UDP, FABRIC
from datapath.flow_control import (
    FLOW_CONTROL_REFRESH_INTERVAL_NS,
    NAME_OF_POLICY,
    PolicyQueue,
    WatermarkGate,
)
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.admin_layout import FlowControl, FlowPolicy, FlowState
from datapath.protocol.codec import ProtocolError, decode_frame, encode_admin

CLIENT_FLOW_ON_EXPIRY_NS = 5_000_000_000
"""A client's "on" not refreshed for this long is taken as off (its thread may be busy
handing a long burst to its application for a while; a dead client's session ends anyway)."""
FLOW_QUIET_NS = 1_000_000_000
"""A client that said nothing for this long while its messages wait (not held off) gets
``FLOW_DEFAULT_CREDIT_MESSAGES`` more of them."""
FLOW_QUEUE_MESSAGES = 65_536
"""Messages a drop-oldest or conflate session queue holds while its client holds it off
(more than the client's socket held before flow control: a burst it absorbed still fits)."""
FLOW_THROTTLE_QUEUE_MESSAGES = 262_144
"""Messages a throttle session queue holds at most (beyond: dropped, counted, reported)."""
FLOW_THROTTLE_HIGH_MESSAGES = 16_384
"""A throttle queue deeper than this holds its local publishers off."""
FLOW_THROTTLE_LOW_MESSAGES = 4_096
"""... until it is shallower than this."""
FLOW_DEFAULT_CREDIT_MESSAGES = 1_024
"""Messages sent from a queue before the client's first word, when its "on" expired, or when
it has said nothing for ``FLOW_QUIET_NS`` while messages wait (then again each such period):
what a client's UDP socket holds with Linux's default receive memory (``net.core.rmem_max``
212,992 bytes: ~1,600 small messages), so a client that is not reading yet loses none of
them in its kernel; its own "off" signals then give the credit its socket has room for."""
FLOW_IDLE_NS = 2_000_000_000
"""A session whose client sent no flow signal for this long, with nothing queued, goes back
to the forwarding pipeline."""
FLOW_INGRESS_HIGH_BYTES = 1 << 20
"""Bytes waiting in the clients' UDP socket above which throttle sessions hold their
publishers off (the socket holds 4 MiB; beyond, the kernel drops what they publish)."""
FLOW_INGRESS_LOW_BYTES = 256 << 10
"""... until fewer than this wait."""
FLOW_INGRESS_CHECK_NS = 1_000_000
"""How often the socket's backlog is looked at while a throttle session exists."""
FLOW_CREDIT_INTERVAL_NS = 10_000_000
"""How often a local UDP publisher whose messages go to sessions under flow control is given
a new credit (the bytes it may send until the next one): a credit of at most
``FLOW_INGRESS_HIGH_BYTES`` this often lets it send up to 100 MiB/s to a data path that
keeps up."""
FLOW_CREDIT_IDLE_NS = 2_000_000_000
"""A credited publisher that sent nothing to a session under flow control for this long (and
is not held off) is let go of its credit (an "off" of 0: no limit)."""
FLOW_REPORT_INTERVAL_NS = 50_000_000
"""Drops are reported to the session at most this often (and when its queue empties)."""
FLOW_REPORT_ROWS = 256
"""(key, policy, count) rows in one POLICY_DROPS document."""
NODE_HOLD_EXPIRY_NS = 1_000_000_000
"""A hold from another appliance not refreshed for this long ends by itself (that appliance
died, or its "off" was lost)."""
MAX_NODE_HOLDS = 65_536
"""Holds from other appliances kept at once (beyond: refused, counted
``flow_node_holds_refused``): a neighbour cannot grow this appliance's state without bound."""
MAX_REMOTE_PUBLISHERS = 4_096
"""(appliance, publisher) pairs one throttle session remembers to hold off."""


class SessionFlow:
    """One client session's flow-control state at its appliance."""

    __slots__ = ("credit", "drops", "gate", "heard_ns", "holding", "on", "on_until_ns",
                 "policy", "publishers", "queue", "refresh_at_ns", "remote", "report_at_ns",
                 "sticky")

    def __init__(self, policy: FlowPolicy, sticky: bool = False) -> None:
        self.sticky = sticky
        """Engaged from the session's first subscription (its policy was configured): kept
        while the session lives, so no message ever goes to it beyond its credit."""
        self.policy = FlowPolicy(policy)
        throttle = self.policy is FlowPolicy.THROTTLE
        self.queue = PolicyQueue(FLOW_THROTTLE_QUEUE_MESSAGES if throttle
                                 else FLOW_QUEUE_MESSAGES, self.policy)
        self.on = False
        self.on_until_ns = 0
        self.heard_ns = 0
        self.credit = 0
        self.drops: Counter[tuple[int, str]] = Counter()
        self.report_at_ns = 0
        self.gate = WatermarkGate(FLOW_THROTTLE_HIGH_MESSAGES, FLOW_THROTTLE_LOW_MESSAGES)
        """Throttle: whether this queue holds its local publishers off."""
        self.publishers: set[int] = set()
        """Throttle: session ids of the local publishers whose messages were queued."""
        self.remote: set[tuple[int, int]] = set()
        """Throttle: (appliance, session id there) of the other appliances' publishers
        whose messages were queued (at most ``MAX_REMOTE_PUBLISHERS``)."""
        self.refresh_at_ns = 0
        self.holding = False
        """Throttle: its publishers are being held off."""


class SessionFlows:
    """The data-path agent's flow-control sessions (``DataPlaneAgent.flows``)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.flows: dict[int, SessionFlow] = {}
        self.holding: dict[int, set[Any]] = {}
        """Publisher session id -> what holds it off: the sessions whose throttle queues do,
        and ``("n", node)`` for another appliance's hold (``on_node_frame``)."""
        self.node_holds: dict[tuple[int, int], int] = {}
        """(appliance, local publisher) -> when that appliance's hold expires."""
        self.remote_holding: dict[tuple[int, int], set[int]] = {}
        """(appliance, publisher there) -> the sessions here whose queues hold it off."""
        self.ingress_full = False
        """The clients' UDP socket holds more than ``FLOW_INGRESS_HIGH_BYTES`` not yet read
        (until less than ``FLOW_INGRESS_LOW_BYTES``): throttle sessions hold their
        publishers off, or the kernel would drop what they publish before it is read."""
        self._ingress_check_ns = 0
        self.credited: dict[int, int] = {}
        """Local UDP publishers under a credit: session id -> when one of its messages last
        went to a session under flow control."""
        self._credit_at_ns = 0
        self._uncredited: set[int] = set()
        """Local publishers on shared memory or RDMA (their ring or queue holds them back)."""

    @property
    def active(self) -> bool:
        """Whether the duty cycle has flow-control work (sessions, holds to expire, credits
        to renew)."""
        return bool(self.flows or self.node_holds or self.credited)

    # --- from the client ----------------------------------------------------------------------
    def on_frame(self, session: Any, frame: bytes, now_ns: int) -> None:
        """A FLOW_CONTROL frame of stream ``SESSION_FLOW_STREAM`` from ``session``."""
        counters = self.agent.counters
        try:
            _, entries = decode_frame(frame).admin()
        except ProtocolError:
            counters["flow_signals_malformed"] += 1
            return
        for entry in entries:
            self.on_signal(session, entry, now_ns)

    def on_signal(self, session: Any, entry: FlowControl, now_ns: int) -> None:
        counters = self.agent.counters
        counters["flow_signals_received"] += 1
        flow = session.flow
        if flow is None:
            if entry.state is not FlowState.ON:
                return  # nothing held: an "off" changes nothing
            flow = session.flow = self.flows[session.session_id] = SessionFlow(
                FlowPolicy(session.flow_policy))
            self.agent.sessions_version += 1  # its messages leave the pipeline for the loop
            counters["flow_sessions_held"] += 1
        flow.heard_ns = now_ns
        if entry.state is FlowState.ON:
            if not flow.on:
                counters["flow_control_on"] += 1
            flow.on = True
            flow.on_until_ns = now_ns + CLIENT_FLOW_ON_EXPIRY_NS
            flow.credit = 0
        else:
            flow.on = False
            flow.credit = max(int(entry.high_watermark) - int(entry.queue_depth), 0)

    def engage(self, session: Any, now_ns: int) -> None:
        """Put ``session`` under flow control now, before its client ever signals (its
        policy was configured): every message to it goes through its queue and its credit,
        starting with ``FLOW_DEFAULT_CREDIT_MESSAGES``."""
        if session.flow is not None:
            session.flow.sticky = True
            return
        flow = session.flow = self.flows[session.session_id] = SessionFlow(
            FlowPolicy(session.flow_policy), sticky=True)
        flow.credit = FLOW_DEFAULT_CREDIT_MESSAGES
        flow.heard_ns = now_ns
        self.agent.sessions_version += 1
        self.agent.counters["flow_sessions_engaged"] += 1

    # --- from the forwarding (general loop) ---------------------------------------------------
    def offer(self, session: Any, key: int, origin: int, stream: int, buf: np.ndarray,
              off: int, length: int) -> None:
        """A message for ``session`` while it has flow control: queued under its policy."""
        flow = session.flow
        queue = flow.queue
        agent = self.agent
        before = queue.conflated
        queue.last_evicted = None
        if not queue.offer(key, (origin, stream, buf[off : off + length].tobytes()),
                           conflate=True):
            self._dropped(flow, key, "throttle")
            return
        policy_name = NAME_OF_POLICY[flow.policy]
        if queue.conflated != before:
            self._dropped(flow, key, policy_name)
        if queue.last_evicted is not None:  # a full queue (drop-oldest, conflate)
            self._dropped(flow, queue.last_evicted, "drop-oldest")
        if origin == agent.node_id:
            flow.publishers.add(stream)  # a local publish: its stream is its session id
            credited = self.credited
            if stream in credited:
                credited[stream] = agent.cycle_ns
            elif stream not in self._uncredited:
                self._start_credit(stream, agent.cycle_ns)
        elif len(flow.remote) < MAX_REMOTE_PUBLISHERS:
            flow.remote.add((origin, stream))  # its session id at its appliance
        if flow.policy is FlowPolicy.THROTTLE and \
                flow.gate.update(len(queue)) is FlowState.ON:
            self._hold(session.session_id, flow, agent.cycle_ns)
            flow.holding = True

    def _dropped(self, flow: SessionFlow, key: int, policy_name: str) -> None:
        flow.drops[(key, policy_name)] += 1
        self.agent.counters[f"flow_dropped_{policy_name.replace('-', '_')}"] += 1

    # --- throttling local publishers ----------------------------------------------------------
    def _hold(self, holder: int, flow: SessionFlow, now_ns: int) -> None:
        """Hold ``flow``'s publishers off (again: the refresh)."""
        flow.refresh_at_ns = now_ns + FLOW_CONTROL_REFRESH_INTERVAL_NS
        for publisher in flow.publishers:
            self.holding.setdefault(publisher, set()).add(holder)
            self._signal_publisher(publisher, FlowState.ON)
        for remote in flow.remote:
            self.remote_holding.setdefault(remote, set()).add(holder)
            self._signal_node(remote, FlowState.ON)

    def _release(self, holder: Any, flow: SessionFlow | None,
                 publishers: Any = ()) -> None:
        """``holder`` no longer holds ``flow``'s publishers (or ``publishers``) off; those
        nothing else holds get "off"."""
        for publisher in (flow.publishers if flow is not None else publishers):
            self._let_go(self.holding, publisher, holder, self._signal_publisher)
        if flow is None:
            return
        flow.publishers.clear()
        for remote in flow.remote:
            self._let_go(self.remote_holding, remote, holder, self._signal_node)
        flow.remote.clear()

    @staticmethod
    def _let_go(holding: dict, publisher: Any, holder: Any, signal: Any) -> None:
        """``holder`` no longer holds ``publisher`` off (in ``holding``); with nothing else
        holding it, ``signal(publisher, OFF)``."""
        held = holding.get(publisher)
        if held is None:
            return
        held.discard(holder)
        if not held:
            del holding[publisher]
            signal(publisher, FlowState.OFF)

    def _hold_frame(self, state: FlowState, stream: int, dest: int,
                    credit: int = 0) -> bytearray:
        """A throttle hold ("on") or release ("off") from this appliance: to a local
        publisher on ``SESSION_FLOW_STREAM``, or to another appliance about its publisher
        ``stream``. ``credit`` (an "off" to a local publisher): the bytes it may send before
        its next credit (in ``queue_depth``; 0: no limit)."""
        return encode_admin(fl.FrameType.FLOW_CONTROL, [FlowControl(
            state, FlowPolicy.THROTTLE, credit, FLOW_THROTTLE_HIGH_MESSAGES,
            FLOW_THROTTLE_LOW_MESSAGES)], stream_id=stream, source_session=self.agent.node_id,
            dest_session=dest, send_ts_ns=time.time_ns())

    def _signal_node(self, remote: tuple[int, int], state: FlowState) -> None:
        """Tell appliance ``remote[0]`` to hold its publisher ``remote[1]`` off, or to let it
        go: a FLOW_CONTROL frame to that node, signed with the fabric key, towards its next
        hop (transit appliances carry it as a reliable stream's frame)."""
        agent = self.agent
        node, publisher = remote
        auth = agent.guaranteed.auth
        hop = agent.tables.next_hop.get(node)
        if auth is None or auth.key is None or hop is None:
            agent.counters["flow_node_signals_unroutable"] += 1
            return
        agent.queue_frame(FABRIC, hop, auth.signed_copy(self._hold_frame(state, publisher,
                                                                         node)))
        agent.counters["flow_node_signals_sent"] += 1

    # --- from other appliances ----------------------------------------------------------------
    def on_node_frame(self, frame: memoryview, src: int, dst: int, publisher: int,
                      now_ns: int) -> None:
        """A FLOW_CONTROL frame on the fabric from appliance ``src`` about this appliance's
        publisher ``publisher`` (its session id): its MAC checked first, then the publisher
        is held off (refreshed) or let go."""
        agent = self.agent
        counters = agent.counters
        auth = agent.guaranteed.auth
        reason = "no_key" if auth is None else auth.check_bytes(frame, src, dst,
                                                                agent.node_id)
        if reason is not None:
            counters["flow_node_signals_refused"] += 1
            counters[f"flow_node_signals_refused_{reason}"] += 1
            return
        try:
            _, entries = decode_frame(bytes(frame)).admin()
        except ProtocolError:
            counters["flow_signals_malformed"] += 1
            return
        counters["flow_node_signals_received"] += 1
        key = (src, publisher)
        for entry in entries:
            if entry.state is FlowState.ON:
                if agent.sessions.get(publisher) is None:
                    counters["flow_node_holds_unknown"] += 1  # gone, or not a session here
                    continue
                if key not in self.node_holds and len(self.node_holds) >= MAX_NODE_HOLDS:
                    counters["flow_node_holds_refused"] += 1
                    continue
                if key not in self.node_holds:
                    counters["flow_node_holds"] += 1
                self.node_holds[key] = now_ns + NODE_HOLD_EXPIRY_NS
                self.holding.setdefault(publisher, set()).add(("n", src))
                self._signal_publisher(publisher, FlowState.ON)
            elif self.node_holds.pop(key, None) is not None:
                self._release(("n", src), None, (publisher,))

    def _expire_node_holds(self, now_ns: int) -> None:
        for key, until in list(self.node_holds.items()):
            if now_ns >= until:
                del self.node_holds[key]
                self.agent.counters["flow_node_holds_expired"] += 1
                self._release(("n", key[0]), None, (key[1],))

    def _signal_publisher(self, publisher: int, state: FlowState, credit: int = 0) -> None:
        """Hold a local publisher off, or let it go (under a credit when it has one)."""
        agent = self.agent
        session = agent.sessions.get(publisher)
        if session is None:
            return
        if state is FlowState.OFF and not credit and publisher in self.credited:
            credit = self._grant()
            if not credit:  # no room now: the next renewal gives it
                return
        agent.queue_frame(session.channel, session.dest,
                          self._hold_frame(state, al.SESSION_FLOW_STREAM, publisher, credit))
        agent.counters["flow_publisher_signals"] += 1

    # --- credits to local publishers ----------------------------------------------------------
    def _start_credit(self, publisher: int, now_ns: int) -> None:
        """Put a local UDP publisher whose message just went to a session under flow control
        under a credit: from now on it sends at most what this appliance's clients' socket
        has room for until the next credit, so it cannot fill the socket (where the kernel
        would drop what it sent, unseen) while the data path is busy or not scheduled."""
        session = self.agent.sessions.get(publisher)
        if session is None:
            return
        if session.channel != CLIENT_UDP:  # (a ring or RDMA holds back its sender itself)
            self._uncredited.add(publisher)
            return
        self.credited[publisher] = now_ns
        self.agent.counters["flow_publisher_credits_started"] += 1
        if publisher not in self.holding:
            self._signal_publisher(publisher, FlowState.OFF)
            # sent now, not at the end of the cycle: the burst this message came in may take
            # the general loop seconds, while the publisher (not limited yet) goes on
            self.agent._out[CLIENT_UDP].flush()

    def _grant(self) -> int:
        """The credit of one publisher now: its share of the room left in the clients'
        socket below ``FLOW_INGRESS_HIGH_BYTES`` (0 when there is none)."""
        from appliance.client.flow import socket_backlog_bytes

        channel = self.agent.channels.get(CLIENT_UDP)
        room = FLOW_INGRESS_HIGH_BYTES - socket_backlog_bytes(getattr(channel, "_sock", None))
        if room <= 0:
            return 0
        return max(room // max(len(self.credited), 1), 1)

    def _renew_credits(self, now_ns: int) -> None:
        """Every ``FLOW_CREDIT_INTERVAL_NS``: a new credit to each credited publisher that is
        not held off; one idle for ``FLOW_CREDIT_IDLE_NS`` (or with no session under flow
        control left) is let go (an "off" of 0)."""
        self._credit_at_ns = now_ns + FLOW_CREDIT_INTERVAL_NS
        agent = self.agent
        end = not self.flows
        credit = 0 if end else self._grant()
        for publisher, seen in list(self.credited.items()):
            if publisher in self.holding:
                continue
            if end or now_ns - seen > FLOW_CREDIT_IDLE_NS:
                del self.credited[publisher]
                self._signal_publisher(publisher, FlowState.OFF)  # (0: no limit)
                agent.counters["flow_publisher_credits_ended"] += 1
            elif credit:
                self._signal_publisher(publisher, FlowState.OFF, credit)
                agent.counters["flow_publisher_credits"] += 1

    # --- the duty cycle -----------------------------------------------------------------------
    def _check_ingress(self, now_ns: int) -> None:
        """Whether the clients' or the fabric's UDP socket is filling faster than the data
        path reads it."""
        self._ingress_check_ns = now_ns + FLOW_INGRESS_CHECK_NS
        from appliance.client.flow import socket_backlog_bytes

        channels = self.agent.channels
        backlog = max(socket_backlog_bytes(getattr(channels.get(name), "_sock", None))
                      for name in (CLIENT_UDP, FABRIC))
        if backlog > FLOW_INGRESS_HIGH_BYTES:
            if not self.ingress_full:
                self.agent.counters["flow_ingress_full"] += 1
            self.ingress_full = True
        elif backlog < FLOW_INGRESS_LOW_BYTES:
            self.ingress_full = False

    def do_work(self, now_ns: int) -> int:
        work = 0
        agent = self.agent
        if now_ns >= self._ingress_check_ns:
            self._check_ingress(now_ns)
        if self.node_holds:
            self._expire_node_holds(now_ns)
        if self.credited and now_ns >= self._credit_at_ns:
            self._renew_credits(now_ns)
        for sid, flow in list(self.flows.items()):
            session = agent.sessions.get(sid)
            if session is None:
                self.forget(sid)
                continue
            queue = flow.queue
            if flow.on and now_ns >= flow.on_until_ns:  # not refreshed: the client is gone
                flow.on = False                         # or the "off" was lost
                flow.credit = FLOW_DEFAULT_CREDIT_MESSAGES
                flow.heard_ns = now_ns
                agent.counters["flow_control_expired"] += 1
            if (not flow.on and not flow.credit and len(queue)
                    and now_ns - flow.heard_ns > FLOW_QUIET_NS):
                # no word from the client for a while (it stopped repeating its "off"):
                # a measured amount goes on, so a queue never waits for ever
                flow.credit = FLOW_DEFAULT_CREDIT_MESSAGES
                flow.heard_ns = now_ns
                agent.counters["flow_credit_assumed"] += 1
            if not flow.on and flow.credit and len(queue):
                n = min(flow.credit, len(queue))
                out = agent._out[session.channel]
                poll = queue.poll
                for _ in range(n):
                    _, (origin, stream, data) = poll()
                    arr = np.frombuffer(data, np.uint8)
                    out.add_message(session.dest, origin, sid, stream, arr, 0, len(arr))
                session.delivered += n
                flow.credit -= n
                work += n
            throttle = flow.policy is FlowPolicy.THROTTLE
            if throttle:
                flow.gate.update(len(queue))
            want = (throttle and flow.gate.on) or self.ingress_full
            if want and (flow.publishers or flow.remote) and (
                    not flow.holding or now_ns >= flow.refresh_at_ns):
                self._hold(sid, flow, now_ns)
                flow.holding = True
            elif not want and flow.holding:
                self._release(sid, flow)
                flow.holding = False
            elif not want and not throttle and len(flow.publishers) > 4_096:
                flow.publishers.clear()  # (bounded: only a hold needs them)
                flow.remote.clear()
            if flow.drops and (now_ns >= flow.report_at_ns or not len(queue)):
                self._report(session, flow, now_ns)
                work += 1
            if (not flow.on and not len(queue) and not flow.drops and not flow.sticky
                    and now_ns - flow.heard_ns > FLOW_IDLE_NS):
                self.forget(sid)  # back to the forwarding pipeline
        return work

    def _report(self, session: Any, flow: SessionFlow, now_ns: int) -> None:
        """Tell the session what its policy dropped since the last report (in order with
        its messages: the same out queue)."""
        rows = [[key, name, count] for (key, name), count in flow.drops.items()]
        flow.drops.clear()
        flow.report_at_ns = now_ns + FLOW_REPORT_INTERVAL_NS
        agent = self.agent
        for i in range(0, len(rows), FLOW_REPORT_ROWS):
            doc = json.dumps({"drops": rows[i : i + FLOW_REPORT_ROWS]})
            frame = encode_admin(fl.FrameType.CONTROL, [al.Control(al.ControlKind.POLICY_DROPS,
                                                                   doc)],
                                 source_session=agent.node_id,
                                 dest_session=session.session_id, send_ts_ns=time.time_ns())
            agent.queue_frame(session.channel, session.dest, frame)
            agent.counters["flow_policy_reports"] += 1

    def forget(self, session_id: int) -> None:
        """The session leaves flow control (it is idle again, or it ended)."""
        flow = self.flows.pop(session_id, None)
        if flow is None:
            return
        if flow.publishers or flow.remote:
            self._release(session_id, flow)
        session = self.agent.sessions.get(session_id)
        if session is not None:
            session.flow = None
        self.agent.sessions_version += 1
        for publisher in [p for p, held in self.holding.items() if session_id in held]:
            self.holding[publisher].discard(session_id)
            if not self.holding[publisher]:
                del self.holding[publisher]

    def forget_publisher(self, session_id: int) -> None:
        """A local session ended: what held it off is dropped with it."""
        self.holding.pop(session_id, None)
        self.credited.pop(session_id, None)
        self._uncredited.discard(session_id)
        for key in [k for k in self.node_holds if k[1] == session_id]:
            del self.node_holds[key]

    def counts(self) -> dict[str, int]:
        """Levels for the status (gauges, not counts: ``GAUGE_COUNTERS`` in
        ops/mgmt/metrics.py): sessions under flow control, messages queued, publishers held
        off."""
        return {"flow_level_sessions": len(self.flows),
                "flow_level_queued": sum(len(f.queue) for f in self.flows.values()),
                "flow_level_publishers_held": len(self.holding),
                "flow_level_remote_publishers_held": len(self.remote_holding),
                "flow_level_node_holds": len(self.node_holds)}
