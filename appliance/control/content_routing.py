"""Content routing by attribute popularity (seed 001): the cores as a DHT of rendezvous points.

Every core runs the same pure functions over the same inputs, so they agree without asking:

- ``RendezvousRing``: consistent hashing of attribute names over the core set
  (``VNODES_PER_CORE`` points per core on a 64-bit ring, BLAKE2b); a core joining or
  leaving moves only the keys of its own points.
- ``AttributeCounts``: how many events carried each attribute, counted where the events are
  published and merged from every core's shared counts; ``popular()`` is the seed's MPAS,
  the attributes carried by more than ``POPULAR_SHARE`` of the events.
- ``rendezvous_key(required, popular, counts, subscription)``: where one content
  subscription is registered: among the attributes its selector *requires*
  (``nic_offload.selectors.required``: every event it selects carries them), the popular
  one carried by the fewest events (fewest events to match it against), ties broken by a
  hash of the subscription so equal selectors spread; when it requires no popular
  attribute, its least popular required attribute; ``None`` when it requires none (it is
  flooded, as every subscription is in flood mode).
- ``event_keys(attributes, keys)``: the routing keys (attributes under which subscriptions
  are registered: popular ones, and the unpopular ones the rendezvous cores announce) an
  event carries; it is sent to their rendezvous cores, each of which matches it against the
  subscriptions registered there and forwards it to their subscribers' cores.

Exactly once: a subscription lives at one place (one rendezvous core, or flooded and then
matched only at the event's ingress core); an event reaches each distinct core at most once;
an event the subscription's selector selects carries the subscription's key (it is
required), and the key is a routing key, so the event reaches the key's core.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping

from nic_offload.selectors.values import normalize

POPULAR_SHARE = 0.5
"""Seed 001's k: an attribute carried by more than this share of events is popular (0..1)."""
VNODES_PER_CORE = 64
"""Points per core on the consistent-hashing ring (more points, more even key spread)."""


def key_hash(text: str) -> int:
    """The 64-bit ring position of ``text`` (BLAKE2b, the same on every core and run)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class RendezvousRing:
    """Consistent hashing of keys (attribute names) over a set of cores."""

    def __init__(self, cores: Iterable[str], vnodes: int = VNODES_PER_CORE) -> None:
        names = sorted(set(cores))
        if not names:
            raise ValueError("content routing: the rendezvous ring needs at least one core")
        if vnodes < 1:
            raise ValueError(f"content routing: vnodes must be >= 1, got {vnodes}")
        points = sorted((key_hash(f"{core}#{i}"), core) for core in names for i in range(vnodes))
        self.cores = tuple(names)
        self._positions = [pos for pos, _ in points]
        self._owners = [core for _, core in points]

    def core_of(self, key: str) -> str:
        """The core responsible for ``key``: the first point at or after its hash."""
        i = bisect.bisect_left(self._positions, key_hash(key))
        return self._owners[i % len(self._owners)]

    def cores_of(self, keys: Iterable[str]) -> set[str]:
        """The distinct cores responsible for ``keys``."""
        return {self.core_of(key) for key in keys}


class AttributeCounts:
    """Events seen and how many carried each attribute (one core's, or merged)."""

    def __init__(self) -> None:
        self.events = 0
        self.counts: Counter[str] = Counter()

    def observe(self, attributes: Iterable[str]) -> None:
        """Count one event carrying ``attributes`` (names of its non-NULL attributes)."""
        self.events += 1
        counts = self.counts
        for name in attributes:
            counts[name] += 1

    def merge(self, other: AttributeCounts) -> None:
        """Add another core's counts (the shared figures every core merges alike)."""
        self.events += other.events
        self.counts.update(other.counts)

    def share(self, attribute: str) -> float:
        """Fraction of events carrying ``attribute``."""
        return self.counts.get(attribute, 0) / self.events if self.events else 0.0

    def popular(self, share: float = POPULAR_SHARE) -> frozenset[str]:
        """MPAS: attributes carried by more than ``share`` of the events."""
        limit = share * self.events
        return frozenset(a for a, c in self.counts.items() if c > limit)


def carried_attributes(event: Mapping[str, object]) -> list[str]:
    """Names of the attributes ``event`` carries, i.e. holds a non-NULL value for."""
    return [name for name, value in event.items() if normalize(value) is not None]


def rendezvous_key(required: Iterable[str], popular: frozenset[str],
                   counts: Mapping[str, int], subscription: Hashable,
                   prefer_popular: bool = True) -> str | None:
    """The attribute whose rendezvous core holds this subscription, or None (flooded).

    A required popular attribute if there is one (the seed's MPAS: events are sent to
    those cores anyway, so the registration adds no key), else the least popular required
    attribute (it becomes a registered key, announced so that events carrying it go there
    too); among equals the one carried by the fewest events, then a hash of the
    subscription. None when the selector requires no attribute. ``prefer_popular=False``
    takes the least popular required attribute whatever MPAS holds (fewest events matched
    against the subscription; more distinct keys)."""
    required = list(required)
    if not required:
        return None
    salt = repr(subscription)
    return min(required, key=lambda a: (prefer_popular and a not in popular, counts.get(a, 0),
                                        key_hash(f"{salt}/{a}")))


def event_keys(attributes: Iterable[str], keys: frozenset[str]) -> frozenset[str]:
    """The routing keys an event carries (the attributes under which subscriptions are
    registered): it is sent to their rendezvous cores."""
    return frozenset(a for a in attributes if a in keys)


class MessageDedup:
    """Rendezvous mode, at a subscriber core: copies of one event arrive from several
    rendezvous cores (and the ingress); the first is delivered, later ones are dropped.
    A message is known by (stream, topic key, sequence, publish time): the stream is the
    publisher's session at its ingress, which the copies keep. Remembers the last
    ``limit`` messages (the oldest is forgotten first). The ingress records the messages
    published at it too, so a copy a rendezvous core sends back is dropped there."""

    def __init__(self, limit: int = 65_536) -> None:
        self.limit = limit
        self._seen: dict[tuple[int, int, int, int], None] = {}
        self.dropped = 0

    def first(self, ident: tuple[int, int, int, int]) -> bool:
        """Whether this is the first copy of the message (it is remembered)."""
        seen = self._seen
        if ident in seen:
            self.dropped += 1
            return False
        if len(seen) >= self.limit:
            del seen[next(iter(seen))]
        seen[ident] = None
        return True
