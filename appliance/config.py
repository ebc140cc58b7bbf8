"""Appliance configuration: the TOML keys (docs/appliance.md), their checks, and the tunables.

``load_config(path)`` reads and checks the whole file before anything starts: an unknown key,
a value of the wrong type or out of range, an address that does not parse, a file that does
not exist raise ``ConfigError`` naming the key (``config: fabric.listen: ...``). Whether a
port is free is checked when the channels open (``node.Appliance.start``), which also fails
as a ``ConfigError`` naming the key, before any thread starts.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.errors import ConfigError

# --- tunables (units in the names) ---------------------------------------------------------
HEARTBEAT_INTERVAL_MS = 100
"""HELLO/HEARTBEAT period towards neighbours (config key ``appliance.heartbeat_interval_ms``)."""
NEIGHBOUR_DEAD_INTERVALS = 4
"""A neighbour silent for this many heartbeat intervals is down, unless
``appliance.neighbour_dead_ms`` says otherwise."""
LSA_REFRESH_MS = 2_000
"""Link state, interest and the P&M document are re-flooded this often
(``appliance.lsa_refresh_ms``)."""
LSA_MAX_AGE_REFRESHES = 4
"""An origin whose LSA was not refreshed for this many periods is forgotten."""
IDLE_SPIN_US = 1_000
"""With ``appliance.idle = "block"``: how long the data path keeps polling after its last
work before it blocks in poll(2) (``appliance.idle_spin_us``; 0 blocks at once)."""
DATAPATH_PRIORITY = 0
"""Nice value of the data-path thread (``appliance.priority``, -20..19; below 0 needs root or
CAP_SYS_NICE). Lower runs it ahead of the host's other work: a thread the scheduler preempts
in the middle of a forward holds every frame behind it (docs/appliance.md, benchmark)."""
DRAIN_TIMEOUT_MS = 500
"""On shutdown, queued frames may take this long to leave (``appliance.drain_timeout_ms``)."""
FABRIC_MAX_FRAME_BYTES = 1_472
"""Frames built towards neighbours: one UDP datagram on a 1,500-byte Ethernet MTU
(``fabric.max_frame_bytes``)."""
CLIENT_MAX_FRAME_BYTES = 65_504
"""Frames built towards local clients (loopback and shared memory carry large frames)."""
CLIENT_MAX_SESSIONS = 256
"""Client sessions one appliance holds (``clients.max_sessions``)."""
CLIENT_SESSION_DEAD_MS = 5_000
"""A client silent this long is logged out (``clients.session_dead_ms``)."""
CLIENT_MAX_GUARANTEED_SESSIONS = 128
"""Sessions that may hold guaranteed subscriptions, each on an egress port of its own beside
its session's (``clients.max_guaranteed_sessions``)."""
CLIENT_MAX_SUBSCRIPTIONS = 1_024
"""Entries one session's subscription lists may hold, both classes together
(``clients.max_subscriptions``)."""
CLIENT_MAX_REGISTRATIONS = 16_384
"""Topics one session may register (``clients.max_registrations``)."""
CLIENT_MAX_PENDING_REQUESTS = 256
"""Requests of one session whose answer waits for the tables to be live
(``clients.max_pending_requests``)."""
EGRESS_PORTS = 510
"""Egress ports of the 9-bit port space that sessions and appliances can use (1..511 without
the CPU port, nic_offload.model)."""
APPLIANCE_EGRESS_PORTS = 64
"""Egress ports kept for destination appliances (two per remote appliance with interest:
best-effort and guaranteed); clients never take the last ones."""
DENIALS_KEPT = 128
"""Rows of the denial table ((identity, action, pattern) -> count); denials of a new row
beyond are counted (``control_denials_dropped``), not kept."""
DENIAL_TEXT_CHARS = 128
"""An identity or pattern is kept in the denial table up to this many characters."""
LOG_SOURCES_KEPT = 256
"""Sources (channel, peer) the once-per-interval log limiter remembers; a new source beyond
is not logged but counted (``control_log_sources_dropped``)."""
FABRIC_MAX_ORIGINS = 1_024
"""Appliances whose link state and interest one appliance keeps; a new origin beyond is
refused and counted (``control_origins_refused``)."""
SHM_BUS_PRODUCERS = 32
"""Producer slots of the shared-memory bus ring (clients that may send at once)."""
STATUS_REFRESH_NS = 250_000_000
"""How often the control agent rebuilds the status snapshot."""
INBOX_FRAMES = 4_096
"""Admin frames the data path may queue for the control agent; more are dropped and counted."""
OUTBOX_FRAMES = 8_192
"""Admin frames the control agent may queue for sending; more are dropped and counted."""
PARKED_MESSAGES = 65_536
"""Messages with a key not yet known that wait for the next snapshot, at most."""
PARKED_MESSAGE_TTL_NS = 2_000_000_000
"""How long a parked message waits for its key before it is dropped and counted."""
AUTH_REPLAY_WINDOW = 1_024
"""Auth sequence numbers per source remembered below the highest accepted (replay window)."""
AUTH_LOG_INTERVAL_NS = 10_000_000_000
"""A rejected admin frame is logged at most once per source per this interval."""
CONTROL_PENDING_POLL_NS = 200_000
"""While the control agent waits for the data path to run the commands before a held
snapshot or reply, it looks again this often; otherwise it sleeps until it is handed work
(the data path's inbox, a management request) or its next timer falls due."""
DATAPATH_RECEIVE_FRAMES = 256
"""Frames one receive call takes from one channel."""
REQUEST_TIMEOUT_S = 5.0
"""How long a client waits for the appliance's answer to a request (retries included)."""
REQUEST_RETRY_FIRST_S = 0.25
"""A request that is safe to repeat (login, registration) is sent again when unanswered this
long; the wait doubles after each retry..."""
REQUEST_RETRY_MAX_S = 1.0
"""...up to this long, until the request's deadline (``REQUEST_TIMEOUT_S``)."""
CLIENT_HEARTBEAT_INTERVAL_NS = 1_000_000_000
"""A client heartbeats its appliance this often."""
CLIENT_BATCH_BUDGET_NS = 200_000
"""A client's open frame leaves at the latest this long after its first message."""
SUBMIT_TIMEOUT_S = 5.0
"""How long ``Appliance.submit`` waits for the control agent to apply a command."""
GROUP_MAX_TTL = 1
"""Highest multicast TTL a fabric group accepts (``fabric.groups[].ttl``): 1 keeps frames on
the local link, 0 on this host (channels.multicast.MULTICAST_MAX_TTL)."""
GUARANTEED_TIMER_INTERVAL_NS = 1_000_000
"""How often the data path runs the reliable transport's timers (NAK retries, ACKs, tail
probes) of guaranteed streams that saw no traffic in the cycle."""
GUARANTEED_RETRANSMIT_BUFFER_BYTES = 4 * 1024 * 1024
"""Message bytes each guaranteed stream's sender keeps for retransmission (one sender per
destination appliance or client and publishing session); older ranges are answered with LOSS."""
GUARANTEED_RETRANSMIT_BUFFER_MESSAGES = 1 << 16
"""Messages each guaranteed stream's sender keeps for retransmission (a power of two)."""
GUARANTEED_UDP_FRAME_BYTES = 1_472
"""Frames of guaranteed streams towards UDP clients: one datagram on an Ethernet MTU, so a
lost packet costs one small frame (shared-memory clients get CLIENT_MAX_FRAME_BYTES)."""
GUARANTEED_SENDER_LINGER_NS = 10_000_000_000
"""A guaranteed sender whose publishing stream has ended stays this long (answering NAKs)
before it is dropped."""
GUARANTEED_HELD_RETRY_NS = 100_000_000
"""A guaranteed message whose topic key the tables do not know yet waits (with everything
after it on its stream) and is tried again on a new snapshot or after this long; after
PARKED_MESSAGE_TTL_NS it is declared lost (reason UNKNOWN_KEY)."""
GUARANTEED_SWEEP_INTERVAL_NS = 1_000_000_000
"""How often ended guaranteed senders are looked for."""
RDMA_LINK_RETRY_NS = 500_000_000
"""An RDMA neighbour link whose set-up failed (the neighbour not up yet, gone) is tried again
after this long (appliance/dataplane/fabric_links.py)."""
RDMA_LINK_BACKLOG_FRAMES = 4_096
"""Frames an RDMA neighbour link holds back while the link pushes back (the peer's credits
are used up), sent in order before newer ones; more are dropped and counted, as a full UDP
socket buffer would."""
RDMA_LINK_BACKLOG_BYTES = 4 * 1024 * 1024
"""Bytes of that backlog at most (as deep as the UDP fabric socket's send buffer)."""

MAX_NODE_ID = 2**31 - 1
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
FABRIC_KEY_BYTES = 32


# --- the parsed configuration ----------------------------------------------------------------

Address = tuple[str, int]


@dataclass(frozen=True)
class RdmaLinkConfig:
    """How an RDMA neighbour is reached (``transport = "rdma"``, docs/appliance.md)."""

    local: str
    """This appliance's IPv4 address on its RDMA device: picks the device and GID
    (``rdma_local``)."""
    remote: str
    """The neighbour's IPv4 address on its RDMA device (``rdma_remote``)."""
    port: int
    """TCP port of the set-up exchange, the same in both appliances' configs (``rdma_port``)."""
    listen: bool
    """This end listens on ``local:port`` (its name sorts before the neighbour's); the other
    connects to ``remote:port``."""
    device: str | None = None
    gid_index: int | None = None


@dataclass(frozen=True)
class RdmaClientsConfig:
    """The RDMA client endpoint (``[clients] rdma = "IP:PORT"``, docs/appliance.md)."""

    local: str
    """This appliance's IPv4 address on its RDMA device: picks the device and GID."""
    port: int
    """TCP port of the clients' set-up exchange (the URL clients give: rdma://local:port)."""
    device: str | None = None
    gid_index: int | None = None


@dataclass(frozen=True)
class NeighbourConfig:
    name: str
    address: Address
    cost: int = 1
    group: str | None = None
    """The fabric group (``fabric.groups[].name``) this neighbour is reached on, or None
    (unicast only)."""
    transport: str = "udp"
    """``udp`` (frames to ``address`` over the fabric socket) or ``rdma`` (over ``rdma``)."""
    rdma: RdmaLinkConfig | None = None


@dataclass(frozen=True)
class GroupConfig:
    """A UDP multicast group shared with some neighbours (``[[fabric.groups]]``)."""

    name: str
    group: str
    port: int
    interface: str
    """An IPv4 address of this host's interface, or an interface name; never the wildcard."""
    ttl: int = 1
    loopback: bool = False
    """Whether this host's own receivers get its group frames (needed when several
    appliances share one host, as on loopback)."""


@dataclass(frozen=True)
class IdentityConfig:
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApplianceConfig:
    name: str
    node_id: int
    role: str = "core"
    namespaces: tuple[int, ...] = (0,)
    idle: str = "block"
    idle_spin_us: int = IDLE_SPIN_US
    priority: int = DATAPATH_PRIORITY
    drain_timeout_ms: int = DRAIN_TIMEOUT_MS
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS
    neighbour_dead_ms: int = HEARTBEAT_INTERVAL_MS * NEIGHBOUR_DEAD_INTERVALS
    lsa_refresh_ms: int = LSA_REFRESH_MS
    fabric_listen: Address | None = None
    fabric_key: bytes | None = None
    fabric_key_id: int = 1
    fabric_max_frame_bytes: int = FABRIC_MAX_FRAME_BYTES
    neighbours: tuple[NeighbourConfig, ...] = ()
    groups: tuple[GroupConfig, ...] = ()
    clients_udp: Address | None = None
    clients_shm: str | None = None
    clients_rdma: RdmaClientsConfig | None = None
    """RDMA clients, sharing the client UDP channel (appliance/dataplane/client_links.py)."""
    max_sessions: int = CLIENT_MAX_SESSIONS
    session_dead_ms: int = CLIENT_SESSION_DEAD_MS
    max_guaranteed_sessions: int = CLIENT_MAX_GUARANTEED_SESSIONS
    max_subscriptions: int = CLIENT_MAX_SUBSCRIPTIONS
    max_registrations: int = CLIENT_MAX_REGISTRATIONS
    max_pending_requests: int = CLIENT_MAX_PENDING_REQUESTS
    pm_mode: str = "embedded"
    pm_registry: Path | None = None
    pm_anonymous: bool = False
    identities: dict[str, IdentityConfig] = field(default_factory=dict)
    schemas: tuple[dict[str, Any], ...] = ()
    """P&M's schemas (``Schema.to_dict`` documents), from ``[pm.schemas.NAME]``."""
    mgmt: dict[str, Any] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None
    telemetry: Any = None
    """``[telemetry]`` (appliance/ops/telemetry/settings.py), None when absent."""
    routes: Any = None
    """``[routes]`` (appliance/ops/telemetry/settings.py)."""


# --- checking ----------------------------------------------------------------------------------

def _fail(key: str, what: str) -> ConfigError:
    return ConfigError(f"{key}: {what}")


def _table(doc: dict, key: str, allowed: set[str], prefix: str) -> dict:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise _fail(prefix + key, "must be a table ([" + prefix + key + "])")
    _known(value, allowed, prefix + key + ".")
    return value


def _known(table: dict, allowed: set[str], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise _fail(prefix + key, "unknown key; known keys here: " + ", ".join(sorted(allowed)))


def _int(table: dict, key: str, prefix: str, default: int, low: int, high: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(prefix + key, f"must be an integer in [{low}, {high}], not {value!r}")
    return value


def _str(table: dict, key: str, prefix: str, default: str | None, choices: tuple[str, ...] = ()
         ) -> str | None:
    value = table.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or (choices and value not in choices):
        want = f"one of {', '.join(repr(c) for c in choices)}" if choices else "a string"
        raise _fail(prefix + key, f"must be {want}, not {value!r}")
    return value


def parse_address(text: object, key: str, *, allow_zero_port: bool = False) -> Address:
    """``"10.0.0.1:47470"`` -> ``("10.0.0.1", 47470)``; numeric IPv4 only (no name lookups)."""
    if not isinstance(text, str) or text.count(":") != 1:
        raise _fail(key, f"must be \"IPv4:port\" such as \"127.0.0.1:47470\", not {text!r}")
    host, port_text = text.split(":")
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise _fail(key, f"{host!r} is not a numeric IPv4 address (names are not "
                    "resolved)") from None
    if address.is_multicast:
        raise _fail(key, f"{host} is a multicast group; give a unicast address")
    try:
        port = int(port_text)
    except ValueError:
        raise _fail(key, f"port {port_text!r} is not a number") from None
    if not (0 if allow_zero_port else 1) <= port <= 65535:
        raise _fail(key, f"port {port} is outside [1, 65535]")
    return str(address), port


def _patterns(value: object, key: str) -> tuple[str, ...]:
    from datapath.topics.algebra import TopicError, split_pattern

    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise _fail(key, "must be a list of topic patterns such as [\"prices/#\"]")
    for pattern in value:
        try:
            split_pattern(pattern)
        except TopicError as exc:
            raise _fail(key, f"{pattern!r}: {str(exc).removeprefix('topics: ')}") from None
    return tuple(value)


def _identities(table: object, key: str) -> dict[str, IdentityConfig]:
    if not isinstance(table, dict):
        raise _fail(key, "must be a table of identities ([pm.identities.NAME])")
    out = {}
    for identity, spec in table.items():
        where = f"{key}.{identity}"
        if not isinstance(spec, dict):
            raise _fail(where, "must be a table with publish = [...] and subscribe = [...]")
        _known(spec, {"publish", "subscribe"}, where + ".")
        out[identity] = IdentityConfig(_patterns(spec.get("publish", []), where + ".publish"),
                                       _patterns(spec.get("subscribe", []), where + ".subscribe"))
    return out


def _schemas(table: object, key: str) -> tuple[dict[str, Any], ...]:
    from nic_offload.errors import OffloadError
    from nic_offload.schema import Schema

    if not isinstance(table, dict):
        raise _fail(key, "must be a table of schemas ([pm.schemas.NAME])")
    out, ids = [], set()
    for name, spec in table.items():
        where = f"{key}.{name}"
        if not isinstance(spec, dict):
            raise _fail(where, "must be a table with id = N and fields = [[name, offset, type"
                        "(, width)], ...]")
        _known(spec, {"id", "fields"}, where + ".")
        schema_id = _int(spec, "id", where + ".", 0, 1, 65_535)
        if schema_id in ids:
            raise _fail(where + ".id", f"schema id {schema_id} is used twice")
        ids.add(schema_id)
        fields = spec.get("fields")
        if not isinstance(fields, list) or not all(isinstance(f, list) for f in fields):
            raise _fail(where + ".fields", "must be a list of [name, offset, type(, width)]")
        try:
            schema = Schema.of(name, schema_id, [tuple(f) for f in fields])
        except (OffloadError, TypeError, ValueError) as exc:
            raise _fail(where + ".fields", str(exc)) from None
        out.append(schema.to_dict())
    return tuple(out)


def _existing_file(value: object, key: str, base: Path) -> Path:
    if not isinstance(value, str) or not value:
        raise _fail(key, "must be a file path")
    path = Path(value)
    if not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise _fail(key, f"no such file: {path}")
    return path


def _fabric_key(text: str, key: str) -> bytes:
    try:
        raw = bytes.fromhex(text.strip())
    except ValueError:
        raise _fail(key, "the fabric key must be hex (64 hex digits)") from None
    if len(raw) != FABRIC_KEY_BYTES:
        raise _fail(key, f"the fabric key must be {FABRIC_KEY_BYTES} bytes (64 hex digits), "
                    f"not {len(raw)}")
    return raw


IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")


def parse_group_address(text: object, key: str) -> Address:
    """``"239.77.0.1:47480"`` -> ``("239.77.0.1", 47480)``: a multicast group and a port."""
    if not isinstance(text, str) or text.count(":") != 1:
        raise _fail(key, f"must be \"group:port\" such as \"239.77.0.1:47480\", not {text!r}")
    host, port_text = text.split(":")
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise _fail(key, f"{host!r} is not a numeric IPv4 address") from None
    if not address.is_multicast:
        raise _fail(key, f"{host} is not a multicast group (224.0.0.0/4); use e.g. 239.77.0.1")
    try:
        port = int(port_text)
    except ValueError:
        raise _fail(key, f"port {port_text!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise _fail(key, f"port {port} is outside [1, 65535]")
    return str(address), port


def is_loopback_interface(interface: str) -> bool:
    """Whether a group interface (address or name) is this host's loopback."""
    try:
        return ipaddress.IPv4Address(interface).is_loopback
    except ValueError:
        return interface == "lo"


def _interface(value: object, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(key, "required: this host's interface for the group, as its IPv4 address "
                    "(\"10.77.0.1\", \"127.0.0.1\") or its name (\"lo\", \"eth1\"); "
                    "without it multicast would leave through the default route")
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        if not IFNAME_RE.match(value) or value[0].isdigit():
            raise _fail(key, f"{value!r} is neither an IPv4 address nor an interface "
                        "name") from None
        return value
    if address.is_unspecified or address.is_multicast:
        raise _fail(key, f"{value} is not one interface's address; the wildcard would send "
                    "through the default route: give this host's address on the fabric")
    return str(address)


def _groups(value: object) -> tuple[GroupConfig, ...]:
    if not isinstance(value, list):
        raise _fail("fabric.groups", "must be an array of tables ([[fabric.groups]])")
    out: list[GroupConfig] = []
    for i, g in enumerate(value):
        where = f"fabric.groups[{i}]."
        if not isinstance(g, dict):
            raise _fail(f"fabric.groups[{i}]", "must be a table with name, address and "
                        "interface")
        _known(g, {"name", "address", "interface", "ttl", "loopback"}, where)
        gname = g.get("name")
        if not isinstance(gname, str) or not NAME_RE.match(gname):
            raise _fail(where + "name", "required: a name the neighbours on this group give "
                        "as their group (letters, digits, '.', '_', '-')")
        if any(x.name == gname for x in out):
            raise _fail(where + "name", f"group {gname!r} is listed twice")
        if "address" not in g:
            raise _fail(where + "address", "required: \"group:port\" such as "
                        "\"239.77.0.1:47480\"")
        group, port = parse_group_address(g["address"], where + "address")
        if any((x.group, x.port) == (group, port) for x in out):
            raise _fail(where + "address", f"{group}:{port} is already another group's address")
        interface = _interface(g.get("interface"), where + "interface")
        ttl = _int(g, "ttl", where, 1, 0, GROUP_MAX_TTL)
        loopback = g.get("loopback", is_loopback_interface(interface))
        if not isinstance(loopback, bool):
            raise _fail(where + "loopback", "must be true or false")
        out.append(GroupConfig(gname, group, port, interface, ttl, loopback))
    return tuple(out)


RDMA_KEYS = frozenset({"rdma_local", "rdma_remote", "rdma_port", "rdma_device",
                       "rdma_gid_index"})
"""A neighbour's keys for ``transport = "rdma"``."""


def _ipv4_host(value: object, key: str) -> str:
    try:
        address = ipaddress.IPv4Address(value)  # type: ignore[arg-type]
    except ValueError:
        raise _fail(key, f"must be a numeric IPv4 address, not {value!r}") from None
    if address.is_unspecified or address.is_multicast:
        raise _fail(key, f"{value} is not one interface's address; give the address of the "
                    "RDMA device's network interface")
    return str(address)


def _rdma_link(n: dict, where: str, name: str, address: Address,
               listen: Address | None) -> RdmaLinkConfig:
    """The RDMA keys of neighbour ``n`` (``transport = "rdma"``)."""
    if "rdma_local" in n:
        local = _ipv4_host(n["rdma_local"], where + "rdma_local")
    elif listen is not None and listen[0] != "0.0.0.0":
        local = listen[0]
    else:
        raise _fail(where + "rdma_local", "required: this host's IPv4 address on its RDMA "
                    "device (fabric.listen's address is the default, but it is the wildcard)")
    remote = _ipv4_host(n.get("rdma_remote", address[0]), where + "rdma_remote")
    if "rdma_port" not in n:
        raise _fail(where + "rdma_port", "required: the TCP port of the link's set-up, the "
                    "same in both appliances' configs (the end whose name sorts first listens)")
    port = _int(n, "rdma_port", where, 0, 1, 65_535)
    device, gid_index = _rdma_device(n, where)
    return RdmaLinkConfig(local, remote, port, name < n["name"], device, gid_index)


def _rdma_device(table: dict, where: str) -> tuple[str | None, int | None]:
    """``rdma_device`` and ``rdma_gid_index`` of a table (None: the address picks them)."""
    device = _str(table, "rdma_device", where, None)
    if device is not None and not NAME_RE.match(device):
        raise _fail(where + "rdma_device", f"must be an RDMA device name such as \"rxe0\" "
                    f"(`rdma link show`), not {device!r}")
    gid_index = None if "rdma_gid_index" not in table else _int(
        table, "rdma_gid_index", where, 0, 0, 65_535)
    return device, gid_index


def _rdma_clients(cl: dict, udp: Address | None) -> RdmaClientsConfig | None:
    """``clients.rdma`` and its device keys."""
    p = "clients."
    if "rdma" not in cl:
        for k in ("rdma_device", "rdma_gid_index"):
            if k in cl:
                raise _fail(p + k, "only with clients.rdma (the RDMA client endpoint)")
        return None
    host, port = parse_address(cl["rdma"], p + "rdma")
    local = _ipv4_host(host, p + "rdma")
    if udp is None:
        raise _fail(p + "rdma", "needs clients.udp too: RDMA clients share the client UDP "
                    "channel (give clients.udp, e.g. on the same address)")
    device, gid_index = _rdma_device(cl, p)
    return RdmaClientsConfig(local, port, device, gid_index)


def node_id_of(name: str) -> int:
    """The default node id of an appliance name: stable across restarts and machines."""
    digest = hashlib.blake2b(name.encode(), digest_size=4, person=b"topicwire-node").digest()
    return int.from_bytes(digest, "big") % MAX_NODE_ID + 1


def parse_config(doc: dict, source: Path | None = None) -> ApplianceConfig:
    """Check a parsed TOML document (see the module docstring)."""
    from appliance.ops.telemetry.settings import parse_routes, parse_telemetry

    base = source.parent if source else Path.cwd()
    _known(doc, {"appliance", "fabric", "neighbours", "clients", "pm", "mgmt", "log",
                 "telemetry", "routes"}, "")
    app = _table(doc, "appliance", {"name", "id", "role", "namespaces", "idle", "idle_spin_us",
                                    "priority", "drain_timeout_ms", "heartbeat_interval_ms",
                                    "neighbour_dead_ms", "lsa_refresh_ms"}, "")
    p = "appliance."
    name = app.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _fail(p + "name", "required: 1..64 letters, digits, '.', '_' or '-'"
                    + ("" if name is None else f", not {name!r}"))
    node_id = _int(app, "id", p, node_id_of(name), 1, MAX_NODE_ID)
    role = _str(app, "role", p, "core", ("core", "edge"))
    namespaces = app.get("namespaces", [0])
    if (not isinstance(namespaces, list) or not namespaces
            or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**32
                       for n in namespaces)):
        raise _fail(p + "namespaces", "must be a non-empty list of integers in [0, 2^32)")
    idle = _str(app, "idle", p, "block", ("block", "busy", "backoff", "sleep"))
    idle_spin_us = _int(app, "idle_spin_us", p, IDLE_SPIN_US, 0, 1_000_000)
    priority = _int(app, "priority", p, DATAPATH_PRIORITY, -20, 19)
    heartbeat = _int(app, "heartbeat_interval_ms", p, HEARTBEAT_INTERVAL_MS, 10, 60_000)
    dead = _int(app, "neighbour_dead_ms", p, heartbeat * NEIGHBOUR_DEAD_INTERVALS,
                2 * heartbeat, 600_000)
    lsa = _int(app, "lsa_refresh_ms", p, LSA_REFRESH_MS, heartbeat, 600_000)
    drain = _int(app, "drain_timeout_ms", p, DRAIN_TIMEOUT_MS, 0, 60_000)

    fab = _table(doc, "fabric", {"listen", "key", "key_file", "key_id", "max_frame_bytes",
                                 "groups"}, "")
    p = "fabric."
    listen = parse_address(fab["listen"], p + "listen") if "listen" in fab else None
    key = None
    if "key" in fab and "key_file" in fab:
        raise _fail(p + "key", "give fabric.key or fabric.key_file, not both")
    if "key" in fab:
        if not isinstance(fab["key"], str):
            raise _fail(p + "key", "must be a hex string")
        key = _fabric_key(fab["key"], p + "key")
    elif "key_file" in fab:
        path = _existing_file(fab["key_file"], p + "key_file", base)
        key = _fabric_key(path.read_text(), p + "key_file")
    key_id = _int(fab, "key_id", p, 1, 1, 2**32 - 1)
    max_frame = _int(fab, "max_frame_bytes", p, FABRIC_MAX_FRAME_BYTES, 512, 65_504)
    if max_frame % 8:
        raise _fail(p + "max_frame_bytes", f"must be a multiple of 8, not {max_frame}")

    groups = _groups(fab.get("groups", []))

    raw_neighbours = doc.get("neighbours", [])
    if not isinstance(raw_neighbours, list):
        raise _fail("neighbours", "must be an array of tables ([[neighbours]])")
    neighbours = []
    for i, n in enumerate(raw_neighbours):
        where = f"neighbours[{i}]."
        if not isinstance(n, dict):
            raise _fail(f"neighbours[{i}]", "must be a table with name and address")
        _known(n, {"name", "address", "cost", "group", "transport", *RDMA_KEYS}, where)
        nname = n.get("name")
        if not isinstance(nname, str) or not NAME_RE.match(nname):
            raise _fail(where + "name", "required: the neighbour's appliance name")
        if nname == name or any(x.name == nname for x in neighbours):
            raise _fail(where + "name", f"{nname!r} is this appliance or listed twice")
        if "address" not in n:
            raise _fail(where + "address", "required: \"IPv4:port\" of the neighbour's "
                        "fabric.listen")
        group = n.get("group")
        if group is not None and not any(g.name == group for g in groups):
            raise _fail(where + "group", f"{group!r} is not a group of fabric.groups; known: "
                        + (", ".join(repr(g.name) for g in groups) or "none (add "
                           "[[fabric.groups]] with name, address and interface)"))
        address = parse_address(n["address"], where + "address")
        transport = _str(n, "transport", where, "udp", ("udp", "rdma"))
        rdma = None
        if transport == "rdma":
            if group is not None:
                raise _fail(where + "group", "a neighbour reached over RDMA is on no fabric "
                            "group (groups are UDP multicast); drop group or transport")
            rdma = _rdma_link(n, where, name, address, listen)
            if any(x.rdma is not None and x.rdma.port == rdma.port for x in neighbours):
                raise _fail(where + "rdma_port", f"{rdma.port} is another RDMA neighbour's "
                            "set-up port; give each RDMA neighbour its own")
        else:
            extra = sorted(RDMA_KEYS & n.keys())
            if extra:
                raise _fail(where + extra[0], "only for transport = \"rdma\"")
        neighbours.append(NeighbourConfig(nname, address, _int(n, "cost", where, 1, 1, 65_535),
                                          group, transport, rdma))
    if groups and listen is None:
        raise _fail("fabric.listen", "required when fabric.groups are configured (admin frames "
                    "and per-destination frames stay unicast)")
    if neighbours and listen is None:
        raise _fail("fabric.listen", "required when neighbours are configured")
    if neighbours and key is None:
        raise _fail("fabric.key_file", "required when neighbours are configured (admin frames "
                    "between appliances are authenticated with it); or give fabric.key")

    cl = _table(doc, "clients", {"udp", "shm", "max_sessions", "session_dead_ms", "rdma",
                                 "rdma_device", "rdma_gid_index", "max_guaranteed_sessions",
                                 "max_subscriptions", "max_registrations",
                                 "max_pending_requests"}, "")
    p = "clients."
    clients_udp = parse_address(cl["udp"], p + "udp") if "udp" in cl else None
    clients_rdma = _rdma_clients(cl, clients_udp)
    shm = _str(cl, "shm", p, None)
    if shm is not None and not NAME_RE.match(shm):
        raise _fail(p + "shm", f"must be a ring name (letters, digits, '.', '_', '-'), not "
                    f"{shm!r}")
    max_sessions = _int(cl, "max_sessions", p, CLIENT_MAX_SESSIONS, 1, 400)
    session_dead = _int(cl, "session_dead_ms", p, CLIENT_SESSION_DEAD_MS, 100, 3_600_000)
    client_ports = EGRESS_PORTS - APPLIANCE_EGRESS_PORTS
    max_guaranteed = _int(cl, "max_guaranteed_sessions", p,
                          min(CLIENT_MAX_GUARANTEED_SESSIONS, client_ports - max_sessions), 0,
                          400)
    if max_sessions + max_guaranteed > client_ports:
        raise _fail(p + "max_guaranteed_sessions", f"{max_sessions} sessions and "
                    f"{max_guaranteed} guaranteed ones need {max_sessions + max_guaranteed} "
                    f"egress ports; clients have {client_ports} ({EGRESS_PORTS} less the "
                    f"{APPLIANCE_EGRESS_PORTS} kept for appliances): lower it or "
                    "clients.max_sessions")
    max_subscriptions = _int(cl, "max_subscriptions", p, CLIENT_MAX_SUBSCRIPTIONS, 1, 65_536)
    max_registrations = _int(cl, "max_registrations", p, CLIENT_MAX_REGISTRATIONS, 1,
                             1_000_000)
    max_pending = _int(cl, "max_pending_requests", p, CLIENT_MAX_PENDING_REQUESTS, 1, 65_536)

    pm = _table(doc, "pm", {"mode", "entitlements", "registry", "anonymous", "identities",
                            "schemas"}, "")
    p = "pm."
    mode = _str(pm, "mode", p, "embedded", ("embedded", "remote"))
    identities: dict[str, IdentityConfig] = {}
    registry = None
    anonymous = pm.get("anonymous", False)
    if not isinstance(anonymous, bool):
        raise _fail(p + "anonymous", "must be true or false")
    schemas = _schemas(pm.get("schemas", {}), p + "schemas")
    if mode == "remote":
        for k in ("entitlements", "registry", "identities", "anonymous", "schemas"):
            if k in pm:
                raise _fail(p + k, "only for pm.mode = \"embedded\" (the P&M appliance)")
    else:
        if "entitlements" in pm:
            path = _existing_file(pm["entitlements"], p + "entitlements", base)
            try:
                ents = tomllib.loads(path.read_text())
            except tomllib.TOMLDecodeError as exc:
                raise _fail(p + "entitlements", f"{path}: not TOML: {exc}") from None
            _known(ents, {"identities"}, f"{path}: ")
            identities.update(_identities(ents.get("identities", {}), "identities"))
        identities.update(_identities(pm.get("identities", {}), p + "identities"))
        if "registry" in pm:
            registry = _existing_file(pm["registry"], p + "registry", base)

    mgmt = _table(doc, "mgmt", {"listen", "token", "token_file"}, "")
    if "listen" in mgmt:
        parse_address(mgmt["listen"], "mgmt.listen", allow_zero_port=True)
    if "token_file" in mgmt:
        _existing_file(mgmt["token_file"], "mgmt.token_file", base)
    log = _table(doc, "log", {"format", "level"}, "")
    _str(log, "format", "log.", "text", ("text", "json"))
    _str(log, "level", "log.", "info", ("debug", "info", "warning", "error"))

    config = ApplianceConfig(
        name=name, node_id=node_id, role=role, namespaces=tuple(namespaces), idle=idle,
        idle_spin_us=idle_spin_us, priority=priority,
        drain_timeout_ms=drain, heartbeat_interval_ms=heartbeat, neighbour_dead_ms=dead,
        lsa_refresh_ms=lsa, fabric_listen=listen, fabric_key=key, fabric_key_id=key_id,
        fabric_max_frame_bytes=max_frame, neighbours=tuple(neighbours), groups=groups,
        clients_udp=clients_udp, clients_shm=shm, clients_rdma=clients_rdma,
        max_sessions=max_sessions, max_guaranteed_sessions=max_guaranteed,
        max_subscriptions=max_subscriptions, max_registrations=max_registrations,
        max_pending_requests=max_pending, session_dead_ms=session_dead, pm_mode=mode,
        pm_registry=registry,
        pm_anonymous=anonymous, identities=identities, schemas=schemas, mgmt=dict(mgmt),
        log=dict(log), source=source, telemetry=parse_telemetry(doc.get("telemetry"), base),
        routes=parse_routes(doc.get("routes"), base, mode))
    if mode == "embedded":
        import json

        from appliance.control.documents import DocumentError, validate
        from appliance.control.pm import embedded_document
        from datapath.protocol.admin_layout import MAX_CONTROL_DOCUMENT_BYTES, ControlKind

        text = json.dumps(embedded_document(config), separators=(",", ":"))
        size = len(text.encode())
        if size > MAX_CONTROL_DOCUMENT_BYTES:
            raise _fail("pm.identities", f"P&M's document would be {size} bytes; at most "
                        f"{MAX_CONTROL_DOCUMENT_BYTES} fit one frame: use fewer identities, "
                        "patterns or schemas")
        try:  # what every appliance checks it against (appliance/control/documents.py)
            validate(ControlKind.PM_UPDATE, text)
        except DocumentError as exc:
            raise _fail("pm.identities", f"P&M's document would be refused by the appliances "
                        f"({exc})") from None
    return config


def load_config(path: str | Path) -> ApplianceConfig:
    """Read and check a TOML config file (raises ConfigError)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such config file: {path}; pass --config FILE") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return parse_config(doc, path.resolve())
