"""Prometheus metrics of an appliance, built at each scrape from its status snapshot and its
channels' counters.

``StatusCollector(status)`` is a ``prometheus_client`` collector: every ``collect()`` reads
one snapshot (``Appliance.status()``, docs/appliance.md "Status contract") and turns it into
metric families; nothing is counted twice and the data path is never asked anything (the
snapshot is the control agent's published, read-only dict). ``ChannelCollector(channels)``
reads each channel's ``ChannelStats`` (channels/stats.py) as they are, without waiting for
the data path (copies of numpy arrays and integers): the latency and frame-size histograms
and the channel counters. ``exposition(registry, accept)`` renders one scrape in the text
format the ``Accept`` header asks for (Prometheus text 0.0.4 or OpenMetrics).
``ApiCollector`` adds the management API's own counters (open connections, error answers).

Rules every metric here keeps (tests/appliance/test_metrics_lint.py checks a live scrape
against them): names start with ``topicwire_`` (``process_*`` and ``python_*`` are
prometheus_client's own collectors) and carry their unit (``_seconds``, ``_bytes``) or what
they count; counters end in ``_total``; latency and sizes are histograms with explicit
buckets (``appliance/ops/mgmt/config.py``), never a gauge per quantile; one metric per
quantity (a label splits a quantity into parts that add up); and no label takes values a
client chooses: identities, sessions and topic patterns are aggregated (the per-client
figures are in ``GET /clients`` and ``GET /denials``), and every label's values come from
the code (reasons, verdicts, actions) or from the appliance's config (channel, neighbour and
appliance names). ``METRIC_NAMES`` lists every sample name (docs/appliance.md's table is
checked against it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from appliance.ops.mgmt.config import METRICS_FRAME_SIZE_BUCKETS_BYTES, METRICS_LATENCY_BUCKETS_S

PREFIX = "topicwire_"

MESSAGE_VERDICTS = ("forwarded", "logged", "dropped", "punted", "unknown_key", "acl_rejected",
                    "acl_short_payload")
"""The software NIC's message verdicts (``nic_offload.softnic.layout.MessageVerdict``) in the
snapshot's ``offload.verdicts``; its other entries are counters of their own
(``OFFLOAD_COUNTERS``)."""
OFFLOAD_COUNTERS = {
    "frames": ("offload_frames", "Frames the software NIC looked at (valid, malformed, admin)"),
    "admin_frames": ("offload_admin_frames", "Valid admin frames the software NIC handed to "
                     "the control path"),
    "messages": ("offload_messages", "Messages the software NIC decoded (each gets a verdict)"),
    "digests": ("offload_digests", "ACL log digests the software NIC queued"),
    "digest_drops": ("offload_dropped_digests", "ACL log digests lost (the queue was full)"),
}
"""``offload.verdicts`` entries that are not verdicts: snapshot name -> (metric, help)."""
DROPPED_FRAMES = ("off_path", "unknown_peer")
"""Fabric frames the data path dropped, by reason (snapshot ``offload``)."""
DROPPED_MESSAGES = ("unroutable", "parked_expired", "publish_denied", "no_port")
"""Messages the data path dropped, by reason (snapshot ``offload``)."""
DENIAL_ACTIONS = ("login", "publish", "subscribe")
GAUGE_COUNTERS = ("rdma_links_up", "rdma_link_up_", "guaranteed_streams_", "flow_level_")
"""Entries (or prefixes) of the snapshot's ``counters`` that are levels, not counts: gauges of
their own (``_levels``), not in ``topicwire_events_total``."""

METRIC_NAMES = (
    "topicwire_build_info",
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
    "topicwire_channel_dropped_frames_total",
    "topicwire_channel_backpressure_frames_total",
    "topicwire_channel_lost_messages_total",
    "topicwire_channel_naks_total",
    "topicwire_channel_retransmitted_messages_total",
    "topicwire_channel_latency_seconds_bucket",
    "topicwire_channel_latency_seconds_sum",
    "topicwire_channel_latency_seconds_count",
    "topicwire_channel_untimed_frames_total",
    "topicwire_channel_received_frame_size_bytes_bucket",
    "topicwire_channel_received_frame_size_bytes_sum",
    "topicwire_channel_received_frame_size_bytes_count",
    "topicwire_channel_jitter_seconds",
    "topicwire_offload_message_verdicts_total",
    *(PREFIX + metric + "_total" for metric, _ in OFFLOAD_COUNTERS.values()),
    "topicwire_offload_malformed_frames_total",
    "topicwire_offload_transit_frames_total",
    "topicwire_offload_dropped_frames_total",
    "topicwire_offload_dropped_messages_total",
    "topicwire_offload_keys",
    "topicwire_offload_snapshot_version",
    "topicwire_offload_parked_messages",
    "topicwire_entitlement_denials_total",
    "topicwire_auth_rejected_frames_total",
    "topicwire_auth_accepted_frames_total",
    "topicwire_client_sessions",
    "topicwire_guaranteed_streams",
    "topicwire_rdma_links_up",
    "topicwire_rdma_link_up",
    "topicwire_flow_control",
    "topicwire_events_total",
    "topicwire_mqtt_connections",
    "topicwire_mqtt_sessions",
    "topicwire_mqtt_events_total",
    "topicwire_mgmt_connections",
    "topicwire_mgmt_errors_total",
)
"""Every ``topicwire_*`` sample name ``/metrics`` can show (counters with their ``_total``,
histograms with ``_bucket``/``_sum``/``_count``)."""


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def families(status: dict[str, Any]) -> Iterator[Metric]:
    """The metric families of one status snapshot (empty snapshot: nothing)."""
    if not status:
        return
    node = status.get("node", {})
    build = node.get("build") or {}
    info = InfoMetricFamily(PREFIX + "build", "The build the appliance runs: version, source "
                            "commit, Python and numba", labels=("version", "commit", "python",
                                                                "numba"))
    info.add_metric(tuple(str(build.get(k, "unknown")) for k in ("version", "commit", "python",
                                                                  "numba")), {})
    yield info
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
    for nb in status.get("neighbours", []):  # the config's [[neighbours]]
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
    for sub in status.get("subscriptions", []):  # patterns are aggregated: clients pick them
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

    counters = status.get("counters", {})
    yield from _offload(status.get("offload", {}))
    yield _denials(status.get("denials", []), counters)

    auth = status.get("auth", {})
    rejected = CounterMetricFamily(PREFIX + "auth_rejected_frames",
                                   "Admin frames rejected by authentication, by reason",
                                   labels=("reason",))
    for reason, n in sorted(auth.get("rejected", {}).items()):
        rejected.add_metric((str(reason),), _num(n))
    yield rejected
    yield CounterMetricFamily(PREFIX + "auth_accepted_frames",
                              "Admin frames that passed authentication",
                              value=_num(auth.get("accepted")))

    sessions: dict[str, int] = {}
    for c in status.get("clients", []):  # by channel (config); identities are the clients'
        sessions[str(c.get("channel"))] = sessions.get(str(c.get("channel")), 0) + 1
    gauge = GaugeMetricFamily(PREFIX + "client_sessions", "Client sessions logged in, by the "
                              "channel they came in on (per session: GET /clients)",
                              labels=("channel",))
    for channel, n in sorted(sessions.items()):
        gauge.add_metric((channel,), n)
    yield gauge

    yield from _levels(counters)
    events = CounterMetricFamily(PREFIX + "events", "Data-path and control counters by name "
                                 "(the status snapshot's counters)", labels=("counter",))
    for name, n in sorted(counters.items()):
        if not str(name).startswith(GAUGE_COUNTERS):
            events.add_metric((str(name),), _num(n))
    yield events

    mqtt = status.get("mqtt")  # an edge's MQTT server (docs/mqtt.md)
    if mqtt:
        yield GaugeMetricFamily(PREFIX + "mqtt_connections", "Open MQTT connections",
                                value=_num(mqtt.get("connections")))
        sessions = GaugeMetricFamily(PREFIX + "mqtt_sessions", "MQTT sessions by state "
                                     "(persistent ones stay while their client is away)",
                                     labels=("state",))
        offline = _num(mqtt.get("sessions_offline"))
        sessions.add_metric(("connected",), _num(mqtt.get("sessions")) - offline)
        sessions.add_metric(("offline",), offline)
        yield sessions
        counters = CounterMetricFamily(PREFIX + "mqtt_events", "The MQTT server's counters "
                                       "by name", labels=("counter",))
        for name, n in sorted(mqtt.get("counters", {}).items()):
            counters.add_metric((str(name),), _num(n))
        yield counters


def _levels(counters: dict[str, Any]) -> Iterator[Metric]:
    """The levels among the snapshot's counters (``GAUGE_COUNTERS``) as gauges."""
    streams = GaugeMetricFamily(PREFIX + "guaranteed_streams", "Guaranteed streams this "
                                "appliance sends (out) and receives (in)", labels=("direction",))
    for direction in ("in", "out"):
        streams.add_metric((direction,), _num(counters.get(f"guaranteed_streams_{direction}")))
    yield streams
    if "rdma_links_up" in counters:
        yield GaugeMetricFamily(PREFIX + "rdma_links_up", "RDMA links to neighbours that are up",
                                value=_num(counters["rdma_links_up"]))
    up = GaugeMetricFamily(PREFIX + "rdma_link_up", "1 when the RDMA link to the neighbour is "
                           "up, else 0", labels=("neighbour",))
    for name, n in sorted(counters.items()):  # the config's neighbours
        if str(name).startswith("rdma_link_up_"):
            up.add_metric((str(name).removeprefix("rdma_link_up_"),), _num(n))
    yield up
    flow = GaugeMetricFamily(PREFIX + "flow_control", "Flow control towards clients: sessions "
                             "under it, messages queued for them, publishers held off",
                             labels=("level",))
    for name, n in sorted(counters.items()):
        if str(name).startswith("flow_level_"):
            flow.add_metric((str(name).removeprefix("flow_level_"),), _num(n))
    yield flow


def _denials(rows: list[dict[str, Any]], counters: dict[str, Any]) -> Metric:
    """Denials by action, summed over identities and patterns (which clients choose); the
    ones the status table could not hold (``control_denials_dropped``) as ``other``."""
    by_action = dict.fromkeys(DENIAL_ACTIONS, 0.0)
    for d in rows:
        action = str(d.get("action"))
        action = action if action in by_action else "other"
        by_action[action] = by_action.get(action, 0.0) + _num(d.get("count"))
    by_action["other"] = by_action.get("other", 0.0) + _num(counters.get("control_denials_dropped"))
    family = CounterMetricFamily(PREFIX + "entitlement_denials", "Entitlement denials by action "
                                 "(per identity and pattern: GET /denials)", labels=("action",))
    for action, n in by_action.items():
        family.add_metric((action,), n)
    return family


def _offload(offload: dict[str, Any]) -> Iterator[Metric]:
    counts = offload.get("verdicts", {})
    verdicts = CounterMetricFamily(PREFIX + "offload_message_verdicts",
                                   "Messages by the software NIC's verdict", labels=("verdict",))
    for name in MESSAGE_VERDICTS:
        verdicts.add_metric((name,), _num(counts.get(name)))
    yield verdicts
    for key, (metric, text) in OFFLOAD_COUNTERS.items():
        yield CounterMetricFamily(PREFIX + metric, text, value=_num(counts.get(key)))
    malformed = CounterMetricFamily(PREFIX + "offload_malformed_frames",
                                    "Malformed frames the software NIC dropped, by reason",
                                    labels=("reason",))
    for reason, n in sorted(offload.get("malformed", {}).items()):
        malformed.add_metric((str(reason),), _num(n))
    yield malformed
    yield CounterMetricFamily(PREFIX + "offload_transit_frames", "Fabric frames forwarded in "
                              "transit to the next appliance of their path",
                              value=_num(offload.get("transit_frames")))
    dropped = CounterMetricFamily(PREFIX + "offload_dropped_frames", "Fabric frames dropped: "
                                  "off their path, or from an appliance not known as a peer",
                                  labels=("reason",))
    for reason in DROPPED_FRAMES:
        dropped.add_metric((reason,), _num(offload.get(reason)))
    yield dropped
    dropped = CounterMetricFamily(PREFIX + "offload_dropped_messages", "Messages dropped: no "
                                  "route to their destination, parked too long for their key, "
                                  "publish not entitled, no egress port", labels=("reason",))
    for reason in DROPPED_MESSAGES:
        dropped.add_metric((reason,), _num(offload.get(reason)))
    yield dropped
    yield GaugeMetricFamily(PREFIX + "offload_keys", "Registered topic keys",
                            value=_num(offload.get("keys")))
    yield GaugeMetricFamily(PREFIX + "offload_snapshot_version",
                            "Version of the table snapshot the data path forwards with",
                            value=_num(offload.get("snapshot_version")))
    yield GaugeMetricFamily(PREFIX + "offload_parked_messages",
                            "Messages waiting for their topic key",
                            value=_num(offload.get("parked")))


# --- channels ---------------------------------------------------------------------------------

@functools.cache
def _hdr_index_values(counts_len: int, sub_bucket_half_count_magnitude: int,
                      unit_magnitude: int) -> tuple[np.ndarray, np.ndarray]:
    """(lowest value, midpoint) of every counts index of an HdrHistogram of this geometry:
    ``HdrHistogram.get_value_from_index`` over the whole array (the tests compare them)."""
    index = np.arange(counts_len + 1, dtype=np.int64)
    half = 1 << sub_bucket_half_count_magnitude
    bucket = (index >> sub_bucket_half_count_magnitude) - 1
    sub = (index & (half - 1)) + half
    first = bucket < 0
    sub = np.where(first, sub - half, sub)
    bucket = np.where(first, 0, bucket)
    lowest = sub << (bucket + unit_magnitude)
    return lowest[:-1], (lowest[:-1] + lowest[1:] - 1) / 2.0


def latency_counts(histogram: Any) -> dict[str, Any]:
    """The nonzero counts of a channel's latency HdrHistogram (ns) and its geometry: what
    ``counts_buckets`` needs. The counts are copied first (one memcpy, microseconds): the
    data path records into them meanwhile, and ``flatnonzero`` over an array that changes
    under it raises ("number of non-zero array elements changed"; it ended an appliance of
    the demo when the management API read it)."""
    view = np.array(np.ctypeslib.as_array(histogram.counts))
    index = np.flatnonzero(view)
    return {"length": len(view), "half": histogram.sub_bucket_half_count_magnitude,
            "unit": histogram.unit_magnitude, "index": index, "counts": view[index]}


def counts_buckets(counts: dict[str, Any], bounds_s: Iterable[float] =
                   METRICS_LATENCY_BUCKETS_S) -> tuple[list[tuple[str, float]], float]:
    """Prometheus buckets ``[(le, cumulative count), ..., ("+Inf", total)]`` and the sum (s)
    of ``latency_counts``. A count index whose values start at or below ``le`` counts as below
    it, and the sum takes each index at its midpoint: both within the histogram's resolution
    (3 significant digits)."""
    index, values = counts["index"], counts["counts"]
    lowest, middle = _hdr_index_values(counts["length"], counts["half"], counts["unit"])
    cumulative = np.cumsum(values)
    total = int(cumulative[-1]) if len(cumulative) else 0
    buckets = []
    for le in bounds_s:
        upto = int(np.searchsorted(lowest, round(le * 1e9), side="right"))
        below = int(np.searchsorted(index, upto, side="left"))  # nonzero entries below upto
        buckets.append((floatToGoString(le), float(cumulative[below - 1]) if below else 0.0))
    buckets.append(("+Inf", float(total)))
    return buckets, float(np.dot(values, middle[index])) / 1e9


def latency_buckets(histogram: Any, bounds_s: Iterable[float] = METRICS_LATENCY_BUCKETS_S
                    ) -> tuple[list[tuple[str, float]], float]:
    """``counts_buckets`` of a channel's latency HdrHistogram (ns) as it is now."""
    return counts_buckets(latency_counts(histogram), bounds_s)


def size_buckets(size_counts: np.ndarray, bounds_bytes: Iterable[int] =
                 METRICS_FRAME_SIZE_BUCKETS_BYTES) -> list[tuple[str, float]]:
    """Prometheus buckets of a channel's size histogram (slot ``i``: frames of at most
    ``2**i`` bytes; every bound a power of two, so the counts are exact)."""
    cumulative = np.cumsum(size_counts)
    buckets = []
    for le in bounds_bytes:
        slot = min(int(le).bit_length() - 1, len(cumulative) - 1)
        buckets.append((floatToGoString(le), float(cumulative[slot])))
    buckets.append(("+Inf", float(cumulative[-1])))
    return buckets


def channel_stats(appliance: Any) -> list[tuple[str, str, Any]]:
    """(name, kind, ``ChannelStats``) of every channel of a running appliance and of the parts
    a channel reports apart (the fabric's RDMA links), as its status rows name them."""
    out = []
    for name, channel in list(getattr(appliance, "channels", {}).items()):
        out.append((name, channel))
        parts = getattr(channel, "status_parts", None)
        if parts is not None:
            out.extend(parts())
    return [(str(name), str(getattr(ch, "kind", "")), ch.stats) for name, ch in out
            if getattr(ch, "stats", None) is not None]


def appliance_channel_samples(appliance: Any) -> list[dict[str, Any]]:
    """``channel_samples`` of an appliance's channels: its own ``channel_samples()`` when it
    has one (a data path in a process of its own sends them with its counters), else read
    from its ``channels``."""
    own = getattr(appliance, "channel_samples", None)
    if own is not None:
        return own()
    return channel_samples(channel_stats(appliance))


def channel_samples(channels: Iterable[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    """Plain figures of every ``(name, kind, ChannelStats)`` (integers, small numpy arrays):
    what ``ChannelCollector`` renders. Read as they are, without waiting for the data path;
    the bucket arithmetic is left to the collector, so that the management API's process,
    which receives these rows in its snapshot (appliance/ops/mgmt/process.py), does it and
    the appliance's process does not."""
    rows = []
    for name, kind, s in channels:
        rows.append({
            "channel": name, "kind": kind,
            "frames_in": s.frames_in, "frames_out": s.frames_out,
            "bytes_in": s.bytes_in, "bytes_out": s.bytes_out, "drops": s.drops,
            "backpressure": s.backpressure, "lost": s.lost, "naks": s.naks,
            "retransmissions": s.retransmissions, "latency": latency_counts(s.latency),
            "untimed": s.latency_out_of_range, "size_counts": s.size_counts.copy(),
            "jitter_s": max(s.jitter_by_peer().values(), default=0.0) / 1e9})
    return rows


class ChannelCollector:
    """Channel metrics from ``rows()``: ``channel_samples`` of the appliance's channels (taken
    at each scrape in the appliance's process, or the latest snapshot's in the management
    API's own process)."""

    def __init__(self, rows: Callable[[], list[dict[str, Any]]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        labels = ("channel", "kind")
        frames = CounterMetricFamily(PREFIX + "channel_frames", "Frames through a channel",
                                     labels=(*labels, "direction"))
        octets = CounterMetricFamily(PREFIX + "channel_bytes", "Bytes through a channel",
                                     labels=(*labels, "direction"))
        dropped = CounterMetricFamily(PREFIX + "channel_dropped_frames", "Frames a channel "
                                      "received but could not deliver (truncated, torn, "
                                      "oversized)", labels=labels)
        pressure = CounterMetricFamily(PREFIX + "channel_backpressure_frames", "Frames a send "
                                       "could not take: socket buffer or ring full",
                                       labels=labels)
        lost = CounterMetricFamily(PREFIX + "channel_lost_messages", "Messages the reliability "
                                   "layer declared unrecoverable", labels=labels)
        naks = CounterMetricFamily(PREFIX + "channel_naks", "NAKs through a channel",
                                   labels=labels)
        retx = CounterMetricFamily(PREFIX + "channel_retransmitted_messages",
                                   "Retransmitted messages through a channel", labels=labels)
        latency = HistogramMetricFamily(PREFIX + "channel_latency_seconds", "One-way latency "
                                        "of received frames (send timestamp to receive)",
                                        labels=labels)
        untimed = CounterMetricFamily(PREFIX + "channel_untimed_frames", "Received frames "
                                      "whose latency was out of range (clock skew, over 60 s)",
                                      labels=labels)
        sizes = HistogramMetricFamily(PREFIX + "channel_received_frame_size_bytes",
                                      "Sizes of the frames a channel received", labels=labels)
        jitter = GaugeMetricFamily(PREFIX + "channel_jitter_seconds",
                                   "Largest RFC 3550 inter-arrival jitter of a peer of the "
                                   "channel", labels=labels)
        for r in self._rows():
            key = (r["channel"], r["kind"])
            frames.add_metric((*key, "in"), r["frames_in"])
            frames.add_metric((*key, "out"), r["frames_out"])
            octets.add_metric((*key, "in"), r["bytes_in"])
            octets.add_metric((*key, "out"), r["bytes_out"])
            dropped.add_metric(key, r["drops"])
            pressure.add_metric(key, r["backpressure"])
            lost.add_metric(key, r["lost"])
            naks.add_metric(key, r["naks"])
            retx.add_metric(key, r["retransmissions"])
            latency.add_metric(key, *counts_buckets(r["latency"]))
            untimed.add_metric(key, r["untimed"])
            sizes.add_metric(key, size_buckets(r["size_counts"]), float(r["bytes_in"]))
            jitter.add_metric(key, r["jitter_s"])
        yield from (frames, octets, dropped, pressure, lost, naks, retx, latency, untimed, sizes,
                    jitter)


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


class SnapshotGcCollector(GCCollector):
    """prometheus_client's ``python_gc_*`` families from ``stats()``, ``gc.get_stats()`` of
    another process (the appliance's, as its management API's process received it)."""

    def __init__(self, stats: Callable[[], list[dict[str, int]]],
                 registry: CollectorRegistry) -> None:
        self._stats = stats
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        collected = CounterMetricFamily("python_gc_objects_collected",
                                        "Objects collected during gc", labels=["generation"])
        uncollectable = CounterMetricFamily("python_gc_objects_uncollectable",
                                            "Uncollectable objects found during GC",
                                            labels=["generation"])
        collections = CounterMetricFamily("python_gc_collections",
                                          "Number of times this generation was collected",
                                          labels=["generation"])
        for gen, stat in enumerate(self._stats()):
            collected.add_metric([str(gen)], value=stat["collected"])
            uncollectable.add_metric([str(gen)], value=stat["uncollectable"])
            collections.add_metric([str(gen)], value=stat["collections"])
        yield from (collected, uncollectable, collections)


def registry_of(status: Callable[[], dict[str, Any]],
                api: ApiCollector | None = None,
                channels: Callable[[], list[dict[str, Any]]] | None = None,
                pid: int | None = None,
                gc_stats: Callable[[], list[dict[str, int]]] | None = None
                ) -> CollectorRegistry:
    """A registry of its own (not the process-global one) holding one ``StatusCollector``,
    the channels' (``channel_samples`` rows) and the API's own collectors when given, and
    prometheus_client's process (``process_*``: CPU, memory, file descriptors, start time),
    platform (``python_info``) and garbage-collector (``python_gc_*``) collectors. ``pid``
    and ``gc_stats`` make the process and garbage-collector figures the appliance's when the
    registry lives in the management API's own process: /proc/<pid> and the appliance's
    ``gc.get_stats()`` as its snapshot carried them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status))
    if channels is not None:
        registry.register(ChannelCollector(channels))
    if api is not None:
        registry.register(api)
    ProcessCollector(registry=registry, pid=(lambda: pid) if pid is not None else
                     (lambda: "self"))
    PlatformCollector(registry=registry)
    if gc_stats is not None:
        SnapshotGcCollector(gc_stats, registry)
    else:
        GCCollector(registry=registry)
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
