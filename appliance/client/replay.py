"""``Client.replay``: the messages an appliance's cache keeps, page by page.

Each page is one REPLAY request (``{"id", "pattern", "namespace", "from_seq" |
"from_time_ns"}``) answered by one REPLAY_RESULT (``messages``, ``next_seq``, ``done``); the
next page asks ``from_seq = next_seq``, so the appliance keeps no state between pages and a
lost request or answer costs a repeat (same id, same page), not the replay. The first page is
asked for when ``replay`` is called, so a refusal raises there; the rest as the generator is
consumed (one page in memory at a time).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from appliance.client.errors import ClientError, EntitlementError
from appliance.client.messages import Message
from datapath.protocol import admin_layout as al
from datapath.topics.algebra import split_pattern

if TYPE_CHECKING:
    from appliance.client.api import Client

_IDS = itertools.count(1)
JOIN_TIMEOUT_S = 2.0
"""How long the join of a replay and the live stream waits for the cache to keep messages
published just before the live subscription took effect."""
JOIN_POLL_S = 0.02
"""... asking the cache again this often."""


def _check(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ClientError(f"replay: {name} must be an integer in [0, 2^63), not {value!r}")
    return value


def replay(client: Client, pattern: str, from_time_ns: int | None,
           from_sequence: int | None, namespace: int, then_live: bool = False
           ) -> Iterator[Message]:
    """See ``Client.replay``."""
    if not isinstance(pattern, str):
        raise ClientError(f"replay: pattern must be a string, not {type(pattern).__name__}")
    split_pattern(pattern)
    from_time_ns = _check("from_time_ns", from_time_ns)
    from_sequence = _check("from_sequence", from_sequence)
    if from_time_ns is not None and from_sequence is not None:
        raise ClientError("replay: give from_time_ns or from_sequence, not both")
    if isinstance(namespace, bool) or not isinstance(namespace, int) or not (
            0 <= namespace < 2**32):
        raise ClientError(f"replay: namespace must be an integer in [0, 2^32), not "
                          f"{namespace!r}")
    client._check_usable()
    start: dict[str, int] = {}
    if from_time_ns is not None:
        start["from_time_ns"] = from_time_ns
    elif from_sequence is not None:
        start["from_seq"] = from_sequence
    if then_live:  # live first: what is published from now on is queued while we replay
        live = client.subscribe(pattern, namespace=namespace)
        try:
            first = _page(client, pattern, namespace, start)
        except BaseException:
            live.unsubscribe()
            raise
        return ReplayThenLive(client, pattern, namespace, first, live)
    first = _page(client, pattern, namespace, start)
    return _pages(client, pattern, namespace, first)


def _page(client: Client, pattern: str, namespace: int, start: dict[str, int]) -> dict:
    rid = next(_IDS) % 2**32 or next(_IDS)
    doc = {"id": rid, "pattern": pattern, "namespace": namespace, **start}
    result = client._request(("replay", rid), lambda: client._control(al.ControlKind.REPLAY,
                                                                       doc),
                             repeatable=True)
    if not result.get("accepted"):
        reason = result.get("reason")
        if result.get("why") == "entitlement":
            raise EntitlementError(f"replay of {pattern!r} refused: {reason}")
        raise ClientError(f"replay of {pattern!r} refused: {reason}")
    return result


def replayed_message(row: list, pattern: str, wall_ns: int) -> Message:
    """The ``Message`` of one REPLAY_RESULT row (``cache_seq`` set)."""
    (cache_seq, topic, ns, key, seq, ts, schema, qos, origin, stream, text) = row
    try:
        payload = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise ClientError(f"replay of {pattern!r}: the appliance sent a payload that is not "
                          "base64") from None
    return Message(topic, payload, key, seq, ts, ns, schema, qos, origin, stream, wall_ns,
                   cache_seq=cache_seq)


def _pages(client: Client, pattern: str, namespace: int, page: dict,
           last: list[int] | None = None) -> Iterator[Message]:
    """The messages of ``page`` and of the pages after it; ``last[0]``: the next page's
    ``from_seq`` once the pages are done."""
    while True:
        wall = time.time_ns()
        for row in page["messages"]:
            yield replayed_message(row, pattern, wall)
        if page["done"]:
            if last is not None:
                last[0] = page["next_seq"]
            return
        page = _page(client, pattern, namespace, {"from_seq": page["next_seq"]})


class ReplayThenLive:
    """``replay(..., then_live=True)``: the kept messages, then the live ones, each once.

    The live subscription is made before the first page is asked for, so every message
    published after it took effect is queued on it; the kept ones are replayed up to the end
    of the log. At the join each publisher's messages are told apart by (origin, stream,
    topic key) and the publisher's sequence number: a live message at or below the highest
    one replayed for its publisher and topic is a duplicate and skipped. A live message
    further ahead than the next one means the cache has not kept the messages between yet
    (they were published just before the subscription took effect): the cache is asked
    again from where the replay ended, until they are there or ``JOIN_TIMEOUT_S`` passed;
    what is still missing then is counted in ``join_gaps`` (and the messages go on).
    ``subscription`` is the live subscription (``unsubscribe()`` it to stop)."""

    def __init__(self, client: Client, pattern: str, namespace: int, first: dict,
                 live: Any) -> None:
        self.client = client
        self.pattern = pattern
        self.namespace = namespace
        self.subscription = live
        self.join_gaps = 0
        """Messages between the replay and the live stream that neither returned."""
        self.duplicates = 0
        """Live messages skipped because the replay returned them."""
        self._seen: dict[tuple[int, int, int], int] = {}
        self._next = [0]
        self._it = self._run(first)

    def __iter__(self) -> ReplayThenLive:
        return self

    def __next__(self) -> Message:
        return next(self._it)

    def _note(self, msg: Message) -> Message:
        key = (msg.origin, msg.stream, msg.topic_key)
        if msg.sequence > self._seen.get(key, 0):
            self._seen[key] = msg.sequence
        return msg

    def _run(self, first: dict) -> Iterator[Message]:
        for msg in _pages(self.client, self.pattern, self.namespace, first, self._next):
            yield self._note(msg)
        held: list[Message] = []
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while True:
            got = self.subscription.get(timeout=0)
            while got is not None:
                held.append(got)
                got = self.subscription.get(timeout=0)
            if not self._gaps(held) or time.monotonic() >= deadline:
                break
            time.sleep(JOIN_POLL_S)  # the cache's thread appends what it received meanwhile
            page = _page(self.client, self.pattern, self.namespace,
                         {"from_seq": self._next[0]})
            for msg in _pages(self.client, self.pattern, self.namespace, page, self._next):
                yield self._note(msg)
        self.join_gaps += self._gaps(held)
        for msg in held:
            if self._fresh(msg):
                yield self._note(msg)
        for msg in self.subscription:
            if self._fresh(msg):
                yield self._note(msg)

    def _gaps(self, held: list[Message]) -> int:
        """Messages missing between what was replayed and the first live message of each
        publisher and topic the replay returned."""
        firsts: dict[tuple[int, int, int], int] = {}
        for msg in held:
            firsts.setdefault((msg.origin, msg.stream, msg.topic_key), msg.sequence)
        return sum(max(0, seq - self._seen[key] - 1) for key, seq in firsts.items()
                   if key in self._seen)

    def _fresh(self, msg: Message) -> bool:
        if msg.sequence <= self._seen.get((msg.origin, msg.stream, msg.topic_key), 0):
            self.duplicates += 1
            return False
        return True
