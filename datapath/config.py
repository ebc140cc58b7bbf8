"""One place for every tunable: an upper-case name with its unit, a default, a config key.

Components import the constant; the appliance's TOML config may override the ones whose
``CONFIG_KEYS`` entry names a key. Protocol bounds here are part of the wire contract
(docs/protocol.md) and must not change without a protocol version bump.
"""

from __future__ import annotations

# --- native protocol v1 bounds (wire contract) -------------------------------------------
NATIVE_UDP_PORT = 47470
"""Default UDP port of the native protocol (config key ``protocol.udp_port``); the scapy
layer binds to it and ``topicwire pcap`` dissects it unless ``--port`` says otherwise."""

MAX_FRAME_BYTES = 65_504
"""Largest frame, header included: the largest multiple of 8 that fits one IPv4 UDP datagram."""

MAX_TOPIC_BYTES = 1_024
"""Longest topic or pattern, in UTF-8 bytes."""

MAX_TOPIC_LEVELS = 64
"""Most levels a topic or pattern may have."""

# --- topics ------------------------------------------------------------------------------
TOPIC_MATCH_CACHE_ENTRIES = 4_096
"""Bound of the topic index's result cache, in topics; 0 disables it (config key
``topics.match_cache_entries``; nats-server's sublist uses 1,024)."""

# --- topic-key registry -------------------------------------------------------------------
REGISTRY_FILE_FORMAT_VERSION = 1
"""Format version of the registry's JSON file."""

# --- benchmarks ---------------------------------------------------------------------------
BENCH_REPEATS = 5
"""Repeats per measured figure; benchmarks report medians (config key ``bench.repeats``)."""

CONFIG_KEYS = {
    "protocol.udp_port": "NATIVE_UDP_PORT",
    "bench.repeats": "BENCH_REPEATS",
    "topics.match_cache_entries": "TOPIC_MATCH_CACHE_ENTRIES",
}
"""Config keys that may override a constant, mapped to the constant's name."""
