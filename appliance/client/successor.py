"""Successor delivery (seed 004) in the native client (``SuccessorSide``, one part of
``Client``; the appliance's side: appliance/control/successor.py; docs/appliance.md,
"Successor delivery").

A client logged in with ``connect(..., client_id=)`` announces itself as a successor
candidate (``announce_successor(vendor)``), asks for candidates (``successor_candidates``)
and names its successor (``set_successor``). When an ancestor's session ends improperly, the
appliance makes the ancestor's subscriptions on its successor's session and says so (a
SUCCESSOR ``route`` notice): the successor's client then hands every message matching them
to ``successor_messages`` (a ``SuccessorInbox``: ``get()``, iterate, or the callback given to
``announce_successor``) as ``SuccessorMessage(ancestor, message)``, until the ``unroute``
notice (the ancestor logged in again).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from appliance.client.errors import ClientError, EntitlementError
from appliance.client.messages import Message
from appliance.control.documents import SUCCESSOR_NAME
from datapath.protocol import admin_layout as al
from datapath.topics.algebra import matches

MAX_NAME_CHARS = 64
SUCCESSOR_INBOX_MESSAGES = 65_536
"""Messages ``successor_messages`` holds at most before it drops its oldest (counted)."""


class SuccessorRefusedError(EntitlementError):
    """The appliance refused a successor request; ``why`` says which rule (``vendor_mismatch``,
    ``other_identity``, ``unknown_client``, ``self``, ``bad_vendor``, ``no_client_id``,
    ``full``)."""

    def __init__(self, text: str, why: str) -> None:
        super().__init__(text)
        self.why = why


def check_name(what: str, value: object) -> str:
    try:
        SUCCESSOR_NAME.check(value, what)
    except Exception:
        raise ClientError(f"{what} must be 1..{MAX_NAME_CHARS} printable characters, not "
                          f"{value!r}") from None
    return str(value)


@dataclass(frozen=True, slots=True)
class SuccessorMessage:
    """A message this client got as the successor of ``ancestor`` (a client id)."""

    ancestor: str
    message: Message


class SuccessorInbox:
    """What a successor receives for its ancestors (``Client.successor_messages``): ``get``
    or iterate, or the callback given to ``announce_successor``. At most ``max_held``
    waiting; beyond, the oldest is dropped and counted in ``dropped``."""

    def __init__(self, callback: Callable[[SuccessorMessage], None] | None,
                 max_held: int = SUCCESSOR_INBOX_MESSAGES) -> None:
        self.callback = callback
        self.max_held = max_held
        self.delivered = 0
        self.dropped = 0
        self._queue: deque[SuccessorMessage] = deque()
        self._cond = threading.Condition()

    def _put(self, item: SuccessorMessage) -> None:
        self.delivered += 1
        if self.callback is not None:
            self.callback(item)
            return
        with self._cond:
            if len(self._queue) >= self.max_held:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(item)
            self._cond.notify_all()

    def get(self, timeout: float | None = None) -> SuccessorMessage | None:
        """The next one; None after ``timeout`` seconds without one."""
        with self._cond:
            self._cond.wait_for(lambda: self._queue, timeout)
            return self._queue.popleft() if self._queue else None

    def __iter__(self) -> Iterator[SuccessorMessage]:
        while True:
            item = self.get()
            if item is not None:
                yield item


class SuccessorSide:
    """The successor calls of ``Client``."""

    def _init_successor(self: Any, client_id: str | None) -> None:
        self.client_id = None if client_id is None else check_name("client_id", client_id)
        """This client's id (``connect(..., client_id=)``), sent with every login."""
        self._login_client_id = {} if client_id is None else {"client_id": client_id}
        self._successor_req = itertools.count(1)
        self._successor_routes: dict[str, list[tuple[int, str]]] = {}
        """ancestor client id -> its (namespace, pattern) routed to this client now."""
        self._successor_lock = threading.Lock()
        self.successor_messages: Any = None
        """The ``SuccessorInbox`` that receives the messages this client gets as a successor
        (made by ``announce_successor``)."""
        self.successor_routes_taken = 0
        """Times an ancestor's messages were routed to this client."""

    def _successor_request(self: Any, op: str, **doc: Any) -> dict:
        if self.client_id is None:
            raise ClientError("successor calls need a client id: connect(..., client_id=...)")
        self._check_usable()
        req = next(self._successor_req)
        result = self._request(("successor", req), lambda: self._control(
            al.ControlKind.SUCCESSOR, {"op": op, "req": req, **doc}))
        if not result.get("ok"):
            raise SuccessorRefusedError(str(result.get("error", "refused")),
                                        str(result.get("why", "refused")))
        return result

    def announce_successor(self: Any, vendor: str,
                           callback: Callable[[Message], None] | None = None) -> Any:
        """Offer this client as a successor for clients of vendor id ``vendor`` and the same
        identity (the seed's notifyAncestor); the messages it gets as a successor go to the
        returned ``SuccessorInbox`` (also ``successor_messages``) as ``SuccessorMessage``s,
        or to ``callback``."""
        if callback is not None and not callable(callback):
            raise ClientError(f"callback must be a callable taking a SuccessorMessage, not "
                              f"{type(callback).__name__}")
        self._successor_request("announce", vendor=check_name("vendor", vendor))
        if self.successor_messages is None:
            self.successor_messages = SuccessorInbox(callback)
        elif callback is not None:
            self.successor_messages.callback = callback
        return self.successor_messages

    def withdraw_successor(self: Any) -> None:
        """No longer offer this client as a successor (routes already made stay)."""
        self._successor_request("withdraw")

    def successor_candidates(self: Any, vendor: str) -> list[str]:
        """The client ids of the logged-in clients of this appliance that announced
        ``vendor`` and log in as this client's identity (the seed's subscribeSuccessors and
        successorData), sorted, at most 64."""
        result = self._successor_request("candidates", vendor=check_name("vendor", vendor))
        return list(result.get("candidates", []))

    def set_successor(self: Any, client_id: str, vendor: str) -> None:
        """Name this client's successor (the seed's setSuccessor): a candidate of the same
        vendor id and identity. ``SuccessorRefusedError`` otherwise (``why``)."""
        self._successor_request("set", successor=check_name("client_id", client_id),
                                vendor=check_name("vendor", vendor))

    def clear_successor(self: Any) -> None:
        """This client has no successor any more."""
        self._successor_request("clear")

    def successor_of(self: Any) -> list[str]:
        """The ancestors whose messages come to this client now."""
        with self._successor_lock:
            return sorted(self._successor_routes)

    def _on_successor(self: Any, doc: dict) -> None:
        """A SUCCESSOR document from the appliance: an answer, or a route notice."""
        op = doc["op"]
        if op == "route" and "ancestor" in doc:
            with self._successor_lock:
                routes = dict(self._successor_routes)
                routes[doc["ancestor"]] = [(int(ns), str(p)) for ns, p in
                                           doc.get("patterns", [])]
                self._successor_routes = routes
            self.successor_routes_taken += 1
        elif op == "unroute" and "ancestor" in doc:
            with self._successor_lock:
                routes = dict(self._successor_routes)
                routes.pop(doc["ancestor"], None)
                self._successor_routes = routes
        else:
            self._answer(("successor", doc.get("req", 0)), doc)

    def _successor_dispatch(self: Any, msg: Message) -> None:
        """Hand ``msg`` to ``successor_messages`` once for each ancestor whose routed
        patterns match it, marked with that ancestor."""
        sink = self.successor_messages
        if sink is None:
            return
        for ancestor, patterns in self._successor_routes.items():
            if any(ns == msg.namespace and matches(p, msg.topic) for ns, p in patterns):
                sink._put(SuccessorMessage(ancestor, msg))
