"""Flow control between a receiver's queue and its senders (seed 002, figure 7).

A subscriber queue has a high and a low watermark. Its depth rising above the high one turns
flow control on, falling below the low one turns it off; between the two nothing changes
(hysteresis), so a depth hovering around one watermark does not make on/off oscillation.
Each transition is signalled to the streams' senders as a FLOW_CONTROL admin frame, and an
"on" is refreshed while it lasts (a sender forgets an "on" that is not refreshed, so a lost
"off" or a dead receiver cannot stall it for ever).

While flow control is on, the sender sends no new data on the stream (it throttles); what
happens where a queue fills up is the subscription's policy:

- ``THROTTLE``: nothing is dropped; a full queue refuses (the publisher, or the reliable
  receiver, holds the message and offers it again later).
- ``DROP_OLDEST``: a full queue evicts its oldest message.
- ``CONFLATE``: while flow control is on, a message whose topic key is already queued replaces
  that message in place (keep the last value); a full queue with no match evicts the oldest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from datapath.errors import UserError
from datapath.protocol.admin_layout import FlowControl, FlowPolicy, FlowState
from datapath.protocol.message_layout import Qos

if TYPE_CHECKING:  # datapath.reliability imports this module; types only, no cycle
    from datapath.reliability.events import StreamKey, UnrecoverableLoss

SUBSCRIBER_QUEUE_MESSAGES = 16_384
"""Capacity of a subscriber queue."""
HIGH_WATERMARK_MESSAGES = 8_192
"""Queue depth above which flow control turns on."""
LOW_WATERMARK_MESSAGES = 2_048
"""Queue depth below which flow control turns off again."""
FLOW_CONTROL_REFRESH_INTERVAL_NS = 50_000_000
"""A receiver repeats its "on" this often while flow control is on."""
FLOW_CONTROL_ON_EXPIRY_NS = 1_000_000_000
"""A sender treats an "on" not refreshed for this long as off."""
MAX_FLOW_CONTROL_RECEIVERS = 1_024
"""Receivers a sender tracks flow-control state for; further "on" signals are counted, ignored."""
MAX_PENDING_LOSS_EVENTS = 4_096
"""Loss events a subscriber queue keeps for its application (oldest dropped beyond)."""



class FlowControlError(UserError):
    """A flow-control setting that cannot work ("flow-control: ...; what to do")."""

    component = "flow-control"


POLICY_NAMES: dict[str, FlowPolicy] = {"throttle": FlowPolicy.THROTTLE,
                                       "drop-oldest": FlowPolicy.DROP_OLDEST,
                                       "conflate": FlowPolicy.CONFLATE}
"""The policies by the name configs, P&M, the client API and the CLI give them."""
NAME_OF_POLICY = {policy: name for name, policy in POLICY_NAMES.items()}


def policy_from_name(name: object, where: str = "flow_policy") -> FlowPolicy:
    """The policy named ``name``; FlowControlError naming ``where`` and the choices if none."""
    policy = POLICY_NAMES.get(name) if isinstance(name, str) else None
    if policy is None:
        raise FlowControlError(f"{where} {name!r} is not a flow-control policy; use one of "
                               f"{', '.join(POLICY_NAMES)}")
    return policy


def strictest(policies: object) -> FlowPolicy | None:
    """The strictest of ``policies`` (throttle, then conflate, then drop-oldest); None when
    there are none."""
    return max(policies, key=_STRICTNESS.__getitem__, default=None)  # type: ignore[arg-type]


_STRICTNESS = {FlowPolicy.THROTTLE: 2, FlowPolicy.CONFLATE: 1, FlowPolicy.DROP_OLDEST: 0}


def policy_for_qos(qos: int) -> FlowPolicy:
    """The default policy of a subscription QoS: guaranteed throttles, last-value conflates,
    best-effort drops the oldest."""
    if qos == Qos.GUARANTEED:
        return FlowPolicy.THROTTLE
    if qos == Qos.LAST_VALUE:
        return FlowPolicy.CONFLATE
    return FlowPolicy.DROP_OLDEST


class WatermarkGate:
    """Hysteresis over a queue depth: on above ``high``, off below ``low``, unchanged between."""

    __slots__ = ("high", "low", "state", "turned_off", "turned_on")

    def __init__(self, high: int, low: int) -> None:
        if not 0 <= low < high:
            raise FlowControlError(f"watermarks low {low} / high {high} give no hysteresis; "
                                   "set 0 <= low < high")
        self.high = high
        self.low = low
        self.state = FlowState.OFF
        self.turned_on = 0
        self.turned_off = 0

    @property
    def on(self) -> bool:
        return self.state is FlowState.ON

    def update(self, depth: int) -> FlowState | None:
        """Feed the current depth; the new state when it changed, else None."""
        if self.state is FlowState.OFF:
            if depth > self.high:
                self.state = FlowState.ON
                self.turned_on += 1
                return self.state
        elif depth < self.low:
            self.state = FlowState.OFF
            self.turned_off += 1
            return self.state
        return None


class _MarkerSlot(list):
    """A queue slot ``[None, item]`` that ``push_marker`` put in: never conflated or evicted."""

    __slots__ = ()


class PolicyQueue:
    """A bounded FIFO of (topic key, item) that applies a FlowPolicy when full.

    ``offer(..., conflate=True)`` replaces the queued item of the same key in place (the
    CONFLATE policy keeps a key index for that). ``push_marker`` appends an item that stands
    for something that must keep its place (a reliable sender's skipped messages): it goes in
    even when the queue is full, has no key (so it is never conflated) and DROP_OLDEST never
    evicts it (it evicts the oldest ordinary item instead: dropping those is the policy a
    subscriber chose, and stays as it is). Markers count in the length, so a full queue stays
    full until it is drained. Single-threaded: use it from one agent.
    """

    __slots__ = ("_by_key", "_queue", "capacity", "conflated", "dropped", "last_evicted",
                 "max_depth", "policy", "refused")

    def __init__(self, capacity: int, policy: FlowPolicy = FlowPolicy.THROTTLE) -> None:
        if capacity < 1:
            raise FlowControlError(f"queue capacity {capacity}; set at least 1 message")
        self.capacity = capacity
        self.policy = FlowPolicy(policy)
        self._queue: deque[list[Any]] = deque()
        self._by_key: dict[int, list[Any]] = {}
        self.conflated = 0
        self.dropped = 0
        self.refused = 0
        self.max_depth = 0
        self.last_evicted: int | None = None
        """The key of the item the latest eviction dropped (set by each eviction)."""

    def __len__(self) -> int:
        return len(self._queue)

    def set_policy(self, policy: FlowPolicy) -> None:
        policy = FlowPolicy(policy)
        if policy is self.policy:
            return
        self.policy = policy
        self._by_key = {}
        if policy is FlowPolicy.CONFLATE:
            for slot in self._queue:
                if slot[0] is not None:
                    self._by_key[slot[0]] = slot

    def offer(self, key: int | None, item: object, *, conflate: bool = False) -> bool:
        """Queue ``item``; False when refused (THROTTLE and full)."""
        indexed = self.policy is FlowPolicy.CONFLATE and key is not None
        if conflate and indexed:
            slot = self._by_key.get(key)
            if slot is not None:
                slot[1] = item
                self.conflated += 1
                return True
        queue = self._queue
        if len(queue) >= self.capacity:
            if self.policy is FlowPolicy.THROTTLE:
                self.refused += 1
                return False
            self._evict_oldest()
        slot = [key, item]
        queue.append(slot)
        if indexed:
            self._by_key[key] = slot
        if len(queue) > self.max_depth:
            self.max_depth = len(queue)
        return True

    def _evict_oldest(self) -> None:
        """DROP_OLDEST / CONFLATE on a full queue: the oldest item that is not a marker goes."""
        queue = self._queue
        if type(queue[0]) is not _MarkerSlot:
            old = queue.popleft()
        else:
            i = next((i for i, s in enumerate(queue) if type(s) is not _MarkerSlot), None)
            if i is None:  # only markers: nothing may go, the new item is added past capacity
                return
            old = queue[i]
            del queue[i]
        if self._by_key.get(old[0]) is old:
            del self._by_key[old[0]]
        self.dropped += 1
        self.last_evicted = old[0]

    def push_marker(self, item: object) -> None:
        """Append ``item`` as a marker: past capacity if full, never conflated, never evicted."""
        queue = self._queue
        queue.append(_MarkerSlot((None, item)))
        if len(queue) > self.max_depth:
            self.max_depth = len(queue)

    def last_item(self) -> Any:
        """The newest queued item (None when empty)."""
        return self._queue[-1][1] if self._queue else None

    def peek(self) -> tuple[int | None, Any] | None:
        """The oldest (key, item) without taking it, or None when empty."""
        if not self._queue:
            return None
        slot = self._queue[0]
        return slot[0], slot[1]

    def poll(self) -> tuple[int | None, Any] | None:
        """The oldest (key, item), or None when empty."""
        if not self._queue:
            return None
        slot = self._queue.popleft()
        if self._by_key and self._by_key.get(slot[0]) is slot:
            del self._by_key[slot[0]]
        return slot[0], slot[1]


Signal = Callable[["StreamKey", FlowControl], None]


class SubscriberQueue:
    """A subscription's receive queue with watermarks: the receiver side of flow control.

    It is the ``DeliveryHandler`` of a ReliableReceiver (``on_message`` copies the message in)
    and an agent: ``do_work`` signals transitions, and refreshes an "on", through ``signal``
    (usually ``ReliableReceiver.send_flow_control``) to every stream that delivered into it.
    The application takes messages with ``poll``/``drain`` and loss events with ``take_losses``.
    """

    name = "subscriber-queue"

    def __init__(self, *, policy: FlowPolicy = FlowPolicy.THROTTLE,
                 capacity: int = SUBSCRIBER_QUEUE_MESSAGES,
                 high_watermark: int = HIGH_WATERMARK_MESSAGES,
                 low_watermark: int = LOW_WATERMARK_MESSAGES,
                 refresh_interval_ns: int = FLOW_CONTROL_REFRESH_INTERVAL_NS,
                 signal: Signal | None = None) -> None:
        if high_watermark >= capacity:
            raise FlowControlError(f"high watermark {high_watermark} is not below the capacity "
                                   f"{capacity}; leave room for the messages in flight")
        self.queue = PolicyQueue(capacity, policy)
        self.gate = WatermarkGate(high_watermark, low_watermark)
        self.refresh_interval_ns = refresh_interval_ns
        self.signal = signal
        self.losses: deque[UnrecoverableLoss] = deque(maxlen=MAX_PENDING_LOSS_EVENTS)
        self._streams: dict[StreamKey, None] = {}
        self._signalled = FlowState.OFF
        self._next_refresh_ns = 0
        self.signals_sent = 0

    @property
    def policy(self) -> FlowPolicy:
        return self.queue.policy

    def __len__(self) -> int:
        return len(self.queue)

    def on_message(self, stream: StreamKey, message: memoryview) -> bool:
        key = int.from_bytes(message[0:8])
        ok = self.queue.offer(key, (stream, bytes(message)), conflate=self.gate.on)
        if ok:
            self.gate.update(len(self.queue))
            if stream not in self._streams and len(self._streams) < MAX_FLOW_CONTROL_RECEIVERS:
                self._streams[stream] = None
        return ok

    def on_loss(self, event: UnrecoverableLoss) -> None:
        self.losses.append(event)

    def poll(self) -> tuple[StreamKey, bytes] | None:
        """The oldest (stream, message bytes), or None."""
        slot = self.queue.poll()
        if slot is None:
            return None
        self.gate.update(len(self.queue))
        return slot[1]

    def drain(self, max_messages: int) -> list[tuple[StreamKey, bytes]]:
        out = []
        poll = self.queue.poll
        for _ in range(max_messages):
            slot = poll()
            if slot is None:
                break
            out.append(slot[1])
        if out:
            self.gate.update(len(self.queue))
        return out

    def take_losses(self) -> list[UnrecoverableLoss]:
        out = list(self.losses)
        self.losses.clear()
        return out

    def do_work(self, now_ns: int) -> int:
        state = self.gate.state
        due = state is FlowState.ON and now_ns >= self._next_refresh_ns
        if state is self._signalled and not due:
            return 0
        self._signalled = state
        self._next_refresh_ns = now_ns + self.refresh_interval_ns
        if self.signal is None:
            return 0
        entry = FlowControl(state, self.queue.policy, len(self.queue), self.gate.high,
                            self.gate.low)
        for stream in self._streams:
            self.signal(stream, entry)
            self.signals_sent += 1
        return 1

    def on_close(self) -> None:
        return None


class SenderFlowControl:
    """The sender side: which receivers asked it to hold off, and with which policy."""

    __slots__ = ("_on", "expiry_ns", "ignored", "max_receivers", "paused_episodes", "signals")

    def __init__(self, expiry_ns: int = FLOW_CONTROL_ON_EXPIRY_NS,
                 max_receivers: int = MAX_FLOW_CONTROL_RECEIVERS) -> None:
        self.expiry_ns = expiry_ns
        self.max_receivers = max_receivers
        self._on: dict[int, tuple[FlowPolicy, int]] = {}
        self.signals = 0
        self.ignored = 0
        self.paused_episodes = 0
        """Times the sender went from sending to paused."""

    def on_signal(self, receiver_session: int, entry: FlowControl, now_ns: int) -> None:
        self.signals += 1
        if entry.state is FlowState.ON:
            if receiver_session not in self._on and len(self._on) >= self.max_receivers:
                self.ignored += 1
                return
            if not self._on:
                self.paused_episodes += 1
            self._on[receiver_session] = (entry.policy, now_ns + self.expiry_ns)
        else:
            self._on.pop(receiver_session, None)

    def paused(self, now_ns: int) -> bool:
        on = self._on
        if not on:
            return False
        expired = [r for r, (_, until) in on.items() if until <= now_ns]
        for r in expired:
            del on[r]
        return bool(on)

    def policy(self) -> FlowPolicy:
        """The strictest policy among the receivers holding the sender off (THROTTLE if none)."""
        if not self._on:
            return FlowPolicy.THROTTLE
        return max((p for p, _ in self._on.values()), key=_STRICTNESS.__getitem__)

    def receivers_on(self) -> list[int]:
        return list(self._on)
