"""NAKs served from the appliance's cache: what a guaranteed sender's buffer no longer holds.

A guaranteed stream's sender keeps its last frames (``appliance.retransmit_buffer_messages``,
4 MiB); a NAK for older sequences used to be answered with LOSS. When the appliance has a
``[cache]``, its cache's session receives the same messages over a stream of its own (the
same (origin, publishing session), numbered apart), and keeps them on disk. So:

```
 routing (data path)    message m offered to sender S as s, to the cache's sender as c
 end of the cycle       S's map gets s -> c (runs of consecutive pairs, bounded)
 NAK for s, gone        S asks here (``SenderCacheMap.request``): s mapped -> a request
                        (origin, stream, [c...]) to the cache through the inbox (channel
                        CACHE_NAK_CHANNEL, read by the control agent, handed to the cache)
 cache (its thread)     reads those records from its logs -> command ``cache_nak_answer``
 data path              S resends them (``retransmit_stored``: RETRANSMISSION, its own
                        sequence numbers); what the cache does not hold: LOSS
```

What neither holds is announced lost at once (a sequence with no map entry), or when the cache
answers that it does not keep it. Bounds: ``CACHE_NAK_MESSAGES_PER_NAK`` per NAK,
``CACHE_NAK_MESSAGES_PER_S`` (a token bucket for the appliance), ``CACHE_NAK_REQUESTS``
requests waiting for the cache; what they refuse is neither resent nor announced lost
(counted ``nak_cache_refused``): the receiver's next NAK asks again, and its recovery bound
(2 s) ends the wait with a loss event of its own. A request the cache does not answer within
``CACHE_NAK_ANSWER_NS`` is forgotten (its sequences may be asked for again); sequences
resent from the cache are not asked for again within ``CACHE_NAK_LINGER_NS`` (the
receiver's retries sent before the retransmissions reached it).

Only messages with no flag but HEADERS are mapped (the cache keeps a large message whole,
not its segments, and does not keep the PARTIAL flag): the others are answered with LOSS as
before.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from appliance.config import (
    CACHE_NAK_ANSWER_NS,
    CACHE_NAK_LINGER_NS,
    CACHE_NAK_MAP_RUNS,
    CACHE_NAK_MESSAGES_PER_NAK,
    CACHE_NAK_MESSAGES_PER_S,
    CACHE_NAK_REQUESTS,
)
from appliance.dataplane.names import CACHE_NAK_CHANNEL
from datapath.protocol import message_layout as ml
from datapath.protocol.admin_layout import SeqRange
from datapath.protocol.frame_layout import align8

if TYPE_CHECKING:
    from datapath.reliability import ReliableSender

_MSG = ml.MESSAGE_HEADER_STRUCT
_MAPPED_FLAGS = int(ml.MessageFlags.HEADERS)
"""A message with other flags is not mapped (module docstring)."""
_ENVELOPE_FLAG_HEADERS = int(ml.MessageFlags.HEADERS)


class SenderCacheMap:
    """One sender's sequences -> the same messages' sequences on the stream to the cache's
    session: runs ``[s0, c0, n]`` (s0+i -> c0+i), oldest first, at most CACHE_NAK_MAP_RUNS.
    The sender's ``evicted_source``."""

    __slots__ = ("firsts", "origin", "pending", "runs", "sender", "service", "stream")

    def __init__(self, service: CacheNaks, sender: ReliableSender, origin: int,
                 stream: int) -> None:
        self.service = service
        self.sender = sender
        self.origin = origin
        self.stream = stream
        self.runs: deque[list[int]] = deque()
        self.firsts: deque[int] = deque()
        self.pending: dict[int, int] = {}
        """Sequences asked of the cache and not answered yet -> when the ask ends."""

    def add(self, s: int, c: int) -> None:
        runs = self.runs
        if runs:
            last = runs[-1]
            if last[0] + last[2] == s and last[1] + last[2] == c:
                last[2] += 1
                return
            if s < last[0] + last[2]:
                return  # (not in order: a sender made again) not mapped
        if len(runs) >= CACHE_NAK_MAP_RUNS:
            runs.popleft()
            self.firsts.popleft()
        runs.append([s, c, 1])
        self.firsts.append(s)

    def lookup(self, first: int, last: int) -> list[tuple[int, int, int | None]]:
        """[a, b] pieces of first..last in order, each with its mapped c of a (None: not
        mapped)."""
        out: list[tuple[int, int, int | None]] = []
        runs, firsts = self.runs, self.firsts
        i = max(bisect_right(firsts, first) - 1, 0)
        at = first
        while at <= last:
            if i >= len(runs):
                out.append((at, last, None))
                break
            s0, c0, n = runs[i]
            if s0 + n - 1 < at:
                i += 1
                continue
            if s0 > at:
                b = min(last, s0 - 1)
                out.append((at, b, None))
                at = b + 1
                continue
            b = min(last, s0 + n - 1)
            out.append((at, b, c0 + at - s0))
            at = b + 1
            i += 1
        return out

    def request(self, sender: ReliableSender, first: int, last: int,
                now_ns: int) -> list[SeqRange]:
        return self.service.request(self, first, last, now_ns)


class CacheNaks:
    """The guaranteed plane's side of NAKs served from the cache (module docstring)."""

    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self.identity: str | None = None
        """The cache's identity (None: this appliance has no cache; nothing is mapped)."""
        self.session: int | None = None
        self.counters: Counter[str] = Counter()
        self._offered_cache: dict[tuple, int] = {}
        """This cycle's messages offered to the cache's senders: identity -> their c."""
        self._offered: list[tuple[SenderCacheMap, int, tuple]] = []
        """This cycle's messages offered to other senders: (map, s, identity)."""
        self._requests: dict[int, tuple[SenderCacheMap, list[tuple[int, int]], int]] = {}
        """Request id -> (map, [(s, c)], when it is forgotten)."""
        self._ids = 0
        self._tokens = float(CACHE_NAK_MESSAGES_PER_S)
        self._tokens_ns = 0
        self._nak: tuple[int, int] = (0, -1)
        self._nak_room = 0
        """What the NAK being answered may still ask for: its ranges come one call each,
        with the same sender and time (``request``)."""

    def use(self, identity: str) -> None:
        self.identity = identity

    def is_cache(self, session_id: int) -> bool:
        if self.session == session_id:
            return True
        session = self.plane.dp.sessions.get(session_id)
        if session is not None and session.identity == self.identity:
            self.session = session_id
            return True
        return False

    def session_removed(self, session_id: int) -> None:
        if self.session == session_id:
            self.session = None

    # --- routing: who got which message -------------------------------------------------------
    def offered(self, key: tuple, held: Any, message: Any, off: int, seq: int) -> None:
        """Message at ``off`` of ``message`` took ``seq`` on the sender of ``key``."""
        topic_key, mseq, ts, _, _, _, flags, _, _, _ = _MSG.unpack_from(message, off)
        if flags & ~_MAPPED_FLAGS:
            return
        if key[0] == "n":
            origin, stream = self.plane.node_id, key[2]
        else:
            origin, stream = key[2], key[3]
        ident = (origin, stream, topic_key, mseq, ts)
        if key[0] == "c" and self.is_cache(key[1]):
            self._offered_cache[ident] = seq
            return
        cmap = held.cache_map
        if cmap is None:
            cmap = held.cache_map = SenderCacheMap(self, held.sender, origin, stream)
            held.sender.evicted_source = cmap
        self._offered.append((cmap, seq, ident))

    def end_cycle(self) -> None:
        """Pair this cycle's offers: a message the cache's sender took too is mapped."""
        if self._offered:
            cached = self._offered_cache
            for cmap, seq, ident in self._offered:
                c = cached.get(ident)
                if c is not None:
                    cmap.add(seq, c)
            self._offered.clear()
        self._offered_cache.clear()

    # --- NAKs ---------------------------------------------------------------------------------
    def _take_tokens(self, wanted: int, now_ns: int) -> int:
        if now_ns > self._tokens_ns:
            if self._tokens_ns:
                self._tokens = min(float(CACHE_NAK_MESSAGES_PER_S), self._tokens + (
                    now_ns - self._tokens_ns) * CACHE_NAK_MESSAGES_PER_S / 1e9)
            self._tokens_ns = now_ns
        got = min(wanted, int(self._tokens))
        self._tokens -= got
        return got

    def request(self, cmap: SenderCacheMap, first: int, last: int,
                now_ns: int) -> list[SeqRange]:
        """(``SenderCacheMap.request``) What is not mapped is lost; what is mapped is asked of
        the cache, within the bounds; the rest waits for the next NAK."""
        c = self.counters
        lost: list[SeqRange] = []
        asked: list[tuple[int, int]] = []
        refused = 0
        pending = cmap.pending
        if self._nak != (id(cmap), now_ns):  # a new NAK (the ranges of one share its room)
            self._nak = (id(cmap), now_ns)
            self._nak_room = CACHE_NAK_MESSAGES_PER_NAK
        room = self._nak_room
        for a, b, c0 in cmap.lookup(first, last):
            if c0 is None:
                lost.append(SeqRange(a, b))
                c["nak_cache_misses"] += b - a + 1
                continue
            for s in range(a, b + 1):
                until = pending.get(s)
                if until is not None and until > now_ns:
                    continue  # asked already: its answer is coming
                if room <= 0:
                    refused += b - s + 1
                    break
                asked.append((s, c0 + s - a))
                room -= 1
        self._nak_room = room
        if asked and (self.identity is None or len(self._requests) >= CACHE_NAK_REQUESTS):
            refused += len(asked)
            asked = []
        if asked:
            got = self._take_tokens(len(asked), now_ns)
            refused += len(asked) - got
            del asked[got:]
        if refused:
            c["nak_cache_refused"] += refused
        if asked:
            self._ask(cmap, asked, now_ns)
        return lost

    def _ask(self, cmap: SenderCacheMap, asked: list[tuple[int, int]], now_ns: int) -> None:
        self._ids = self._ids % 0x7FFF_FFFF + 1
        until = now_ns + CACHE_NAK_ANSWER_NS
        self._requests[self._ids] = (cmap, asked, until)
        for s, _ in asked:
            cmap.pending[s] = until
        doc = {"id": self._ids, "origin": cmap.origin, "stream": cmap.stream,
               "seqs": [c for _, c in asked]}
        dp = self.plane.dp
        if not dp.to_inbox(CACHE_NAK_CHANNEL, json.dumps(doc, separators=(",", ":")).encode()):
            self.counters["nak_cache_refused"] += len(asked)
            self._forget(self._ids)
            return
        self.counters["nak_cache_requests"] += 1
        self.counters["nak_cache_asked"] += len(asked)

    def _forget(self, request_id: int) -> tuple | None:
        held = self._requests.pop(request_id, None)
        if held is not None:
            cmap, asked, _ = held
            for s, _ in asked:
                cmap.pending.pop(s, None)
        return held

    def answer(self, request_id: int, records: list[Any], now_ns: int) -> None:
        """The cache's answer (a command): per sequence asked, (publish ts, record payload)
        when kept, None when not kept, False when refused (its bounds: asked again later)."""
        from appliance.cache.layout import ENVELOPE, ENVELOPE_BYTES

        held = self._forget(request_id)
        if held is None:
            self.counters["nak_cache_answers_late"] += 1
            return
        cmap, asked, _ = held
        sender = cmap.sender
        if sender.evicted_source is not cmap:  # the sender was dropped meanwhile
            return
        out: list[bytes] = []
        served: list[int] = []
        lost: list[SeqRange] = []
        c = self.counters
        for (s, _), rec in zip(asked, records, strict=False):
            if rec is False:
                c["nak_cache_refused"] += 1
                continue
            message = None if rec is None else _message(s, rec, ENVELOPE, ENVELOPE_BYTES)
            if message is None:
                c["nak_cache_misses"] += 1
                if lost and lost[-1].last_seq + 1 == s:
                    lost[-1] = SeqRange(lost[-1].first_seq, s)
                else:
                    lost.append(SeqRange(s, s))
                continue
            out.append(message)
            served.append(s)
        if out:
            sent = sender.retransmit_stored(out, now_ns)
            c["nak_served_from_cache"] += sent
            # the receiver's retries sent before these arrive do not ask the cache again
            linger = now_ns + CACHE_NAK_LINGER_NS
            for s in served[:sent]:
                cmap.pending[s] = linger
        sender.declare_lost(lost)

    def expire(self, now_ns: int) -> None:
        """Forget the requests the cache did not answer in time, and the sequences served
        whose linger is over."""
        for rid in [r for r, (_, _, until) in self._requests.items() if until <= now_ns]:
            self._forget(rid)
            self.counters["nak_cache_unanswered"] += 1
        for held in self.plane.senders.values():
            cmap = held.cache_map
            if cmap is not None and cmap.pending:
                cmap.pending = {s: t for s, t in cmap.pending.items() if t > now_ns}


def _message(seq: int, rec: Any, envelope: Any, envelope_bytes: int) -> bytes | None:
    """The wire bytes of a cache record as message ``seq`` of the asking sender's stream."""
    ts, record = rec
    if len(record) < envelope_bytes:
        return None
    _, key, _, _, ns, schema, qos, flags, tlen = envelope.unpack_from(record)
    if not key:
        return None  # a loss marker, not a message
    payload = memoryview(record)[envelope_bytes + tlen:]
    plen = len(payload)
    out = bytearray(ml.MESSAGE_HEADER_BYTES + align8(plen))
    _MSG.pack_into(out, 0, key, seq, int(ts), ns, schema, qos, flags & _ENVELOPE_FLAG_HEADERS,
                   plen, 0, 0)
    out[ml.MESSAGE_HEADER_BYTES : ml.MESSAGE_HEADER_BYTES + plen] = payload
    return bytes(out)
