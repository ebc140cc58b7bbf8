"""``subscribe(pattern, durable=NAME)``: a subscription whose place the appliance keeps.

The messages come from the appliance's cache (``[cache]``; its pattern must lie within one
of ``cache.patterns``), not from the live stream: a thread of the subscription asks for one
page after another with REPLAY requests naming the durable subscription. Each request says
where to read (``from_seq``: the cache sequence after the last message received) and how
far the application has got (``ack``: the cache sequence after the last message handed to
it: returned by the callback, or taken from the queue by ``get``/iteration); the appliance
keeps the acknowledged position in its durable book, so a subscriber that disconnects, or
whose process ends, starts again from there, to the message, on the next ``subscribe`` with
the same name. A request that finds nothing new is held by the appliance up to
``DURABLE_WAIT_MS`` and answered as soon as the log takes a record (a long poll), so the
subscription follows the live messages with the delay of one append (and its fsync).

Flow control is the pull itself: no page is asked for while ``DURABLE_QUEUE_MESSAGES`` wait
in the queue, so a slow subscriber never loses a message; what the cache's retention or
``max_disk_bytes`` deleted before the subscriber read it, and what the cache did not keep
(its loss markers), arrive as ``Loss`` events in their place (``losses`` in the answer,
each at its cache sequence), handed over once the application has taken every message
before them. Guarantee: each message kept by the cache is handed over in the
order it was kept, once per subscriber process; after a crash of the subscriber's process
(or the appliance's), the messages after the last acknowledgement that reached the disk are
handed over again (at least once).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from appliance.client.errors import ClientError, EntitlementError
from appliance.client.messages import Loss
from appliance.client.replay import Page, request_page
from datapath.errors import TopicwireError
from datapath.protocol import admin_layout as al

if TYPE_CHECKING:
    from appliance.client.api import Client

log = logging.getLogger("topicwire.client")
_IDS = itertools.count(1)
DURABLE_WAIT_MS = 1_000
"""How long the appliance holds a request that finds nothing new."""
DURABLE_QUEUE_MESSAGES = 20_000
"""Messages waiting in a durable subscription's queue before it stops asking for more."""
BUSY_RETRY_S = 0.05
"""A request refused because the cache is busy is asked again after this."""
RETRY_S = 0.2
"""... and one that got no answer (the appliance restarts, the client reconnects)."""
CLOSE_ACK_TIMEOUT_S = 1.0
"""``close`` waits this long for the appliance to take the final acknowledgement."""


class DurableFetcher:
    """The thread that pages a durable subscription in (``DurableSubscription._fetcher``)."""

    def __init__(self, sub: Any, name: str) -> None:
        self.sub = sub
        self.name = name
        self.next_seq: int | None = None
        """Where the next page begins (None: at the appliance's stored position)."""
        self.handed = 0
        """The cache sequence after the last message handed to the application."""
        self.callback_errors = 0
        """Messages whose callback raised (logged; the subscription goes on)."""
        self.error: BaseException | None = None
        """Why the subscription ended, when the appliance refused it."""
        self.stop = threading.Event()
        self._waiting_box: list | None = None
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"durable-{name}")

    def _doc(self, rid: int, wait_ms: int) -> dict:
        doc: dict[str, Any] = {"id": rid, "pattern": self.sub.pattern,
                               "namespace": self.sub.namespace, "durable": self.name,
                               "wait_ms": wait_ms}
        if self.next_seq is not None:
            doc["from_seq"] = self.next_seq
        if self.handed:
            doc["ack"] = self.handed
        return doc

    def request(self, wait_ms: int, timeout_s: float) -> Page:
        """One page (``request_page``: its frames, then its document)."""
        rid = next(_IDS) % 2**32 or next(_IDS)
        doc = self._doc(rid, wait_ms)
        start = {} if self.next_seq is None else {"from_seq": self.next_seq}
        waiting: list = [None]
        self._waiting_box = waiting
        return request_page(self.sub.client, doc, start, self.sub.pattern,
                            timeout_s=timeout_s, waiting=waiting)

    @property
    def waiting(self) -> tuple | None:
        """The key of the request waiting for its answer (``close`` wakes it)."""
        box = self._waiting_box
        return box[0] if box is not None else None

    def first(self) -> None:
        """The first page, on the subscribing thread: a refusal raises there."""
        page = self.request(0, self.sub.client.timeout_s)
        self._check(page.doc)
        self._take(page, can_wait=False)

    def _check(self, result: dict) -> None:
        if result.get("accepted"):
            return
        text = f"durable subscription {self.name!r} to {self.sub.pattern!r} refused: " \
               f"{result.get('reason')}"
        if result.get("why") == "entitlement":
            raise EntitlementError(text)
        raise ClientError(text)

    def _take(self, page: Page, can_wait: bool = True) -> None:
        """Hand a page's messages over, and its losses in their places: a loss once every
        message before it was handed over (a queue's consumer took them; ``can_wait``
        false, on the subscribing thread: the page is taken up to the loss and the rest is
        asked for again by the subscription's thread)."""
        result = page.doc
        sub = self.sub
        node = sub.client.node_id
        losses = result.get("losses")
        if losses is None and result.get("lost"):  # an appliance before "losses"
            first, last = result["lost"]
            losses = [{"at": first, "reason": "RETENTION", "messages": last - first + 1,
                       "first_seq": first, "last_seq": last}]
        messages = page.messages
        if "position" in result and not self.handed:
            self.handed = result["position"]
        if page.complete:
            end = result["next_seq"]
        elif messages:  # a frame missing: asked again after the last message received
            end = messages[-1].cache_seq + 1
        else:
            end = None
        i = 0
        for doc in losses or ():
            at = int(doc["at"])
            deleted = doc.get("reason") in ("RETENTION", "CACHE_DISK_LIMIT")
            if not deleted and (end is None or at >= end):
                break  # after a missing frame: read again
            while i < len(messages) and messages[i].cache_seq < at:
                self._hand(messages[i])
                i += 1
            if not self._drained(can_wait):
                self.next_seq = at  # read again from the loss on
                return
            loss = Loss(int(doc.get("origin") or node), int(doc.get("stream", 0)),
                        int(doc.get("first_seq", 0)), int(doc.get("last_seq", 0)),
                        int(doc.get("messages", 0)), str(doc.get("reason", "")), node,
                        time.time_ns(), str(doc.get("topic", "")))
            try:
                sub._loss(loss)
            except Exception:  # an application's on_loss must not end the subscription
                self.callback_errors += 1
                log.exception("client %s: durable subscription %r: on_loss raised",
                              sub.client.identity, self.name)
            # every message before it was handed over: acknowledged past it
            self.handed = max(self.handed, (int(doc["last_seq"]) if deleted else at) + 1)
        for msg in messages[i:]:
            self._hand(msg)
        if end is not None:
            self.next_seq = end

    def _hand(self, msg: Any) -> None:
        sub = self.sub
        try:
            sub._put(msg)
        except Exception:  # an application's callback must not end the subscription
            self.callback_errors += 1
            log.exception("client %s: durable subscription %r: the callback raised",
                          sub.client.identity, self.name)
        if sub.callback is not None:  # handed over once the callback returned
            self.handed = msg.cache_seq + 1

    def _drained(self, can_wait: bool) -> bool:
        """Whether the application has taken every message queued (waits for it when
        ``can_wait``, until the subscription stops)."""
        sub = self.sub
        if sub.callback is not None:
            return True
        with sub._cond:
            while sub._queue and can_wait and not self.stop.is_set():
                sub._cond.wait(0.1)
            return not sub._queue

    def _run(self) -> None:
        sub = self.sub
        client = sub.client
        while not self.stop.is_set():
            if not sub._wait_for_room(self.stop):
                break
            try:
                page = self.request(DURABLE_WAIT_MS,
                                    DURABLE_WAIT_MS / 1000 + client.timeout_s)
                result = page.doc
            except TopicwireError:
                if client.closed or self.stop.is_set():
                    break
                self.stop.wait(RETRY_S)  # no answer: the connection comes back, or not
                continue
            if not result.get("accepted") and result.get("why") in ("busy", "remote"):
                # busy: asked again soon; remote: the neighbour's cache this appliance
                # forwards to is down or slow, asked again until it answers
                self.stop.wait(BUSY_RETRY_S if result.get("why") == "busy" else RETRY_S)
                continue
            try:
                self._check(result)
                self._take(page)
            except TopicwireError as exc:
                self.error = exc
                log.error("client %s: %s", client.identity, exc)
                break
        sub._close()

    def close(self) -> None:
        """Stop paging in, tell the appliance how far the application got."""
        self.stop.set()
        client = self.sub.client
        with client._lock:  # a held request stops waiting for its answer
            waiter = client._waiters.get(self.waiting) if self.waiting else None
        if waiter is not None:
            waiter.event.set()
        if self.thread is not threading.current_thread():
            self.thread.join(DURABLE_WAIT_MS / 1000 + self.sub.client.timeout_s + 1)
        if self.handed and not client.closed:
            try:
                self.request(0, CLOSE_ACK_TIMEOUT_S)
            except TopicwireError:
                pass  # the position stays where the last request left it


def open_durable(sub: Any, name: str) -> Any:
    """See ``Client.subscribe``'s ``durable``: ``sub`` (a ``Subscription`` of QoS guaranteed,
    whose queue never drops) is fed by a pager of the durable subscription ``name``."""
    if not isinstance(name, str) or not name:
        raise ClientError(f"durable: a non-empty name expected, not {name!r}")
    fetcher = DurableFetcher(sub, name)
    sub.durable = name
    sub._fetcher = fetcher
    fetcher.first()
    fetcher.thread.start()
    return sub


def delete_durable(client: Client, name: str) -> bool:
    """See ``Client.delete_durable``."""
    rid = next(_IDS) % 2**32 or next(_IDS)
    doc = {"id": rid, "pattern": "#", "durable": name, "delete": True}
    result = client._request(("replay", rid), lambda: client._control(
        al.ControlKind.REPLAY, doc), repeatable=True)
    if not result.get("accepted"):
        raise ClientError(f"delete of durable subscription {name!r} refused: "
                          f"{result.get('reason')}")
    return bool(result.get("deleted"))
