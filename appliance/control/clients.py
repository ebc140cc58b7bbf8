"""The control agent's client side: logins and sessions, subscriptions, registrations and
key resolution, entitlements and their limits (``ClientSide``, one part of ``ControlAgent``;
docs/appliance.md, "Clients")."""


import copy
import hmac
import logging
import os
import random
import time
from collections import Counter
from json.encoder import encode_basestring_ascii
from typing import Any

from appliance.config import (
    APPLIANCE_EGRESS_PORTS,
    DENIAL_TEXT_CHARS,
    DENIALS_KEPT,
    LOGIN_CHALLENGE_TTL_NS,
    LOGIN_CHALLENGES_KEPT,
)
from appliance.control import acl_apply, flow_apply, selector_apply
from appliance.control import pm as pmod
from appliance.control.credentials import (
    NONCE_BYTES,
    auth_message,
    server_signature,
    verify_proof,
)
from appliance.control.documents import DocumentError, validate
from appliance.control.state import (
    QOS_GUARANTEED,
    QOS_NAMES,
    REGISTRY_FRAME_BYTES,
    Session,
    log,
)
from appliance.dataplane.agent import (
    CLIENT_SHM,
    DpSession,
)
from appliance.dataplane.state import OWN_GUARANTEED, OWN_PLAIN
from datapath.protocol import admin_layout as al
from datapath.protocol.codec import decode_frame, encode_admin
from datapath.protocol.errors import ProtocolError
from datapath.protocol.frame_layout import FrameType
from datapath.topics.algebra import TopicError, is_pattern
from datapath.topics.registry import RegistryError
from datapath.topics.sublist import SubscriptionList
from nic_offload.errors import OffloadError

_ACCEPTED_REGISTER = '{"request":"register","topic":%s,"namespace":%d,"accepted":true}'
"""The answer to an accepted registration, its topic as a JSON string (``_json_text``): what
``json.dumps`` makes of the answer's dict, made without it (100,000 answers per batch)."""
_json_text = encode_basestring_ascii


class ClientSide:
    """Client sessions: login, subscribe, register, resolve, expiry, refusals. Its methods
    run on the control agent's thread with the agent's state (``ControlAgent`` inherits
    them)."""

    # --- clients ------------------------------------------------------------------------------
    def _on_client(self, channel: str, peer: int, data: bytes, now_ns: int) -> None:
        try:
            frame = decode_frame(data)
        except ProtocolError:
            self.counters["client_malformed"] += 1
            return
        ftype = frame.header.frame_type
        _, entries = frame.admin()
        sid = self.session_of_peer.get((channel, peer))
        session = self.sessions.get(sid) if sid is not None else None
        if ftype is FrameType.CONTROL and entries[0].kind is al.ControlKind.LOGIN:
            try:
                doc = validate(al.ControlKind.LOGIN, entries[0].document, "client")
            except DocumentError as exc:
                self._bad_document(channel, peer, exc, now_ns)
                if channel != CLIENT_SHM:  # a ring is named by the document
                    self._refuse_login(channel, peer, None, "bad_document", str(exc))
                return
            self._login(channel, peer, doc, now_ns)
            return
        if session is None or frame.header.source_session != session.session_id:
            self.counters["client_no_session"] += 1
            return
        self.counters["client_admin_frames"] += 1  # its entries are counted as they go
        session.last_heard_ns = now_ns
        if ftype in (FrameType.SUBSCRIBE, FrameType.UNSUBSCRIBE):
            self._subscribe_frame(session, entries, ftype is FrameType.SUBSCRIBE)
        elif ftype is FrameType.REGISTRY_UPDATE:
            self._register(session, entries)
        elif ftype is FrameType.CONTROL:
            for entry in entries:
                try:
                    doc = validate(entry.kind, entry.document, "client")
                except DocumentError as exc:
                    self._bad_document(channel, peer, exc, now_ns)
                    continue
                if entry.kind is al.ControlKind.RESOLVE:
                    self._resolve(session, doc["keys"])
                elif entry.kind is al.ControlKind.REPLAY:
                    self._replay(session, doc)
                elif entry.kind is al.ControlKind.LOGOUT:
                    self._end_session(session, "logout")
                    return
                elif entry.kind is al.ControlKind.SUCCESSOR:
                    self.successors.request(self, session, doc)
                else:  # a LOGIN after the first entry
                    self.counters["client_unexpected"] += 1
        elif ftype is FrameType.HEARTBEAT:
            pass
        else:
            self.counters["client_unexpected"] += 1

    def _deny(self, identity: str, action: str, pattern: str) -> None:
        """Count a denial per (identity, action, pattern): at most DENIALS_KEPT rows, each
        text cut to DENIAL_TEXT_CHARS; a denial that would need a new row beyond is counted
        in ``denials_dropped`` only (a flood of distinct names cannot grow the status)."""
        self.counters["denials"] += 1
        key = (identity[:DENIAL_TEXT_CHARS], action, pattern[:DENIAL_TEXT_CHARS])
        if key in self.denials or len(self.denials) < DENIALS_KEPT:
            self.denials[key] += 1
        else:
            self.counters["denials_dropped"] += 1

    def _namespace_refused(self, session: Session, action: str, namespace: int) -> str | None:
        """Why the session may not ``action`` in ``namespace`` (its identity's namespaces do
        not hold it; counted ``namespace_denials`` and as a denial row), or None."""
        reason = pmod.namespace_refusal(session.ents, session.identity, namespace)
        if reason is not None:
            self.counters["namespace_denials"] += 1
            self._deny(session.identity, action, f"namespace {namespace}")
        return reason

    def _client_port(self) -> int | None:
        """An egress port for a client's egress, or None when only the ones kept for
        destination appliances (APPLIANCE_EGRESS_PORTS) are left."""
        if len(self._free_ports) <= APPLIANCE_EGRESS_PORTS:
            return None
        return self._free_ports.pop()

    def _refuse_login(self, channel: str, peer: int, ring: object, why: str,
                      reason: str) -> None:
        """Answer a login with a refusal (counted ``login_refused_<why>``)."""
        self.counters[f"login_refused_{why}"] += 1
        self._answer_login(channel, peer, ring, {"accepted": False, "reason": reason,
                                                 "node": self.cfg.name})

    def _answer_login(self, channel: str, peer: int, ring: object, doc_out: dict) -> None:
        """A LOGIN_RESULT to a peer that has no session (a refusal or a challenge)."""
        frame = encode_admin(FrameType.CONTROL, [self._control(al.ControlKind.LOGIN_RESULT,
                                                               doc_out)],
                             source_session=self.node_id, send_ts_ns=time.time_ns())
        if channel == CLIENT_SHM:
            if isinstance(ring, str):
                self.dp.offer_admin("ring", ring, frame)  # type: ignore[arg-type]
        else:
            self.dp.offer_admin(channel, peer, frame)

    def _login(self, channel: str, peer: int, doc: dict, now_ns: int) -> None:
        """A LOGIN whose document ``validate`` accepted."""
        identity = doc["identity"]
        ring = doc.get("ring")
        refuse = why = None
        ents = self._entitlements_of(identity)
        if not self.accepting:
            refuse, why = "the appliance is shutting down", "stopping"
        elif self.pm_doc is None and identity not in self.internal_logins:
            refuse, why = "no P&M document yet; retry in a moment", "no_pm"
        elif identity not in self.internal_logins and self._cache_starting():
            refuse, why = ("the appliance's cache is not subscribed yet (cache.acknowledge = "
                           "persisted: nothing is taken before it keeps it); retry in a "
                           "moment"), "cache_starting"
        elif ents is None:
            refuse, why = f"identity {identity!r} is not known to P&M", "identity"
            self._deny(identity, "login", "")
        elif len(self.sessions) >= self.cfg.max_sessions:
            refuse, why = (f"all {self.cfg.max_sessions} client sessions are taken "
                           "(clients.max_sessions)"), "sessions"
        elif channel == CLIENT_SHM and not isinstance(ring, str):
            refuse, why = "a shared-memory client must name its reply ring", "no_ring"
        elif "client_id" in doc:
            refuse = self.successors.login_refusal(self, identity, doc["client_id"])
            why = None if refuse is None else "client_id"
        token = doc.get("token")
        old = self.session_of_peer.get((channel, peer))
        if old is not None and old in self.sessions:
            session = self.sessions[old]
            if (self.accepting and isinstance(token, int) and token == session.login_token
                    and session.identity == identity):
                self.counters["login_repeats"] += 1
                answer = self._login_result(session)
                if "probe" in doc:  # a client measuring its path: the number back
                    answer["probe"] = doc["probe"]
                    self.counters["login_probes"] += 1
                self._reply(session, al.ControlKind.LOGIN_RESULT, answer)
                return
        else:
            old = None
        signature = key = None
        verifier = self._verifier_of(identity) if refuse is None else None
        trusted = doc.get("trusted")
        vouched = trusted is not None and hmac.compare_digest(trusted, self.trusted_login_token)
        if verifier is not None and vouched:
            verifier = None  # this appliance's own process vouches for the identity
            self.counters["login_trusted"] += 1
        elif (refuse is None and verifier is None and not vouched
              and identity not in self.internal_logins
              and pmod.requires_passwords(self.pm_doc)):
            self._refuse_login(channel, peer, ring, "no_password", (
                f"identity {identity!r} has no password in P&M, which requires one: give it "
                "a password (pm.identities.NAME.password), or set pm.require_passwords = "
                "false (demos)"))
            return
        if verifier is not None:
            checked = self._credential(channel, peer, ring, identity, doc, verifier, now_ns)
            if checked is None:
                return  # a challenge went out (the peer's session, if any, stays)
            if isinstance(checked[0], bytes):
                signature, key = checked[0].hex(), checked[1]
            else:  # refused: a LOGIN forged from a session's address does not end it
                self._refuse_login(channel, peer, ring, str(checked[1]), str(checked[0]))
                return
        if old is not None:  # (a client logging in again with its client id keeps its record)
            self.successors.taking_over = doc.get("client_id")
            try:
                self._end_session(self.sessions[old], "replaced by a new login")
            finally:
                self.successors.taking_over = None
        if refuse is None and channel == CLIENT_SHM:
            from channels.shm import ShmChannel

            try:  # a check: the data path opens its own (DpSession.ring)
                ShmChannel(tx=ring).close()
            except Exception as exc:
                refuse, why = f"cannot open reply ring {ring!r}: {exc}", "ring"
        port = self._client_port() if refuse is None else None
        if refuse is None and port is None:  # ports of ended sessions wait for a snapshot
            refuse, why = ("no egress port is free for another client session on this "
                           "appliance; retry later"), "ports"
        if refuse is not None or port is None:
            self._refuse_login(channel, peer, ring, str(why), str(refuse))
            return
        sid = random.randrange(1, 2**31)
        while sid in self.sessions or sid in self.names:
            sid = random.randrange(1, 2**31)
        self.compiler.add_egress(f"c:{sid}", port)
        self._port_changes[port] = ("client", sid)
        session = Session(sid, identity, channel, peer, ents, port, ring, now_ns,
                          login_token=token if isinstance(token, int) else None,
                          server_signature=signature, standby=bool(doc.get("standby")))
        session.client_id = doc.get("client_id")
        self.sessions[sid] = session
        self.session_of_peer[(channel, peer)] = sid
        dest = sid if channel == CLIENT_SHM else peer
        dps = DpSession(sid, identity, channel, dest, ring=ring if channel == CLIENT_SHM else None,
                        key=key, acl_class=acl_apply.session_class(self, session))
        self.dp.command("add_session", dps, (channel, peer))
        self._tables_dirty = True
        self.counters["login_accepted"] += 1
        log.info("%s: client %r logged in (session %d, %s)", self.cfg.name, identity, sid,
                 channel)
        moved = doc.get("moved_from")
        mirrored = None if moved is None else self.mirror.take(
            moved["node_id"], moved["session"], identity, now_ns)
        if mirrored is None:
            self._reply(session, al.ControlKind.LOGIN_RESULT, self._login_result(session))
        else:  # made before the answer, which goes once the tables with them are live
            self._restore(session, mirrored)
            self._replies_when_live.append((session, al.ControlKind.LOGIN_RESULT,
                                            self._login_result(session)))
        if moved is not None:
            self._moved_in(session, moved["node_id"], moved["session"],
                           moved.get("why", "silence"))
        if session.client_id is not None:
            self.successors.logged_in(self, session, session.client_id)

    def _restore(self, session: Session, mirrored: tuple) -> None:
        """Make a moved session's subscriptions from the standby's mirror (control/mirror.py)
        as if its client had asked (entitlements and limits applied), without answering each:
        the login's answer names those made (``restored``)."""
        restored = []
        for ns, pattern, qos in mirrored:
            entry = al.Subscription(0, ns, qos, 0, pattern, "")
            if self._subscribe(session, entry, True, reply=False):
                restored.append([ns, pattern, qos])
        session.restored = restored
        self.counters["mirror_restores"] += 1
        self.counters["mirror_subscriptions_restored"] += len(restored)
        log.info("%s: client %r's session %d: %d of %d subscriptions made from the mirror",
                 self.cfg.name, session.identity, session.session_id, len(restored),
                 len(mirrored))

    def _moved_in(self, session: Session, node_id: int, old_session: int,
                  why: str = "silence") -> None:
        """A client's session moved here from appliance ``node_id`` (its session there,
        ``old_session``; ``why``: what made the client leave, documents.MOVE_WHY): logged,
        counted (also by ``why``), and that appliance told (SESSION_MOVE) when it is an up
        neighbour, so it ends the old session at once instead of when it expires."""
        self.counters["sessions_moved_in"] += 1
        self.counters[f"sessions_moved_in_{why}"] += 1
        name = self.names.get(node_id, f"node {node_id}")
        log.warning("%s: client %r moved its session here from %s (session %d there, %s), "
                    "now session %d", self.cfg.name, session.identity, name, old_session, why,
                    session.session_id)
        nb = next((n for n in self.neighbours.values() if n.up and n.node_id == node_id), None)
        if nb is None:
            self.counters["session_moves_not_told"] += 1
            return
        self.counters["session_moves_told"] += 1
        self._to_neighbour(nb, FrameType.SESSION_MOVE, [al.SessionMove(
            old_session, node_id, self.node_id, 0)])

    def _on_session_move(self, nb: Any, move: al.SessionMove) -> None:
        """A neighbour says a session of ours moved to it: end the session here."""
        session = self.sessions.get(move.session_id)
        if move.from_node != self.node_id or move.to_node != nb.node_id:
            self.counters["session_moves_unknown"] += 1
            return
        if session is None:
            identity = self.asked_to_move.pop(move.session_id, None)
            if identity is None:
                self.counters["session_moves_unknown"] += 1
                return
            self.counters["sessions_moved_out"] += 1
            self.counters["sessions_moved_out_asked"] += 1
            log.warning("%s: client %r moved its session %d to %s, as asked", self.cfg.name,
                        identity, move.session_id, nb.config.name)
            return
        self.counters["sessions_moved_out"] += 1
        log.warning("%s: client %r moved its session %d to %s", self.cfg.name,
                    session.identity, session.session_id, nb.config.name)
        self._end_session(session, f"moved to {nb.config.name}")

    def _cache_starting(self) -> bool:
        """Whether this appliance acknowledges once persisted and its cache's session has not
        subscribed yet (a message taken now would be acknowledged without being kept)."""
        cache = self.cache
        return cache is not None and cache.persisted_acks and not cache.ready.is_set()

    def _login_result(self, session: Session) -> dict:
        out = {"accepted": True, "session": session.session_id, "node": self.cfg.name,
               "node_id": self.node_id, "schemas": (self.pm_doc or {}).get("schemas", [])}
        if session.server_signature is not None:
            out["server_signature"] = session.server_signature
        if session.restored is not None:
            out["restored"] = session.restored
        if session.ents.move_on is not None:  # P&M's bounds for its clients that have none
            out["move_on"] = dict(session.ents.move_on)
        return out

    def _credential(self, channel: str, peer: int, ring: object, identity: str, doc: dict,
                    verifier: dict, now_ns: int
                    ) -> tuple[bytes, bytes] | tuple[str, str] | None:
        """The challenge-response of a login as an identity with a password
        (appliance/control/credentials.py): None when this LOGIN got a challenge (the
        same one while it is pending for this peer, login and client nonce: a repeated
        LOGIN is answered alike), (the server signature, the session key) when it carries
        the proof of the challenge pending for its peer, else (reason, why) to refuse it.
        A challenge is used once and expires after LOGIN_CHALLENGE_TTL_NS; at most
        LOGIN_CHALLENGES_KEPT are pending."""
        nonce = doc.get("nonce")
        if nonce is None:
            return (f"identity {identity!r} logs in with its password: this client sent no "
                    "nonce (connect with password=..., or --password-file)", "credential")
        key = (channel, peer)
        pending = self._challenges.get(key)
        proof = doc.get("proof")
        if proof is None:
            if (pending is None or pending[:2] != (identity, nonce)
                    or now_ns >= pending[3]):
                if key not in self._challenges and len(self._challenges) >= \
                        LOGIN_CHALLENGES_KEPT:
                    for k in [k for k, c in self._challenges.items() if now_ns >= c[3]]:
                        del self._challenges[k]
                    if len(self._challenges) >= LOGIN_CHALLENGES_KEPT:
                        return ("too many logins waiting for their proof; retry in a "
                                "moment", "challenges")
                pending = (identity, nonce, os.urandom(NONCE_BYTES).hex(),
                           now_ns + LOGIN_CHALLENGE_TTL_NS)
                self._challenges[key] = pending
                self.counters["login_challenges"] += 1
            challenge = {"nonce": pending[2], **{k: verifier[k] for k in ("n", "r", "p",
                                                                           "salt")}}
            self._answer_login(channel, peer, ring, {
                "accepted": False, "node": self.cfg.name, "challenge": challenge,
                "reason": f"identity {identity!r} logs in with its password: prove it"})
            return None
        if (pending is None or now_ns >= pending[3] or pending[:2] != (identity, nonce)
                or pending[2] != doc.get("server_nonce")):
            return ("no login challenge is pending for this proof (expired, used, or for "
                    "another login or address): log in again", "challenge")
        del self._challenges[key]
        message = auth_message(identity, bytes.fromhex(nonce), bytes.fromhex(pending[2]),
                               self.cfg.name)
        key = verify_proof(verifier, message, bytes.fromhex(proof))
        if key is None:
            self._deny(identity, "login", "")
            return f"wrong password for identity {identity!r}", "credential"
        self.counters["login_proofs_accepted"] += 1
        return server_signature(verifier, message), key

    def _end_session(self, session: Session, why: str) -> None:
        if self.sessions.pop(session.session_id, None) is None:
            return
        if self.session_of_peer.get((session.channel, session.peer)) == session.session_id:
            del self.session_of_peer[(session.channel, session.peer)]
        self.compiler.remove_egress(f"c:{session.session_id}")
        self._quarantine.append(session.port)
        self._retired[session.port] = ("client", session.session_id)
        if session.gport is not None:
            self.compiler.remove_egress(f"g:{session.session_id}")
            self._quarantine.append(session.gport)
            self._retired[session.gport] = ("gclient", session.session_id)
        sid = session.session_id
        self.mirror.ended(session)
        self.successors.ended(self, session, why)
        self.dp.command("remove_session", sid)
        self._selectors_dirty = self._selectors_dirty or bool(session.rules)
        self._interest_changed.add(sid)
        self._interest_dirty = True
        self._tables_dirty = True
        log.info("%s: client %r session %d ended (%s)", self.cfg.name, session.identity,
                 session.session_id, why)

    def _end_unpersisted_sessions(self, published: dict) -> None:
        """End the sessions of the local publishers one of whose guaranteed messages the
        cache will never persist (``[cache] acknowledge = "persisted"``: the data path
        holds their acknowledgements from that message on; appliance/dataplane/
        guaranteed.py ``_persist_failed``): the LOGOUT says why, and the client fails or
        publishes again what was not acknowledged, instead of waiting for good."""
        for sid, reason in (published.get("persist_failed") or {}).items():
            session = self.sessions.get(sid)
            if session is not None:
                self.counters["sessions_ended_unpersisted"] += 1
                self._reply(session, al.ControlKind.LOGOUT, {"reason": reason})
                self._end_session(session, reason)

    def _expire_sessions(self, now_ns: int, paused_ns: int) -> None:
        """Log out clients silent for session_dead_ms; after a stall of this process
        (``paused_ns``: its threads did not run, e.g. compiling or a busy host) their
        heartbeats may still sit unread, so they get half the interval again first."""
        dead_ns = self.cfg.session_dead_ms * 1_000_000
        if paused_ns > dead_ns // 2:
            for session in self.sessions.values():
                session.last_heard_ns = max(session.last_heard_ns, now_ns - dead_ns // 2)
        for session in list(self.sessions.values()):
            if now_ns - session.last_heard_ns > dead_ns:
                self.counters["sessions_expired"] += 1
                self._end_session(session, "silent")

    def _subscribe_frame(self, session: Session, entries: list, add: bool) -> None:
        """The (un)subscribes of one SUBSCRIBE or UNSUBSCRIBE frame (a client's
        ``subscribe_many`` sends many patterns in one): each decided and answered as alone,
        but the session's pattern sets are made once for the frame, the frame is admitted
        whole when the session had fewer than ``clients.max_pending_requests`` requests
        waiting before it (each accepted entry then counts as one: a session holds at most
        the limit plus one frame's entries), and the tables are built once for all of them
        (the answers of the accepted ones go together once they are live)."""
        batch = {"pending": session.pending}
        accepted = False
        for entry in entries:
            accepted |= self._subscribe(session, entry, add, batch=batch)
        if accepted:
            self._patterns_changed(session)

    def _patterns_changed(self, session: Session) -> None:
        """The session's lists changed: its pattern sets follow them."""
        sid = session.session_id
        session.patterns = self._positive(f"c:{sid}")
        if session.gport is not None:
            session.gpatterns = self._positive(f"g:{sid}")
        self._interest_changed.add(sid)
        if len(session.qos) > len(session.patterns) + len(session.gpatterns):
            session.qos = {k: q for k, q in session.qos.items()
                           if k in session.patterns or k in session.gpatterns}
        self._own_class_changed(session)

    def _own_class_changed(self, session: Session) -> None:
        """Tell the data path when the session's classes become, or stop being, one copy per
        message: a class whose every positive pattern was subscribed with ``own_class``
        (``Session.own_class``; docs/appliance.md, "One class per message")."""
        own = 0
        for bit, owned, unowned, held in (
                (OWN_PLAIN, session.owned[0], session.unowned[0], session.patterns),
                (OWN_GUARANTEED, session.owned[1], session.unowned[1], session.gpatterns)):
            if owned and held and not unowned:
                own |= bit
        if own != session.own_class:
            session.own_class = own
            self.dp.command("set_own_class", session.session_id, own)

    def _subscribe(self, session: Session, entry: al.Subscription, add: bool,
                   reply: bool = True, batch: dict | None = None) -> bool:
        """A (un)subscribe of ``session``, answered (REQUEST_RESULT; once the tables with it
        are live when accepted) unless ``reply`` is false; whether it was accepted.
        ``batch``: one entry of a frame (``_subscribe_frame``): the caller updates the
        session's pattern sets after the last, and the pending requests are those before the
        frame."""
        pattern, ns = entry.pattern, entry.namespace_id
        result = {"request": "subscribe" if add else "unsubscribe", "sub_id": entry.sub_id,
                  "pattern": pattern, "accepted": True}
        guaranteed = entry.qos == QOS_GUARANTEED
        sid = session.session_id
        try:
            refused = self._subscribe_refused(session, entry, add,
                                              None if batch is None else batch["pending"])
            if refused is None and add and entry.selector:
                refused = selector_apply.selector_refusal(self, session, entry)
            if refused is not None:
                result.update(accepted=False, reason=refused)
            elif add:
                refused = self._namespace_refused(session, "subscribe", ns)
                if refused is not None:
                    result.update(accepted=False, reason=refused)
                elif not session.ents.may_subscribe(pattern):
                    self._deny(session.identity, "subscribe", pattern)
                    result.update(accepted=False, reason=f"identity {session.identity!r} may "
                                  f"not subscribe to {pattern!r}")
                else:
                    if guaranteed and session.gport is None:
                        session.gport = self._client_port()
                        if session.gport is None:  # checked by _subscribe_refused
                            raise OffloadError("no egress port is free")
                        self.compiler.add_egress(f"g:{sid}", session.gport)
                        self._port_changes[session.gport] = ("gclient", sid)
                    self.compiler.subscribe(f"g:{sid}" if guaranteed else f"c:{sid}", pattern,
                                            ns)
            else:  # an unsubscribe applies to both classes (the client keeps one list)
                self.compiler.unsubscribe(f"c:{sid}", pattern, ns)
                if session.gport is not None:
                    self.compiler.unsubscribe(f"g:{sid}", pattern, ns)
        except (TopicError, OffloadError) as exc:
            result.update(accepted=False, reason=str(exc))
        if result["accepted"]:
            configured = flow_apply.record(self, session, entry, add)
            if configured is not None:  # (only then: an older client knows no such key)
                result["flow_policy"] = configured
            filtered = selector_apply.record(self, session, entry, add)
            if add and entry.selector:  # (only then: an older client knows no such key)
                result["selector_filtered"] = filtered
            if add:
                owned, unowned = session.owned[guaranteed], session.unowned[guaranteed]
                if entry.flags & al.SUBSCRIPTION_FLAG_OWN_CLASS:
                    owned.add((ns, pattern))
                    unowned.discard((ns, pattern))
                    result["own_class"] = True  # (only then: an older client knows no such key)
                else:
                    unowned.add((ns, pattern))
            else:  # an unsubscribe applies to both classes, and withdraws what it includes
                wild = is_pattern(pattern)
                for kept in (*session.owned, *session.unowned):
                    if kept and not wild:
                        kept.discard((ns, pattern))
                    elif kept:
                        kept.difference_update([k for k in kept if k[0] == ns and (
                            k[1] == pattern or selector_apply.within(pattern, k[1]))])
            if add:
                session.qos[(ns, pattern)] = QOS_NAMES.get(entry.qos, "best-effort")
            if batch is None:
                self._patterns_changed(session)
            self._interest_dirty = True
            self._tables_dirty = True
            self.mirror.changed(session)
            if add and session.client_id is not None:
                self.successors.subscribed(self, session)
            if reply:
                # answered once the tables with it are live: a message published after the
                # client heard "accepted" reaches it
                session.pending += 1
                self._replies_when_live.append((session, al.ControlKind.REQUEST_RESULT,
                                                result))
        elif reply:
            self._reply(session, al.ControlKind.REQUEST_RESULT, result)
        return bool(result["accepted"])

    def _subscribe_refused(self, session: Session, entry: al.Subscription, add: bool,
                           pending: int | None = None) -> str | None:
        """Why a (un)subscribe must be refused for a limit (counted ``refused_<limit>``), or
        None. May raise TopicError (the pattern is not one). ``pending``: the session's
        requests waiting when its frame came (default: now)."""
        cfg = self.cfg
        why = reason = None
        pending = session.pending if pending is None else pending
        if pending >= cfg.max_pending_requests:
            why, reason = "pending", (f"{pending} requests of this session are still "
                                      "waiting for their answer (clients.max_pending_requests "
                                      f"= {cfg.max_pending_requests}); wait for them")
        elif add and entry.qos == QOS_GUARANTEED and session.gport is None:
            held = sum(1 for s in self.sessions.values() if s.gport is not None)
            if held >= cfg.max_guaranteed_sessions:
                why, reason = "guaranteed", (
                    f"all {cfg.max_guaranteed_sessions} guaranteed subscriber places of this "
                    "appliance are taken (clients.max_guaranteed_sessions)")
            elif len(self._free_ports) <= APPLIANCE_EGRESS_PORTS:
                why, reason = "ports", ("no egress port is free for another guaranteed "
                                        "subscriber on this appliance; retry later")
        if why is None:
            entries = self._list_entries(session)
            if entries + 2 > cfg.max_subscriptions and entries + self._list_growth(
                    session, entry, add) > cfg.max_subscriptions:
                why, reason = "subscriptions", (
                    f"the session's subscription lists hold {entries} entries, at most "
                    f"{cfg.max_subscriptions} (clients.max_subscriptions); unsubscribe "
                    "first")
        if why is None:
            return None
        self.counters[f"refused_{why}"] += 1
        return reason

    def _session_lists(self, session: Session) -> list[tuple[str, Any]]:
        """(egress name, egress) of the session's egresses (best-effort, guaranteed)."""
        names = [f"c:{session.session_id}", f"g:{session.session_id}"]
        return [(name, egress) for name in names
                if (egress := self.compiler.egress_of(name)) is not None]

    def _list_entries(self, session: Session) -> int:
        """Entries of the session's subscription lists, both classes together."""
        return sum(len(lst) for _, egress in self._session_lists(session)
                   for lst in egress.lists.values())

    def _list_growth(self, session: Session, entry: al.Subscription, add: bool) -> int:
        """How many entries the request would add to the session's lists (tried on copies)."""
        target = f"{'g' if entry.qos == QOS_GUARANTEED else 'c'}:{session.session_id}"
        held = dict(self._session_lists(session))
        names = [target] if add else list(held)
        grow = 0
        for name in names:
            egress = held.get(name)
            lst = egress.lists.get(entry.namespace_id) if egress is not None else None
            trial = copy.deepcopy(lst) if lst is not None else SubscriptionList()
            before = len(trial)
            (trial.subscribe if add else trial.unsubscribe)(entry.pattern)
            grow += len(trial) - before
        return grow

    def _positive(self, egress: str) -> Counter:
        return Counter({(n, p): 1 for n, lst in self.compiler.egress_of(egress).lists.items()
                        for p in lst.positive_patterns()})

    def _register(self, session: Session, entries: list) -> None:
        """A REGISTRY_UPDATE frame of a client: each topic checked (its key, the session's
        limit, the namespace, the publish entitlement), the allowed ones registered in one
        pass (``KeyRegistry.register_many``) and sent to the neighbours together, the keys
        allowed at the data path in one command, and every topic answered (packed
        REQUEST_RESULT entries, in input order). Per topic this is a few dictionary and
        string operations: the entitlement check is made once per distinct tuple of
        patterns (``pm.publish_checker``), not by the pattern algebra per topic."""
        results: list[dict | str] = []  # (a str: an accepted topic's answer, encoded)
        wanted: list[tuple[int, str, int]] = []  # allowed so far: (namespace, topic, key)
        wanted_at: list[tuple[int, int]] = []  # (index in results, the key it gave)
        registry, registered = self.registry, session.registered
        limit = self.cfg.max_registrations
        may_publish = pmod.publish_checker(session.ents.publish)
        namespaces: dict[int, str | None] = {}
        taking: set[int] = set()
        for entry in entries:
            topic, ns = entry.topic, entry.namespace_id
            result = {"request": "register", "topic": topic, "namespace": ns,
                      "accepted": True}
            results.append(result)
            try:
                record = registry.record_of(topic, ns)
                key = record.topic_key if record is not None else registry.key_of(topic, ns)
                if key != entry.topic_key:
                    raise RegistryError(f"key {entry.topic_key:#x} is not the key of "
                                        f"{topic!r}")
                if key not in registered and key not in taking and \
                        len(registered) + len(taking) >= limit:
                    self.counters["refused_registrations"] += 1
                    result.update(accepted=False, reason=f"the session registered {limit} "
                                  "topics, as many as one session may "
                                  "(clients.max_registrations)")
                elif (refused := self._publish_namespace(session, ns, namespaces)) \
                        is not None:
                    result.update(accepted=False, reason=refused)
                elif not may_publish(topic):
                    self._deny(session.identity, "publish", topic)
                    result.update(accepted=False, reason=f"identity {session.identity!r} may "
                                  f"not publish to {topic!r}")
                else:
                    wanted.append((ns, topic, key))  # (the check split the topic)
                    wanted_at.append((len(results) - 1, key))
                    taking.add(key)
            except (RegistryError, TopicError) as exc:
                result.update(accepted=False, reason=str(exc))
        granted: list[int] = []
        if wanted:
            before = registry.version
            outcomes = registry.register_many(wanted, checked=True)
            for (at, _key), outcome in zip(wanted_at, outcomes):
                if isinstance(outcome, RegistryError):
                    self.counters["registry_refused"] += 1
                    results[at].update(accepted=False, reason=str(outcome))  # type: ignore[union-attr]
                else:
                    granted.append(outcome.topic_key)
                    results[at] = _ACCEPTED_REGISTER % (_json_text(outcome.topic),
                                                        outcome.namespace_id)
            registered.update(granted)
            if registry.version != before:  # new topics: the tables, then the neighbours
                self._tables_dirty = True
                new = registry.updates_since(before)
                for nb in self.neighbours.values():
                    if nb.up:
                        self._send_registry(nb, new)
        if granted:  # before the replies: the data path allows the keys before a publish
            sid = session.session_id
            self.dp.command("allow_keys", sid, granted)
            acl_class = acl_apply.session_class(self, session)
            if acl_class:  # the audit lines of its LOG verdicts name the topic
                self.dp.command("set_session_acl", sid, acl_class, {
                    key: self.registry.lookup(key)[1] for key in granted
                    if self.registry.lookup(key) is not None})
        self._reply_many(session, al.ControlKind.REQUEST_RESULT, results)

    def _publish_namespace(self, session: Session, ns: int, known: dict[int, str | None]
                           ) -> str | None:
        """``_namespace_refused(session, "publish", ns)`` looked up once per namespace in
        ``known`` (each refusal still counted as a denial)."""
        if ns not in known:
            known[ns] = self._namespace_refused(session, "publish", ns)
        elif known[ns] is not None:
            self.counters["namespace_denials"] += 1
            self._deny(session.identity, "publish", f"namespace {ns}")
        return known[ns]

    def _resolve(self, session: Session, keys: list) -> None:
        records = []
        for key in keys[:4096]:
            found = self.registry.lookup(int(key))
            if found is not None and self._namespace_refused(session, "resolve",
                                                             found[0]) is None:
                records.append(al.RegistryEntry(int(key), found[0], found[1]))
        if not records:
            return
        dest = session.session_id if session.channel == CLIENT_SHM else session.peer
        chunk: list = []
        size = 0
        for r in records:
            cost = 24 + len(r.topic.encode())
            if chunk and size + cost > REGISTRY_FRAME_BYTES:
                self._to_client((session.channel, dest), FrameType.REGISTRY_UPDATE, chunk,
                                {"version": self.registry.version}, session.session_id)
                chunk, size = [], 0
            chunk.append(r)
            size += cost
        self._to_client((session.channel, dest), FrameType.REGISTRY_UPDATE, chunk,
                        {"version": self.registry.version}, session.session_id)

    def _reentitle(self, doc: dict) -> None:
        """A new P&M document: each session's identity gets the entitlements it now grants.
        The session stays logged in (an identity P&M no longer knows keeps no entitlements);
        a subscription the identity may no longer make is withdrawn from its lists (its
        topics stop at once; the client is not told), and a topic it registered but may no
        longer publish to is taken back (its messages are dropped and counted as denied).
        Later requests are checked against the new entitlements (docs/appliance.md,
        "Reload (SIGHUP)")."""
        for session in list(self.sessions.values()):
            internal = self.internal_logins.get(session.identity)
            ents = internal[1] if internal is not None else (
                pmod.entitlements_of(doc, session.identity) or pmod.NONE)
            if ents == session.ents:
                continue
            session.ents = ents
            sid = session.session_id
            withdrawn = 0
            for name, egress in self._session_lists(session):
                for ns, sublist in list(egress.lists.items()):
                    for pattern in sublist.positive_patterns():
                        if not (ents.may_use(ns) and ents.may_subscribe(pattern)):
                            self.compiler.withdraw(name, pattern, ns)
                            withdrawn += 1
            revoked = []
            for key in session.registered:
                found = self.registry.lookup(key)
                if found is None or not (ents.may_use(found[0]) and ents.may_publish(found[1])):
                    revoked.append(key)
            if withdrawn:
                session.patterns = self._positive(f"c:{sid}")
                if session.gport is not None:
                    session.gpatterns = self._positive(f"g:{sid}")
                self._interest_changed.add(sid)
                session.qos = {k: q for k, q in session.qos.items()
                               if k in session.patterns or k in session.gpatterns}
                self._interest_dirty = True
                self._tables_dirty = True
            if revoked:
                session.registered.difference_update(revoked)
                self.dp.command("revoke_keys", sid, revoked)
            self.counters["entitlements_changed"] += 1
            self.counters["entitlement_withdrawn_subscriptions"] += withdrawn
            self.counters["entitlement_revoked_topics"] += len(revoked)
            log.log(logging.INFO if withdrawn or revoked else logging.DEBUG,
                    "%s: client %r session %d: P&M changed its entitlements%s: %d "
                    "subscriptions withdrawn, %d registered topics taken back", self.cfg.name,
                    session.identity, sid, " (it no longer knows the identity)"
                    if ents is pmod.NONE else "", withdrawn, len(revoked))

    def logout_all(self) -> None:
        """Tell every client and neighbour the appliance is going away (shutdown)."""
        self.accepting = False
        for session in list(self.sessions.values()):
            self._reply(session, al.ControlKind.LOGOUT, {"reason": "appliance shutting down"})
        self._flood(al.ControlKind.LOGOUT, {"reason": "appliance shutting down"})
