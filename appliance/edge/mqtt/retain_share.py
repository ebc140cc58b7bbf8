"""Retained messages shared by the edges of a fabric (``mqtt.retained_namespace``,
docs/mqtt.md "Retained messages across edges").

Without it, each edge keeps the retained messages of its own MQTT publishers only. With it,
every edge that names the same namespace sends a copy of each retained PUBLISH (a clear
too) into that namespace, and keeps what the other edges send there: a subscriber at any edge
gets the retained messages set at every edge that was up when they were set.

- **The session.** One native client session of the edge, logged in as
  ``mqtt.retained_identity`` (P&M entitles it to publish and subscribe ``#`` in the
  namespace), subscribes ``#`` in the namespace and publishes the copies (guaranteed: the
  copies are state, not a stream to sample; a duplicate is harmless), in order, from a
  thread of its own (``COPY_QUEUE`` bounded: beyond it a copy is dropped and counted).
  Logged in in the background, again after a loss (P&M's document may reach an edge with a
  remote P&M after its start).
- **A copy** is the message as the edge published it into the fabric: its topic, payload and
  ``mqtt.`` headers (meta.py), plus ``STAMP_HEADER``: when and where the retained message was
  set (the publishing edge's clock, ns). A native client entitled to the namespace may set a
  retained message there directly, publishing guaranteed (its publish time is its stamp; an
  empty payload clears).
- **Which wins.** Each edge keeps per topic the stamp of what it holds (``RetainedStore``):
  a copy replaces it only when its (time, node id) is later, so edges that set one topic at
  the same moment agree on one message once the copies have crossed (last writer wins;
  ties go to the higher node id). A clear leaves a stamp behind (at most ``max_retained``
  of them, the oldest forgotten first), so an older set arriving later does not bring the
  message back.
- **Catch-up.** Each time the session logs in (at start, after a restart, after a loss) it
  publishes a request on ``SYNC_TOPIC`` in the namespace; every other edge that hears it
  sends again all it holds: each retained message and each clear it remembers, with its
  stamp (``"ns:node"``: when and where it was set). So an edge that was down, or not yet
  logged in, gets what was set meanwhile; the stamps decide as for any copy. An edge answers
  one request at a time: requests that come while its answer is on its way are covered by
  it (the requester is subscribed before it asks, so what is set later reaches it as a
  copy) and counted (``retained_share_sync_coalesced``).
- **Not shared:** retained messages over a native frame's limits.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from appliance.edge.mqtt.meta import (
    ORIGIN_HEADER,
    SENDER_HEADER,
    STAMP_HEADER,
    MetadataTooLarge,
    from_headers,
    to_headers,
)
from appliance.edge.mqtt.namespace_session import NamespaceSession

if TYPE_CHECKING:
    from appliance.edge.mqtt.server import MqttServer

log = logging.getLogger("topicwire.edge.mqtt.retain_share")

EDGE_LOCAL_HEADERS = (ORIGIN_HEADER, SENDER_HEADER)
"""Headers meaningful to the publishing edge only: not in a copy."""
COPY_QUEUE = 10_000
"""Copies waiting for the session's thread, at most."""
SYNC_TOPIC = "$tw/retained/sync"
"""A (re)logged-in edge's request for every other edge's retained messages and clears (a
``$`` topic: no MQTT subscriber's ``#`` matches it)."""


def parse_stamp(value: Any, default_ns: int, origin: int) -> tuple[int, int] | None:
    """``STAMP_HEADER`` as (ns, node): ``"ns"`` (a copy: set at its sender, ``origin``) or
    ``"ns:node"`` (a catch-up answer: set at ``node``); absent: ``default_ns`` at
    ``origin``; None when it does not read."""
    if value is None:
        return default_ns, origin
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    ns, sep, node = str(value).partition(":")
    try:
        return int(ns), int(node) if sep else origin
    except ValueError:
        return None


class RetainedShare(NamespaceSession):
    """See the module docstring."""

    WHAT = "retained share"
    PREFIX = "retained_share"

    def __init__(self, server: MqttServer, namespace: int, identity: str) -> None:
        super().__init__(server, namespace, identity)
        self._copies: queue.Queue = queue.Queue(COPY_QUEUE)
        self._answering = False
        """(the event loop sets it, the thread clears it) An answer to a catch-up request
        is on its way."""

    def start(self) -> RetainedShare:
        self._start_thread("mqtt-retained-share")
        return self

    def close(self) -> None:
        self._stop.set()
        try:
            self._copies.put_nowait(None)
        except queue.Full:
            pass  # (the thread sees the stop within its 0.5 s wait)
        self._join_and_log_out()

    # --- out: copies of this edge's retained publishes ------------------------------------
    def copy(self, topic: str, payload: bytes, headers: dict, stamp_ns: int) -> None:
        """Send a copy of a retained message set here (the event loop; never waits)."""
        headers = {k: v for k, v in headers.items() if k not in EDGE_LOCAL_HEADERS}
        headers[STAMP_HEADER] = str(stamp_ns)
        try:
            self._copies.put_nowait((topic, payload, headers))
        except queue.Full:
            self.server.count("retained_share_dropped_queue_full")

    def _run(self) -> None:
        while not self._stop.is_set():
            native = self.logged_in()
            if native is None:
                continue
            try:
                item = self._copies.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is None:
                return
            if isinstance(item, list):  # the answer to a catch-up request
                self._send_all(native, item)
                continue
            self._send(native, *item, flush=True)

    def _send(self, native: Any, topic: str, payload: bytes, headers: dict,
              flush: bool) -> bool:
        from appliance.client.errors import ClientError

        try:
            native.publish(topic, payload, qos="guaranteed", namespace=self.namespace,
                           headers=headers, flush=flush)
        except ClientError as exc:
            self.server.count("retained_share_send_failed")
            log.info("mqtt: retained share: a copy of %r not sent: %s", topic, exc)
            return False
        self.server.count("retained_share_sent")
        return True

    def _send_all(self, native: Any, held: list) -> None:
        """Send every (topic, payload, qos, meta, stamp) of ``held`` (the catch-up answer)."""
        try:
            now = time.monotonic()
            for topic, payload, qos, meta, (stamp_ns, node) in held:
                if meta is not None and meta.expired(now):
                    continue
                try:
                    headers = dict(to_headers(meta, qos))
                except MetadataTooLarge:  # (it came in a frame: it fits one going out)
                    continue
                for key in EDGE_LOCAL_HEADERS:
                    headers.pop(key, None)
                headers[STAMP_HEADER] = f"{stamp_ns}:{node}"
                if not self._send(native, topic, payload, headers, flush=False):
                    return
                self.server.count("retained_share_sync_sent")
            native.flush()
        finally:
            self._answering = False

    def _after_login(self, native: Any) -> None:
        """The catch-up request, once logged in and subscribed."""
        native.publish(SYNC_TOPIC, b"", qos="guaranteed", namespace=self.namespace,
                       flush=True)
        self.server.count("retained_share_sync_requests")

    def status(self) -> dict[str, Any]:
        return {**self.session_status(),
                "copies_waiting": self._copies.qsize()}

    # --- in: the other edges' copies ------------------------------------------------------
    def _on_native(self, msg: Any) -> None:
        """A message of the namespace (the native client's thread)."""
        native = self.native
        if native is not None and msg.origin == self.server.node_id and (
                msg.stream & ~RELIABLE_STREAM_BIT) == native.session:
            return  # our own copy
        if msg.topic == SYNC_TOPIC:
            if msg.origin != self.server.node_id:
                self.server.loop.call_soon_threadsafe(self._answer_sync)
            return
        meta, qos = from_headers(msg.headers, self.server.count)
        if meta is not None and meta.origin:  # (another edge's store record: not ours)
            meta = replace(meta, origin=0)
        stamp = parse_stamp(msg.headers.get(STAMP_HEADER), msg.publish_ts_ns, msg.origin)
        if stamp is None:
            self.server.count("retained_share_bad_stamp")
            return
        self.server.loop.call_soon_threadsafe(
            self._apply, msg.topic, bytes(msg.payload), 1 if qos is None else min(qos, 1),
            meta, stamp)

    def _answer_sync(self) -> None:
        """(the event loop) Another edge asked: everything held goes to the thread, once."""
        self.server.count("retained_share_sync_asked")
        if self._answering:
            self.server.count("retained_share_sync_coalesced")
            return
        store = self.server.retained
        held = [(topic, m.payload, m.qos, m.meta, store.stamps[topic])
                for topic, m in store.messages.items() if topic in store.stamps]
        held += [(topic, b"", 0, None, stamp) for topic, stamp in store.cleared.items()]
        self._answering = True
        try:
            self._copies.put_nowait(held)
        except queue.Full:
            self._answering = False
            self.server.count("retained_share_dropped_queue_full")

    def _apply(self, topic: str, payload: bytes, qos: int, meta: Any,
               stamp: tuple[int, int]) -> None:
        """(the event loop) Keep a copy unless what is held was set later."""
        if meta is not None and meta.expired(time.monotonic()):
            self.server.count("retained_share_expired")
            return
        result = self.server.retained.set_shared(topic, payload, qos, meta, stamp)
        self.server.count({None: "retained_share_older", True: "retained_share_taken",
                           False: "retained_refused_full"}[result])
