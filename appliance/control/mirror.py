"""The standby's mirror of client sessions (docs/fault-tolerance.md, "The standby's mirror").

An appliance with ``clients.mirror_to = "NEIGHBOUR"`` (the primary) sends that neighbour (the
standby its clients name) the subscriptions of each client session whose client has a
standby (``LOGIN.standby``): a CONTROL ``SESSION_MIRROR`` document, signed on the fabric link
like every admin frame, at once when a session's subscriptions change or it ends, and all of
them every ``MIRROR_REFRESH_NS`` (a lost frame, a restarted standby). The standby keeps them
(``Mirror.records``, bounded) for ``MIRROR_KEEP_NS`` after the last word about them, so that
a primary that died leaves them behind for the clients about to move.

When a client's session moves to the standby (its login names the session it leaves,
``moved_from``), the standby makes the mirrored subscriptions for the new session before it
answers the login, and the answer names them (``LOGIN_RESULT.restored``): the client does not
make them again (appliance/client/connection.py ``_subscribe_again``), so a move costs one
round trip and one table build, however many subscriptions the session had.

Only what can be made again exactly is mirrored: a session whose lists hold a negative
entry (a partial unsubscribe, seed 000) or a subscription with a selector is sent as ended,
and its client makes its subscriptions again itself as before. Stream positions stay the
client's (the identities of the messages it handed over): every appliance numbers its own
streams, so a position at the primary means nothing at the standby.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from appliance.control.documents import MAX_MIRROR_SESSIONS, MAX_MIRROR_SUBSCRIPTIONS
from appliance.control.state import QOS_GUARANTEED, Session, log
from datapath.protocol import admin_layout as al
from datapath.protocol.frame_layout import FrameType

MIRROR_REFRESH_NS = 20_000_000_000
"""Every mirrored session is sent again this often, as last computed (a lost frame); all of
them also when the standby's link comes up (a restarted standby)."""
MIRROR_KEEP_NS = 60_000_000_000
"""The standby keeps a record this long after the last document that named it: a primary
that died leaves its sessions' records for their clients' moves."""
MAX_MIRRORS = 65_536
"""Records the standby keeps at most (from every neighbour together); beyond, new ones are
refused and counted (``mirror_refused_full``)."""
MIRROR_DOC_BYTES = 16_000
"""A SESSION_MIRROR document is cut at about this many bytes of JSON."""
QOS_NUMBERS = {"best-effort": 0, "last-value": 1}


@dataclass
class Mirrored:
    """A session mirrored here by a neighbour."""

    identity: str
    subscriptions: tuple[tuple[int, str, int], ...]
    heard_ns: int


class Mirror:
    """Both sides of the mirror for one control agent: what it sends to ``clients.mirror_to``
    (``changed``, ``ended``, ``timers``) and what it keeps for its neighbours (``on_document``,
    ``take``). Runs on the control agent's thread."""

    def __init__(self, target: str | None) -> None:
        self.target = target
        self.records: dict[tuple[int, int], Mirrored] = {}
        self._dirty: set[int] = set()
        self._rows: dict[int, list | None] = {}
        """Session -> its subscriptions as last sent (None: not mirrored), recomputed only
        when they change: a refresh costs no walk of the lists."""
        self._ended: list[int] = []
        self._refresh_at = 0
        self._target_up = False
        self._expire_at = 0
        self.kept_subscriptions = 0
        """Subscriptions of the records kept (status: ``mirror_records_subscriptions``)."""

    # --- the primary's side ----------------------------------------------------------------
    def changed(self, session: Session) -> None:
        """A mirrored session's subscriptions changed (sent at the next ``timers``)."""
        if self.target is not None and session.standby:
            self._dirty.add(session.session_id)

    def ended(self, session: Session) -> None:
        """A mirrored session ended here: the standby forgets it."""
        if self.target is not None and session.standby:
            self._dirty.discard(session.session_id)
            self._rows.pop(session.session_id, None)
            if len(self._ended) < MAX_MIRROR_SESSIONS * 16:  # (bounded: sent soon, or refreshed)
                self._ended.append(session.session_id)

    def timers(self, agent: Any, now_ns: int) -> None:
        """Send what changed, and everything every ``MIRROR_REFRESH_NS`` or when the standby
        has just come up."""
        if self.target is None:
            return
        nb = next((n for n in agent.neighbours.values() if n.config.name == self.target),
                  None)
        up = nb is not None and nb.up
        if not up:
            self._target_up = False
            return
        full = not self._target_up or now_ns >= self._refresh_at
        self._target_up = True
        if not (full or self._dirty or self._ended):
            return
        for sid in self._dirty:
            session = agent.sessions.get(sid)
            if session is not None:
                subs = self._rows[sid] = self._subscriptions(agent, session)
                if subs is None:
                    agent.counters["mirror_sessions_not_mirrored"] += 1
        if full:
            self._refresh_at = now_ns + MIRROR_REFRESH_NS
            ids = [sid for sid, s in agent.sessions.items() if s.standby and sid in self._rows]
        else:
            ids = sorted(self._dirty)
        self._dirty.clear()
        rows, ended = [], list(self._ended)
        self._ended.clear()
        for sid in ids:
            session = agent.sessions.get(sid)
            subs = self._rows.get(sid)
            if session is None:
                continue
            if subs is None:  # cannot be made again exactly: the standby forgets it
                ended.append(sid)
            else:
                rows.append([sid, session.identity, subs])
        self._send(agent, nb, rows, ended)

    @staticmethod
    def _subscriptions(agent: Any, session: Session) -> list | None:
        """(namespace, pattern, QoS number) of the session's subscriptions, or None when
        they cannot be made again exactly (a negative list entry, a selector, too many)."""
        if session.rules:
            return None
        for _, egress in agent._session_lists(session):
            if any(not e.positive for lst in egress.lists.values() for e in lst.entries):
                return None
        subs = [[ns, p, QOS_NUMBERS.get(session.qos.get((ns, p), "best-effort"), 0)]
                for ns, p in sorted(session.patterns)]
        subs += [[ns, p, QOS_GUARANTEED] for ns, p in sorted(session.gpatterns)]
        return subs if len(subs) <= MAX_MIRROR_SUBSCRIPTIONS else None

    @staticmethod
    def _send(agent: Any, nb: Any, rows: list, ended: list) -> None:
        """Rows and ended sessions in documents of at most MIRROR_DOC_BYTES."""
        doc: dict[str, list] = {"sessions": [], "ended": []}
        size = 0

        def flush() -> None:
            nonlocal doc, size
            if doc["sessions"] or doc["ended"]:
                out = {"sessions": doc["sessions"]}
                if doc["ended"]:
                    out["ended"] = doc["ended"]
                agent._to_neighbour(nb, FrameType.CONTROL,
                                    [agent._control(al.ControlKind.SESSION_MIRROR, out)])
                agent.counters["mirror_documents_sent"] += 1
            doc, size = {"sessions": [], "ended": []}, 0

        for row in rows:
            cost = len(json.dumps(row)) + 2
            if size + cost > MIRROR_DOC_BYTES or len(doc["sessions"]) >= MAX_MIRROR_SESSIONS:
                flush()
            doc["sessions"].append(row)
            size += cost
        for sid in ended:
            if size + 12 > MIRROR_DOC_BYTES or len(doc["ended"]) >= MAX_MIRROR_SESSIONS:
                flush()
            doc["ended"].append(sid)
            size += 12
        flush()
        agent.counters["mirror_sessions_sent"] += len(rows)

    # --- the standby's side ----------------------------------------------------------------
    def on_document(self, agent: Any, node_id: int, doc: dict, now_ns: int) -> None:
        """A SESSION_MIRROR from neighbour ``node_id`` (checked by ``validate``)."""
        records = self.records
        for sid in doc.get("ended", ()):
            self._forget((node_id, sid))
        for sid, identity, subs in doc["sessions"]:
            key = (node_id, sid)
            if key not in records and len(records) >= MAX_MIRRORS:
                agent.counters["mirror_refused_full"] += 1
                continue
            self._forget(key)
            records[key] = Mirrored(identity, tuple((ns, p, q) for ns, p, q in subs), now_ns)
            self.kept_subscriptions += len(subs)
        agent.counters["mirror_documents_received"] += 1
        if now_ns >= self._expire_at:
            self._expire_at = now_ns + MIRROR_REFRESH_NS
            old = [k for k, r in records.items() if now_ns - r.heard_ns > MIRROR_KEEP_NS]
            for key in old:
                self._forget(key)
            agent.counters["mirror_records_expired"] += len(old)
        agent.counters["mirror_records"] = len(records)
        agent.counters["mirror_records_subscriptions"] = self.kept_subscriptions

    def _forget(self, key: tuple[int, int]) -> Mirrored | None:
        record = self.records.pop(key, None)
        if record is not None:
            self.kept_subscriptions -= len(record.subscriptions)
        return record

    def take(self, node_id: int, session_id: int, identity: str, now_ns: int
             ) -> tuple[tuple[int, str, int], ...] | None:
        """The subscriptions mirrored for session ``session_id`` of neighbour ``node_id``,
        when the same identity logs in here naming it (``moved_from``); None otherwise. The
        record goes (a second move from there is not made from it); a login of another
        identity naming it leaves it."""
        record = self.records.get((node_id, session_id))
        if record is None or record.identity != identity:
            return None
        self._forget((node_id, session_id))
        if now_ns - record.heard_ns > MIRROR_KEEP_NS:
            log.info("mirror: the record of session %d is %.0f s old: not used", session_id,
                     (now_ns - record.heard_ns) / 1e9)
            return None
        return record.subscriptions
