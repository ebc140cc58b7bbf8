"""Subscriber statistics (``topicwire sub --stats``, ``topicwire bench client``, and any
application that wants them): messages received, sequence gaps and duplicates per
publisher stream and topic, and a latency histogram (HdrHistogram) from each message's
publish time to its hand-over (``Message.latency_ns``)."""

from __future__ import annotations

STATS_LATENCY_HIGHEST_NS = 60_000_000_000
"""Largest latency the statistics record (60 s)."""


class SubStats:
    """Received, gaps, duplicates (per publisher stream and topic) and latency percentiles."""

    def __init__(self) -> None:
        from hdrh.histogram import HdrHistogram

        self.received = 0
        self.duplicates = 0
        self.lost = 0
        """Messages named by loss events (guaranteed subscriptions); ``summary`` adds the
        gaps no flow-control report explains."""
        self._highest: dict[tuple[int, int, int], int] = {}
        self._missing: dict[tuple[int, int, int], set[int]] = {}
        self.latency = HdrHistogram(1, STATS_LATENCY_HIGHEST_NS, 3)

    def on_message(self, msg) -> None:  # noqa: ANN001 - appliance.client.Message
        self.received += 1
        # a guaranteed stream numbers messages per (origin, publisher) across topics
        key = (msg.origin, msg.stream, -1 if msg.guaranteed else msg.topic_key)
        seq = msg.sequence
        # a large message's segments took sequences up to its own on a guaranteed stream
        first = seq - msg.segments + 1 if msg.guaranteed else seq
        highest = self._highest.get(key)
        if highest is None or first == highest + 1:
            self._highest[key] = seq
        elif first > highest:
            self._missing.setdefault(key, set()).update(range(highest + 1, first))
            self._highest[key] = seq
        else:
            missing = self._missing.get(key)
            if missing and seq in missing:
                missing.discard(seq)
            else:
                self.duplicates += 1
        latency = msg.latency_ns
        if 0 < latency <= STATS_LATENCY_HIGHEST_NS:
            self.latency.record_value(latency)

    @property
    def gaps(self) -> int:
        return sum(len(m) for m in self._missing.values())

    def summary(self, policy_drops: dict[str, int] | None = None) -> dict:
        """The figures; ``policy_drops``: what the appliance's flow-control policy dropped
        (``Subscription.policy_drops``): a gap those explain is not lost, one they do not
        explain is (``lost`` never hides a gap)."""
        count = self.latency.get_total_count()

        def at(p: float) -> float:
            return round(self.latency.get_value_at_percentile(p) / 1e3, 3) if count else 0.0
        drops = {k: v for k, v in sorted((policy_drops or {}).items()) if v}
        dropped = sum(drops.values())
        gaps = self.gaps
        return {"received": self.received, "delivered": self.received, "gaps": gaps,
                "duplicates": self.duplicates,
                "dropped_by_policy": drops, "conflated": drops.get("conflate", 0),
                "accounted": self.received + dropped,
                "lost": self.lost + max(gaps - dropped, 0),
                "streams": len(self._highest), "latency_p50_us": at(50),
                "latency_p99_us": at(99), "latency_max_us": round(
                    self.latency.get_max_value() / 1e3, 3) if count else 0.0}
