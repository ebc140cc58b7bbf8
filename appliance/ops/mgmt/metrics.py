"""Prometheus metrics of an appliance, built from its status snapshot at each scrape.

``StatusCollector(status)`` is a ``prometheus_client`` collector: every ``collect()`` reads
one snapshot (``Appliance.status()``, docs/appliance.md "Status contract") and turns it into
metric families; nothing is counted twice and the data path is never touched (the snapshot
is the control agent's published, read-only dict). ``exposition(status, accept)`` renders one
scrape in the text format the ``Accept`` header asks for (Prometheus text 0.0.4 or
OpenMetrics). Every name starts with ``topicwire_``; ``METRIC_NAMES`` lists them (the docs'
table is checked against it by the tests). ``ApiCollector`` adds the management API's own
counters (open connections, error answers), which are not part of the snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

PREFIX = "topicwire_"

OFFLOAD_EVENTS = ("off_path", "unknown_peer", "transit_frames", "unroutable", "parked_expired",
                  "publish_denied", "no_port")
"""Data-path events the status snapshot reports under ``offload`` (counted since start)."""

METRIC_NAMES = (
    "topicwire_node_info",
    "topicwire_uptime_seconds",
    "topicwire_neighbour_up",
    "topicwire_neighbour_rtt_seconds",
    "topicwire_neighbour_last_heard_seconds",
    "topicwire_subscriptions",
    "topicwire_routes",
    "topicwire_route_cost",
    "topicwire_channel_frames_total",
    "topicwire_channel_bytes_total",
    "topicwire_channel_loss_total",
    "topicwire_channel_naks_total",
    "topicwire_channel_retransmissions_total",
    "topicwire_channel_latency_seconds",
    "topicwire_channel_jitter_seconds",
    "topicwire_offload_verdicts_total",
    "topicwire_offload_malformed_total",
    "topicwire_offload_events_total",
    "topicwire_offload_keys",
    "topicwire_offload_snapshot_version",
    "topicwire_offload_parked_messages",
    "topicwire_entitlement_denials_total",
    "topicwire_auth_rejected_total",
    "topicwire_auth_accepted_total",
    "topicwire_clients",
    "topicwire_client_published_total",
    "topicwire_client_delivered_total",
    "topicwire_events_total",
    "topicwire_mqtt_connections",
    "topicwire_mqtt_events_total",
    "topicwire_mgmt_connections",
    "topicwire_mgmt_errors_total",
)
"""Every sample name ``/metrics`` can show (counters with their ``_total``)."""


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def families(status: dict[str, Any]) -> Iterator[Metric]:
    """The metric families of one status snapshot (empty snapshot: nothing)."""
    if not status:
        return
    node = status.get("node", {})
    info = InfoMetricFamily(PREFIX + "node", "The appliance: name, id, role and its P&M",
                            labels=("node", "id", "role", "pm"))
    info.add_metric((str(node.get("name", "")), str(node.get("id", "")),
                     str(node.get("role", "")), str(node.get("pm") or "")), {})
    yield info
    yield GaugeMetricFamily(PREFIX + "uptime_seconds", "Seconds since the appliance started",
                            value=_num(node.get("uptime_s")))

    up = GaugeMetricFamily(PREFIX + "neighbour_up", "1 when the neighbour is up, else 0",
                           labels=("neighbour", "address"))
    rtt = GaugeMetricFamily(PREFIX + "neighbour_rtt_seconds",
                            "Round-trip time to the neighbour (heartbeat echo)",
                            labels=("neighbour",))
    heard = GaugeMetricFamily(PREFIX + "neighbour_last_heard_seconds",
                              "Seconds since the neighbour was last heard",
                              labels=("neighbour",))
    for nb in status.get("neighbours", []):
        name = str(nb.get("name"))
        up.add_metric((name, str(nb.get("address", ""))), 1.0 if nb.get("state") == "up" else 0.0)
        if nb.get("rtt_us") is not None:
            rtt.add_metric((name,), _num(nb["rtt_us"]) / 1e6)
        if nb.get("last_heard_ms") is not None:
            heard.add_metric((name,), _num(nb["last_heard_ms"]) / 1e3)
    yield up
    yield rtt
    yield heard

    subs: dict[tuple[str, str], int] = {}
    for sub in status.get("subscriptions", []):
        key = (str(sub.get("origin")), str(sub.get("qos")))
        subs[key] = subs.get(key, 0) + 1
    gauge = GaugeMetricFamily(PREFIX + "subscriptions",
                              "Subscription patterns by origin appliance (local ones and "
                              "advertised interest) and QoS", labels=("origin", "qos"))
    for (origin, qos), n in sorted(subs.items()):
        gauge.add_metric((origin, qos), n)
    yield gauge

    routes = status.get("routes", [])
    yield GaugeMetricFamily(PREFIX + "routes", "(source, destination) paths this appliance knows",
                            value=len(routes))
    cost = GaugeMetricFamily(PREFIX + "route_cost", "Cost of the path of (source, destination)",
                             labels=("source", "destination"))
    for r in routes:
        cost.add_metric((str(r.get("source")), str(r.get("destination"))), _num(r.get("cost")))
    yield cost

    yield from _channels(status.get("channels", []))
    yield from _offload(status.get("offload", {}))

    denials = CounterMetricFamily(PREFIX + "entitlement_denials",
                                  "Entitlement denials by identity, action and pattern",
                                  labels=("identity", "action", "pattern"))
    for d in status.get("denials", []):
        denials.add_metric((str(d.get("identity")), str(d.get("action")),
                            str(d.get("pattern"))), _num(d.get("count")))
    yield denials

    auth = status.get("auth", {})
    rejected = CounterMetricFamily(PREFIX + "auth_rejected",
                                   "Admin frames rejected by authentication, by reason",
                                   labels=("reason",))
    for reason, n in sorted(auth.get("rejected", {}).items()):
        rejected.add_metric((str(reason),), _num(n))
    yield rejected
    yield CounterMetricFamily(PREFIX + "auth_accepted", "Admin frames that passed authentication",
                              value=_num(auth.get("accepted")))

    clients = status.get("clients", [])
    yield GaugeMetricFamily(PREFIX + "clients", "Client sessions logged in", value=len(clients))
    published = CounterMetricFamily(PREFIX + "client_published",
                                    "Messages a client session published (allowed ones)",
                                    labels=("session", "identity"))
    delivered = CounterMetricFamily(PREFIX + "client_delivered",
                                    "Messages delivered to a client session",
                                    labels=("session", "identity"))
    for c in clients:
        labels = (str(c.get("session")), str(c.get("identity")))
        published.add_metric(labels, _num(c.get("published")))
        delivered.add_metric(labels, _num(c.get("delivered")))
    yield published
    yield delivered

    events = CounterMetricFamily(PREFIX + "events", "Data-path and control counters by name",
                                 labels=("counter",))
    for name, n in sorted(status.get("counters", {}).items()):
        events.add_metric((str(name),), _num(n))
    yield events

    mqtt = status.get("mqtt")  # an edge's MQTT server (docs/edge.md)
    if mqtt:
        yield GaugeMetricFamily(PREFIX + "mqtt_connections", "Open MQTT connections",
                                value=_num(mqtt.get("connections")))
        counters = CounterMetricFamily(PREFIX + "mqtt_events", "The MQTT server's counters "
                                       "by name", labels=("counter",))
        for name, n in sorted(mqtt.get("counters", {}).items()):
            counters.add_metric((str(name),), _num(n))
        yield counters


def _channels(channels: list[dict[str, Any]]) -> Iterator[Metric]:
    labels = ("channel", "kind")
    frames = CounterMetricFamily(PREFIX + "channel_frames", "Frames through a channel",
                                 labels=(*labels, "direction"))
    octets = CounterMetricFamily(PREFIX + "channel_bytes", "Bytes through a channel",
                                 labels=(*labels, "direction"))
    loss = CounterMetricFamily(PREFIX + "channel_loss", "Frames lost or dropped on a channel",
                               labels=labels)
    naks = CounterMetricFamily(PREFIX + "channel_naks", "NAKs through a channel", labels=labels)
    retx = CounterMetricFamily(PREFIX + "channel_retransmissions",
                               "Retransmitted messages through a channel", labels=labels)
    latency = GaugeMetricFamily(PREFIX + "channel_latency_seconds",
                                "One-way latency of received frames (send timestamp to "
                                "receive), by quantile", labels=(*labels, "quantile"))
    jitter = GaugeMetricFamily(PREFIX + "channel_jitter_seconds",
                               "Largest inter-arrival jitter of a peer of the channel",
                               labels=labels)
    for ch in channels:
        key = (str(ch.get("name")), str(ch.get("kind")))
        frames.add_metric((*key, "in"), _num(ch.get("frames_in")))
        frames.add_metric((*key, "out"), _num(ch.get("frames_out")))
        octets.add_metric((*key, "in"), _num(ch.get("bytes_in")))
        octets.add_metric((*key, "out"), _num(ch.get("bytes_out")))
        loss.add_metric(key, _num(ch.get("loss")))
        naks.add_metric(key, _num(ch.get("naks")))
        retx.add_metric(key, _num(ch.get("retransmissions")))
        latency.add_metric((*key, "0.5"), _num(ch.get("p50_us")) / 1e6)
        latency.add_metric((*key, "0.99"), _num(ch.get("p99_us")) / 1e6)
        jitter.add_metric(key, _num(ch.get("jitter_us")) / 1e6)
    yield from (frames, octets, loss, naks, retx, latency, jitter)


def _offload(offload: dict[str, Any]) -> Iterator[Metric]:
    verdicts = CounterMetricFamily(PREFIX + "offload_verdicts",
                                   "Software NIC counters: message verdicts, frames, messages",
                                   labels=("verdict",))
    for name, n in sorted(offload.get("verdicts", {}).items()):
        verdicts.add_metric((str(name),), _num(n))
    yield verdicts
    malformed = CounterMetricFamily(PREFIX + "offload_malformed",
                                    "Malformed frames the software NIC dropped, by reason",
                                    labels=("reason",))
    for reason, n in sorted(offload.get("malformed", {}).items()):
        malformed.add_metric((str(reason),), _num(n))
    yield malformed
    events = CounterMetricFamily(PREFIX + "offload_events",
                                 "Data-path forwarding events (off-path frames, transit, "
                                 "denied publishes, ...)", labels=("event",))
    for name in OFFLOAD_EVENTS:
        events.add_metric((name,), _num(offload.get(name)))
    yield events
    yield GaugeMetricFamily(PREFIX + "offload_keys", "Registered topic keys",
                            value=_num(offload.get("keys")))
    yield GaugeMetricFamily(PREFIX + "offload_snapshot_version",
                            "Version of the table snapshot the data path forwards with",
                            value=_num(offload.get("snapshot_version")))
    yield GaugeMetricFamily(PREFIX + "offload_parked_messages",
                            "Messages waiting for their topic key",
                            value=_num(offload.get("parked")))


class StatusCollector:
    """A collector over ``status()`` (see the module docstring)."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        yield from families(self._status())


class ApiCollector:
    """The management API's own metrics: ``errors()`` gives its error answers so far by status
    code, ``connections()`` the connections it holds open now."""

    def __init__(self, errors: Callable[[], dict[int, int]],
                 connections: Callable[[], int]) -> None:
        self._errors = errors
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(PREFIX + "mgmt_connections",
                                "Connections the management API holds open",
                                value=self._connections())
        errors = CounterMetricFamily(PREFIX + "mgmt_errors",
                                     "Error answers of the management API by status code "
                                     "(malformed or refused requests, 503 when full)",
                                     labels=("status",))
        for status, n in sorted(self._errors().items()):
            errors.add_metric((str(status),), n)
        yield errors


def registry_of(status: Callable[[], dict[str, Any]],
                api: ApiCollector | None = None) -> CollectorRegistry:
    """A registry of its own (not the process-global one) holding one ``StatusCollector``
    (and the API's own collector, when given)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status))
    if api is not None:
        registry.register(api)
    return registry


OPENMETRICS_ACCEPT = "application/openmetrics-text; version=1.0.0"
"""What ``exposition`` asks prometheus_client for when the scraper wants OpenMetrics."""


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """One scrape: (body, content type): OpenMetrics 1.0.0 when ``accept`` names
    ``application/openmetrics-text``, else Prometheus text 0.0.4. Only the media types of
    ``accept`` are read: its ``version`` and ``escaping`` parameters are not passed on
    (prometheus_client raises on some versions and escapes the names for some escapings)."""
    wants = any(part.split(";", 1)[0].strip().lower() == "application/openmetrics-text"
                for part in (accept or "").split(","))
    encoder, content_type = choose_encoder(OPENMETRICS_ACCEPT if wants else "")
    return encoder(registry), content_type
