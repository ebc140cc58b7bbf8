"""Project-wide tunables: the wire contract's bounds and settings shared by several packages.

Every tunable is an upper-case constant with its unit in the name and a docstring. The ones
here are used across packages; a subsystem's own tunables sit beside the code that uses them,
one place per subsystem: ``datapath/reliability/config.py`` (NAK timing, buffers, ACKs),
``datapath/flow_control.py`` and ``datapath/batching.py`` (watermarks, latency budget),
``datapath/agent.py`` (idle strategies), the ``channels`` modules (socket and ring sizes,
histogram bounds; listed in docs/channels.md), ``nic_offload`` (table sizes, selector cache)
and ``appliance/config.py`` (every key of the appliance's TOML config, with its default and
check). The appliance config may override the constants whose ``CONFIG_KEYS`` entry names a
key. Protocol bounds here are part of the wire contract (docs/protocol.md) and must not
change without a protocol version bump.
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
