"""Shared subscription groups across the edges of a fabric (``mqtt.shared_namespace``,
docs/mqtt.md "Shared subscriptions across edges").

Without it a group is per edge (shared.py): members of one group on two edges each get a copy
of every message. With it, the edges that name the same namespace tell each other which
groups they have members of, and each message goes to one edge's members only:

- **Announcements.** One native client session of the edge, logged in as
  ``mqtt.shared_identity`` (P&M entitles it to publish and subscribe ``#`` in the
  namespace), subscribes ``#`` there and publishes on ``ANNOUNCE_TOPIC`` the edge's whole
  state: ``{"boot": ns, "seq": n, "groups": {"GROUP/FILTER": 1 | 0}}`` (1: a member is
  connected; 0: its members are all offline persistent sessions), at once when it changes
  (a new group ``JOIN_GRACE_S`` after its first member joined: until then this edge takes
  no share of it while another edge has members) and every ``ANNOUNCE_S`` while it has
  groups (an empty state is a withdrawal, sent when
  the last member leaves and when the edge stops). The announcing edge is the message's
  origin (its appliance id), not anything in the payload.
- **The view.** Each edge keeps, per other edge, its latest announcement (a later ``(boot,
  seq)`` replaces it) for ``EXPIRY_S`` after it arrived: an edge that died drops out of the
  view then. At most ``MAX_EDGES`` other edges and ``MAX_GROUPS`` groups per edge are kept
  (beyond: ignored and counted); an edge's own groups come from its router, at once.
- **The owner.** For a message of group ``GROUP/FILTER`` the candidates are the edges with a
  connected member (else, when none has one, every edge with a member), sorted by appliance
  id; the owner is ``candidates[h % n]``, ``h`` a stable hash (BLAKE2b) of the group and of
  the message's identity that shared.py already uses to recognise repeated arrivals (origin,
  publishing session, publish time, topic: set by the publisher, the same at every edge).
  Only the owner delivers (to one of its members, as shared.py does within an edge); the
  others drop the message (``shared_remote_owner``). While the edges' views agree, each
  message goes to one member of the fabric; while they differ (an announcement on its way,
  an edge dead and not yet expired) a message may go to two members or to none.
- **Hand-offs.** A QoS 1/2 message of a group this edge owns, or owed in the state it
  announced before (for ``HANDOFF_GRACE_S`` after that state dropped), with no member here
  to take it is handed to the other edges on ``HANDOFF_TOPIC`` (shared_handoff.py), by the
  same session after the announcement of the new state; a hand-off received is owned by the
  owner among the candidates without the handing edge (shared.py ``handed``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from appliance.edge.mqtt.namespace_session import NamespaceSession
from appliance.edge.mqtt.shared_handoff import (
    HANDOFF_GRACE_S,
    HANDOFF_MAX_BYTES,
    HANDOFF_PENDING,
    HANDOFF_PENDING_BYTES,
    HANDOFF_TOPIC,
    Handoff,
    encode_handoff,
    parse_handoff,
)

if TYPE_CHECKING:
    from appliance.edge.mqtt.server import MqttServer

log = logging.getLogger("topicwire.edge.mqtt.shared_view")

ANNOUNCE_S = 2.0
"""An edge with members announces its groups again this often."""
JOIN_GRACE_S = 1.0
"""A group new at an edge is announced, and the edge takes a share of its messages, this
long after its first member joined: time for the member's native subscription to reach the
publishers' appliances, so that the other edges do not leave it messages it never gets."""
EXPIRY_S = 6.0
"""An edge's announcement counts this long after it arrived (three announcements missed)."""
MAX_EDGES = 64
"""Other edges kept in the view, at most (``shared_view_edges_full`` beyond)."""
MAX_GROUPS = 1024
"""Groups of one edge announced and kept, at most (``shared_view_groups_full`` beyond)."""
ANNOUNCE_MAX_BYTES = 256 * 1024
"""An announcement's payload, at most: groups beyond are not announced (counted), a larger
one received is refused (so the view holds at most ``MAX_EDGES`` times this)."""
ANNOUNCE_TOPIC = "edges"
"""The announcements' topic in the namespace."""
STATUS_GROUPS = 100
"""Groups listed in ``/status`` ``mqtt.shared.groups``, at most (sorted by key)."""
HANDOFF_RETRY_S = 0.2
"""Hand-offs the session could not send are sent again this long after."""


def _ranked(edges: dict[int, int]) -> list[int]:
    """The candidates among ``edges`` (edge -> flag): those with a connected member (flag 1),
    else all of them; sorted."""
    connected = [e for e, f in edges.items() if f]
    return sorted(connected or edges)


def owner_hash(key: str, msg: Any) -> int:
    """A stable hash (not Python's salted ``hash``) of group ``key`` and the message's
    identity: the same at every edge for one message."""
    head = struct.pack(">QQq", msg.origin & (2**64 - 1),
                       (msg.stream & ~RELIABLE_STREAM_BIT) & (2**64 - 1), msg.publish_ts_ns)
    topic = msg.topic if isinstance(msg.topic, bytes) else str(msg.topic).encode()
    digest = hashlib.blake2b(head + key.encode() + b"\0" + topic, digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(candidates: list[int], key: str, msg: Any) -> int:
    """The edge of ``candidates`` (sorted appliance ids) that delivers ``msg``."""
    return candidates[owner_hash(key, msg) % len(candidates)]


@dataclass
class EdgeEntry:
    """Another edge's latest announcement."""

    boot: int
    seq: int
    groups: dict[str, int] = field(default_factory=dict)
    heard: float = 0.0
    """When it arrived (monotonic seconds)."""


def parse_announcement(payload: bytes) -> tuple[int, int, dict[str, int]] | None:
    """(boot, seq, groups) of an announcement; None when it is not one."""
    try:
        doc = json.loads(bytes(payload))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    boot, seq, groups = doc.get("boot"), doc.get("seq"), doc.get("groups")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (boot, seq)):
        return None
    if not isinstance(groups, dict) or not all(
            isinstance(k, str) and k and v in (0, 1) and not isinstance(v, bool)
            for k, v in groups.items()):
        return None
    return boot, seq, groups


class SharedView(NamespaceSession):
    """See the module docstring. The view lives on the server's event loop; the session's
    thread sends and receives announcements."""

    WHAT = "shared view"
    PREFIX = "shared_view"

    def __init__(self, server: MqttServer, namespace: int, identity: str,
                 clock: Any = time.monotonic) -> None:
        super().__init__(server, namespace, identity)
        self.node_id = server.node_id
        self.clock = clock
        self.remote: dict[int, EdgeEntry] = {}
        self.index: dict[str, dict[int, int]] = {}
        """Group -> the other edges that announced it -> their flag (1: a connected member)."""
        self.local: dict[str, int] = {}
        """This edge's groups past their ``JOIN_GRACE_S`` (announced) -> their flag."""
        self._maturing: Any = None
        self.boot = time.time_ns()
        self._seq = 0
        self._groups: dict[str, int] = {}
        """What the session's thread announces (replaced whole by the loop)."""
        self._wake = threading.Event()
        self._sweep: Any = None
        self._snapshot: dict[str, Any] = {"edges": [], "groups": {}}
        self.left: dict[str, tuple[int, float]] = {}
        """(the loop) Groups whose announced flag dropped (withdrawn, or 1 -> 0) -> (the
        flag before, until when this edge hands off what it owed in that state)."""
        self._outbox: deque[bytes] = deque()
        """Hand-offs' payloads for the session's thread to send (``_outbox_lock``)."""
        self._outbox_bytes = 0
        self._outbox_lock = threading.Lock()

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> SharedView:
        self._start_thread("mqtt-shared-view")
        self.server.loop.call_soon_threadsafe(self._tick)
        return self

    def close(self) -> None:
        """Withdraw (an empty announcement), log out (safe twice)."""
        self._stop.set()
        self._wake.set()
        sweep, self._sweep = self._sweep, None
        if sweep is not None:
            self.server.loop.call_soon_threadsafe(sweep.cancel)
        self._join_and_log_out()

    # --- this edge's groups (the loop) ------------------------------------------------------
    def local_changed(self) -> None:
        """The router's groups or their members' connections changed: announce at once."""
        if self._stop.is_set():
            return
        router = self.server.shared_router
        now = self.clock()
        state, young = {}, []
        for key, flag in router.flags().items():
            since = router.since.get(key, now - JOIN_GRACE_S)
            if now - since >= JOIN_GRACE_S:
                state[key] = flag
            else:
                young.append(since + JOIN_GRACE_S - now)
        if young and self._maturing is None:  # (announced when they come of age)
            def mature() -> None:
                self._maturing = None
                self.local_changed()
            self._maturing = self.server.loop.call_later(min(young) + 0.01, mature)
        if state != self.local:
            until = now + HANDOFF_GRACE_S
            for key, flag in self.local.items():
                if state.get(key, -1) < flag:  # (the highest flag of the grace counts)
                    was = self.left.get(key)
                    self.left[key] = (flag if was is None else max(flag, was[0]), until)
            for key in [k for k, (flag, _) in self.left.items() if state.get(k, -1) >= flag]:
                del self.left[key]
            self.local = state
            self._groups = self._bounded(state)
            self._wake.set()
            self._refresh_snapshot()

    def _bounded(self, state: dict[str, int]) -> dict[str, int]:
        """The groups to announce, within ``MAX_GROUPS`` and ``ANNOUNCE_MAX_BYTES``."""
        groups: dict[str, int] = {}
        size = 0
        for key in sorted(state):
            size += len(json.dumps(key)) + 4
            if len(groups) >= MAX_GROUPS or size > ANNOUNCE_MAX_BYTES:
                self.server.count("shared_view_groups_not_announced")
                break
            groups[key] = state[key]
        return groups

    def _tick(self) -> None:
        """Every ``ANNOUNCE_S`` (the loop): expired edges leave the view; this edge's state is
        taken again (a change a hook missed is announced)."""
        if self._stop.is_set():
            return
        now = self.clock()
        for edge, entry in list(self.remote.items()):
            if now - entry.heard > EXPIRY_S:
                if entry.groups:
                    self.server.count("shared_view_expired")
                    log.info("mqtt: shared view: edge %d silent for %.0f s: out of the view",
                             edge, now - entry.heard)
                self._drop(edge)
        for key in [k for k, (_, until) in self.left.items() if now > until]:
            del self.left[key]
        self.local_changed()
        self._refresh_snapshot()
        self._sweep = self.server.loop.call_later(ANNOUNCE_S, self._tick)

    # --- the owner (the loop, per message) --------------------------------------------------
    def candidates(self, key: str, own: int | None, exclude: int | None = None) -> list[int]:
        """The edges that share ``key``'s messages, sorted; ``own``: this edge's flag (None:
        no member here; this edge counts once the group is announced); ``exclude``: an edge
        left out (one that handed a message off)."""
        edges = self._live(key, exclude)
        if own is not None and key in self.local:
            edges[self.node_id] = own
        return _ranked(edges)

    def _live(self, key: str, exclude: int | None = None) -> dict[int, int]:
        """The other edges announcing ``key`` and heard within ``EXPIRY_S`` -> their flag."""
        now = self.clock()
        return {e: f for e, f in self.index.get(key, {}).items()
                if e != exclude and now - self.remote[e].heard <= EXPIRY_S}

    def owns(self, key: str, own: int | None, msg: Any, exclude: int | None = None) -> bool:
        """Whether this edge delivers ``msg`` of group ``key`` (``exclude``: ``candidates``)."""
        candidates = self.candidates(key, own, exclude)
        if self.node_id not in candidates:  # (no other edge: this one's members, joining)
            return not candidates and own is not None
        return len(candidates) == 1 or owner_of(candidates, key, msg) == self.node_id

    def owed(self, key: str, msg: Any) -> bool:
        """Whether this edge owned ``msg`` of group ``key`` in the state it announced before
        its flag dropped (``left``, ``HANDOFF_GRACE_S``): another edge still holding that
        state left it to this one."""
        was = self.left.get(key)
        if was is None or self.clock() > was[1]:
            return False
        edges = self._live(key)
        edges[self.node_id] = was[0]
        return owner_of(_ranked(edges), key, msg) == self.node_id

    def connected_elsewhere(self, key: str) -> bool:
        """Whether another edge in the view has a connected member of ``key``."""
        return any(self._live(key).values())

    def stopped(self) -> bool:
        return self._stop.is_set()

    # --- hand-offs (the loop, then the session's thread) -------------------------------------
    def hand_off(self, d: Any) -> bool:
        """Queue shared delivery ``d`` (QoS 1/2, with its ``ident``) as a hand-off, sent
        after the announcement of this edge's current state; False when it cannot be
        (counted): too large, the queue full, the view stopped."""
        from dataclasses import replace

        from appliance.edge.mqtt.meta import MetadataTooLarge, to_headers

        if self._stop.is_set():
            self.server.count("shared_handoffs_dropped_stopping")
            return False
        key, origin, stream, ts, topic = d.ident
        meta = d.meta if d.meta is None or not d.meta.origin else replace(d.meta, origin=0)
        try:
            payload = encode_handoff(Handoff(key, origin, stream, ts, topic, d.qos,
                                             dict(to_headers(meta, d.qos)), bytes(d.payload)))
        except (ValueError, MetadataTooLarge):
            self.server.count("shared_handoffs_too_large")
            return False
        with self._outbox_lock:
            if (len(self._outbox) >= HANDOFF_PENDING
                    or self._outbox_bytes + len(payload) > HANDOFF_PENDING_BYTES):
                self.server.count("shared_handoffs_dropped_full")
                return False
            self._outbox.append(payload)
            self._outbox_bytes += len(payload)
        self._wake.set()
        return True

    def _take_outbox(self) -> list[bytes]:
        with self._outbox_lock:
            out = list(self._outbox)
            self._outbox.clear()
            self._outbox_bytes = 0
        return out

    def _put_back(self, payloads: list[bytes]) -> None:
        """Hand-offs not sent: first again (still in order)."""
        with self._outbox_lock:
            self._outbox.extendleft(reversed(payloads))
            self._outbox_bytes += sum(len(p) for p in payloads)

    def _send_handoffs(self, native: Any, payloads: list[bytes]) -> bool:
        """(the thread) Publish hand-offs; those not sent for now (the session lost, held
        off, busy) are put back (False); one the client refuses otherwise is dropped
        (``shared_handoffs_refused``)."""
        from appliance.client.errors import (
            BackPressureError,
            BusyError,
            ClientError,
            ConnectionLostError,
            NoAnswerError,
        )

        for i, payload in enumerate(payloads):
            try:
                native.publish(HANDOFF_TOPIC, payload, qos="guaranteed",
                               namespace=self.namespace, flush=True)
            except (ConnectionLostError, BackPressureError, BusyError, NoAnswerError) as exc:
                self.server.count("shared_handoffs_send_failed")
                log.info("mqtt: shared view: %d hand-offs not sent yet: %s",
                         len(payloads) - i, exc)
                self._put_back(payloads[i:])
                return False
            except ClientError as exc:
                if native.closed:  # (logged in again by the next round)
                    self.server.count("shared_handoffs_send_failed")
                    self._put_back(payloads[i:])
                    return False
                self.server.count("shared_handoffs_refused")
                log.warning("mqtt: shared view: a hand-off refused: %s", exc)
                continue
            self.server.count("shared_handoffs_sent")
        return True

    # --- the other edges' announcements -----------------------------------------------------
    def _on_native(self, msg: Any) -> None:
        """A message of the namespace (the native client's thread)."""
        if msg.origin == self.node_id:
            return  # our own announcement or hand-off
        if msg.topic == HANDOFF_TOPIC:
            handoff = None if len(msg.payload) > HANDOFF_MAX_BYTES else parse_handoff(
                msg.payload)
            if handoff is None:
                self.server.count("shared_handoffs_bad")
                return
            self.server.loop.call_soon_threadsafe(self.server.shared_router.handed,
                                                  msg.origin, handoff)
            return
        parsed = None if len(msg.payload) > ANNOUNCE_MAX_BYTES else parse_announcement(
            msg.payload)
        if parsed is None:
            self.server.count("shared_view_bad_announcements")
            return
        self.server.loop.call_soon_threadsafe(self.apply, msg.origin, *parsed)

    def apply(self, edge: int, boot: int, seq: int, groups: dict[str, int]) -> None:
        """(the loop) Edge ``edge``'s announcement."""
        entry = self.remote.get(edge)
        if entry is not None and (boot, seq) <= (entry.boot, entry.seq):
            self.server.count("shared_view_stale")
            return
        if entry is None and len(self.remote) >= MAX_EDGES:
            self.server.count("shared_view_edges_full")
            return
        if len(groups) > MAX_GROUPS:
            self.server.count("shared_view_groups_full")
            groups = dict(sorted(groups.items())[:MAX_GROUPS])
        self._drop(edge)
        self.remote[edge] = EdgeEntry(boot, seq, groups, self.clock())
        for key, flag in groups.items():
            self.index.setdefault(key, {})[edge] = flag
        self.server.count("shared_view_announcements")
        self._refresh_snapshot()

    def _drop(self, edge: int) -> None:
        entry = self.remote.pop(edge, None)
        if entry is None:
            return
        for key in entry.groups:
            edges = self.index.get(key)
            if edges is not None:
                edges.pop(edge, None)
                if not edges:
                    del self.index[key]

    # --- the session's thread ---------------------------------------------------------------
    def _run(self) -> None:
        last = 0.0
        sent: dict[str, int] | None = None
        held: Any = None
        while not self._stop.is_set():
            native = self.logged_in()
            if native is None:
                continue
            if native is not held:  # a new login: announce again
                held, sent = native, None
            if not self._outbox:
                self._wake.wait(max(0.0, last + ANNOUNCE_S - time.monotonic()))
                self._wake.clear()
            if self._stop.is_set():
                break
            # the hand-offs first, then the state: each was queued after the state it follows
            handoffs = self._take_outbox()
            groups = self._groups
            due = time.monotonic() >= last + ANNOUNCE_S
            if groups != sent or (groups and due):
                if not self._announce(native, groups):
                    self._put_back(handoffs)
                    self._stop.wait(HANDOFF_RETRY_S)
                    continue
                sent, last = groups, time.monotonic()
            if handoffs and not self._send_handoffs(native, handoffs):
                self._stop.wait(HANDOFF_RETRY_S)
        native = self.native
        if native is not None and not native.closed:
            handoffs = self._take_outbox()
            if sent:
                self._announce(native, {})  # the withdrawal
            self._send_handoffs(native, handoffs)

    def _announce(self, native: Any, groups: dict[str, int]) -> bool:
        from appliance.client.errors import ClientError

        self._seq += 1
        payload = json.dumps({"boot": self.boot, "seq": self._seq, "groups": groups},
                             separators=(",", ":")).encode()
        try:
            native.publish(ANNOUNCE_TOPIC, payload, qos="guaranteed",
                           namespace=self.namespace, flush=True)
        except ClientError as exc:
            self.server.count("shared_view_send_failed")
            log.info("mqtt: shared view: an announcement not sent: %s", exc)
            return False
        self.server.count("shared_view_sent")
        return True

    # --- status -----------------------------------------------------------------------------
    def _refresh_snapshot(self) -> None:
        """(the loop) What ``status`` shows, rebuilt here so another thread reads it whole."""
        now = self.clock()
        live = sorted(e for e, entry in self.remote.items()
                      if entry.groups and now - entry.heard <= EXPIRY_S)
        keys = sorted(set(self.index) | set(self.local))[:STATUS_GROUPS]
        self._snapshot = {"edges": live, "groups": {
            k: self.candidates(k, self.local.get(k)) for k in keys}}

    def status(self) -> dict[str, Any]:
        return {**self.session_status(),
                "node": self.node_id, "announced": len(self.local),
                "handoffs_pending": len(self._outbox), **self._snapshot}
