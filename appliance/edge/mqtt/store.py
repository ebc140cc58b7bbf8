"""The edge's MQTT state on disk (``mqtt.state_dir``): persistent sessions, their QoS 1/2
deliveries, the QoS 2 packet ids awaiting PUBREL, the retained messages and the QoS 1/2
publishes not yet known to have reached the fabric, so that an edge restart or a ``kill -9``
loses none of them (docs/mqtt.md, "Persistence").

One journal ``mqtt-state.log`` in the directory (journal.py: CRC-32 records, a writer thread,
group commit with one ``fdatasync`` per batch, torn tail cut, compaction), magic
``TWMS\\x01``. Each record body is a put or a delete of one key in one space::

    body:  u8 op (1 put, 2 delete) | u8 space | u16 key length | key | (put) value

    space      key                           value
    SESSION    client id                     JSON: identity, expiry_s, filters and their
                                             SubOptions, offline_since (wall clock or null),
                                             will (a will waiting for its delay, or null)
    DELIVERY   u16 len | client id | u64 seq  u8 qos | u8 retain | u64 origin | u16 topic
                                             len | u32 meta len | topic | meta | payload
                                             (origin: the INBOUND seq of a publish of this
                                             edge, else 0)
    SENT       (the DELIVERY key)             u16 packet id | u8 awaited ack (1 PUBACK,
                                             2 PUBREC, 3 PUBCOMP)
    REL        u16 len | client id | u16 id   (empty): an incoming QoS 2 id awaiting PUBREL
    RETAINED   topic                          u64 seq | u8 qos | u32 meta len | meta | payload
    INBOUND    u64 seq                        u8 qos | u8 retain | u16 identity len |
                                             identity | u16 topic len | topic | u32 meta
                                             len | meta | payload
    DONE       u16 len | client id | u64 seq  (empty): a QoS 2 delivery of INBOUND ``seq``
                                             to the session ended (PUBCOMP) before ``seq``
                                             was retired; deleted with it (exactly_once.py)

Numbers (``seq``) are not reused across restarts: at open the next one is past both the
highest recorded and the wall clock in microseconds.

``meta``: a message's 5.0 metadata (meta.MessageMeta), empty when it has none: f64 expiry
deadline on the wall clock (-1: none) | u8 retain | its properties as in a PUBLISH. The
deadline is kept on the wall clock, so time spent while the edge was down counts.

Records are idempotent (a put replaces its key, a delete of a missing key changes nothing),
as the journal's compaction needs. The store keeps the live records in memory too (what a
compaction writes); the event loop changes them (a lock guards them against the writer's
snapshot) and never waits for the disk: ``put`` takes an ``on_synced`` callback, run on the
loop (``call_soon_threadsafe``) once the record and everything written before it is synced.

The directory is locked (``flock`` on its file ``lock``) while the store is open: a second
edge on the same directory is refused with a ``ConfigError`` (the kernel releases the lock of
a killed process). Opening reads the journal back: a torn or corrupt tail is cut off and counted
(``store_torn_tail_bytes``); a file that is no such journal, or cannot be read, raises
``ConfigError`` naming ``mqtt.state_dir``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.dataplane.process import close_at_fork
from appliance.edge.mqtt import codec, journal
from appliance.edge.mqtt.journal import Journal, JournalError
from appliance.edge.mqtt.meta import MessageMeta
from appliance.edge.mqtt.state import Delivery, SubOptions
from appliance.errors import ConfigError

if TYPE_CHECKING:
    import asyncio

    from appliance.edge.mqtt.sessions import SessionState

log = logging.getLogger("topicwire.edge.mqtt")

MAGIC = b"TWMS\x02"
MAGIC_READ = (b"TWMS\x01",)
"""Earlier headers read too (their records are a subset); the file is rewritten with
``MAGIC`` at open, so an earlier version refuses it with an error instead of misreading."""
JOURNAL = "mqtt-state.log"
PUT, DELETE = 1, 2
SESSION, DELIVERY, SENT, REL, RETAINED, INBOUND, DONE = 1, 2, 3, 4, 5, 6, 7
HEAD = struct.Struct(">BBH")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
DELIVERY_HEAD = struct.Struct(">BBQHI")
RETAINED_HEAD = struct.Struct(">QBI")
META_HEAD = struct.Struct(">dB")
SENT_BODY = struct.Struct(">HB")
AWAITING = ("", "puback", "pubrec", "pubcomp")
INBOUND_RETIRE_S = 2.0
"""How long after its native publish an incoming QoS 1/2 message stays recorded as
``INBOUND``: by then it reached this edge's subscribers and their delivery records are
synced (a message reaches them within milliseconds, meta.py), so it is not published again
after a restart."""


def _cid_key(client_id: str) -> bytes:
    cid = client_id.encode()
    return U16.pack(len(cid)) + cid


def delivery_key(client_id: str, seq: int) -> bytes:
    return _cid_key(client_id) + U64.pack(seq)


def _cid_of(key: bytes) -> tuple[str, bytes]:
    n = U16.unpack_from(key)[0]
    return key[2:2 + n].decode(), key[2 + n:]


def encode_meta(meta: MessageMeta | None) -> bytes:
    if meta is None or (not meta.props and meta.expires_at is None and not meta.retain):
        return b""
    deadline = -1.0 if meta.expires_at is None else (
        time.time() + meta.expires_at - time.monotonic())
    return META_HEAD.pack(deadline, int(meta.retain)) + codec.encode_props(meta.props)


def decode_meta(blob: bytes, origin: int = 0) -> MessageMeta | None:
    if not blob:
        return None if not origin else MessageMeta([], None, False, origin)
    deadline, retain = META_HEAD.unpack_from(blob)
    props = codec._Reader(blob[META_HEAD.size:]).props("publish")
    expires_at = None if deadline < 0 else time.monotonic() + deadline - time.time()
    return MessageMeta(props, expires_at, bool(retain), origin)


def encode_delivery(d: Delivery) -> bytes:
    topic = d.topic.encode()
    origin = getattr(d.meta, "origin", 0)
    meta = encode_meta(d.meta)
    return DELIVERY_HEAD.pack(d.qos, int(d.retain), origin, len(topic), len(meta)) + topic + (
        meta + d.payload)


def decode_delivery(value: bytes) -> tuple[Delivery, int]:
    """The delivery and its origin (0: none)."""
    qos, retain, origin, tlen, mlen = DELIVERY_HEAD.unpack_from(value)
    at = DELIVERY_HEAD.size
    meta = decode_meta(value[at + tlen:at + tlen + mlen], origin)
    return Delivery(value[at:at + tlen].decode(), bytes(value[at + tlen + mlen:]), qos,
                    bool(retain), meta), origin


def encode_inbound(qos: int, retain: bool, identity: str, topic: str, payload: bytes,
                   meta: MessageMeta | None = None) -> bytes:
    ident, top = identity.encode(), topic.encode()
    blob = encode_meta(meta)
    return (bytes((qos, int(retain))) + U16.pack(len(ident)) + ident + U16.pack(len(top)) +
            top + U32.pack(len(blob)) + blob + payload)


@dataclass
class Inbound:
    seq: int
    qos: int
    retain: bool
    identity: str
    topic: str
    payload: bytes
    meta: MessageMeta | None = None


def decode_inbound(seq: int, value: bytes) -> Inbound:
    qos, retain = value[0], bool(value[1])
    n = U16.unpack_from(value, 2)[0]
    identity = value[4:4 + n].decode()
    at = 4 + n
    m = U16.unpack_from(value, at)[0]
    topic = value[at + 2:at + 2 + m].decode()
    at += 2 + m
    mlen = U32.unpack_from(value, at)[0]
    meta = decode_meta(value[at + 4:at + 4 + mlen])
    return Inbound(seq, qos, retain, identity, topic, bytes(value[at + 4 + mlen:]), meta)


@dataclass
class StoredSession:
    """One persistent session read back."""

    client_id: str
    identity: str
    expiry_s: int
    filters: dict[str, SubOptions]
    offline_since: float | None
    carve_outs: dict[str, int] = field(default_factory=dict)
    """Its partial unsubscribes: filter -> place in the ordered list (sessions.py)."""
    will: tuple[codec.Will, float] | None = None
    """A will waiting for its delay when the edge stopped, and when it is due (wall clock)."""
    deliveries: list[tuple[int, Delivery, tuple[int, str] | None]] = field(default_factory=list)
    """(seq, the delivery, (packet id, awaited ack) when it was sent), oldest first."""
    origins: set[int] = field(default_factory=set)
    """The INBOUND seqs its deliveries came from (a publish sent again is not queued
    twice)."""
    awaiting_rel: set[int] = field(default_factory=set)


class StateStore:
    """See the module docstring."""

    def __init__(self, directory: Path, loop: asyncio.AbstractEventLoop,
                 count: Callable[[str, int], None]) -> None:
        self.directory = Path(directory)
        self.loop = loop
        self._count = count
        self.lock = threading.Lock()
        self.records: dict[tuple[int, bytes], bytes] = {}
        self._done: dict[int, list[bytes]] = {}
        """INBOUND seq -> the DONE keys to delete when it is retired."""
        self.bytes = 0
        self._lock_fd = -1
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # a data path forked later in this process (another appliance of a test or of
            # an embedded fabric) must not hold the directory's lock after this edge lets go
            close_at_fork(self._lock_fd)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise ConfigError(f"mqtt.state_dir: {self.directory} is in use by another running "
                              "edge; give each edge a directory of its own") from None
        except OSError as exc:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
            raise ConfigError(f"mqtt.state_dir: cannot use {self.directory}: "
                              f"{exc.strerror or exc}") from None
        try:
            bodies, cut = journal.read(self.directory / JOURNAL, MAGIC, MAGIC_READ)
        except (OSError, JournalError) as exc:
            self._unlock()
            raise ConfigError(
                f"mqtt.state_dir: cannot read the edge's state in {self.directory}: {exc}; "
                f"move {JOURNAL} away (its sessions and retained messages are then lost) or "
                "point mqtt.state_dir at another directory") from None
        for i, body in enumerate(bodies):
            if not self._replay(body):  # an unknown record: cut there, as a corrupt one
                cut += sum(len(b) + journal.RECORD_HEAD.size for b in bodies[i:])
                break
        if cut:
            count("store_torn_tail_bytes", cut)
            count("store_torn_tails_cut", 1)
            log.warning("mqtt.state_dir: %d bytes of a torn or corrupt tail cut off %s", cut,
                        self.directory / JOURNAL)
        self.seq = max((U64.unpack_from(k, len(k) - 8)[0] for (s, k) in self.records
                        if s in (DELIVERY, INBOUND) and len(k) >= 8), default=0)
        self.seq = max([self.seq] + [U64.unpack_from(v)[0] for (s, _), v in
                                     self.records.items() if s == RETAINED and len(v) >= 8])
        # numbers never repeat across restarts, even when every record was retired: other
        # edges tell a publish sent again at start by its number (exactly_once.py)
        self.seq = max(self.seq, time.time_ns() // 1_000)
        try:
            self._journal = Journal(self.directory / JOURNAL, MAGIC, self._snapshot,
                                    lambda: self.bytes, count, prefix="store_",
                                    name="mqtt-state-writer").start(self._snapshot())
        except OSError as exc:
            self._unlock()
            raise ConfigError(f"mqtt.state_dir: cannot write the edge's state in "
                              f"{self.directory}: {exc}") from None

    # --- records -------------------------------------------------------------------------------
    @staticmethod
    def _body(op: int, space: int, key: bytes, value: bytes = b"") -> bytes:
        return HEAD.pack(op, space, len(key)) + key + value

    def _replay(self, body: bytes) -> bool:
        if len(body) < HEAD.size:
            return False
        op, space, klen = HEAD.unpack_from(body)
        if op not in (PUT, DELETE) or not SESSION <= space <= DONE or (
                len(body) < HEAD.size + klen):
            return False
        key = bytes(body[HEAD.size:HEAD.size + klen])
        if op == PUT:
            self._set((space, key), bytes(body[HEAD.size + klen:]))
        else:
            self._pop((space, key))
        return True

    def _set(self, k: tuple[int, bytes], value: bytes) -> None:
        old = self.records.get(k)
        if old is not None:
            self.bytes -= len(old) + len(k[1]) + HEAD.size + journal.RECORD_HEAD.size
        self.records[k] = value
        self.bytes += len(value) + len(k[1]) + HEAD.size + journal.RECORD_HEAD.size

    def _pop(self, k: tuple[int, bytes]) -> bool:
        old = self.records.pop(k, None)
        if old is None:
            return False
        self.bytes -= len(old) + len(k[1]) + HEAD.size + journal.RECORD_HEAD.size
        return True

    def _snapshot(self) -> list[bytes]:
        with self.lock:
            return [self._body(PUT, s, k, v) for (s, k), v in self.records.items()]

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def put(self, space: int, key: bytes, value: bytes,
            on_synced: Callable[[bool], None] | None = None) -> None:
        """Keep ``key`` = ``value``; ``on_synced(ok)`` runs on the loop once it is on disk."""
        with self.lock:
            self._set((space, key), value)
            self._journal.write(self._body(PUT, space, key, value), self._on_loop(on_synced))

    def delete(self, space: int, key: bytes) -> None:
        with self.lock:
            if self._pop((space, key)):
                self._journal.write(self._body(DELETE, space, key))

    def _on_loop(self, fn: Callable[[bool], None] | None) -> Callable[[bool], None] | None:
        if fn is None:
            return None
        loop = self.loop

        def synced(ok: bool) -> None:
            try:
                loop.call_soon_threadsafe(fn, ok)
            except RuntimeError:  # the loop has stopped: the edge is going down
                pass
        return synced

    def sync(self, timeout_s: float) -> bool:
        return self._journal.sync(timeout_s)

    def close(self) -> None:
        """Write and sync what is queued, then release the directory (safe twice)."""
        self._journal.close()
        self._unlock()

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            close_at_fork(fd, close=False)
            os.close(fd)

    # --- reading back ------------------------------------------------------------------------
    def _unreadable(self, space: int, key: bytes, exc: BaseException) -> None:
        """A record whose CRC holds but whose content does not decode (written by a newer
        or broken edge): dropped, counted and logged, never a stop."""
        self._count("store_records_unreadable", 1)
        log.warning("mqtt.state_dir: a record (space %d, key %r) does not decode (%r); "
                    "dropped", space, key[:64], exc)
        self.delete(space, key)

    def stored_sessions(self) -> list[StoredSession]:
        """The persistent sessions recorded, each with its deliveries (in order) and QoS 2
        ids; records of a session that is not recorded are deleted."""
        out: dict[str, StoredSession] = {}
        for (space, key), value in list(self.records.items()):
            if space != SESSION:
                continue
            try:
                doc = json.loads(value)
                filters = {k: SubOptions(**o) for k, o in doc["filters"].items()}
                will = doc.get("will")
                if will is not None:
                    will = (codec.Will(will["topic"], bytes.fromhex(will["payload"]),
                                       int(will["qos"]), bool(will["retain"]),
                                       codec._Reader(bytes.fromhex(will["props"])).props("will")),
                            float(will["due"]))
                carve_outs = {str(f): int(seq) for f, seq in doc.get("carve_outs", {}).items()}
                out[key.decode()] = StoredSession(key.decode(), doc["identity"],
                                                  int(doc["expiry_s"]), filters,
                                                  doc.get("offline_since"), carve_outs, will)
            except Exception as exc:  # (see _unreadable)
                self._unreadable(space, key, exc)
        sent = {}
        for (space, key), value in list(self.records.items()):
            if space == SENT:
                try:
                    pid, ack = SENT_BODY.unpack(value)
                    sent[key] = (pid, AWAITING[ack])
                except Exception as exc:
                    self._unreadable(space, key, exc)
        for (space, key), value in sorted(self.records.items()):
            if space not in (DELIVERY, REL, DONE):
                continue
            try:
                cid, rest = _cid_of(key)
                session = out.get(cid)
                if session is None:
                    self.delete(space, key)
                    self.delete(SENT, key)
                elif space == REL:
                    session.awaiting_rel.add(U16.unpack(rest)[0])
                elif space == DONE:
                    origin = U64.unpack(rest)[0]
                    if (INBOUND, rest) in self.records:
                        session.origins.add(origin)
                        self._done.setdefault(origin, []).append(key)
                    else:
                        self.delete(DONE, key)
                else:
                    d, origin = decode_delivery(value)
                    if origin:
                        session.origins.add(origin)
                    session.deliveries.append((U64.unpack(rest)[0], d, sent.get(key)))
            except Exception as exc:
                self._unreadable(space, key, exc)
                self.delete(SENT, key)
        for session in out.values():
            session.deliveries.sort(key=lambda x: x[0])
        return list(out.values())

    def stored_retained(self) -> list[tuple[str, bytes, int, int, MessageMeta | None]]:
        """(topic, payload, qos, seq, meta) of the retained messages recorded."""
        out = []
        for (space, key), value in list(self.records.items()):
            if space == RETAINED:
                try:
                    seq, qos, mlen = RETAINED_HEAD.unpack_from(value)
                    at = RETAINED_HEAD.size
                    out.append((key.decode(), value[at + mlen:], qos, seq,
                                decode_meta(value[at:at + mlen])))
                except Exception as exc:
                    self._unreadable(space, key, exc)
        return out

    def stored_inbound(self) -> list[Inbound]:
        out = []
        for (space, key), value in list(self.records.items()):
            if space == INBOUND:
                try:
                    out.append(decode_inbound(U64.unpack(key)[0], value))
                except Exception as exc:
                    self._unreadable(space, key, exc)
        return sorted(out, key=lambda m: m.seq)

    # --- what the sessions do ----------------------------------------------------------------
    def save_session(self, state: SessionState, offline_since: float | None = None) -> None:
        """Record ``state`` (persistent), its deliveries not recorded yet and its QoS 2 ids;
        a session that is not persistent (expiry 0) is forgotten instead. ``offline_since``:
        default ``state.offline_at``."""
        if not state.expiry_s or state.ended:
            self.forget_session(state)
            return
        if offline_since is None:
            offline_since = getattr(state, "offline_at", None)
        will = getattr(state, "will", None)
        doc = {"identity": state.identity, "expiry_s": state.expiry_s,
               "filters": {k: asdict(o) for k, o in state.filters.items()},
               "carve_outs": state.carve_outs,
               "offline_since": offline_since,
               "will": None if will is None else {
                   "topic": will.topic, "payload": will.payload.hex(), "qos": will.qos,
                   "retain": will.retain, "props": codec.encode_props(will.props).hex(),
                   "due": state.will_due}}
        self.put(SESSION, state.client_id.encode(), json.dumps(doc).encode())
        state.stored = True
        for pid, d in list(state.inflight.items()):
            if not d.stored:
                self.kept(state, d)
                self.sent(state, pid, d)
        for d in state.queued:
            if not d.stored:
                self.kept(state, d)
        for pid in state.awaiting_rel:
            self.put(REL, _cid_key(state.client_id) + U16.pack(pid), b"")

    def forget_session(self, state: SessionState) -> None:
        if not state.stored:
            return
        state.stored = False
        self.delete(SESSION, state.client_id.encode())
        prefix = _cid_key(state.client_id)
        with self.lock:
            keys = [k for k in self.records if k[0] in (DELIVERY, SENT, REL, DONE) and
                    k[1].startswith(prefix) and _cid_of(k[1])[0] == state.client_id]
        for space, key in keys:
            self.delete(space, key)
        for d in list(state.inflight.values()) + list(state.queued):
            d.stored = 0

    def kept(self, state: SessionState, d: Delivery) -> None:
        """``d`` (QoS 1/2) entered ``state``'s queue or inflight."""
        if not state.stored or d.qos == 0:
            return
        if not d.stored:
            d.stored = self.next_seq()
        self.put(DELIVERY, delivery_key(state.client_id, d.stored), encode_delivery(d))
        self._count("store_deliveries_kept", 1)

    def sent(self, state: SessionState, packet_id: int, d: Delivery,
             on_synced: Callable[[bool], None] | None = None) -> None:
        """``d`` goes to the client as ``packet_id`` (or passed PUBREC); ``on_synced(ok)``
        once that is on disk."""
        if not state.stored or d.qos == 0:
            if on_synced is not None:
                self.loop.call_soon(on_synced, True)
            return
        if not d.stored:
            self.kept(state, d)
        self.put(SENT, delivery_key(state.client_id, d.stored),
                 SENT_BODY.pack(packet_id, AWAITING.index(d.awaiting or "puback")), on_synced)

    def done(self, state: SessionState, d: Delivery) -> None:
        """``d``'s flow ended (PUBACK, PUBCOMP) or it left ``state`` (dropped, expired,
        handed to another session)."""
        if not d.stored:
            return
        key = delivery_key(state.client_id, d.stored)
        d.stored = 0
        origin = d.meta.origin if d.meta is not None else 0
        if d.qos == 2 and origin and (INBOUND, U64.pack(origin)) in self.records:
            # its publish may still be sent again at start: the session must not get it
            # twice (exactly_once.py); forgotten when the publish is retired
            done = _cid_key(state.client_id) + U64.pack(origin)
            self.put(DONE, done, b"")
            self._done.setdefault(origin, []).append(done)
        self.delete(DELIVERY, key)
        self.delete(SENT, key)

    def rel(self, state: SessionState, packet_id: int, waiting: bool,
            on_synced: Callable[[bool], None] | None = None) -> None:
        """An incoming QoS 2 id starts (``waiting``) or ends awaiting PUBREL."""
        key = _cid_key(state.client_id) + U16.pack(packet_id)
        if waiting and state.stored:
            self.put(REL, key, b"", on_synced)
        else:
            self.delete(REL, key)
            if on_synced is not None:
                self.loop.call_soon(on_synced, True)

    def retained(self, topic: str, payload: bytes, qos: int, seq: int = 0,
                 meta: MessageMeta | None = None) -> None:
        """The retained store set (an empty payload: cleared) ``topic``."""
        key = topic.encode()
        if not payload:
            self.delete(RETAINED, key)
        else:
            blob = encode_meta(meta)
            self.put(RETAINED, key, RETAINED_HEAD.pack(seq or self.next_seq(), qos, len(blob)) +
                     blob + payload)

    def retained_seq(self, topic: str) -> int:
        value = self.records.get((RETAINED, topic.encode()))
        return 0 if value is None else U64.unpack_from(value)[0]

    def inbound(self, qos: int, retain: bool, identity: str, topic: str, payload: bytes,
                on_synced: Callable[[bool], None], meta: MessageMeta | None = None) -> int:
        """Record an incoming QoS 1/2 publish (its acknowledgement waits for ``on_synced``);
        its seq, for ``retire``."""
        seq = self.next_seq()
        self.put(INBOUND, U64.pack(seq), encode_inbound(qos, retain, identity, topic, payload,
                                                        meta), on_synced)
        return seq

    def inbound_pending(self) -> bool:
        """Some publish is recorded and not retired yet."""
        with self.lock:
            return any(space == INBOUND for space, _ in self.records)

    def retire(self, seq: int, delay_s: float = INBOUND_RETIRE_S) -> None:
        """The publish ``seq`` reached the fabric: forget it after ``delay_s``."""
        self.loop.call_later(delay_s, self._retired, seq)

    def _retired(self, seq: int) -> None:
        self.delete(INBOUND, U64.pack(seq))
        for key in self._done.pop(seq, ()):
            self.delete(DONE, key)
