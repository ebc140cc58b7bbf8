"""``CacheAgent``: the caching engine of one appliance (``[cache]``; docs/fault-tolerance.md).

It keeps what a client session of the appliance's own receives: at start it logs in to the
appliance's client endpoint (``clients.udp``, else ``clients.shm``) as ``CACHE_IDENTITY``
with a password made at each start (the control agent knows its verifier and entitles it to
subscribe to ``cache.patterns``; nobody else can log in as it), subscribes to each pattern
twice, best-effort and guaranteed, and appends every message it receives to the
``CacheStore`` log of each pattern the topic matches, committing once per batch
(``cache.fsync``). The two subscriptions split the messages by the QoS they were published
with: the guaranteed one keeps the guaranteed messages, published here or anywhere in the
fabric, which reach it over a reliable stream (a message that stream loses is a loss event,
counted ``cache_lost``); the best-effort one keeps the best-effort and last-value messages
(a local guaranteed publish reaches it too, and is skipped there: it is kept once, from
the reliable stream).

It also answers REPLAY requests, which the control agent hands over (``submit``) after
checking the session's entitlements: one bounded page per request, read on this agent's
thread (the logs are not shared with any other) and sent back through the data path's admin
outbox. A client pages on with ``from_seq`` = the answer's ``next_seq``: the appliance keeps
no state between pages. Pending requests are bounded (``REPLAYS_PENDING``, per session
``REPLAYS_PENDING_PER_SESSION``); one more is refused (busy), as is a pattern no
configured pattern includes.

An agent (``do_work(now_ns)``) on its own thread (``WakeableIdle``: it sleeps until a message
or a request arrives or a sync or retention falls due).

Durable subscriptions (``durable`` in a REPLAY; appliance/cache/durables.py): the agent keeps
each one's position in its ``DurableBook``, takes a request's ``from_seq`` as the
acknowledgement of everything before it, answers from the stored position otherwise, names
what retention deleted before the subscriber read it (``lost``), and holds a request that
finds nothing new (``wait_ms``) until its log takes a record or the wait ends: a long poll,
so a durable subscriber follows the live messages without asking again and again. Held
requests are bounded by the book (one per durable subscription and session).

Nothing a durable subscription's pattern matches goes missing without a word: where the cache
does not keep messages (its queue was full, a message too large, the hop to its session lost
some) it appends a loss marker to each log concerned in their place (``_Gap``,
``_write_gap``), and a durable page that reads past a marker, or past records retention or
``max_disk_bytes`` deleted, names them in its answer (``losses``), which the client turns
into ``Loss`` events in their place.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from appliance.cache.durables import DurableBook, DurableError
from appliance.cache.naks import NakServer
from appliance.cache.settings import (
    CACHE_APPEND_BATCH_MESSAGES,
    CACHE_IDENTITY,
    CACHE_MAX_PAYLOAD_BYTES,
    CACHE_QUEUE_MESSAGES,
    FORWARDED_PAGE_BYTES,
    FORWARDED_PARKED,
    FORWARDED_PENDING_PER_NEIGHBOUR,
    RELAY_CHANNEL,
    RELAY_PAGES_WAITING,
    REPLAY_OUTBOX_FRAMES,
    REPLAYS_PENDING,
    REPLAYS_PENDING_PER_SESSION,
    RETENTION_CHECK_INTERVAL_NS,
    STORE_RETRY_INTERVAL_NS,
    CacheSettings,
)
from appliance.cache.store import DISK_LIMIT, RETENTION, CacheStore, ReplayPage
from appliance.client.connection import SESSION_LOST
from appliance.client.messages import QOS
from appliance.config import (
    CLIENT_MAX_FRAME_BYTES,
    ApplianceConfig,
    ConfigError,
    local_client_url,
)
from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from datapath.errors import TopicwireError
from datapath.protocol.extensions import HEADERS_FLAG, encode_headers
from datapath.protocol.frame_layout import AUTH_TRAILER_BYTES
from datapath.topics.algebra import matches

log = logging.getLogger("topicwire.appliance")
QOS_GUARANTEED = QOS["guaranteed"]
SEQUENCES_KEPT = 65_536
"""(origin, stream, topic key) whose last sequence is remembered to count gaps; cleared when
full (counted ``cache_gap_table_resets``)."""
CONNECT_RETRY_S = 0.5
"""The cache's session is tried again this often until it logs in and subscribes."""
REPLAYS_PER_CYCLE = 4
"""Pages answered per duty cycle (appends go between)."""
STATUS_INTERVAL_NS = 250_000_000
INTERNAL_SCRYPT_N = 1 << 10
"""The internal password is 32 random bytes: a cheap hash is enough."""
GAP_TOPICS = 64
"""Topics a loss marker counts one by one; past them its topics are not known (every
durable subscription of its log is told)."""
PAGE_LOSSES = 16
"""Loss markers one durable page names at most (the page ends before one more)."""
PAGE_DELETED_RANGES = 16
"""Deleted ranges of different reasons one durable page names at most (the rest are named
as one more range, ``RETENTION`` unless ``max_disk_bytes`` deleted some of them)."""
QUEUE_FULL = "CACHE_QUEUE_FULL"
TOO_LARGE = "CACHE_TOO_LARGE"
MISSED = "CACHE_MISSED"
LOST = "CACHE_LOST"
SESSION_GONE = "CACHE_SESSION_LOST"
RESTART = "CACHE_RESTART"
"""The reasons of the loss events a durable subscriber gets for messages the cache did not
keep (docs/fault-tolerance.md, "Durable subscriptions"). The last two do not know how many:
the cache's own session lost its appliance and logged in again; the appliance stopped
without closing its cache (killed, or its disk still failed), so what it had received and
not yet written is gone."""
CLEAN_STOP_FILE = "clean-stop"
"""Written in ``cache.dir`` when the cache closed with everything it received written;
removed at start. A start without it (and with records kept) puts a ``CACHE_RESTART`` loss
marker at the end of every log."""


class _Gap:
    """Messages the cache will not keep, in its queue in their place (a loss marker is
    appended for them when the queue reaches it): the reason, how many, and, where one
    publisher and topic had them all, its (origin, stream) and the range of its sequences
    (of the hop's stream for ``CACHE_LOST``). ``topics`` counts them per topic (None: not
    known, e.g. a reliable stream's loss)."""

    __slots__ = ("reason", "messages", "origin", "stream", "first_seq", "last_seq", "topics",
                 "sealed", "sequences")

    def __init__(self, reason: str, messages: int, origin: int, stream: int, first_seq: int,
                 last_seq: int, topics: dict[str, int] | None) -> None:
        self.reason = reason
        self.messages = messages
        self.origin = origin
        self.stream = stream
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.topics = topics
        self.sealed = False
        """Taken by the agent: the session's thread adds no more to it."""
        self.sequences: dict[tuple[int, int, int], int] = {}
        """(origin, stream, topic key) -> the highest sequence of the best-effort messages
        it stands for (at most ``GAP_TOPICS``): the agent's count of the gaps in each
        publisher's sequence (``cache_missed``) does not name them a second time."""

    @classmethod
    def of(cls, reason: str, msg: Any) -> _Gap:
        gap = cls(reason, 1, msg.origin, msg.stream, msg.sequence, msg.sequence,
                  {msg.topic: 1})
        gap._note(msg)
        return gap

    def _note(self, msg: Any) -> None:
        if msg.qos != QOS_GUARANTEED:
            key = (msg.origin, msg.stream, msg.topic_key)
            if key in self.sequences or len(self.sequences) < GAP_TOPICS:
                self.sequences[key] = max(self.sequences.get(key, 0), msg.sequence)

    def add(self, msg: Any) -> None:
        """One more message of the same reason (a run of them is one marker)."""
        self._note(msg)
        self.messages += 1
        if (msg.origin, msg.stream) != (self.origin, self.stream):
            self.origin = self.stream = 0
        topics = self.topics
        if topics is not None:
            if msg.topic in topics or len(topics) < GAP_TOPICS:
                topics[msg.topic] = topics.get(msg.topic, 0) + 1
            else:
                self.topics = None
        if self.origin and self.topics is not None and len(self.topics) == 1:
            self.first_seq = min(self.first_seq, msg.sequence)
            self.last_seq = max(self.last_seq, msg.sequence)
        else:
            self.first_seq = self.last_seq = 0


class _RegistryTopics(dict):
    """The cache session's topic names: what it learnt, else the appliance's own registry
    (every key a message reaching the session has is registered there). The client library
    holds a message of an unknown key back until a RESOLVE answers, which would put it after
    later messages of known topics; read from the registry, each publisher's messages keep
    their order across topics."""

    def __init__(self, registry: Any) -> None:
        super().__init__()
        self.registry = registry

    def get(self, key: Any, default: Any = None) -> Any:
        found = dict.get(self, key)
        if found is None:
            found = self.registry.lookup(key)
            if found is None:
                return default
            self[key] = found
        return found

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _marker_loss(seq: int, mark: dict, pattern: str, kept: str) -> dict | None:
    """What a loss marker (cache sequence ``seq``) of the log of ``kept`` tells a durable
    subscription to ``pattern``: None when none of its topics match the pattern; the topic
    when one does, else the pattern (the log's when the topics are not known)."""
    topics = mark.get("topics")
    if isinstance(topics, dict):
        mine = {t: n for t, n in topics.items() if matches(pattern, t)}
        if not mine:
            return None
        messages = sum(mine.values())
        topic = next(iter(mine)) if len(mine) == 1 else pattern
    else:
        messages, topic = int(mark.get("messages", 0)), kept
    return {"at": seq, "reason": str(mark.get("reason", "")), "messages": messages,
            "topic": topic, "origin": int(mark.get("origin", 0)),
            "stream": int(mark.get("stream", 0)), "first_seq": int(mark.get("first_seq", 0)),
            "last_seq": int(mark.get("last_seq", 0))}


class CacheAgent:
    """See the module docstring."""

    name = "cache"

    def __init__(self, config: ApplianceConfig, settings: CacheSettings, dp: Any,
                 registry: Any) -> None:
        from appliance.control.credentials import hash_password, verifier_of
        from appliance.control.pm import Entitlements

        self.config = config
        self.settings = settings
        self.dp = dp
        self.registry = registry
        """The appliance's ``KeyRegistry`` (read by the cache session's thread)."""
        try:
            self.store = CacheStore(settings)
        except (TopicwireError, OSError) as exc:
            raise ConfigError(f"cache.dir: cannot open the cache's logs in {settings.dir}: "
                              f"{exc}") from None
        try:
            self.book = DurableBook(settings.dir)
        except DurableError as exc:
            self.store.close()
            raise ConfigError(str(exc)) from None
        try:
            self._mark_unclean_stop()
        except (TopicwireError, OSError) as exc:
            self.store.close()
            raise ConfigError(f"cache.dir: cannot write in {settings.dir}: {exc}") from None
        self._parked: dict[str, dict[tuple[int, str, str], tuple[tuple, int]]] = {}
        """Log -> (session, identity, durable name) -> (request, deadline): durable requests
        waiting for their log to take a record."""
        self._woken: deque[tuple[int, str, int, dict, str]] = deque()
        self._password = secrets.token_hex(32)
        self.verifier = verifier_of(hash_password(self._password, n=INTERNAL_SCRYPT_N))
        self.entitlements = Entitlements((), settings.patterns)
        self.counters: Counter[str] = Counter()
        self.wakeup = threading.Event()
        self.ready = threading.Event()
        """Set once the cache's session is subscribed to every pattern."""
        self._inbox: deque[Any] = deque()
        self._requests: deque[tuple[int, str, int, dict, str]] = deque()
        self._pending: Counter[int] = Counter()
        self._queued: set[tuple[int, int]] = set()
        """(session, request id) of the requests waiting: a client's repeat of one of them
        (its answer is late) is not queued again."""
        self._lock = threading.Lock()
        self._last_seq: dict[tuple[int, int, int], int] = {}
        self._retention_at = 0
        self._status_at = 0
        self.status_snapshot: dict[str, Any] = {}
        self.dropped_queue_full = 0
        """Counted on the client's thread (kept apart from ``counters``)."""
        self.lost_guaranteed = 0
        """Guaranteed messages named by loss events of the cache's session (client thread)."""
        self._lost_logged = False
        self.client: Any = None
        self._closing = threading.Event()
        self._runner: Any = None
        self._connector: threading.Thread | None = None
        self.persisted_acks = settings.acknowledge == "persisted"
        """A local publisher's guaranteed messages are acknowledged once on disk: the data
        path waits for ``_report_persisted`` (docs/fault-tolerance.md)."""
        self._unpersisted: deque[tuple[tuple[int, int], list[tuple[str, int]]]] = deque()
        """(publishing session, sequence on the stream from the data path) of the local
        guaranteed messages appended, with their (pattern, cache sequence), until they are on disk;
        bounded by the publishers' send windows (nothing more is acknowledged meanwhile)."""
        self._unkept: deque[tuple[int, int, int, str]] = deque()
        """(publishing session, first and last sequence on the stream from the data path,
        why) of local guaranteed messages this cache will never keep (dropped from a full
        queue, lost on the way), for the data path (``_report_unkept``); appended on the
        session's thread, taken on the agent's."""
        self.failing: str | None = None
        """The storage error the logs fail with now (None: they write)."""
        self._failing_since_ns = 0
        self._retry_at = 0
        self._page_buf = ReplayPage(CLIENT_MAX_FRAME_BYTES - AUTH_TRAILER_BYTES)
        """The page being answered (one at a time, on the agent's thread)."""
        self._page_ids = 0
        self._relay_buf = ReplayPage(CLIENT_MAX_FRAME_BYTES - AUTH_TRAILER_BYTES,
                                     max_bytes=FORWARDED_PAGE_BYTES)
        """The page answering a request a neighbour forwarded (``RELAY_CHANNEL``): smaller,
        it crosses the link in parts."""
        self.relay_out: deque[tuple[int, int, dict, list[bytes]]] = deque()
        """(neighbour node, forward id, REPLAY_RESULT document, page frames) of the answers
        to forwarded requests, for the control agent to send on the link (at most
        ``RELAY_PAGES_WAITING`` before no page is built)."""
        self.relay_wakeup: Any = None
        """The control agent's wakeup (set by the appliance)."""
        self._pending_nodes: Counter[int] = Counter()
        """Forwarded requests waiting, per neighbour node."""
        self.naks = NakServer(self.store, dp)
        """Reads back what the data path's senders no longer hold (appliance/cache/naks.py)."""

    # --- lifecycle ----------------------------------------------------------------------------
    def _mark_unclean_stop(self) -> None:
        """The last stop did not close the cache with everything written: a loss marker
        (how many not known) at the end of every log that holds records, for the durable
        subscriptions reading past it."""
        clean = Path(self.settings.dir) / CLEAN_STOP_FILE
        self.restart_marked = False
        if not clean.exists() and any(log.last_seq for log in self.store.logs.values()):
            for pattern in self.store.logs:
                self.store.append_marker(pattern, time.time_ns(), 0, 0, {
                    "reason": RESTART, "messages": 0, "origin": 0, "stream": 0,
                    "first_seq": 0, "last_seq": 0, "topics": None})
            self.store.commit()
            self.restart_marked = True
            log.warning("%s: cache: the last stop did not close the cache (killed, or its "
                        "disk failed): what it had received and not written then is lost; "
                        "durable subscribers get a loss event (CACHE_RESTART)", self.config.name)
        clean.unlink(missing_ok=True)
        _sync_dir(clean.parent)

    def _mark_clean_stop(self) -> None:
        clean = Path(self.settings.dir) / CLEAN_STOP_FILE
        with open(clean, "w") as f:
            f.flush()
            os.fsync(f.fileno())
        _sync_dir(clean.parent)

    def start(self) -> CacheAgent:
        """Start the agent's thread and the cache's session (logged in in the background:
        ``ready`` says when it is subscribed)."""
        from appliance.cache.store import warm_up
        from datapath.agent import AgentRunner, WakeableIdle

        # the persistence kernels load (or, with a cold cache, compile) now, not on the
        # cache's thread at its first append or replay: a replay must not wait for a compile
        warm_up()
        self._runner = AgentRunner([self], WakeableIdle(self.wakeup, self.wake_at_ns),
                                   name=f"{self.config.name}-cache")
        self._runner.start()
        self._connector = threading.Thread(target=self._connect, daemon=True,
                                           name=f"{self.config.name}-cache-session")
        self._connector.start()
        return self

    def _connect(self) -> None:
        from appliance.client.api import connect
        from appliance.client.settings import RECONNECT_MAX_S

        url = local_client_url(self.config)
        logged = False
        while not self._closing.is_set():
            client = None
            try:
                client = connect(url, CACHE_IDENTITY, password=self._password, idle="sleep",
                                 reconnect_s=RECONNECT_MAX_S, on_state=self._on_state)
                with client._lock:
                    topics = _RegistryTopics(self.registry)
                    topics.update(client._topics)
                    client._topics = topics
                for pattern in self.settings.patterns:
                    client.subscribe(pattern, callback=self._on_message)
                    client.subscribe(pattern, qos="guaranteed", callback=self._on_guaranteed,
                                     on_loss=self._on_loss)
            except TopicwireError as exc:
                if client is not None:
                    client.close()
                if not logged:
                    log.warning("%s: cache: its session is not subscribed yet (%s); trying "
                                "again every %.1f s", self.config.name, exc, CONNECT_RETRY_S)
                    logged = True
                self._closing.wait(CONNECT_RETRY_S)
                continue
            with self._lock:
                if self._closing.is_set():
                    client.close()
                    return
                self.client = client
            self.dp.command("cache_ready", client.session)
            self.ready.set()
            log.info("%s: cache: keeping %s in %s (fsync %s)", self.config.name,
                     ", ".join(self.settings.patterns), self.settings.dir, self.settings.fsync)
            return

    def _on_state(self, change: Any) -> None:
        """The cache's session logged in again and made its subscriptions again: the data
        path may count on it from now on (``cache_ready``; a neighbour's messages routed
        before then are not reported persisted)."""
        client = self.client
        if change.state == "reconnected" and client is not None and client.session:
            self.dp.command("cache_ready", client.session)

    def close(self) -> None:
        """Log the cache's session out, stop the thread, sync and close the logs (twice is
        fine)."""
        self._closing.set()
        with self._lock:
            client, self.client = self.client, None
        if client is not None:
            client.close()
        if self._connector is not None:
            self._connector.join(30)
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
        self.drain()
        try:
            self.book.save()
        except OSError as exc:
            self._store_error("durables", exc)
        try:
            closing = bool(self.store.logs)  # (not a second close)
            self.store.close()
            if closing and not self._inbox and self.failing is None:  # all received written
                self._mark_clean_stop()
        except (TopicwireError, OSError) as exc:
            self._store_error("close", exc)

    def drain(self) -> None:
        """Append what was received and not yet kept (at stop, on the caller's thread); a
        failing disk is tried once more."""
        if self._runner is None and self.store.logs:
            self._retry_at = 0
            while self._inbox or self.failing is not None:
                self._append(time.monotonic_ns())
                if self.failing is not None:
                    log.error("%s: cache: stopping with %d received messages not kept: the "
                              "logs in %s still fail (%s)", self.config.name,
                              len(self._inbox), self.settings.dir, self.failing)
                    return

    # --- in: messages (the cache session's client thread) -------------------------------------
    def _on_message(self, msg: Any) -> None:
        """The best-effort subscription's messages: all but the guaranteed ones."""
        if msg.qos == QOS_GUARANTEED:
            return  # kept from the guaranteed subscription's reliable stream
        self._take(msg)

    def _on_guaranteed(self, msg: Any) -> None:
        if msg.qos != QOS_GUARANTEED:
            return  # kept from the best-effort subscription
        self._take(msg)

    def _on_loss(self, loss: Any) -> None:
        self.lost_guaranteed += loss.messages
        # in the lost messages' place: which topics they had is not known (every log)
        reason = SESSION_GONE if loss.reason == SESSION_LOST else LOST
        with self._lock:
            self._inbox.append(_Gap(reason, loss.messages, loss.origin, loss.stream,
                                    loss.first_seq, loss.last_seq, None))
        self.wakeup.set()
        if self.persisted_acks and loss.at == 0:
            # lost on the hop from this appliance's data path: sequences of that stream
            why = f"lost on the way to the cache: {loss.reason}"
            stream = loss.stream & ~RELIABLE_STREAM_BIT
            self._unkept.append((stream, loss.first_seq, loss.last_seq, why)
                                if loss.origin == self.config.node_id else
                                (loss.origin, loss.stream, loss.first_seq, loss.last_seq, why))
            self.wakeup.set()
        if not self._lost_logged:
            self._lost_logged = True
            log.error("%s: cache: %d guaranteed messages of origin %d stream %d were lost "
                      "before the cache received them (%s); counted cache_lost",
                      self.config.name, loss.messages, loss.origin, loss.stream, loss.reason)

    def _take(self, msg: Any) -> None:
        inbox = self._inbox
        if len(inbox) >= CACHE_QUEUE_MESSAGES:
            self.dropped_queue_full += 1
            self._not_kept(msg, f"the cache's queue was full ({CACHE_QUEUE_MESSAGES} "
                                "messages waiting for its disk)")
            if msg.namespace == 0:  # a marker in its place (one per run of drops)
                with self._lock:
                    last = inbox[-1] if inbox else None
                    if (isinstance(last, _Gap) and not last.sealed
                            and last.reason == QUEUE_FULL):
                        last.add(msg)
                    else:  # past the bound by one gap per run of messages queued
                        inbox.append(_Gap.of(QUEUE_FULL, msg))
            return
        inbox.append(msg)
        self.wakeup.set()

    def _not_kept(self, msg: Any, why: str) -> None:
        """A message this cache received and will not keep: when its publisher waits for it
        (a local guaranteed one, persisted acknowledgements), the data path is told."""
        if self.persisted_acks and msg.qos == QOS_GUARANTEED:
            self._unkept.append((msg.stream & ~RELIABLE_STREAM_BIT, msg.sequence,
                                 msg.sequence, why) if msg.origin == self.config.node_id else
                                (msg.origin, msg.stream, msg.sequence, msg.sequence, why))
            self.wakeup.set()

    def on_nak_request(self, data: bytes) -> None:
        """The data path asks for guaranteed messages its senders no longer hold (the
        control thread hands it over; appliance/cache/naks.py)."""
        if self.naks.on_request(data):
            self.wakeup.set()

    # --- in: replay requests (the control thread) ---------------------------------------------
    def submit(self, session_id: Any, channel: str, dest: Any, doc: dict, identity: str = ""
               ) -> tuple[str, str] | None:
        """Queue a REPLAY of ``identity``'s session (checked against its entitlements
        already, except a durable subscription's deletion); (why, reason) when it is
        refused. A request a neighbour forwarded has ``channel`` ``RELAY_CHANNEL``, ``dest``
        (its node, forward id) and ``session_id`` ("n", node, its session there)."""
        if not doc.get("delete") and (doc.get("namespace", 0) != 0
                                      or self.store.log_of(doc["pattern"]) is None):
            return "pattern", (f"cache: this appliance keeps {', '.join(self.settings.patterns)}"
                               f" (namespace 0); ask for a pattern within one of them")
        node = dest[0] if channel == RELAY_CHANNEL else None
        with self._lock:
            if (session_id, doc["id"]) in self._queued:
                return None  # a repeat of a request still waiting: one answer serves both
            if node is not None and self._pending_nodes[node] >= FORWARDED_PENDING_PER_NEIGHBOUR:
                return "busy", (f"cache: {FORWARDED_PENDING_PER_NEIGHBOUR} requests forwarded "
                                "by that appliance are waiting; retry in a moment")
            if len(self._requests) >= REPLAYS_PENDING:
                return "busy", (f"cache: {REPLAYS_PENDING} replay requests are waiting; retry "
                                "in a moment")
            if self._pending[session_id] >= REPLAYS_PENDING_PER_SESSION:
                return "busy", (f"cache: this session has {REPLAYS_PENDING_PER_SESSION} replay "
                                "requests waiting for their answer; wait for them")
            self._pending[session_id] += 1
            if node is not None:
                self._pending_nodes[node] += 1
            self._queued.add((session_id, doc["id"]))
            self._requests.append((session_id, channel, dest, doc, identity))
        self.wakeup.set()
        return None

    # --- the duty cycle -----------------------------------------------------------------------
    def wake_at_ns(self, now_ns: int) -> int:
        due = [t for t in (self.store.wake_at_ns(), self.book.wake_at_ns()) if t is not None]
        due.extend(deadline for parked in self._parked.values()
                   for _, deadline in parked.values())
        if self.failing is not None:
            due.append(self._retry_at)
        nak_due = self.naks.wake_at_ns()
        if nak_due is not None:
            due.append(nak_due)
        return min(self._retention_at, self._status_at, *due)

    def do_work(self, now_ns: int) -> int:
        work = self._append(now_ns) if self._inbox or self.failing is not None else 0
        if self._unkept:
            work += self._report_unkept()
        if self.naks.waiting:  # after the appends: what was just kept is found
            work += self.naks.do_work(now_ns)
        if self.failing is None:
            try:
                synced = self.store.do_work(now_ns)
            except (TopicwireError, OSError) as exc:
                self._store_failing(exc, now_ns)
                synced = 0
            if synced and self._unpersisted:
                self._report_persisted()
            work += synced
        while self._woken:  # held durable requests whose log took records (not counted)
            self._answer_durable(self._woken.popleft())
            work += 1
        for _ in range(REPLAYS_PER_CYCLE):
            if not self._requests or self._outbox_busy():
                break  # (a busy outbox: the agent's idle strategy wakes it again soon)
            self._answer(self._requests.popleft())
            work += 1
        if self._parked:
            work += self._expire_parked(now_ns)
        try:
            work += self.book.save_if_due(now_ns)
        except OSError as exc:
            self._store_error("durables", exc)
        if now_ns >= self._retention_at:
            self._retention_at = now_ns + RETENTION_CHECK_INTERVAL_NS
            try:
                self.counters["segments_deleted"] += self.store.enforce_retention()
            except (TopicwireError, OSError) as exc:
                self._store_error("retention", exc)
            if self.settings.max_disk_bytes:
                self._enforce_disk_limit()
        if now_ns >= self._status_at:
            self._status_at = now_ns + STATUS_INTERVAL_NS
            self.status_snapshot = self._status()
        return work

    def _append(self, now_ns: int) -> int:
        """Append a batch and commit it. A write or sync that fails keeps what it held (the
        logs' write buffers, the messages not yet appended stay in the queue) and is tried
        again every ``STORE_RETRY_INTERVAL_NS``: nothing is reported persisted meanwhile."""
        if self.failing is not None and now_ns < self._retry_at:
            return 0
        inbox = self._inbox
        n = 0
        committed: set[str] = set()
        try:
            if self.failing is not None:  # what the logs still buffer goes first
                committed = self.store.commit()
            while inbox and n < CACHE_APPEND_BATCH_MESSAGES:
                item = inbox[0]
                if isinstance(item, _Gap):
                    with self._lock:  # the session's thread adds no more to it
                        item.sealed = True
                    self._write_gap(item)
                else:
                    self._keep(item)
                inbox.popleft()
                n += 1
            committed |= self.store.commit()
        except (TopicwireError, OSError) as exc:
            self._store_failing(exc, now_ns)
            return n
        if self.failing is not None:
            log.warning("%s: cache: the logs in %s take writes again after %.1f s; the held "
                        "messages are kept and acknowledgements resume", self.config.name,
                        self.settings.dir, (now_ns - self._failing_since_ns) / 1e9)
            self.failing = None
        if self._unpersisted:
            self._report_persisted()
        if committed and self.settings.max_disk_bytes:
            self._enforce_disk_limit()
        for kept in committed:  # the durable subscribers waiting for these logs go on
            parked = self._parked.pop(kept, None)
            if parked:
                self._woken.extend(request for request, _ in parked.values())
        return n

    def _keep(self, msg: Any) -> None:
        counters = self.counters
        counters["received"] += 1
        if msg.qos != QOS_GUARANTEED:  # guaranteed ones: their losses are loss events
            key = (msg.origin, msg.stream, msg.topic_key)
            last = self._last_seq.get(key)
            if last is not None and msg.sequence > last + 1:
                missed = msg.sequence - last - 1
                counters["missed"] += missed
                if msg.namespace == 0:  # a marker in their place
                    self._write_gap(_Gap(MISSED, missed, msg.origin, msg.stream, last + 1,
                                         msg.sequence - 1, {msg.topic: missed}),
                                    msg.publish_ts_ns)
            if last is None and len(self._last_seq) >= SEQUENCES_KEPT:
                self._last_seq.clear()
                counters["gap_table_resets"] += 1
            self._last_seq[key] = msg.sequence
        region, flags = msg.payload, 0
        if msg.headers:  # kept as on the wire: the header block after the payload
            region, flags = region + encode_headers(msg.headers), HEADERS_FLAG
        if len(region) > CACHE_MAX_PAYLOAD_BYTES:  # received, not missed: not kept
            counters["too_large"] += 1
            self._not_kept(msg, f"larger than the cache keeps ({CACHE_MAX_PAYLOAD_BYTES} "
                                "bytes with its headers)")
            if msg.namespace == 0:
                self._write_gap(_Gap.of(TOO_LARGE, msg), msg.publish_ts_ns)
            return
        taken = self.store.append(msg.topic, msg.namespace, msg.sequence, msg.topic_key,
                                  msg.origin, msg.stream, msg.schema_id, msg.qos,
                                  msg.publish_ts_ns, region, flags)
        if taken:
            counters["kept"] += 1
            if msg.qos == QOS_GUARANTEED:  # its sequence on the stream to this session
                pattern, cache_seq = taken[0]
                self.naks.index.add(msg.origin, msg.stream, msg.sequence, pattern, cache_seq)
            if self.persisted_acks and msg.qos == QOS_GUARANTEED:
                # (publisher, its sequence on the data path's stream to this session); a
                # neighbour's publisher with its origin (reported to that appliance)
                self._unpersisted.append((
                    (msg.stream & ~RELIABLE_STREAM_BIT, msg.sequence)
                    if msg.origin == self.config.node_id else
                    (msg.origin, msg.stream, msg.sequence), taken))

    def _write_gap(self, gap: _Gap, ts_ns: int | None = None) -> None:
        """A loss marker for ``gap`` in the log of each pattern that matches one of its
        topics (every log when they are not known), counting only those topics; buffered
        with the appends around it (raises as an append does)."""
        ts_ns = time.time_ns() if ts_ns is None else ts_ns
        last_seq = self._last_seq
        for key, seq in gap.sequences.items():  # named here, not again as missed
            if seq > last_seq.get(key, 0):
                last_seq[key] = seq
        for pattern in self.store.logs:
            topics = gap.topics
            if topics is not None:
                topics = {t: n for t, n in topics.items() if matches(pattern, t)}
                if not topics:
                    continue
            doc = {"reason": gap.reason, "messages": (sum(topics.values()) if topics
                                                      else gap.messages),
                   "origin": gap.origin, "stream": gap.stream, "first_seq": gap.first_seq,
                   "last_seq": gap.last_seq, "topics": topics}
            self.store.append_marker(pattern, ts_ns, gap.origin, gap.stream, doc)
            self.counters["loss_markers"] += 1
        self.counters[f"gaps_{gap.reason.lower()}"] += 1

    def _enforce_disk_limit(self) -> None:
        """``max_disk_bytes``: the oldest segments of any log go (counted, said once)."""
        try:
            deleted = self.store.enforce_disk_limit()
        except (TopicwireError, OSError) as exc:
            self._store_error("disk_limit", exc)
            return
        if deleted and not self.counters["disk_limit_segments_deleted"]:
            log.warning("%s: cache: its logs in %s reached cache.max_disk_bytes (%d bytes): "
                        "the oldest segments of any log are deleted (counted "
                        "cache_disk_limit_segments_deleted; durable subscribers that had not "
                        "read them get a loss event, CACHE_DISK_LIMIT)", self.config.name,
                        self.settings.dir, self.settings.max_disk_bytes)
        self.counters["disk_limit_segments_deleted"] += deleted

    def _report_persisted(self) -> None:
        """Tell the data path which local guaranteed messages are on disk now (in the order
        they were appended): their publishers' acknowledgements go on."""
        pending = self._unpersisted
        store = self.store
        done = []
        while pending and store.durable(pending[0][1]):
            done.append(pending.popleft()[0])
        if done:
            if self._unkept:  # a drop before these: told first, with its reason
                self._report_unkept()
            self.counters["persisted_reported"] += len(done)
            self.dp.command("persisted", done)

    def _report_unkept(self) -> int:
        """Tell the data path which local guaranteed messages this cache will never keep:
        their publishers are not left waiting for acknowledgements that cannot come."""
        unkept = self._unkept
        ranges = [unkept.popleft() for _ in range(len(unkept))]
        self.counters["unkept_reported"] += len(ranges)
        self.dp.command("unpersisted", ranges)
        return len(ranges)

    def _store_failing(self, exc: BaseException, now_ns: int) -> None:
        """A write or sync of the logs failed: said once per failure period, at ERROR."""
        self.counters["store_errors_append"] += 1
        self._retry_at = now_ns + STORE_RETRY_INTERVAL_NS
        if self.failing is None:
            self._failing_since_ns = now_ns
            self.counters["store_failures"] += 1
            held = ("nothing more is acknowledged to the local publishers of guaranteed "
                    "messages on " + ", ".join(self.settings.patterns) + " (acknowledge = "
                    "\"persisted\") until it does; " if self.persisted_acks else "")
            log.error("%s: cache: cannot write its logs in %s: %s. Free space there or fix "
                      "the disk: %sreceived messages wait in memory (up to %d, then dropped, "
                      "counted cache_dropped_queue_full) and the write is tried again every "
                      "%.0f s (counted cache_store_errors_append)", self.config.name,
                      self.settings.dir, exc, held, CACHE_QUEUE_MESSAGES,
                      STORE_RETRY_INTERVAL_NS / 1e9)
        self.failing = str(exc)

    def _store_error(self, what: str, exc: BaseException) -> None:
        self.counters[f"store_errors_{what}"] += 1
        if self.counters[f"store_errors_{what}"] == 1:
            log.error("%s: cache: %s failed: %s (counted cache_store_errors_%s; what was "
                      "being kept is lost)", self.config.name, what, exc, what)

    # --- out: replay pages --------------------------------------------------------------------
    def _answer(self, request: tuple[int, str, int, dict, str]) -> None:
        session_id, channel, dest, doc, identity = request
        with self._lock:
            self._pending[session_id] -= 1
            if self._pending[session_id] <= 0:
                del self._pending[session_id]
            if channel == RELAY_CHANNEL:
                self._pending_nodes[dest[0]] -= 1
                if self._pending_nodes[dest[0]] <= 0:
                    del self._pending_nodes[dest[0]]
            self._queued.discard((session_id, doc["id"]))
        if "durable" in doc:
            self._answer_durable(request)
            return
        pattern = doc["pattern"]
        kept = self.store.log_of(pattern)
        out: dict[str, Any] = {"id": doc["id"]}
        assert kept is not None  # checked by submit; the patterns do not change
        buf = self._buf(channel)
        page = self._page(kept, pattern, doc.get("from_seq"), doc.get("from_time_ns"), out,
                          doc["id"], buf=buf)
        if page is not None:
            next_seq, done = page
            out.update(accepted=True, next_seq=next_seq, done=done)
            self.counters["replay_pages"] += 1
            self.counters["replayed_messages"] += buf.count
        self._send(channel, dest, session_id, out, page is not None)

    def _buf(self, channel: str) -> ReplayPage:
        """The page buffer of an answer on ``channel``."""
        return self._relay_buf if channel == RELAY_CHANNEL else self._page_buf

    def _page(self, kept: str, pattern: str, from_seq: int | None, from_time_ns: int | None,
              out: dict, request_id: int, markers: list | None = None, *,
              buf: ReplayPage) -> tuple[int, bool] | None:
        """``CacheStore.page`` into ``buf``; None when the log cannot be read (counted,
        logged, and ``out`` made the refusal)."""
        self._page_ids = self._page_ids % 0xFFFF_FFFF + 1
        buf.request_id, buf.page_id = request_id, self._page_ids
        try:
            return self.store.page(kept, pattern, from_seq, from_time_ns, buf, markers,
                                   PAGE_LOSSES)
        except (TopicwireError, OSError) as exc:
            self._store_error("replay", exc)
            out.update(accepted=False, why="storage", reason=f"cache: cannot read the log of "
                       f"{kept!r}: {exc}")
            return None

    def _outbox_busy(self) -> bool:
        """Whether ``REPLAY_OUTBOX_FRAMES`` admin frames wait in the data path's outbox (a
        data path in a process of its own takes frames as they are offered)."""
        return (len(getattr(self.dp, "outbox", ())) >= REPLAY_OUTBOX_FRAMES
                or len(self.relay_out) >= RELAY_PAGES_WAITING)

    def _answer_durable(self, request: tuple[int, str, int, dict, str]) -> None:
        """A durable subscription's request: acknowledge, page from its position, or hold
        it (see the module docstring)."""
        session_id, channel, dest, doc, identity = request
        now_ns = time.monotonic_ns()
        name = doc["durable"]
        out: dict[str, Any] = {"id": doc["id"]}
        if doc.get("delete"):
            deleted = self.book.delete(identity, name, now_ns)
            for parked in self._parked.values():  # its held requests are answered no more
                for key in [k for k in parked if k[1:] == (identity, name)]:
                    del parked[key]
            self.counters["durables_deleted"] += deleted
            out.update(accepted=True, next_seq=0, done=True, deleted=deleted)
            self._send(channel, dest, session_id, out)
            return
        pattern = doc["pattern"]
        kept = self.store.log_of(pattern)
        assert kept is not None  # checked by submit; the patterns do not change
        try:
            entry, made = self.book.open(identity, name, pattern, doc.get("namespace", 0),
                                         self.store.end(kept), now_ns,
                                         make="from_seq" not in doc)
        except DurableError as exc:
            self.counters["durables_refused"] += 1
            out.update(accepted=False, why="durable", reason=str(exc))
            self._send(channel, dest, session_id, out)
            return
        self.counters["durables_made"] += made
        if "ack" in doc:  # the subscriber was handed everything before it
            self.book.move(entry, doc["ack"], now_ns)
        start = doc.get("from_seq", entry.position)
        first = self.store.first(kept)
        losses: list[dict] = []
        if start < first:  # retention or max_disk_bytes deleted what it had not read
            ranges = self.store.deleted_ranges(kept, start, first - 1)
            if len(ranges) > PAGE_DELETED_RANGES:
                rest = ranges[PAGE_DELETED_RANGES - 1:]
                why = DISK_LIMIT if any(r[2] == DISK_LIMIT for r in rest) else RETENTION
                ranges[PAGE_DELETED_RANGES - 1:] = [(rest[0][0], rest[-1][1], why)]
            losses.extend({"at": a, "reason": why, "messages": b - a + 1, "topic": kept,
                           "first_seq": a, "last_seq": b} for a, b, why in ranges)
            out["lost"] = [start, first - 1]  # (what clients before "losses" read)
            self.counters["durables_lost_records"] += first - start
            self.book.move(entry, first, now_ns)
            start = first
        markers: list[tuple[int, dict]] = []
        buf = self._buf(channel)
        page = self._page(kept, pattern, start, None, out, doc["id"], markers, buf=buf)
        if page is None:
            self._send(channel, dest, session_id, out)
            return
        next_seq, done = page
        count = buf.count
        named = [loss for loss in (_marker_loss(seq, mark, pattern, kept)
                                   for seq, mark in markers) if loss is not None]
        if not count and entry.position >= start:  # only other topics' records: passed,
            # up to the first loss named (the position passes it once the client has it)
            self.book.move(entry, named[0]["at"] if named else next_seq, now_ns)
        losses.extend(named)
        if losses:
            out["losses"] = losses
            self.counters["durables_loss_events"] += len(losses)
            self.counters["durables_lost_messages"] += sum(x["messages"] for x in losses)
        wait_ns = doc.get("wait_ms", 0) * 1_000_000
        if not count and done and wait_ns and not losses and (
                channel != RELAY_CHANNEL or self._relayed_parked() < FORWARDED_PARKED):
            parked = self._parked.setdefault(kept, {})
            parked.pop((session_id, identity, name), None)  # a newer request replaces it
            parked[(session_id, identity, name)] = (request, now_ns + wait_ns)
            self.counters["durables_parked"] += 1
            return
        out.update(accepted=True, next_seq=next_seq, done=done, position=entry.position)
        self.counters["replay_pages"] += 1
        self.counters["durables_delivered"] += count
        self._send(channel, dest, session_id, out, True)

    def _relayed_parked(self) -> int:
        """Forwarded durable requests held now (their session key is a tuple)."""
        return sum(isinstance(key[0], tuple) for parked in self._parked.values()
                   for key in parked)

    def _expire_parked(self, now_ns: int) -> int:
        """Answer the held requests whose wait ended with an empty page."""
        woken = 0
        for kept in list(self._parked):
            parked = self._parked[kept]
            for key, (request, deadline) in list(parked.items()):
                if now_ns >= deadline:
                    del parked[key]
                    session_id, channel, dest, doc, identity = request
                    entry = self.book.entries.get((identity, doc["durable"]))
                    position = entry.position if entry is not None else 0
                    self._send(channel, dest, session_id, {
                        "id": doc["id"], "accepted": True,
                        "next_seq": doc.get("from_seq", position), "done": True,
                        "position": position})
                    woken += 1
            if not parked:
                del self._parked[kept]
        return woken

    def _send(self, channel: str, dest: int, session_id: int, doc: dict,
              with_page: bool = False) -> None:
        """The answer: with ``with_page``, the frames of ``_page_buf`` first (the document
        names the page: ``page``, ``frames``, ``count``), then the document, all through
        the data path's outbox in that order. A frame the outbox refuses is counted; the
        client sees the page incomplete and asks again from what it has."""
        from datapath.protocol import admin_layout as al
        from datapath.protocol.codec import encode_admin
        from datapath.protocol.frame_layout import FrameType

        if channel == RELAY_CHANNEL:  # to the neighbour that forwarded it, by its control agent
            frames: list[bytes] = []
            if with_page:
                buf = self._relay_buf
                doc.update(page=buf.page_id, frames=buf.frames, count=buf.count)
                now = time.time_ns()
                frames = [bytes(buf.stamp(i, self.config.node_id, 0, now))
                          for i in range(buf.frames)]
            else:
                doc.setdefault("count", 0)
            self.relay_out.append((dest[0], dest[1], doc, frames))
            self.counters["relayed_answers"] += 1
            if self.relay_wakeup is not None:
                self.relay_wakeup.set()
            return
        if with_page:
            buf = self._page_buf
            doc.update(page=buf.page_id, frames=buf.frames, count=buf.count)
            now = time.time_ns()
            for i in range(buf.frames):
                frame = buf.stamp(i, self.config.node_id, session_id, now)
                if not self.dp.offer_admin(channel, dest, frame):
                    self.counters["replay_frames_dropped"] += 1
                else:
                    self.counters["replay_frames"] += 1
        else:
            doc.setdefault("count", 0)
        text = json.dumps(doc, separators=(",", ":"))
        frame = encode_admin(FrameType.CONTROL, [al.Control(al.ControlKind.REPLAY_RESULT,
                                                            text)],
                             source_session=self.config.node_id, dest_session=session_id,
                             send_ts_ns=time.time_ns())
        if not self.dp.offer_admin(channel, dest, frame):
            self.counters["replay_answers_dropped"] += 1  # the client asks again

    def _status(self) -> dict[str, Any]:
        counters = {f"cache_{k}": int(v) for k, v in self.counters.items()}
        counters["cache_dropped_queue_full"] = self.dropped_queue_full
        counters.update({f"cache_{k}": int(v) for k, v in self.naks.counters.items()})
        counters["cache_lost"] = self.lost_guaranteed
        counters["cache_store_failing"] = int(self.failing is not None)
        counters["cache_awaiting_persist"] = len(self._unpersisted)
        disk = self.store.disk_status()
        counters["cache_disk_bytes"] = disk["bytes"]
        counters["cache_disk_limit_records_deleted"] = disk["records_deleted"]
        return {"dir": str(self.settings.dir), "fsync": self.settings.fsync,
                "disk": disk,
                "acknowledge": self.settings.acknowledge,
                "storage": "ok" if self.failing is None else f"failing: {self.failing}",
                "session": "subscribed" if self.ready.is_set() else "connecting",
                "logs": self.store.status(), "durables": self.book.status(),
                "counters": counters}
