"""Replay and durable subscriptions from a neighbour's cache (``cache.serve_from``;
docs/fault-tolerance.md, "Replay and durable subscriptions from a neighbour's cache").

Two sides, both on the control agent's thread, over the authenticated fabric link (every
frame signed with the fabric key, bound to the link, replay window: control/auth.py):

``Forwarder`` (at the appliance A whose clients ask): a client's REPLAY that no cache of A
keeps (A has no ``[cache]``, or the pattern lies outside ``cache.patterns``) is checked
against the identity's entitlements at A as a local one is, then sent to the neighbour C
that ``cache.serve_from`` names as a CONTROL ``REMOTE_REPLAY`` (a forward id, the client's
identity and session, the request unchanged). C's answer comes back as ``REMOTE_REPLAY_PART``
entries (each page frame in parts: a page frame is larger than a frame on the link) and one
``REMOTE_REPLAY_RESULT``. A puts each page frame together, writes its own node id and the
client's session into its header (the data path signs it under the session's key as every
frame to the session) and hands it to the session, then the result document: the client sees
exactly what a local cache would have sent. A part that never comes leaves its frame
missing; the client sees the page incomplete and asks again from what it has, as for a frame
lost on its own hop.

``serve`` and ``send_answers`` (at C): a forwarded request is checked again against C's own
P&M (the identity must be known there and may subscribe to the pattern), then handed to C's
cache like a client's, under the session key ("n", A's node, the client's session at A). The
cache answers on its thread into ``CacheAgent.relay_out``; ``send_answers`` sends them on
the link. A durable subscription's position is kept in C's book under the identity and the
name, as for a client of C: a subscriber that moves from A to another appliance S naming the
same C goes on where it left off.

Bounds: A holds at most ``FORWARDS_PER_SESSION`` forwarded requests per session and
``FORWARDS_PENDING`` in all (one more is refused ``busy``, counted and logged), and at most
``RELAY_HELD_BYTES`` of page frames being put together (parts beyond are dropped and
counted); a request C has not answered within ``FORWARD_ANSWER_NS`` (plus the durable
request's own wait) is answered to the client with a refusal ``remote`` naming C, as is one
made while C is not up. C bounds what a neighbour queues at its cache
(``FORWARDED_PENDING_PER_NEIGHBOUR``, ``FORWARDED_PARKED``; appliance/cache/settings.py). A
forwarded request is never forwarded again (no chains, no loops). Counters
``control_replay_forward_*`` at A and ``control_replay_served_*`` at C.
"""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from typing import Any

from appliance.cache.settings import RELAY_CHANNEL, REPLAY_PAGE_FRAMES, REPLAYS_PENDING_PER_SESSION
from appliance.control.state import log
from appliance.dataplane.names import CLIENT_SHM
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.frame_layout import FrameType
from datapath.protocol.replay_layout import MAX_PAGE_FRAMES, REPLAY_STREAM_ID

FORWARDS_PER_SESSION = REPLAYS_PENDING_PER_SESSION
"""Forwarded requests of one client session waiting for the neighbour's answer."""
FORWARDS_PENDING = 256
"""Forwarded requests of all sessions waiting; one more is refused (busy)."""
FORWARD_ANSWER_NS = 2_500_000_000
"""A forwarded request not answered within this (after its durable wait, ``wait_ms``) is
refused to its client (``remote``): within the client's own request timeout (5 s)."""
RELAY_HELD_BYTES = 16 * 1024 * 1024
"""Bytes of page frames being put together from their parts, all forwards together."""
PART_OVERHEAD_BYTES = (fl.FRAME_HEADER_BYTES + 8 + fl.AUTH_TRAILER_BYTES + 8 + 160)
"""Room in a frame on the link besides a part's base64 text: the header, the CONTROL
entry, the trailer, padding and the document's other keys."""
LOG_INTERVAL_NS = 10_000_000_000
"""A refusal to forward is logged at most this often per reason."""
_HEADER = fl.FRAME_HEADER_STRUCT


def part_bytes(max_frame_bytes: int) -> int:
    """Page-frame bytes per part so that a part's frame fits ``fabric.max_frame_bytes``."""
    return max(48, (max_frame_bytes - PART_OVERHEAD_BYTES) // 4 * 3)


class _Forward:
    __slots__ = ("deadline_ns", "doc", "fid", "frames", "held", "node", "page", "result",
                 "rid", "session_id")

    def __init__(self, fid: int, session_id: int, rid: int, node: int, deadline_ns: int,
                 doc: dict) -> None:
        self.fid = fid
        self.session_id = session_id
        self.rid = rid
        self.node = node
        self.deadline_ns = deadline_ns
        self.doc = doc
        """The REMOTE_REPLAY document (sent again when the client repeats its request)."""
        self.page = -1
        self.frames: dict[int, list[bytes | None]] = {}
        """Frame index -> its parts so far (of page ``page`` only: a newer answer replaces
        an older one's, as the client keeps the newest page)."""
        self.held = 0
        self.result: list[str | None] = []
        """The parts of a result document too large for one frame on the link."""


class Forwarder:
    """The asking side (module docstring), owned by the control agent."""

    def __init__(self, agent: Any, name: str) -> None:
        self.agent = agent
        self.name = name
        """The neighbour ``cache.serve_from`` names."""
        self.pending: dict[int, _Forward] = {}
        self.by_request: dict[tuple[int, int], int] = {}
        """(session, the client's request id) -> forward id: a repeat is sent again, not
        forwarded twice."""
        self.per_session: Counter[int] = Counter()
        self.held = 0
        self._fid = 0
        self._logged: dict[str, int] = {}

    @property
    def counters(self) -> Counter:
        return self.agent.counters

    def _neighbour(self) -> Any:
        nb = self.agent.neighbours.get(self.name)
        return nb if nb is not None and nb.up and nb.node_id is not None else None

    def _refuse(self, what: str, why: str, reason: str, now_ns: int) -> tuple[str, str]:
        self.counters[f"replay_forward_refused_{what}"] += 1
        if now_ns >= self._logged.get(what, 0):
            self._logged[what] = now_ns + LOG_INTERVAL_NS
            log.warning("%s: %s (counted control_replay_forward_refused_%s)",
                        self.agent.cfg.name, reason, what)
        return why, reason

    def forward(self, session: Any, doc: dict, now_ns: int) -> tuple[str, str] | None:
        """Send a client's REPLAY (checked already) to the serving neighbour; (why, reason)
        when it cannot be."""
        key = (session.session_id, doc["id"])
        fid = self.by_request.get(key)
        if fid is not None:  # the client asks again: its answer is late, or was lost
            fwd = self.pending[fid]
            nb = self._neighbour()
            if nb is not None and nb.node_id == fwd.node:
                self.counters["replay_forward_repeats"] += 1
                self._send(nb, fwd.doc)
            return None
        nb = self._neighbour()
        me = self.agent.cfg.name
        if nb is None:
            return self._refuse("down", "remote", (
                f"cache: appliance {me!r} forwards this replay to the cache of {self.name!r} "
                f"(cache.serve_from), which is not up (not heard from): retry once it is"),
                now_ns)
        if self.per_session[session.session_id] >= FORWARDS_PER_SESSION:
            return self._refuse("session_limit", "busy", (
                f"cache: this session has {FORWARDS_PER_SESSION} replay requests forwarded "
                f"by {me!r} to {self.name!r} waiting for their answer; wait for them"), now_ns)
        if len(self.pending) >= FORWARDS_PENDING:
            return self._refuse("limit", "busy", (
                f"cache: {FORWARDS_PENDING} replay requests forwarded by {me!r} to "
                f"{self.name!r} are waiting; retry in a moment"), now_ns)
        self._fid = self._fid % 0xFFFF_FFFF + 1
        while self._fid in self.pending:
            self._fid = self._fid % 0xFFFF_FFFF + 1
        fid = self._fid
        out = {"fid": fid, "session": session.session_id, "identity": session.identity,
               "request": doc}
        room = self.agent.cfg.fabric_max_frame_bytes - PART_OVERHEAD_BYTES
        if len(json.dumps(out, separators=(",", ":")).encode()) > room:
            return self._refuse("too_large", "remote", (
                f"cache: this replay request (its pattern and identity) is too long for one "
                f"frame on the link from {me!r} to {self.name!r} (fabric.max_frame_bytes = "
                f"{self.agent.cfg.fabric_max_frame_bytes}); ask for a shorter pattern"),
                now_ns)
        deadline = now_ns + doc.get("wait_ms", 0) * 1_000_000 + FORWARD_ANSWER_NS
        self.pending[fid] = _Forward(fid, session.session_id, doc["id"], nb.node_id,
                                     deadline, out)
        self.by_request[key] = fid
        self.per_session[session.session_id] += 1
        self.counters["replay_forwarded"] += 1
        self._send(nb, out)
        return None

    def _send(self, nb: Any, doc: dict) -> None:
        self.agent._to_neighbour(nb, FrameType.CONTROL, [self.agent._control(
            al.ControlKind.REMOTE_REPLAY, doc)])

    def _end(self, fwd: _Forward) -> None:
        self.pending.pop(fwd.fid, None)
        self.by_request.pop((fwd.session_id, fwd.rid), None)
        self.per_session[fwd.session_id] -= 1
        if self.per_session[fwd.session_id] <= 0:
            del self.per_session[fwd.session_id]
        self.held -= fwd.held
        fwd.held = 0
        fwd.frames.clear()

    def _mine(self, nb: Any, fid: int, what: str) -> _Forward | None:
        fwd = self.pending.get(fid)
        if fwd is None:  # answered, timed out, or never asked
            self.counters[f"replay_forward_{what}_unknown"] += 1
            return None
        if nb.node_id != fwd.node or nb.config.name != self.name:
            self.counters[f"replay_forward_{what}_refused"] += 1
            return None
        return fwd

    def on_part(self, nb: Any, doc: dict) -> None:
        """A part of a page frame of a forwarded request's answer."""
        fwd = self._mine(nb, doc["fid"], "parts")
        if fwd is None:
            return
        if doc["page"] != fwd.page:  # a newer answer (a repeat's): the older one is dropped
            self.held -= fwd.held
            fwd.held, fwd.page, fwd.frames = 0, doc["page"], {}
        parts = fwd.frames.get(doc["frame"])
        n = doc["parts"]
        if parts is None:
            if len(fwd.frames) >= REPLAY_PAGE_FRAMES:  # a page has no more frames
                self.counters["replay_forward_parts_refused"] += 1
                return
            parts = fwd.frames[doc["frame"]] = [None] * n
        part = doc["part"]
        if len(parts) != n or part >= n:
            self.counters["replay_forward_parts_refused"] += 1
            return
        data = base64.b64decode(doc["data"])
        if parts[part] is not None:
            return  # a copy
        if self.held + len(data) > RELAY_HELD_BYTES:
            self.counters["replay_forward_parts_dropped"] += 1
            return
        parts[part] = data
        fwd.held += len(data)
        self.held += len(data)
        self.counters["replay_forward_parts"] += 1
        if all(p is not None for p in parts):
            frame = bytearray(b"".join(parts))  # type: ignore[arg-type]
            del fwd.frames[doc["frame"]]
            fwd.held -= len(frame)
            self.held -= len(frame)
            self._relay_frame(fwd, frame)

    def _relay_frame(self, fwd: _Forward, frame: bytearray) -> None:
        """A page frame put together: to the client's session, in its header."""
        if len(frame) < fl.FRAME_HEADER_BYTES:
            self.counters["replay_forward_frames_malformed"] += 1
            return
        (magic, version, ftype, flags, count, length, _, _, stream,
         _) = _HEADER.unpack_from(frame)
        if (magic != fl.FRAME_MAGIC or ftype != FrameType.DATA or flags or length != len(frame)
                or stream != REPLAY_STREAM_ID or not count):
            self.counters["replay_forward_frames_malformed"] += 1
            return
        session = self.agent.sessions.get(fwd.session_id)
        if session is None:
            self.counters["replay_forward_session_gone"] += 1
            return
        _HEADER.pack_into(frame, 0, magic, version, ftype, flags, count, length,
                          self.agent.node_id, fwd.session_id, stream, time.time_ns())
        dest = session.session_id if session.channel == CLIENT_SHM else session.peer
        if self.agent.dp.offer_admin(session.channel, dest, frame):
            self.counters["replay_forward_frames"] += 1
        else:
            self.counters["replay_forward_frames_dropped"] += 1

    def on_result(self, nb: Any, doc: dict) -> None:
        """The serving cache's answer to a forwarded request: to the client's session."""
        fwd = self._mine(nb, doc["fid"], "answers")
        if fwd is None:
            return
        result = doc.get("result")
        if result is None:  # in parts: put together, then checked as a REPLAY_RESULT
            result = self._result_part(fwd, doc)
            if result is None:
                return
        self._end(fwd)
        result = dict(result, id=fwd.rid)
        session = self.agent.sessions.get(fwd.session_id)
        if session is None:
            self.counters["replay_forward_session_gone"] += 1
            return
        self.counters["replay_forward_answers"] += 1
        if not result["accepted"]:
            self.counters["replay_forward_answers_refused"] += 1
        self.agent._reply(session, al.ControlKind.REPLAY_RESULT, result)

    def _result_part(self, fwd: _Forward, doc: dict) -> dict | None:
        """One part of a result document; the document once every part is there."""
        from appliance.control.documents import DocumentError, validate

        n = doc["parts"]
        if len(fwd.result) != n:
            fwd.result = [None] * n
        fwd.result[doc["part"]] = doc["text"]
        if any(p is None for p in fwd.result):
            return None
        text = "".join(fwd.result)  # type: ignore[arg-type]
        fwd.result = []
        try:
            return validate(al.ControlKind.REPLAY_RESULT, text, "appliance")
        except DocumentError:
            self.counters["replay_forward_answers_malformed"] += 1
            return None

    def expire(self, now_ns: int) -> int:
        """Refuse, to their clients, the forwards not answered in time or whose neighbour
        is no longer up."""
        if not self.pending:
            return 0
        nb = self._neighbour()
        done = 0
        for fwd in list(self.pending.values()):
            down = nb is None or nb.node_id != fwd.node
            if not down and now_ns < fwd.deadline_ns:
                continue
            self._end(fwd)
            done += 1
            what = "down" if down else "timeout"
            self.counters[f"replay_forward_failed_{what}"] += 1
            reason = (f"cache: the cache of {self.name!r} that appliance "
                      f"{self.agent.cfg.name!r} forwarded this replay to " + (
                          "went down before it answered" if down else
                          f"did not answer within {FORWARD_ANSWER_NS / 1e9:g} s") +
                      "; retry")
            session = self.agent.sessions.get(fwd.session_id)
            if session is not None:
                self.agent._reply(session, al.ControlKind.REPLAY_RESULT, {
                    "id": fwd.rid, "accepted": False, "why": "remote", "reason": reason})
        return done

    def wake_at_ns(self) -> int | None:
        if not self.pending:
            return None
        return min(f.deadline_ns for f in self.pending.values())

    def status(self) -> dict:
        return {"serve_from": self.name, "pending": len(self.pending),
                "held_bytes": self.held}


# --- the serving side (the appliance whose cache keeps the pattern) -----------------------------
def serve(agent: Any, nb: Any, doc: dict) -> None:
    """A neighbour's forwarded REPLAY: checked against this appliance's P&M, then queued at
    its cache, or refused back to the neighbour (module docstring)."""
    from appliance.control import pm as pmod

    agent.counters["replay_served_requests"] += 1
    request, identity = doc["request"], doc["identity"]
    me = agent.cfg.name
    refused: tuple[str, str] | None = None
    ents = (pmod.entitlements_of(agent.pm_doc, identity)
            if not identity.startswith("$") else None)
    if agent.cache is None:
        refused = "no_cache", (f"cache: appliance {me!r}, which {nb.config.name!r} forwards "
                               "replay requests to (cache.serve_from), keeps no messages (its "
                               "config has no [cache])")
    elif ents is None:
        refused = "entitlement", (f"cache: identity {identity!r} is not known at appliance "
                                  f"{me!r}, whose cache serves this replay")
    elif not request.get("delete") and (
            pmod.namespace_refusal(ents, identity, request.get("namespace", 0)) is not None
            or not ents.may_subscribe(request["pattern"])):
        agent._deny(identity, "replay", request["pattern"])
        refused = "entitlement", (f"identity {identity!r} may not subscribe to "
                                  f"{request['pattern']!r} at appliance {me!r}, so it may "
                                  "not replay it")
    else:
        refused = agent.cache.submit(("n", nb.node_id, doc["session"]), RELAY_CHANNEL,
                                     (nb.node_id, doc["fid"]), request, identity)
    if refused is not None:
        why, reason = refused
        agent.counters[f"replay_served_refused_{why}"] += 1
        answer(agent, nb, doc["fid"], {"id": request["id"], "accepted": False, "why": why,
                                       "reason": reason}, [])


def send_answers(agent: Any) -> int:
    """The cache's answers to forwarded requests, on the link to the neighbour that asked."""
    relay = agent.cache.relay_out
    n = 0
    while relay:
        node, fid, doc, frames = relay.popleft()
        n += 1
        nb = next((x for x in agent.neighbours.values() if x.up and x.node_id == node), None)
        if nb is None:
            agent.counters["replay_served_unroutable"] += 1
            continue
        answer(agent, nb, fid, doc, frames)
    return n


def answer(agent: Any, nb: Any, fid: int, doc: dict, frames: list[bytes]) -> None:
    """Send one answer: each page frame in parts, then the document."""
    size = part_bytes(agent.cfg.fabric_max_frame_bytes)
    control = agent._control
    for index, frame in enumerate(frames[:MAX_PAGE_FRAMES]):
        parts = (len(frame) + size - 1) // size
        for part in range(parts):
            data = base64.b64encode(frame[part * size:(part + 1) * size]).decode("ascii")
            agent._to_neighbour(nb, FrameType.CONTROL, [control(
                al.ControlKind.REMOTE_REPLAY_PART,
                {"fid": fid, "page": doc.get("page", 0), "frame": index, "part": part,
                 "parts": parts, "data": data})])
            agent.counters["replay_served_parts"] += 1
    text = json.dumps(doc, separators=(",", ":"))
    room = agent.cfg.fabric_max_frame_bytes - PART_OVERHEAD_BYTES
    if len(text.encode()) <= room:
        agent._to_neighbour(nb, FrameType.CONTROL, [control(
            al.ControlKind.REMOTE_REPLAY_RESULT, {"fid": fid, "result": doc})])
    else:  # losses with long topics: the document in parts of text (room / 6 characters
        # at most each, so that JSON's escapes of any character still fit)
        step = max(16, room // 6)
        pieces = [text[i:i + step] for i in range(0, len(text), step)]
        for i, piece in enumerate(pieces):
            agent._to_neighbour(nb, FrameType.CONTROL, [control(
                al.ControlKind.REMOTE_REPLAY_RESULT,
                {"fid": fid, "part": i, "parts": len(pieces), "text": piece})])
        agent.counters["replay_served_results_in_parts"] += 1
    agent.counters["replay_served_answers"] += 1

