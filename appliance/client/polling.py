"""``Client.poll``: received messages handed to a handler as one reused flyweight, with no
Python object and no payload copy per message (the model is Aeron's ``Subscription.poll``).

A subscription made with ``subscribe(pattern, poll=True)`` is a *poll subscription*. The
client's thread does not decode its messages: it copies each received DATA frame whole
(one ``bytes`` per frame, which holds up to ~600 messages of 64 B) onto the client's poll
queue (``PollQueue.push``). The application's thread calls ``client.poll(handler, limit)``:
it moves up to ``POLL_CHUNK_FRAMES`` frames into one staging buffer, decodes them in one
call of the batch decoder (``datapath.protocol.batch.decode_frames``), and for each message
of a topic that matches a poll subscription calls ``handler(view)`` with the same
``PollView``, pointed at that message.

Lifetime rules (docs/appliance.md, "Polling"):

- ``view`` and everything read from it are valid only during that call of the handler; the
  view raises ``ClientError`` when it is read after the call (kept and read later).
- ``view.payload`` is a read-only ``memoryview`` into the staging buffer, which the next
  frames overwrite: copy it (``bytes(view.payload)``) to keep it.
- One thread polls a client at a time (a second concurrent or nested ``poll`` is refused).

A message whose topic key the client does not know yet stops the poll at that message (order
is kept) until the appliance answers the client's resolution of the key; a key still
unknown after ``POLL_UNRESOLVED_GIVE_UP_NS`` is dropped and counted (``unresolved``). When
the queue holds ``POLL_QUEUE_BYTES`` of frames not yet polled, further frames are dropped
and counted (``dropped_frames``, ``dropped_messages``): nothing is lost silently.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.client.errors import ClientError
from appliance.client.messages import NO_HEADERS
from appliance.client.settings import (
    POLL_CHUNK_FRAMES,
    POLL_QUEUE_BYTES,
    POLL_STAGING_BYTES,
    POLL_UNRESOLVED_GIVE_UP_NS,
)
from datapath.agent import yield_cpu
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.batch import decode_frames, new_message_batch
from datapath.protocol.extensions import EXTENSION_FLAGS

if TYPE_CHECKING:
    from appliance.client.api import Client

_HDR = fl.FRAME_HEADER_STRUCT
_STALE = ("a PollView is valid only during the handler call it was given to; copy what you "
          "keep (bytes(view.payload), view.sequence, ...) inside the handler")


class PollView:
    """The flyweight ``Client.poll`` hands its handler: one message, read in place.

    Fields as ``Message`` has them: ``topic``, ``topic_key``, ``sequence``, ``publish_ts_ns``,
    ``namespace``, ``schema_id``, ``qos``, ``flags``, ``origin``, ``stream``, ``received_ns``,
    ``latency_ns``, ``headers``, ``segments``, ``guaranteed`` (always False) and ``payload``
    (a read-only memoryview). Valid only during the handler call (module docstring)."""

    __slots__ = ("_q", "_i", "_ext")

    guaranteed = False
    """Poll subscriptions are best-effort."""
    cache_seq = 0

    def __init__(self, queue: PollQueue) -> None:
        self._q = queue
        self._i = -1
        self._ext: tuple | None = None

    def _at(self) -> int:
        i = self._i
        if i < 0:
            raise ClientError(_STALE)
        return i

    @property
    def payload(self) -> memoryview:
        i = self._at()
        if self._ext is not None:
            return memoryview(self._ext[0]).toreadonly()
        q = self._q
        off = q.offs[i]
        return q.ro[off : off + q.lens[i]]

    @property
    def topic_key(self) -> int:
        return self._q.keys[self._at()]

    @property
    def topic(self) -> str:
        known = self._q.client._topics.get(self._q.keys[self._at()])
        return "" if known is None else known[1]

    @property
    def namespace(self) -> int:
        known = self._q.client._topics.get(self._q.keys[self._at()])
        return 0 if known is None else known[0]

    @property
    def sequence(self) -> int:
        i = self._i  # (the most read field: no call but the property's)
        if i < 0:
            raise ClientError(_STALE)
        return self._q.seqs[i]

    @property
    def publish_ts_ns(self) -> int:
        return self._q.column("publish_ts_ns")[self._at()]

    @property
    def schema_id(self) -> int:
        i = self._at()
        return self._ext[2] if self._ext is not None else self._q.column("schema_id")[i]

    @property
    def qos(self) -> int:
        return self._q.column("qos")[self._at()]

    @property
    def flags(self) -> int:
        return self._q.column("flags")[self._at()]

    def _head(self) -> tuple:
        """(origin, stream, received_ns) of the frame the current message came in."""
        q = self._q
        return q.heads[q.fidx[self._at()]]

    @property
    def origin(self) -> int:
        return self._head()[0]

    @property
    def stream(self) -> int:
        return self._head()[1]

    @property
    def received_ns(self) -> int:
        return self._head()[2]

    @property
    def latency_ns(self) -> int:
        """Receive time (the client thread's, wall clock) minus publish time."""
        return self.received_ns - self.publish_ts_ns

    @property
    def headers(self) -> Any:
        self._at()
        return NO_HEADERS if self._ext is None else self._ext[1]

    @property
    def segments(self) -> int:
        self._at()
        return 1 if self._ext is None else self._ext[3]

    def __repr__(self) -> str:
        if self._i < 0:
            return "PollView(<not valid outside its handler call>)"
        return (f"PollView(topic={self.topic!r}, sequence={self.sequence}, "
                f"payload={len(self.payload)} bytes)")


class PollQueue:
    """The frames waiting for ``Client.poll`` (filled by the client thread) and the chunk
    being polled (the application's thread)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.frames: deque[tuple[bytes, int]] = deque()
        self.pushed_bytes = 0
        """(client thread) frame bytes queued so far; ``popped_bytes`` (polling thread)
        those taken: two counters, each with one writer, instead of one shared."""
        self.popped_bytes = 0
        self.pushed_frames = 0
        self.dropped_frames = 0
        self.dropped_messages = 0
        """Frames (and their messages) not queued: the queue held ``POLL_QUEUE_BYTES``."""
        self.polled = 0
        """Messages handed to a poll handler."""
        self.unresolved = 0
        """Messages dropped: their topic key stayed unknown (``POLL_UNRESOLVED_GIVE_UP_NS``)."""
        self.malformed = 0
        self._staging = np.zeros(POLL_STAGING_BYTES, np.uint8)
        self.ro = memoryview(self._staging).toreadonly()
        self._msgs = new_message_batch(POLL_STAGING_BYTES // ml.MESSAGE_HEADER_BYTES)
        self._offsets = np.zeros(POLL_CHUNK_FRAMES, np.int64)
        self._lengths = np.zeros(POLL_CHUNK_FRAMES, np.int64)
        self._status = np.zeros(POLL_CHUNK_FRAMES, np.uint8)
        self._types = np.zeros(POLL_CHUNK_FRAMES, np.uint8)
        self._event = threading.Event()
        self._waiting = False
        self._busy = False
        self.routes: dict[int, bool] = {}
        self._routes_version = -1
        # the chunk being polled: its message columns (lists), its frames' (origin, stream,
        # received wall ns), and the next message
        self.n = 0
        self.i = 0
        self.keys: list[int] = []
        self.seqs: list[int] = []
        self.offs: list[int] = []
        self.lens: list[int] = []
        self.fidx: list[int] = []
        self.heads: list[tuple[int, int, int]] = []
        self._cols: dict[str, list[int]] = {}
        self._ext_any = False
        self.view = PollView(self)

    # --- the client thread ----------------------------------------------------------------------
    def push(self, frame: memoryview, wall_ns: int) -> None:
        """Queue one received, checked DATA frame (a copy: the receive batch is reused)."""
        if self.pushed_bytes - self.popped_bytes + len(frame) > POLL_QUEUE_BYTES:
            self.dropped_frames += 1
            self.dropped_messages += _HDR.unpack_from(frame, 0)[4]
            return
        self.frames.append((bytes(frame), wall_ns))
        self.pushed_bytes += len(frame)
        self.pushed_frames += 1
        if self._waiting:
            self._event.set()

    @property
    def queued_bytes(self) -> int:
        return self.pushed_bytes - self.popped_bytes

    # --- the polling thread ---------------------------------------------------------------------
    def column(self, name: str) -> list[int]:
        """A column of the chunk's messages as a list, made on first use in the chunk."""
        col = self._cols.get(name)
        if col is None:
            col = self._cols[name] = self._msgs[name][: self.n].tolist()
        return col

    def _load(self) -> bool:
        """Move the next frames into the staging buffer and decode them; False when none."""
        frames = self.frames
        if not frames:
            return False
        # let the client thread have the interpreter once a chunk (it fills the queue; a
        # polling loop would otherwise keep it waiting a whole switch interval, 5 ms)
        yield_cpu()
        staging = self._staging
        offsets, lengths = self._offsets, self._lengths
        heads: list[tuple[int, int, int]] = []
        pos = k = taken = 0
        while frames and k < POLL_CHUNK_FRAMES:
            data, wall = frames[0]
            size = len(data)
            if pos + size > len(staging):
                break
            frames.popleft()
            staging[pos : pos + size] = np.frombuffer(data, np.uint8)
            fields = _HDR.unpack_from(data, 0)
            heads.append((fields[6], fields[8], wall))
            offsets[k] = pos
            lengths[k] = size
            pos += (size + 7) & ~7
            k += 1
            taken += size
        self.popped_bytes += taken
        msgs = self._msgs
        result = decode_frames(staging, offsets[:k], lengths[:k], msgs, self._status,
                               self._types)
        if result.frames < k or self._status[:k].any():  # checked before they were queued
            self.malformed += int(np.count_nonzero(self._status[:k])) + k - result.frames
        n = result.messages
        self.n, self.i = n, 0
        self.heads = heads
        self._cols = {}
        self.keys = msgs["topic_key"][:n].tolist()
        self.seqs = msgs["sequence"][:n].tolist()
        self.offs = msgs["payload_offset"][:n].tolist()
        self.lens = msgs["payload_len"][:n].tolist()
        self.fidx = msgs["frame_index"][:n].tolist()
        self._ext_any = bool((msgs["flags"][:n] & EXTENSION_FLAGS).any())
        return True

    def _route(self, key: int) -> bool | None:
        """Whether messages of ``key`` go to a poll subscription; None: the key is unknown."""
        client = self.client
        known = client._topics.get(key)
        if known is None:
            return None
        route = bool(client._targets(known[0], known[1], False, poll=True))
        self.routes[key] = route
        return route

    def _unknown(self, key: int, now_ns: int) -> bool:
        """A message of an unknown key: ask for it (the client thread resolves it); True when
        it has stayed unknown too long (the message is dropped and counted)."""
        first = self.client._poll_unknown.setdefault(key, now_ns)
        if now_ns - first > POLL_UNRESOLVED_GIVE_UP_NS:
            self.unresolved += 1
            return True
        return False

    def poll(self, handler: Callable[[PollView], Any], limit: int, timeout_s: float) -> int:
        if self._busy:
            raise ClientError("poll: this client is being polled already (one thread polls a "
                              "client, and a handler must not poll)")
        self._busy = True
        client = self.client
        if self._routes_version != client._subs_version:
            self.routes.clear()
            self._routes_version = client._subs_version
        routes = self.routes
        view = self.view
        done = 0
        waited = False
        try:
            while done < limit:
                i = self.i
                if i >= self.n:
                    if self._load():
                        continue
                    if done or waited or timeout_s <= 0:
                        break
                    waited = True
                    self._wait(timeout_s)
                    continue
                key = self.keys[i]
                route = routes.get(key)
                if route is None:
                    route = self._route(key)
                    if route is None:
                        if self._unknown(key, time.monotonic_ns()):
                            self.i = i + 1
                            continue
                        break  # kept in order: polled once its key is known
                self.i = i + 1
                if not route:
                    continue  # a message of the client's callback or iterator subscriptions
                if self._ext_any and self.column("flags")[i] & EXTENSION_FLAGS:
                    off = self.offs[i]
                    origin, stream, _ = self.heads[self.fidx[i]]
                    split = client._split_extensions(self.ro[off : off + self.lens[i]],
                                                     self.column("flags")[i],
                                                     (origin, stream, key),
                                                     self.column("schema_id")[i])
                    if split is None:
                        continue  # a segment of a message not complete yet, or malformed
                    view._ext = split
                    view._i = i
                    handler(view)
                    view._ext = None
                else:
                    view._i = i
                    handler(view)
                done += 1
        finally:
            view._i = -1
            view._ext = None
            self.polled += done
            self._busy = False
        return done

    def _wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the client thread to queue a frame."""
        self._waiting = True
        self._event.clear()
        try:
            if not self.frames:
                self._event.wait(timeout_s)
        finally:
            self._waiting = False

    def counters(self) -> dict[str, int]:
        return {"polled": self.polled, "queued_frames": len(self.frames),
                "queued_bytes": self.queued_bytes, "dropped_frames": self.dropped_frames,
                "dropped_messages": self.dropped_messages, "unresolved": self.unresolved,
                "malformed": self.malformed}
