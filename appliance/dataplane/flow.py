"""Flow control towards client sessions: the appliance's side (docs/flow-control.md).

A subscribing client tells its appliance the state of its receive queue with FLOW_CONTROL
frames on stream ``SESSION_FLOW_STREAM`` (on above its high watermark, refreshed while on;
off below its low one, with its depth: how much the appliance may send before it hears
again). From the first "on", the session's messages leave the forwarding pipeline for the
general loop (``express.build_plan``: a session with ``flow`` set is ``K_GENERAL``), which
puts them in the session's ``SessionFlow`` queue, and the queue applies the session's
policy while the client holds it off:

- ``THROTTLE``: nothing is dropped. Above ``FLOW_THROTTLE_HIGH_MESSAGES`` queued, the local
  publishers whose messages are queued get FLOW_CONTROL "on" (refreshed; "off" below
  ``FLOW_THROTTLE_LOW_MESSAGES``): their ``publish`` waits. A queue that still reaches
  ``FLOW_THROTTLE_QUEUE_MESSAGES`` (publishers on other appliances, which this does not
  reach) drops what does not fit, counted ``flow_dropped_throttle`` and reported.

Whatever the policy, the local publishers whose messages go to sessions under flow control
are held off the same way while the clients' UDP socket fills faster than the data path
reads it (``FLOW_INGRESS_HIGH_BYTES``): the kernel would drop what they publish unseen.
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
FLOW_REPORT_INTERVAL_NS = 50_000_000
"""Drops are reported to the session at most this often (and when its queue empties)."""
FLOW_REPORT_ROWS = 256
"""(key, policy, count) rows in one POLICY_DROPS document."""


class SessionFlow:
    """One client session's flow-control state at its appliance."""

    __slots__ = ("credit", "drops", "gate", "heard_ns", "holding", "on", "on_until_ns",
                 "policy", "publishers", "queue", "refresh_at_ns", "report_at_ns", "sticky")

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
        self.refresh_at_ns = 0
        self.holding = False
        """Throttle: its publishers are being held off."""


class SessionFlows:
    """The data-path agent's flow-control sessions (``DataPlaneAgent.flows``)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.flows: dict[int, SessionFlow] = {}
        self.holding: dict[int, set[int]] = {}
        """Publisher session id -> the sessions whose throttle queues hold it off."""
        self.ingress_full = False
        """The clients' UDP socket holds more than ``FLOW_INGRESS_HIGH_BYTES`` not yet read
        (until less than ``FLOW_INGRESS_LOW_BYTES``): throttle sessions hold their
        publishers off, or the kernel would drop what they publish before it is read."""
        self._ingress_check_ns = 0

    @property
    def active(self) -> bool:
        return bool(self.flows)

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
            if flow.policy is FlowPolicy.THROTTLE and \
                    flow.gate.update(len(queue)) is FlowState.ON:
                self._hold(session.session_id, flow, agent.cycle_ns)
                flow.holding = True

    def _dropped(self, flow: SessionFlow, key: int, policy_name: str) -> None:
        flow.drops[(key, policy_name)] += 1
        self.agent.counters[f"flow_dropped_{policy_name.replace('-', '_')}"] += 1

    # --- throttling local publishers ----------------------------------------------------------
    def _hold(self, holder: int, flow: SessionFlow, now_ns: int) -> None:
        flow.refresh_at_ns = now_ns + FLOW_CONTROL_REFRESH_INTERVAL_NS
        for publisher in flow.publishers:
            self.holding.setdefault(publisher, set()).add(holder)
            self._signal_publisher(publisher, FlowState.ON)

    def _release(self, holder: int, flow: SessionFlow) -> None:
        for publisher in flow.publishers:
            held = self.holding.get(publisher)
            if held is None:
                continue
            held.discard(holder)
            if not held:
                del self.holding[publisher]
                self._signal_publisher(publisher, FlowState.OFF)
        flow.publishers.clear()

    def _signal_publisher(self, publisher: int, state: FlowState) -> None:
        agent = self.agent
        session = agent.sessions.get(publisher)
        if session is None:
            return
        frame = encode_admin(fl.FrameType.FLOW_CONTROL, [FlowControl(
            state, FlowPolicy.THROTTLE, 0, FLOW_THROTTLE_HIGH_MESSAGES,
            FLOW_THROTTLE_LOW_MESSAGES)], stream_id=al.SESSION_FLOW_STREAM,
            source_session=agent.node_id, dest_session=publisher, send_ts_ns=time.time_ns())
        agent.queue_frame(session.channel, session.dest, frame)
        agent.counters["flow_publisher_signals"] += 1

    # --- the duty cycle -----------------------------------------------------------------------
    def _check_ingress(self, now_ns: int) -> None:
        """Whether the clients' UDP socket is filling faster than the data path reads it."""
        self._ingress_check_ns = now_ns + FLOW_INGRESS_CHECK_NS
        from appliance.client.flow import socket_backlog_bytes
        from appliance.dataplane.names import CLIENT_UDP

        backlog = socket_backlog_bytes(getattr(self.agent.channels.get(CLIENT_UDP), "_sock",
                                               None))
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
            if want and flow.publishers and (not flow.holding or now_ns >= flow.refresh_at_ns):
                self._hold(sid, flow, now_ns)
                flow.holding = True
            elif not want and flow.holding:
                self._release(sid, flow)
                flow.holding = False
            elif not want and not throttle and len(flow.publishers) > 4_096:
                flow.publishers.clear()  # (bounded: only a hold needs them)
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
        if flow.publishers:
            self._release(session_id, flow)
        session = self.agent.sessions.get(session_id)
        if session is not None:
            session.flow = None
        self.agent.sessions_version += 1
        for publisher in [p for p, held in self.holding.items() if session_id in held]:
            self.holding[publisher].discard(session_id)
            if not self.holding[publisher]:
                del self.holding[publisher]

    def counts(self) -> dict[str, int]:
        """Levels for the status (gauges, not counts: ``GAUGE_COUNTERS`` in
        ops/mgmt/metrics.py): sessions under flow control, messages queued, publishers held
        off."""
        return {"flow_level_sessions": len(self.flows),
                "flow_level_queued": sum(len(f.queue) for f in self.flows.values()),
                "flow_level_publishers_held": len(self.holding)}
