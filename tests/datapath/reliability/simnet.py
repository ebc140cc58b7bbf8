"""An in-memory network with a deterministic clock for driving senders and receivers in tests.

Frames sent through a node's sink are delivered to their destination (a node name, or a group
name reaching every member but the sender) after a latency plus seeded jitter (which reorders),
and may be dropped or duplicated with seeded probabilities per receiving node. A stand-in for
channels in unit tests of the transport only; the namespace tests use the real channels.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

OnFrame = Callable[[bytes, int, object], None]


@dataclass
class NodeLink:
    loss: float = 0.0
    duplicate: float = 0.0
    egress_loss: float = 0.0
    """Frames this node sends that reach nobody (shared loss, as on the sender's own link)."""
    drop: Callable[[bytes], bool] | None = None
    """Extra deterministic drop rule (e.g. drop every NAK)."""
    received: int = 0
    dropped: int = 0


@dataclass
class SimNet:
    seed: int = 1
    latency_ns: int = 200_000
    jitter_ns: int = 0
    nodes: dict[str, OnFrame] = field(default_factory=dict)
    links: dict[str, NodeLink] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    now_ns: int = 0
    sent: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._queue: list[tuple[int, int, str, bytes, str]] = []
        self._order = 0

    def add(self, name: str, on_frame: OnFrame, *, loss: float = 0.0, duplicate: float = 0.0,
            egress_loss: float = 0.0, groups: tuple[str, ...] = ()) -> NodeLink:
        self.nodes[name] = on_frame
        link = self.links[name] = NodeLink(loss, duplicate, egress_loss)
        for g in groups:
            self.groups.setdefault(g, []).append(name)
        return link

    def sink(self, name: str) -> _NodeSink:
        return _NodeSink(self, name)

    def _schedule(self, src: str, frame: bytes, dest: object) -> None:
        self.sent += 1
        if self.rng.random() < self.links[src].egress_loss:
            self.links[src].dropped += 1
            return
        targets = self.groups.get(dest, [dest]) if isinstance(dest, str) else []
        for target in targets:
            if target == src or target not in self.nodes:
                continue
            link = self.links[target]
            copies = 1 + (self.rng.random() < link.duplicate)
            for _ in range(copies):
                if self.rng.random() < link.loss or (link.drop and link.drop(frame)):
                    link.dropped += 1
                    continue
                at = self.now_ns + self.latency_ns + int(self.rng.random() * self.jitter_ns)
                self._order += 1
                heapq.heappush(self._queue, (at, self._order, target, frame, src))

    def deliver_until(self, now_ns: int) -> int:
        """Deliver every frame due by ``now_ns`` (in arrival order); the count delivered."""
        n = 0
        while self._queue and self._queue[0][0] <= now_ns:
            at, _, target, frame, src = heapq.heappop(self._queue)
            self.now_ns = at
            self.links[target].received += 1
            self.nodes[target](frame, at, src)
            n += 1
        self.now_ns = now_ns
        return n

    @property
    def in_flight(self) -> int:
        return len(self._queue)


class _NodeSink:
    def __init__(self, net: SimNet, name: str) -> None:
        self.net = net
        self.name = name

    def send_frame(self, frame: memoryview, dest: object) -> None:
        self.net._schedule(self.name, bytes(frame), dest)


class Recorder:
    """A DeliveryHandler that records what it gets; ``refuse`` makes it push back."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.keys: list[int] = []
        self.flags: list[int] = []
        self.losses: list = []
        self.items: list[tuple[str, object]] = []
        self.refuse = False

    def on_message(self, stream, message) -> bool:
        if self.refuse:
            return False
        seq = int.from_bytes(message[8:16])
        self.seqs.append(seq)
        self.keys.append(int.from_bytes(message[0:8]))
        self.flags.append(message[31])
        self.items.append(("msg", seq))
        return True

    def on_loss(self, event) -> None:
        self.losses.append(event)
        self.items.append(("loss", (event.first_seq, event.last_seq)))


def run(net: SimNet, agents, until, *, step_ns: int = 100_000, start_ns: int = 0,
        each_step=None) -> int:
    """Advance the clock in ``step_ns`` steps: deliver due frames, then run every agent's
    duty cycle; stop when ``until()`` is true. Returns the time reached."""
    t = start_ns
    while not until():
        net.deliver_until(t)
        if each_step is not None:
            each_step(t)
        for agent in agents:
            agent.do_work(t)
        t += step_ns
    return t
