"""``Client.replay``: the messages an appliance's cache keeps, page by page.

Each page is one REPLAY request (``{"id", "pattern", "namespace", "from_seq" |
"from_time_ns"}``) answered by the page's frames (``frames`` DATA frames of stream
``REPLAY_STREAM_ID``, the messages as native message records: datapath/protocol/
replay_layout.py), then one REPLAY_RESULT (``page``, ``frames``, ``count``, ``next_seq``,
``done``), all to this session. The client thread keeps the frames of the requests waiting
(``PageFrames``: at most ``MAX_PAGE_FRAMES`` each, of the newest page); the requesting
thread decodes them with the batch decoder once the answer came. A page with a frame
missing (a best-effort hop dropped it) gives the messages of the frames before the gap and
is asked again from the cache sequence after the last of them: nothing is skipped. The next
page asks ``from_seq = next_seq``, so the appliance keeps no state between pages and a lost
request or answer costs a repeat, not the replay. The first page is asked for when
``replay`` is called, so a refusal raises there; the rest as the generator is consumed (one
page in memory at a time).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.client.errors import ClientError, EntitlementError
from appliance.client.messages import NO_HEADERS, Headers, Message
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol import replay_layout as rl
from datapath.protocol.extensions import EXTENSION_FLAGS, ExtensionError
from datapath.protocol.extensions import split as split_extensions
from datapath.topics.algebra import split_pattern

if TYPE_CHECKING:
    from appliance.client.api import Client

_IDS = itertools.count(1)
JOIN_TIMEOUT_S = 2.0
"""How long the join of a replay and the live stream waits for the cache to keep messages
published just before the live subscription took effect."""
JOIN_POLL_S = 0.02
"""... asking the cache again this often."""
_HEAD = fl.FRAME_HEADER_STRUCT
_FIELDS = ("topic", "payload", "topic_key", "sequence", "publish_ts_ns", "namespace",
           "schema_id", "qos", "origin", "stream", "received_ns", "guaranteed", "cache_seq",
           "headers", "segments")
assert {f.name for f in fields(Message)} == set(_FIELDS)
_SETTERS = tuple(getattr(Message, name).__set__ for name in _FIELDS)
"""The slot setters of ``Message`` (``decode_page`` builds messages with them)."""


class PageFrames:
    """The page frames of one waiting request, as the client thread receives them: of the
    newest page only (a repeat's answer replaces an older one's), at most
    ``MAX_PAGE_FRAMES``."""

    def __init__(self) -> None:
        self.page = -1
        self.frames: dict[int, bytes] = {}


def take_frame(client: Client, frame: memoryview) -> None:
    """A page frame (the client thread): kept for the request it answers, else counted in
    ``replay_frames_unexpected`` (its request stopped waiting) or ``replay_frames_malformed``
    (its descriptor does not check)."""
    (_, _, _, flags, count, length, _, _, _, _) = _HEAD.unpack_from(frame)
    end = length - (fl.AUTH_TRAILER_BYTES if flags & fl.FrameFlags.AUTH_TRAILER else 0)
    n = count - 1
    at = end - rl.DESCRIPTOR_HEAD_BYTES - rl.DESCRIPTOR_ENTRY_BYTES * n
    if n < 0 or at - 40 < fl.FRAME_HEADER_BYTES:
        client.replay_frames_malformed += 1
        return
    rid, page, index, messages, _ = rl.DESCRIPTOR_HEAD.unpack_from(frame, at)
    if messages != n or index >= rl.MAX_PAGE_FRAMES:
        client.replay_frames_malformed += 1
        return
    with client._lock:
        kept = client._replay_pages.get(rid)
        if kept is None:
            client.replay_frames_unexpected += 1
            return
        if page != kept.page:
            kept.page, kept.frames = page, {}
        kept.frames[index] = bytes(frame)


@dataclass
class Page:
    """One answered page: its document, its messages (of the frames received before the
    first missing one), where the next page starts and whether the replay is done."""

    doc: dict
    messages: list[Message]
    complete: bool
    next: dict[str, int] = field(default_factory=dict)
    done: bool = False


def request_page(client: Client, doc: dict, start: dict[str, int], pattern: str, *,
                 repeatable: bool = False, timeout_s: float | None = None,
                 waiting: list | None = None) -> Page:
    """Send REPLAY ``doc`` (its ``id`` new) and wait for its page; ``start``: where it
    reads (asked again from there when no frame came). A refusal is returned as it came
    (``doc["accepted"]`` false, no messages). ``waiting``: set to the request's key while
    it waits (a durable subscription's ``close`` wakes it)."""
    rid = doc["id"]
    kept = PageFrames()
    key = ("replay", rid)
    with client._lock:
        client._replay_pages[rid] = kept
    if waiting is not None:
        waiting[0] = key
    try:
        result = client._request(key, lambda: client._control(al.ControlKind.REPLAY, doc),
                                 repeatable=repeatable, timeout_s=timeout_s)
    finally:
        if waiting is not None:
            waiting[0] = None
        with client._lock:
            client._replay_pages.pop(rid, None)
    if not result.get("accepted"):
        return Page(result, [], True, dict(start), True)
    frames = kept.frames if kept.page == result.get("page") else {}
    wanted = result.get("frames", 0)
    have = 0
    while have < wanted and have in frames:
        have += 1
    messages = decode_page([frames[i] for i in range(have)], pattern)
    complete = have == wanted and len(messages) == result["count"]
    if complete:
        return Page(result, messages, True, {"from_seq": result["next_seq"]}, result["done"])
    client.replay_pages_incomplete += 1
    nxt = {"from_seq": messages[-1].cache_seq + 1} if messages else dict(start)
    return Page(result, messages, False, nxt, False)


def decode_page(frames: list[bytes], pattern: str) -> list[Message]:
    """The messages of page frames, in order (the batch decoder validates each frame; the
    last message of each is its descriptor)."""
    from datapath.protocol.batch import decode_frames, new_message_batch

    if not frames:
        return []
    raw = b"".join(frames)
    lengths = np.array([len(f) for f in frames], np.int64)
    offsets = np.zeros(len(frames), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    total = sum(_HEAD.unpack_from(f)[4] for f in frames)
    out = new_message_batch(max(total, 1))
    status = np.zeros(len(frames), np.uint8)
    types = np.zeros(len(frames), np.uint8)
    result = decode_frames(raw, offsets, lengths, out, status, types)
    if result.frames != len(frames) or status.any() or result.messages != total:
        raise ClientError(f"replay of {pattern!r}: the appliance sent a page frame that does "
                          "not decode")
    rows = out[:total]
    last = np.zeros(total, bool)  # each frame's descriptor: the last message of its frame
    last[np.cumsum([_HEAD.unpack_from(f)[4] for f in frames]) - 1] = True
    entries = []
    for j in np.flatnonzero(last).tolist():
        at = int(rows["payload_offset"][j]) + rl.DESCRIPTOR_HEAD_BYTES
        n = int(rows["payload_len"][j]) - rl.DESCRIPTOR_HEAD_BYTES
        entries.append(np.frombuffer(raw, rl.DESCRIPTOR_ENTRY_DTYPE, n // 16, at))
    extra = np.concatenate(entries) if entries else np.zeros(0, rl.DESCRIPTOR_ENTRY_DTYPE)
    rows = rows[~last]
    if len(extra) != len(rows):
        raise ClientError(f"replay of {pattern!r}: a page frame's descriptor does not match "
                          "its messages")
    wall = time.time_ns()
    topics: dict[bytes, str] = {}
    messages: list[Message] = []
    append = messages.append
    cols = [rows[name].tolist() for name in (
        "topic_key", "sequence", "publish_ts_ns", "namespace_id", "schema_id", "qos",
        "flags", "payload_offset", "payload_len", "topic_len")]
    new = object.__new__
    (s_topic, s_payload, s_key, s_seq, s_ts, s_ns, s_schema, s_qos, s_origin, s_stream,
     s_wall, s_guaranteed, s_cache_seq, s_headers, s_segments) = _SETTERS
    for (key, seq, ts, ns, schema, qos, flags, po, plen, tlen, cache_seq, origin,
         stream) in zip(*cols, extra["cache_seq"].tolist(), extra["origin"].tolist(),
                        extra["stream"].tolist()):
        end = po + plen
        name = raw[end : end + tlen]
        topic = topics.get(name)
        if topic is None:
            try:
                topic = topics[name] = name.decode("utf-8")
            except UnicodeDecodeError:
                raise ClientError(f"replay of {pattern!r}: the appliance sent a topic that "
                                  "is not UTF-8") from None
        payload = raw[po:end]
        headers = NO_HEADERS
        if flags & EXTENSION_FLAGS:
            try:
                payload, block, _ = split_extensions(payload, flags)
            except ExtensionError:
                raise ClientError(f"replay of {pattern!r}: a replayed message's headers do "
                                  "not parse") from None
            payload = bytes(payload)
            headers = NO_HEADERS if block is None else Headers(block)
        # Message(topic, payload, key, seq, ts, ns, schema, qos, origin, stream, wall,
        # cache_seq=cache_seq, headers=headers), its fields set without the frozen
        # dataclass's __init__ (a third of the time per message; tests compare the two)
        msg = new(Message)
        s_topic(msg, topic)
        s_payload(msg, payload)
        s_key(msg, key)
        s_seq(msg, seq)
        s_ts(msg, ts)
        s_ns(msg, ns)
        s_schema(msg, schema)
        s_qos(msg, qos)
        s_origin(msg, origin)
        s_stream(msg, stream)
        s_wall(msg, wall)
        s_guaranteed(msg, False)
        s_cache_seq(msg, cache_seq)
        s_headers(msg, headers)
        s_segments(msg, 1)
        append(msg)
    return messages


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


def _page(client: Client, pattern: str, namespace: int, start: dict[str, int]) -> Page:
    rid = next(_IDS) % 2**32 or next(_IDS)
    doc = {"id": rid, "pattern": pattern, "namespace": namespace, **start}
    page = request_page(client, doc, start, pattern, repeatable=True)
    result = page.doc
    if not result.get("accepted"):
        reason = result.get("reason")
        if result.get("why") == "entitlement":
            raise EntitlementError(f"replay of {pattern!r} refused: {reason}")
        raise ClientError(f"replay of {pattern!r} refused: {reason}")
    return page


def _pages(client: Client, pattern: str, namespace: int, page: Page,
           last: list[int] | None = None) -> Iterator[Message]:
    """The messages of ``page`` and of the pages after it; ``last[0]``: the next page's
    ``from_seq`` once the pages are done."""
    while True:
        yield from page.messages
        if page.done:
            if last is not None:
                last[0] = page.next["from_seq"]
            return
        page = _page(client, pattern, namespace, page.next)


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

    def __init__(self, client: Client, pattern: str, namespace: int, first: Page,
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

    def _run(self, first: Page) -> Iterator[Message]:
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
