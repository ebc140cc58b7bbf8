"""Appliance configuration: the TOML keys (docs/appliance.md), their checks, and the tunables.

``load_config(path)`` reads and checks the whole file before anything starts: an unknown key,
a value of the wrong type or out of range, an address that does not parse, a file that does
not exist raise ``ConfigError`` naming the key (``config: fabric.listen: ...``). Whether a
port is free is checked when the channels open (``node.Appliance.start``), which also fails
as a ``ConfigError`` naming the key, before any thread starts.

A config is input like a frame: ``parse_config`` returns a config or raises ``ConfigError``
whatever the document holds. The document's shape is bounded first (``_check_tree``: nesting,
key and string lengths, 64-bit integers), then every key is read with its type and bounds;
addresses are ``HOST:PORT`` (an IPv4 address or a host name, resolved at load; ``[IPv6]`` on
``mgmt.listen``: appliance/addresses.py) and unicast; the files a config names are read at most so
many bytes, as UTF-8, never under /proc or /sys (``appliance/config_files.py``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.config_files import (
    decode,
    existing_file,
    parse_toml,
    path_of,
    read_text,
    show,
    topic_patterns,
)
from appliance.errors import ConfigError

# --- tunables (units in the names) ---------------------------------------------------------
HEARTBEAT_INTERVAL_MS = 1_000
"""HELLO/HEARTBEAT period towards neighbours (config key ``appliance.heartbeat_interval_ms``):
a dead neighbour is noticed in 4 s by default, as Aeron's and Solace's defaults take
seconds; 100 notices it in 0.4 s for ~3-5 % of a core more when idle (docs/appliance.md,
"Idle strategies")."""
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
MAX_CPUS = 4096
"""``appliance.dataplane_cpus`` takes CPU numbers below this."""
SWITCH_INTERVAL_US = 5_000
"""The appliance process's interpreter switch interval (``appliance.switch_interval_us``,
``sys.setswitchinterval``; set by ``topicwire run``): how long a thread that holds the
interpreter lock (the control agent compiling tables, the management API) keeps it while
the data path waits for it. Python's default is 5,000; docs/appliance.md, "Inside one
appliance", gives the trade measured."""
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
EGRESS_PORTS = 65_534
"""Egress ports of the 16-bit logical port space that sessions and appliances can use
(1..65,535 without the CPU port, nic_offload.model.MAX_EGRESS_PORT)."""
CLIENT_SESSIONS_LIMIT = 16_384
"""The largest ``clients.max_sessions`` (and ``clients.max_guaranteed_sessions``): what the
scale goal of one appliance needs (10,000 sessions) with room; the port space holds more."""
APPLIANCE_EGRESS_PORTS = 64
"""Egress ports kept for destination appliances (two per remote appliance with interest:
best-effort and guaranteed); clients never take the last ones."""
ROUTING_CONTENT_MODES = ("flood", "rendezvous")
"""``routing.content``: how content (selector) subscriptions are routed between cores
(docs/routing.md, "Content routing by attribute popularity"); flood is the default."""
RENDEZVOUS_COUNTS_INTERVAL_MS = 1_000
"""Rendezvous mode: a core shares its attribute counts this often
(``routing.counts_interval_ms``)."""
RENDEZVOUS_MAX_COUNTED_ATTRIBUTES = 256
"""Rendezvous mode: attributes a core's shared counts name at most (its most frequent)."""
RENDEZVOUS_MAX_REGISTRATIONS = 65_536
"""Rendezvous mode: registrations a rendezvous core holds at most (counted beyond)."""
RENDEZVOUS_DEDUP_MESSAGES = 65_536
"""Rendezvous mode: message identities a subscriber core remembers to drop later copies."""
MAX_SELECTORS_PER_SESSION = 256
"""Best-effort subscriptions with a selector one client session may hold (each is a rule the
appliance evaluates per message of its topics; docs/selectors.md, "In the fabric")."""
DENIALS_KEPT = 128
"""Rows of the denial table ((identity, action, pattern) -> count); denials of a new row
beyond are counted (``control_denials_dropped``), not kept."""
LOGIN_CHALLENGES_KEPT = 4_096
"""Logins waiting for the proof of a password at once (one per client address); one more is
refused until one is used or expires (a flood of LOGINs cannot grow the table)."""
LOGIN_CHALLENGE_TTL_NS = 10 * 1_000_000_000
"""How long a login challenge waits for its proof."""
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
"""How often the control agent rebuilds the status snapshot, and the data path publishes
its counters while it forwards messages or applies commands."""
STATUS_COST_SHARE = 10
"""The control agent's status is rebuilt no sooner than this many times what its last build
took (at most about a tenth of the control thread: it grows with the sessions)."""
STATUS_IDLE_REFRESH_NS = 1_000_000_000
"""How often an idle data path (no message, no command since its last publish: heartbeats
only) publishes its counters; the first message or command brings the next publish back
within ``STATUS_REFRESH_NS``."""
INBOX_FRAMES = 4_096
"""Admin frames the data path may queue for the control agent; more are dropped and counted."""
OUTBOX_FRAMES = 8_192
"""Admin frames the control agent may queue for sending; more are dropped and counted."""
PARKED_MESSAGES = 65_536
"""Messages with a key not yet known that wait for the next snapshot, at most."""
PARKED_MESSAGE_TTL_NS = 2_000_000_000
"""How long a parked message waits for its key before it is dropped and counted (the default
of ``appliance.parked_ttl_ms``)."""
AUTH_REPLAY_WINDOW = 1_024
"""Auth sequence numbers per source remembered below the highest accepted (replay window)."""
AUTH_MAX_LINKS = 4_096
"""Replay windows (one per link: sender, receiver) an appliance keeps per plane; a frame of
one more link is refused (``links_full``). Only holders of the fabric key create windows."""
DISCOVERY_HELLO_REPLY_NS = 20_000_000
"""A neighbour's discovery HELLO (it does not know our node id yet) is answered with a HELLO
bound to its node id at most this often (a replayed one makes us send no more than this)."""
NEIGHBOUR_ECHO_NS = 5_000_000_000
"""A neighbour's HELLO is echoed back (an ECHO carrying its send time, from which it works out
``rtt_us``) at most this often (5 s), not every heartbeat: each admin frame costs an idle appliance
a trip between its data path and its control plane."""
AUTH_LOG_INTERVAL_NS = 10_000_000_000
"""A rejected admin frame is logged at most once per source per this interval."""
CONTROL_TABLES_INTERVAL_NS = 2_000_000
"""The control agent compiles the data path's tables at most this often: changes that arrive
closer together (subscriptions, logins, interest) share one table build and one snapshot, and
their answers wait for it (each build costs the control plane a compile and the data path a
table swap; at 1,000 subscribe/unsubscribe requests a second one per request took half a core
of the data path's process)."""
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
CLIENT_SESSION_DEAD_MIN_MS = 3 * CLIENT_HEARTBEAT_INTERVAL_NS // 1_000_000
"""The least ``clients.session_dead_ms``: three client heartbeats, so one late or lost
heartbeat never logs an idle client out."""
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
"""Messages each guaranteed stream's sender keeps for retransmission (a power of two); the
default of ``appliance.retransmit_buffer_messages``."""
CACHE_NAK_MESSAGES_PER_NAK = 1_024
"""NAKed messages a guaranteed sender asks its appliance's cache for per NAK (those its
retransmission buffer no longer holds); the rest wait for the receiver's next NAK
(docs/reliability.md, "NAKs served from the cache")."""
CACHE_NAK_MESSAGES_PER_S = 65_536
"""NAKed messages the data path asks the cache for per second, all senders together (a token
bucket of one second's worth); what is over it is counted ``nak_cache_refused``."""
CACHE_NAK_REQUESTS = 64
"""Requests to the cache waiting for its answer at most; one more is refused."""
CACHE_NAK_ANSWER_NS = 1_000_000_000
"""A request the cache has not answered within this is forgotten (its messages can be asked
for again); half the receivers' recovery bound."""
CACHE_NAK_LINGER_NS = 100_000_000
"""A message resent from the cache is not asked of it again for this long: the receiver's
NAK retries (every 20 .. 200 ms) sent before the retransmission reached it."""
CACHE_NAK_MAP_RUNS = 4_096
"""Per guaranteed sender: runs of its sequences mapped to the cache's (a run is a stretch of
consecutive messages both took); the oldest go first."""
GUARANTEED_UDP_FRAME_BYTES = 1_472
"""Frames of guaranteed streams towards UDP clients: one datagram on an Ethernet MTU, so a
lost packet costs one small frame (shared-memory clients get CLIENT_MAX_FRAME_BYTES)."""
GUARANTEED_NAK_ANSWER_BYTES_PER_S = 4 * 1024 * 1024
"""What the NAKs of one requester (an appliance, or a client session) can make this
appliance resend per second, over all the streams it sends to that requester; the rest of a
NAK waits for the requester's next NAK (counted ``guaranteed_retransmits_limited``)."""
GUARANTEED_NAK_ANSWER_BURST_BYTES = 256 * 1024
"""...and at once: the most one NAK can make this appliance resend (a 48-byte NAK: at most
this much, then GUARANTEED_NAK_ANSWER_BYTES_PER_S)."""
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

MQTT_MAX_CONNECTIONS = 64
"""MQTT connections one edge holds (``mqtt.max_connections``); the connections of one P&M
identity share one client session, so at most ``MQTT_MAX_CONNECTIONS_LIMIT`` and the
process's open-file limit (checked when the MQTT server starts)."""
MQTT_MAX_CONNECTIONS_LIMIT = 100_000
"""The largest ``mqtt.max_connections`` and ``mqtt.max_offline_sessions``."""
MQTT_MAX_PACKET_BYTES = 65_536
"""Largest MQTT packet the edge accepts (``mqtt.max_packet_bytes``); a larger one is refused
and its connection closed."""
MQTT_MAX_SUBSCRIPTIONS = 64
"""Topic filters one MQTT connection may hold (``mqtt.max_subscriptions``)."""
MQTT_MAX_INFLIGHT = 64
"""QoS 1/2 messages to one MQTT client awaiting its acknowledgement, and QoS 2 messages from
it awaiting PUBREL (``mqtt.max_inflight``); beyond, deliveries wait in the connection's
queue (``mqtt.max_queued``) and QoS 2 publishes are refused."""
MQTT_MAX_QUEUED = 1_000
"""QoS 1/2 messages queued for one MQTT client while its inflight window is full
(``mqtt.max_queued``); beyond, deliveries are dropped and counted."""
MQTT_MAX_RETAINED = 10_000
"""Retained messages the edge keeps (``mqtt.max_retained``)."""
MQTT_MAX_RETAINED_BYTES = 16 * 1024 * 1024
"""Bytes of retained payloads and topics the edge keeps (``mqtt.max_retained_bytes``)."""
MQTT_CONNECT_TIMEOUT_MS = 10_000
"""A connection that has not sent CONNECT this long after it opened is closed
(``mqtt.connect_timeout_ms``)."""
MQTT_SEND_BUFFER_BYTES = 1024 * 1024
"""Bytes queued towards one MQTT client before further QoS 0 deliveries to it are dropped and
counted (``mqtt.send_buffer_bytes``)."""
MQTT_MAX_OFFLINE_SESSIONS = 64
"""Persistent MQTT sessions kept while their client is away (``mqtt.max_offline_sessions``);
they hold no client session of their own (their identity's shared one), at most
``MQTT_MAX_CONNECTIONS_LIMIT``."""
MQTT_MAX_SESSION_EXPIRY_S = 86_400
"""Longest an offline persistent session is kept (``mqtt.max_session_expiry_s``): the cap of
a 5.0 Session Expiry Interval, and the expiry of a 3.1.1 persistent session."""
MQTT_EXACTLY_ONCE_WINDOW = 65_536
"""QoS 2 messages an edge remembers delivering, by their publish number, so that one a
crashed edge publishes again at start is not delivered twice (``mqtt.exactly_once_window``;
appliance/edge/mqtt/exactly_once.py); 0: none."""
MQTT_TOPIC_ALIAS_MAXIMUM = 16
"""Topic aliases a 5.0 client may set towards the edge (``mqtt.topic_alias_maximum``)."""
MQTT_SERVER_KEEP_ALIVE_S = 0
"""Longest keep-alive the edge grants a 5.0 client (``mqtt.server_keep_alive_s``); 0: the
client's own."""

MAX_NODE_ID = 2**31 - 1
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""Appliance, neighbour, group, ring and device names (whole string: ``fullmatch``)."""
FABRIC_KEY_BYTES = 32

# --- bounds of the input itself (a config is checked as strictly as a frame) ------------------
MAX_CONFIG_BYTES = 1 << 20
"""A config file, and an entitlements file, is at most this long."""
MAX_KEY_FILE_BYTES = 4_096
"""``fabric.key_file`` and ``mgmt.token_file`` are at most this long."""
MAX_NESTING = 8
"""Tables and arrays nested deeper than this are refused, before any key is looked at (the
deepest value of a valid config, ``pm.schemas.NAME.fields[i][j]``, is 6 levels down)."""
MAX_KEY_CHARS = 1_024
"""A key is 1..1,024 characters (identity and schema names are keys; P&M's document bounds
those further)."""
MAX_STRING_CHARS = 4_096
"""A string value is at most this long (a path: PATH_MAX; a pattern is shorter)."""
MAX_NAMESPACES = 4_096
MAX_NEIGHBOURS = FABRIC_MAX_ORIGINS
"""``[[neighbours]]`` entries (``FABRIC_MAX_ORIGINS`` appliances fit one fabric)."""
MAX_GROUPS = 64
"""``[[fabric.groups]]`` entries (each opens two sockets)."""
ACL_LOG_LINES_PER_S = 10
"""Audit lines of content ACL LOG verdicts the data path writes per second at most (the rest
are counted: ``content_acl_log_lines_suppressed``)."""
MAX_IDENTITIES = 16_384
MAX_PATTERNS = 16_384
"""Patterns of one list (``publish``, ``subscribe``, ``routes.duplicate``)."""
MAX_SCHEMAS = 1_024
MAX_SCHEMA_FIELDS = 1_024
MAX_SCHEMA_NAME_CHARS = 255
"""Schema and field names, as P&M's document carries them (appliance/control/documents.py)."""


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
    password: str | None = None
    """The identity's credential (``scrypt:N:r:p:SALT:HASH``, appliance/control/credentials.py)
    for logins that carry a password (the MQTT edge); None: it has none."""
    acl_class: str | None = None
    """The content ACL class (``[pm.acl_classes.NAME]``) every message it publishes must
    pass; None: none."""
    namespaces: tuple[int, ...] = (0,)
    """The namespaces it may use (each one P&M's ``appliance.namespaces`` declares)."""
    flow_policy: str | None = None
    """The flow-control policy of its subscriptions that do not ask for one
    (docs/flow-control.md); None: P&M's ``pm.flow_policy``, then the QoS's default."""
    move_on: tuple[tuple[str, float], ...] | None = None
    """``move_on = {latency_ms = ..., ...}``: the bounds on loss, latency and jitter beyond
    which its clients' sessions move to their standby (the fields of
    appliance/client/pathwatch.py ``MoveBounds``), for clients that give none of their own;
    None: only the client's."""
    scram_sha256: str | None = None
    """The identity's SCRAM-SHA-256 stored keys (``scram-sha-256:ITER:SALT:STOREDKEY:
    SERVERKEY``, appliance/control/credentials.py) for MQTT 5.0 enhanced authentication at
    the edge; None: it cannot log in that way."""


@dataclass(frozen=True)
class MqttConfig:
    """``[mqtt]``: the MQTT server of an edge appliance (docs/mqtt.md)."""

    listen: Address
    max_connections: int = MQTT_MAX_CONNECTIONS
    max_packet_bytes: int = MQTT_MAX_PACKET_BYTES
    max_subscriptions: int = MQTT_MAX_SUBSCRIPTIONS
    max_inflight: int = MQTT_MAX_INFLIGHT
    max_queued: int = MQTT_MAX_QUEUED
    max_retained: int = MQTT_MAX_RETAINED
    max_retained_bytes: int = MQTT_MAX_RETAINED_BYTES
    connect_timeout_ms: int = MQTT_CONNECT_TIMEOUT_MS
    send_buffer_bytes: int = MQTT_SEND_BUFFER_BYTES
    allow_anonymous: bool = False
    """A CONNECT without a username logs in as P&M identity ``anonymous``."""
    partial_unsubscribe: bool = False
    """Every connection's UNSUBSCRIBE of a filter narrower than one it holds carves it out
    (seed 000's partial unsubscribe); without it a 5.0 client opts in per UNSUBSCRIBE with
    the user property ``tw-partial-unsubscribe`` (appliance/edge/mqtt/handle_subscribe.py)."""
    max_offline_sessions: int = MQTT_MAX_OFFLINE_SESSIONS
    max_session_expiry_s: int = MQTT_MAX_SESSION_EXPIRY_S
    exactly_once_window: int = MQTT_EXACTLY_ONCE_WINDOW
    topic_alias_maximum: int = MQTT_TOPIC_ALIAS_MAXIMUM
    server_keep_alive_s: int = MQTT_SERVER_KEEP_ALIVE_S
    tls_listen: Address | None = None
    """MQTT over TLS; with ``tls_cert_file`` and ``tls_key_file`` (PEM)."""
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    """CAs that sign client certificates: a client may present one (required with
    ``tls_require_client_cert``)."""
    tls_require_client_cert: bool = False
    tls_identity_from_cert: bool = False
    """A verified client certificate's CN is the connection's P&M identity (no password)."""
    ws_listen: Address | None = None
    """MQTT over WebSocket (subprotocol ``mqtt``)."""
    ws_tls: bool = False
    """The WebSocket listener speaks TLS (``wss://``) with the ``tls_*`` files and rules."""
    bridges: tuple = ()
    """``[[mqtt.bridges]]`` (appliance/edge/mqtt/bridge_config.py)."""
    state_dir: Path | None = None
    """Where the edge keeps its persistent sessions, their QoS 1/2 deliveries and its retained
    messages across restarts (appliance/edge/mqtt/store.py); None: in memory only."""
    response_information: str = ""
    """Response Information for a 5.0 client that asks (``{client_id}`` its identifier);
    "" sends none."""
    retained_namespace: int | None = None
    """Retained messages shared with the other edges through this namespace
    (appliance/edge/mqtt/retain_share.py); None: this edge's own only."""
    retained_identity: str = ""
    """The P&M identity of the session that shares them (with ``retained_namespace``)."""
    shared_namespace: int | None = None
    """Shared subscription groups span the edges that announce their members through this
    namespace (appliance/edge/mqtt/shared_view.py); None: groups are per edge."""
    shared_identity: str = ""
    """The P&M identity of the session that announces them (with ``shared_namespace``)."""


@dataclass(frozen=True)
class ApplianceConfig:
    name: str
    node_id: int
    role: str = "core"
    namespaces: tuple[int, ...] = (0,)
    dataplane: str = "process"
    """Where the data path runs: ``"process"`` (its own, forked at start) or ``"thread"`` (a
    thread of the appliance's process, sharing its interpreter lock with the control plane)."""
    idle: str = "block"
    idle_spin_us: int = IDLE_SPIN_US
    priority: int = DATAPATH_PRIORITY
    dataplane_cpus: tuple[int, ...] = ()
    """The CPUs the data path may run on (empty: wherever the OS schedules it)."""
    switch_interval_us: int = SWITCH_INTERVAL_US
    drain_timeout_ms: int = DRAIN_TIMEOUT_MS
    parked_ttl_ms: int = PARKED_MESSAGE_TTL_NS // 1_000_000
    retransmit_buffer_messages: int = GUARANTEED_RETRANSMIT_BUFFER_MESSAGES
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
    pm_flow_policy: str | None = None
    """``pm.flow_policy``: the flow-control policy of subscriptions that neither ask for one
    nor belong to an identity with one (docs/flow-control.md); None: the QoS's default."""
    pm_require_passwords: bool = True
    """Native logins of identities without a password are refused (the default); false is
    the anonymous mode for demos and tests: such identities log in without proof."""
    identities: dict[str, IdentityConfig] = field(default_factory=dict)
    schemas: tuple[dict[str, Any], ...] = ()
    """P&M's schemas (``Schema.to_dict`` documents), from ``[pm.schemas.NAME]``."""
    acl_classes: tuple[dict[str, Any], ...] = ()
    """P&M's content ACL classes (``{"name", "schema", "rules", "default"}``), from
    ``[pm.acl_classes.NAME]`` in the config's order (their ids in the tables: 1, 2, ...)."""
    mgmt: dict[str, Any] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None
    telemetry: Any = None
    """``[telemetry]`` (appliance/ops/telemetry/settings.py), None when absent."""
    routes: Any = None
    """``[routes]`` (appliance/ops/telemetry/settings.py)."""
    mqtt: MqttConfig | None = None
    """``[mqtt]`` (role ``edge`` only), None when absent."""
    cache: Any = None
    """``[cache]`` (appliance/cache/settings.py), None when absent (or when it only names
    a neighbour's cache: ``persist_remote``)."""
    persist_remote: str | None = None
    """``cache.remote``: the neighbour whose cache must persist this appliance's publishers'
    guaranteed messages before they are acknowledged (docs/fault-tolerance.md, "Persisted
    by a neighbour's cache"), None when not configured."""
    mirror_to: str | None = None
    """``clients.mirror_to``: the neighbour (the clients' standby appliance) this appliance
    mirrors its client sessions' subscriptions to, for the sessions whose client has a
    standby (docs/fault-tolerance.md, "The standby's mirror"); None: no mirror."""
    cache_serve_from: str | None = None
    """``cache.serve_from`` (default ``cache.remote``): the neighbour whose cache answers the
    replay and durable requests of this appliance's clients that no cache here keeps
    (docs/fault-tolerance.md, "Replay and durable subscriptions from a neighbour's cache"),
    None when not configured."""
    routing_content: str = "flood"
    """``routing.content``: ``"flood"`` or ``"rendezvous"`` (one value per fabric)."""
    popular_share: float = 0.5
    """``routing.popular_share``: seed 001's k (an attribute carried by more than this share
    of events is popular)."""
    counts_interval_ms: int = RENDEZVOUS_COUNTS_INTERVAL_MS


# --- checking ----------------------------------------------------------------------------------

def _fail(key: str, what: str) -> ConfigError:
    return ConfigError(f"{key}: {what}")


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _check_tree(value: object, key: str = "", depth: int = 0) -> None:
    """The shape of the whole document before any key is read: tables and arrays nested at
    most ``MAX_NESTING`` deep, keys of 1..``MAX_KEY_CHARS`` characters, strings of at most
    ``MAX_STRING_CHARS``, integers of 64 bits (TOML's own bound)."""
    if isinstance(value, dict | list):
        if depth >= MAX_NESTING:
            raise _fail(key, f"tables and arrays nested deeper than {MAX_NESTING} levels")
        if isinstance(value, dict):
            for name, item in value.items():
                if not isinstance(name, str) or not 0 < len(name) <= MAX_KEY_CHARS:
                    raise _fail(key or "(top level)", f"a key must be 1..{MAX_KEY_CHARS} "
                                f"characters, not {show(name)}")
                _check_tree(item, _join(key, name), depth + 1)
        else:
            for i, item in enumerate(value):
                _check_tree(item, f"{key}[{i}]", depth + 1)
    elif isinstance(value, str):
        if len(value) > MAX_STRING_CHARS:
            raise _fail(key, f"a string of {len(value)} characters; at most {MAX_STRING_CHARS}")
        if "\x00" in value:
            raise _fail(key, "a string holding a NUL character")
    elif isinstance(value, int) and not isinstance(value, bool) and not (
            -(2**63) <= value < 2**63):
        raise _fail(key, f"{show(value)} does not fit 64 bits (TOML integers are 64-bit)")


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
        raise _fail(prefix + key, f"must be an integer in [{low}, {high}], not {show(value)}")
    return value


def _str(table: dict, key: str, prefix: str, default: str | None, choices: tuple[str, ...] = ()
         ) -> str | None:
    value = table.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or (choices and value not in choices):
        want = f"one of {', '.join(repr(c) for c in choices)}" if choices else "a string"
        raise _fail(prefix + key, f"must be {want}, not {show(value)}")
    return value


def _list(value: object, key: str, most: int, what: str) -> list:
    """An array of at most ``most`` values (``what`` says what it holds)."""
    if not isinstance(value, list):
        raise _fail(key, f"must be an array of {what}, not {show(value)}")
    if len(value) > most:
        raise _fail(key, f"{len(value)} values; at most {most}")
    return value


_IPV4_RE = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")
_ADDRESS_RE = re.compile(r"([0-9.]{7,15}):([0-9]{1,5})")
"""``IPv4:port`` in ASCII digits, nothing around it (no spaces, signs, '_' or other digits)."""
BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def _ipv4(text: object, key: str) -> ipaddress.IPv4Address:
    """A numeric IPv4 address, four decimal numbers 0..255 without leading zeros."""
    if not isinstance(text, str) or not _IPV4_RE.fullmatch(text):
        raise _fail(key, f"{show(text)} is not a numeric IPv4 address such as \"10.0.0.1\" "
                    "(names are not resolved)")
    try:
        return ipaddress.IPv4Address(text)
    except ValueError:
        raise _fail(key, f"{text!r} is not an IPv4 address (four numbers 0..255, no leading "
                    "zeros)") from None


def _address(text: object, key: str, form: str, example: str, low_port: int
             ) -> tuple[ipaddress.IPv4Address, int]:
    match = _ADDRESS_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise _fail(key, f"must be \"{form}:port\" such as \"{example}\" (digits only, no "
                    f"spaces), not {show(text)}")
    address = _ipv4(match[1], key)
    port_text = match[2]
    port = int(port_text)
    if port_text != str(port):
        raise _fail(key, f"port {port_text!r} has a leading zero; write {port}")
    if not low_port <= port <= 65535:
        raise _fail(key, f"port {port} is outside [{low_port}, 65535]")
    return address, port


def parse_address(text: object, key: str, *, allow_zero_port: bool = False,
                  destination: bool = False, ipv6: bool = False) -> Address:
    """``"10.0.0.1:47470"`` or ``"localhost:47470"`` -> ``("10.0.0.1", 47470)``: the host an
    IPv4 address or a host name, resolved now (appliance/addresses.py; ``[IPv6]`` too with
    ``ipv6``: the TCP listeners), and a port 1..65535 (0 too with ``allow_zero_port``: the
    kernel picks one). Multicast and the broadcast address are refused (a unicast socket is
    bound or sent to); so is the wildcard for a ``destination`` (an address frames are sent
    to)."""
    from appliance.addresses import host_address

    address, port = host_address(text, key, ipv6=ipv6)
    if not (0 if allow_zero_port else 1) <= port <= 65535:
        raise _fail(key, f"port {port} is outside [{0 if allow_zero_port else 1}, 65535]")
    if address.is_multicast:
        raise _fail(key, f"{address} is a multicast group; give a unicast address")
    if address == BROADCAST:
        raise _fail(key, f"{address} is the broadcast address; give a unicast address")
    if destination and address.is_unspecified:
        raise _fail(key, f"{address} is the wildcard; give the address frames are sent to")
    return str(address), port


def local_client_url(config: ApplianceConfig) -> str:
    """Where a client inside the appliance's own process reaches its client endpoint (the
    MQTT edge's native sessions, the cache's session): ``clients.udp`` (127.0.0.1 for the
    wildcard), else ``clients.shm``."""
    if config.clients_udp is not None:
        host, port = config.clients_udp
        return f"udp://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    return f"shm://{config.clients_shm}"


def _patterns(value: object, key: str) -> tuple[str, ...]:
    from datapath.topics.syntax import dot_subject_refusal

    patterns = topic_patterns(value, key, MAX_PATTERNS)
    for pattern in patterns:
        refusal = dot_subject_refusal(pattern, "pattern")
        if refusal is not None:
            raise _fail(key, refusal)
    return patterns


def _identities(table: object, key: str) -> dict[str, IdentityConfig]:
    if not isinstance(table, dict):
        raise _fail(key, "must be a table of identities ([pm.identities.NAME])")
    if len(table) > MAX_IDENTITIES:
        raise _fail(key, f"{len(table)} identities; at most {MAX_IDENTITIES}")
    out = {}
    for identity, spec in table.items():
        where = f"{key}.{identity}"
        if not isinstance(spec, dict):
            raise _fail(where, "must be a table with publish = [...] and subscribe = [...]")
        _known(spec, {"publish", "subscribe", "password", "acl_class", "namespaces",
                      "flow_policy", "move_on", "scram_sha256"}, where + ".")
        acl_class = spec.get("acl_class")
        if acl_class is not None and not isinstance(acl_class, str):
            raise _fail(where + ".acl_class", f"must be the name of a [pm.acl_classes.NAME] "
                        f"table, not {show(acl_class)}")
        from appliance.control.credentials import parse_hash, parse_scram

        password = _credential(spec, "password", where, parse_hash)
        scram = _credential(spec, "scram_sha256", where, parse_scram)
        out[identity] = IdentityConfig(_patterns(spec.get("publish", []), where + ".publish"),
                                       _patterns(spec.get("subscribe", []), where + ".subscribe"),
                                       password, acl_class,
                                       _namespaces(spec.get("namespaces", [0]),
                                                   where + ".namespaces"),
                                       _flow_policy(spec, where + ".flow_policy"),
                                       _move_on(spec.get("move_on"), where + ".move_on"),
                                       scram)
    return out


def _credential(spec: dict, key: str, where: str, parse: Callable[[object], object]
                ) -> str | None:
    """An identity's stored credential ``key`` (None when absent), checked by ``parse``
    (appliance/control/credentials.py: ``CredentialError`` names what is wrong)."""
    from appliance.control.credentials import CredentialError

    value = spec.get(key)
    if value is not None:
        try:
            parse(value)
        except CredentialError as exc:
            raise _fail(f"{where}.{key}", str(exc)) from None
    return value


def _move_on(table: object, key: str) -> tuple[tuple[str, float], ...] | None:
    """An identity's ``move_on`` table, checked whole as the client API's ``MoveBounds``
    checks it, as (field, value) pairs; None when absent."""
    if table is None:
        return None
    from dataclasses import fields

    from appliance.client.errors import ClientError
    from appliance.client.pathwatch import MoveBounds

    names = [f.name for f in fields(MoveBounds)]
    if not isinstance(table, dict):
        raise _fail(key, f"must be a table of {', '.join(names)}, not {show(table)}")
    _known(table, set(names), key + ".")
    try:
        MoveBounds(**table)
    except ClientError as exc:
        raise _fail(key, str(exc).removeprefix("move_on: ")) from None
    return tuple((name, float(table[name])) for name in names if name in table)


def _flow_policy(table: dict, key: str) -> str | None:
    """A ``flow_policy`` key: one of the policies' names, or absent (None)."""
    from datapath.flow_control import POLICY_NAMES

    name = table.get("flow_policy")
    if name is None:
        return None
    if not isinstance(name, str) or name not in POLICY_NAMES:
        raise _fail(key, f"{show(name)} is not a flow-control policy; use one of "
                    f"{', '.join(POLICY_NAMES)}")
    return name


def _namespaces(value: object, key: str) -> tuple[int, ...]:
    """A non-empty list of distinct namespaces, each in [0, 2^32)."""
    namespaces = _list(value, key, MAX_NAMESPACES, "namespaces")
    if (not namespaces
            or any(isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**32
                   for n in namespaces)):
        raise _fail(key, "must be a non-empty list of integers in [0, 2^32)")
    if len(set(namespaces)) != len(namespaces):
        raise _fail(key, "names a namespace twice")
    return tuple(namespaces)


def _mqtt(doc: dict, role: str, clients_udp: Address | None, shm: str | None,
          max_sessions: int, max_subscriptions: int, base: Path,
          identities: dict[str, IdentityConfig] | None = None) -> MqttConfig | None:
    """``[mqtt]``: an edge's MQTT server (docs/mqtt.md)."""
    if "mqtt" not in doc:
        return None
    mq = _table(doc, "mqtt", {"listen", "max_connections", "max_packet_bytes",
                              "max_subscriptions", "max_inflight", "max_queued",
                              "max_retained",
                              "max_retained_bytes", "connect_timeout_ms", "send_buffer_bytes",
                              "allow_anonymous", "partial_unsubscribe",
                              "max_offline_sessions", "max_session_expiry_s",
                              "exactly_once_window",
                              "topic_alias_maximum", "server_keep_alive_s",
                              "tls_listen",
                              "tls_cert_file", "tls_key_file", "tls_ca_file",
                              "tls_require_client_cert",
                              "tls_identity_from_cert", "ws_listen", "ws_tls", "bridges",
                              "state_dir", "response_information", "retained_namespace",
                              "retained_identity", "shared_namespace", "shared_identity"}, "")
    p = "mqtt."
    if role != "edge":
        raise _fail("mqtt", "only for appliance.role = \"edge\" (MQTT clients connect to edges)")
    if "listen" not in mq:
        raise _fail(p + "listen", "required: \"IPv4:port\" the MQTT server listens on, such as "
                    "\"127.0.0.1:1883\"")
    listen = parse_address(mq["listen"], p + "listen", allow_zero_port=True)
    if clients_udp is None and shm is None:
        raise _fail(p + "listen", "needs clients.udp or clients.shm: the MQTT sessions of each "
                    "identity log in a client session through the edge's own client endpoint")
    flags = {}
    for key in ("allow_anonymous", "tls_require_client_cert", "tls_identity_from_cert",
                "ws_tls", "partial_unsubscribe"):
        flags[key] = mq.get(key, False)
        if not isinstance(flags[key], bool):
            raise _fail(p + key, "must be true or false")
    tls = _mqtt_tls(mq, p, base, flags)
    ws = mq.get("ws_listen")
    ws_listen = None if ws is None else parse_address(ws, p + "ws_listen", allow_zero_port=True)
    if flags["ws_tls"] and ws is None:
        raise _fail(p + "ws_tls", "only with mqtt.ws_listen (the WebSocket listener)")
    if flags["ws_tls"] and not tls:
        raise _fail(p + "ws_tls", "needs mqtt.tls_listen and its files (the same certificate "
                    "serves wss://)")
    from appliance.edge.mqtt.bridge_config import parse_bridges

    bridges = parse_bridges(mq.get("bridges", []), base, identities)
    state_dir = None
    if "state_dir" in mq:
        state_dir = path_of(mq["state_dir"], p + "state_dir", base, "a directory path")
        if state_dir.exists() and not state_dir.is_dir():
            raise _fail(p + "state_dir", f"{state_dir} is not a directory")
    return MqttConfig(
        **_retained_share(mq, p, identities), **_shared_view(mq, p, identities),
        state_dir=state_dir, response_information=_response_information(mq, p),
        **tls, ws_listen=ws_listen, ws_tls=flags["ws_tls"], bridges=bridges,
        tls_require_client_cert=flags["tls_require_client_cert"],
        tls_identity_from_cert=flags["tls_identity_from_cert"],
        max_offline_sessions=_int(mq, "max_offline_sessions", p, MQTT_MAX_OFFLINE_SESSIONS, 0,
                                  MQTT_MAX_CONNECTIONS_LIMIT),
        max_session_expiry_s=_int(mq, "max_session_expiry_s", p, MQTT_MAX_SESSION_EXPIRY_S, 0,
                                  2**32 - 2),
        exactly_once_window=_int(mq, "exactly_once_window", p, MQTT_EXACTLY_ONCE_WINDOW, 0,
                                 10_000_000),
        topic_alias_maximum=_int(mq, "topic_alias_maximum", p, MQTT_TOPIC_ALIAS_MAXIMUM, 0,
                                 65_535),
        server_keep_alive_s=_int(mq, "server_keep_alive_s", p, MQTT_SERVER_KEEP_ALIVE_S, 0,
                                 65_535),
        listen=listen,
        max_connections=_int(mq, "max_connections", p, MQTT_MAX_CONNECTIONS, 1,
                             MQTT_MAX_CONNECTIONS_LIMIT),
        max_packet_bytes=_int(mq, "max_packet_bytes", p, MQTT_MAX_PACKET_BYTES, 64,
                              16 * 1024 * 1024),
        max_subscriptions=_int(mq, "max_subscriptions", p,
                               min(MQTT_MAX_SUBSCRIPTIONS, max_subscriptions), 1,
                               max_subscriptions),
        max_inflight=_int(mq, "max_inflight", p, MQTT_MAX_INFLIGHT, 1, 65_535),
        max_queued=_int(mq, "max_queued", p, MQTT_MAX_QUEUED, 0, 1_000_000),
        max_retained=_int(mq, "max_retained", p, MQTT_MAX_RETAINED, 0, 10_000_000),
        max_retained_bytes=_int(mq, "max_retained_bytes", p, MQTT_MAX_RETAINED_BYTES, 0,
                                1 << 34),
        connect_timeout_ms=_int(mq, "connect_timeout_ms", p, MQTT_CONNECT_TIMEOUT_MS, 100,
                                600_000),
        send_buffer_bytes=_int(mq, "send_buffer_bytes", p, MQTT_SEND_BUFFER_BYTES, 4_096,
                               1 << 30),
        allow_anonymous=flags["allow_anonymous"],
        partial_unsubscribe=flags["partial_unsubscribe"])


def _retained_share(mq: dict, p: str, identities: dict[str, IdentityConfig] | None
                    ) -> dict[str, Any]:
    """``mqtt.retained_namespace`` and ``mqtt.retained_identity``: both or neither."""
    return _namespace_session(mq, p, identities, "retained", "retained messages are shared")


def _shared_view(mq: dict, p: str, identities: dict[str, IdentityConfig] | None
                 ) -> dict[str, Any]:
    """``mqtt.shared_namespace`` and ``mqtt.shared_identity``: both or neither, and not the
    retained messages' namespace (each session takes everything of its namespace as its own
    kind of record)."""
    out = _namespace_session(mq, p, identities, "shared",
                             "shared subscription groups are announced")
    if out and out["shared_namespace"] == mq.get("retained_namespace"):
        raise _fail(p + "shared_namespace", f"{out['shared_namespace']} is also "
                    "mqtt.retained_namespace: give the group announcements a namespace of "
                    "their own")
    return out


def _namespace_session(mq: dict, p: str, identities: dict[str, IdentityConfig] | None,
                       kind: str, what: str) -> dict[str, Any]:
    """``mqtt.KIND_namespace`` and ``mqtt.KIND_identity``: both or neither."""
    ns_key, id_key = f"{kind}_namespace", f"{kind}_identity"
    if ns_key not in mq and id_key not in mq:
        return {}
    for key in (ns_key, id_key):
        if key not in mq:
            other = ({ns_key, id_key} - {key}).pop()
            raise _fail(p + key, f"required with mqtt.{other}: {what} through a namespace "
                        "by a session of a P&M identity")
    namespace = _int(mq, ns_key, p, 1, 1, 2**32 - 1)
    identity = mq[id_key]
    if not isinstance(identity, str) or not identity:
        raise _fail(p + id_key, "must be the name of a P&M identity")
    if identities and identity not in identities:
        raise _fail(p + id_key, f"{identity!r} is not in pm.identities")
    return {ns_key: namespace, id_key: identity}


def _response_information(mq: dict, p: str) -> str:
    """``mqtt.response_information``: the topic prefix a 5.0 client that asks for Response
    Information gets (``{client_id}`` replaced by its client identifier); "" sends none."""
    key = p + "response_information"
    value = mq.get("response_information", "")
    if not isinstance(value, str):
        raise _fail(key, "must be a string: a topic prefix such as \"responses/{client_id}/\"")
    if any(c in value for c in "+#\0"):
        raise _fail(key, f"{value!r} is not a topic name prefix: no '+', '#' or NUL")
    if value.replace("{client_id}", "").count("{") or value.replace(
            "{client_id}", "").count("}"):
        raise _fail(key, f"{value!r}: the only placeholder is {{client_id}}")
    if len(value.encode()) > 1024:
        raise _fail(key, "at most 1024 bytes")
    return value


def _mqtt_tls(mq: dict, p: str, base: Path, flags: dict) -> dict[str, Any]:
    """``mqtt.tls_*``: the TLS listener's address and PEM files (each must exist)."""
    files = {k: existing_file(mq[k], p + k, base) if k in mq else None
             for k in ("tls_cert_file", "tls_key_file", "tls_ca_file")}
    if "tls_listen" not in mq:
        for key in [*files, "tls_require_client_cert", "tls_identity_from_cert"]:
            if mq.get(key):
                raise _fail(p + key, "only with mqtt.tls_listen (the TLS listener)")
        return {}
    listen = parse_address(mq["tls_listen"], p + "tls_listen", allow_zero_port=True)
    for key in ("tls_cert_file", "tls_key_file"):
        if files[key] is None:
            raise _fail(p + key, "required with mqtt.tls_listen: the server's PEM file")
    if files["tls_ca_file"] is None:
        for key in ("tls_require_client_cert", "tls_identity_from_cert"):
            if flags[key]:
                raise _fail(p + key, "needs mqtt.tls_ca_file (the CAs of client certificates)")
    return {"tls_listen": listen, **files}


FIELD_FORM = "[name, offset, type] or [name, offset, type, width]"


def _schema_field(spec: object, key: str) -> tuple[str, int, str, int]:
    """One field of ``pm.schemas.NAME.fields``: its shape, types and bounds (it must end
    inside the largest message payload)."""
    from datapath.protocol.message_layout import MAX_PAYLOAD_BYTES
    from nic_offload.schema import TYPE_NAMES

    if not isinstance(spec, list) or len(spec) not in (3, 4):
        raise _fail(key, f"must be {FIELD_FORM}, not {show(spec)}")
    name, offset, type_name = spec[0], spec[1], spec[2]
    if not isinstance(name, str) or not name.isidentifier() or (
            len(name) > MAX_SCHEMA_NAME_CHARS):
        raise _fail(key, f"the name must be an identifier of at most {MAX_SCHEMA_NAME_CHARS} "
                    f"characters such as \"price\", not {show(name)}")
    ftype = TYPE_NAMES.get(type_name.lower()) if isinstance(type_name, str) else None
    if ftype is None:
        raise _fail(key, f"the type must be one of {', '.join(TYPE_NAMES)}, not "
                    f"{show(type_name)}")
    fixed = ftype.value[1]
    if len(spec) == 4:
        width = spec[3]
        if isinstance(width, bool) or not isinstance(width, int) or not (
                1 <= width <= MAX_PAYLOAD_BYTES):
            raise _fail(key, f"the width must be an integer in [1, {MAX_PAYLOAD_BYTES}], not "
                        f"{show(width)}")
        if fixed and width != fixed:
            raise _fail(key, f"a {ftype.name.lower()} field is {fixed} bytes wide, not {width}")
    elif not fixed:
        raise _fail(key, f"a {ftype.name.lower()} field needs a width: [name, offset, "
                    f"\"{ftype.name.lower()}\", width]")
    else:
        width = fixed
    high = MAX_PAYLOAD_BYTES - width
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= high:
        raise _fail(key, f"the offset must be an integer in [0, {high}] (the field ends inside "
                    f"a payload of at most {MAX_PAYLOAD_BYTES} bytes), not {show(offset)}")
    return name, offset, type_name, width


def _schemas(table: object, key: str) -> tuple[dict[str, Any], ...]:
    from nic_offload.errors import OffloadError
    from nic_offload.schema import Schema

    if not isinstance(table, dict):
        raise _fail(key, "must be a table of schemas ([pm.schemas.NAME])")
    if len(table) > MAX_SCHEMAS:
        raise _fail(key, f"{len(table)} schemas; at most {MAX_SCHEMAS}")
    out, ids = [], set()
    for name, spec in table.items():
        where = f"{key}.{name}"
        if not name.isprintable() or len(name) > MAX_SCHEMA_NAME_CHARS:
            raise _fail(where, f"a schema's name must be printable text of at most "
                        f"{MAX_SCHEMA_NAME_CHARS} characters")
        if not isinstance(spec, dict):
            raise _fail(where, f"must be a table with id = N and fields = [{FIELD_FORM}, ...]")
        _known(spec, {"id", "fields"}, where + ".")
        schema_id = _int(spec, "id", where + ".", 0, 1, 65_535)
        if schema_id in ids:
            raise _fail(where + ".id", f"schema id {schema_id} is used twice")
        ids.add(schema_id)
        fields = _list(spec.get("fields"), where + ".fields", MAX_SCHEMA_FIELDS, FIELD_FORM)
        checked = [_schema_field(f, f"{where}.fields[{i}]") for i, f in enumerate(fields)]
        try:  # distinct names, no overlap
            schema = Schema.of(name, schema_id, checked)
        except OffloadError as exc:
            raise _fail(where + ".fields", str(exc)) from None
        out.append(schema.to_dict())
    return tuple(out)


_ACL_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_ACL_CLASSES = 256
"""``[pm.acl_classes.NAME]`` tables P&M may define (the per-class counters stay bounded)."""
MAX_ACL_RULES = 256
"""Rules one class may hold."""


def _acl_classes(table: object, key: str, schemas: tuple[dict[str, Any], ...]
                 ) -> tuple[dict[str, Any], ...]:
    """``pm.acl_classes``: each class's schema, rules and default, compiled once against the
    pipeline's ACL fields (appliance/control/pm.py ``acl_class_of``)."""
    from appliance.control.pm import ACL_VERDICTS, acl_class_of
    from nic_offload.errors import OffloadError
    from nic_offload.schema import Schema

    if not isinstance(table, dict):
        raise _fail(key, "must be a table of content ACL classes ([pm.acl_classes.NAME])")
    if len(table) > MAX_ACL_CLASSES:
        raise _fail(key, f"{len(table)} classes; at most {MAX_ACL_CLASSES}")
    by_name = {s["name"]: Schema.from_dict(s) for s in schemas}
    out = []
    for i, (name, spec) in enumerate(table.items(), 1):
        where = f"{key}.{name}"
        if not _ACL_NAME_RE.fullmatch(name):
            raise _fail(where, "a class's name is 1..64 letters, digits, '.', '_' or '-'")
        if not isinstance(spec, dict):
            raise _fail(where, "must be a table with schema = \"NAME\" and rules = "
                        "[\"(CONDITION, ACCEPT|REJECT|LOG[, ON_MISS])\", ...]")
        _known(spec, {"schema", "rules", "default"}, where + ".")
        schema = _str(spec, "schema", where + ".", None)
        if schema is None or schema not in by_name:
            raise _fail(where + ".schema", f"must name a [pm.schemas.NAME] table (known: "
                        f"{', '.join(sorted(by_name)) or 'none'}), not {show(schema)}")
        rules = _list(spec.get("rules", []), where + ".rules", MAX_ACL_RULES,
                      "rule strings \"(CONDITION, ACCEPT|REJECT|LOG[, ON_MISS])\"")
        for j, rule in enumerate(rules):
            if not isinstance(rule, str):
                raise _fail(f"{where}.rules[{j}]", f"must be a string, not {show(rule)}")
        default = _str(spec, "default", where + ".", "REJECT", ACL_VERDICTS)
        entry = {"name": name, "schema": schema, "rules": list(rules), "default": default}
        for j, rule in enumerate(rules):  # the first bad rule names its own key
            try:
                acl_class_of({**entry, "rules": [rule]}, by_name, i)
            except OffloadError as exc:
                raise _fail(f"{where}.rules[{j}]", str(exc).removeprefix("offload: ")) from None
        try:  # the whole class: its states must fit the tables
            acl_class_of(entry, by_name, i)
        except OffloadError as exc:
            raise _fail(where + ".rules", str(exc).removeprefix("offload: ")) from None
        out.append(entry)
    return tuple(out)


_HEX_KEY_RE = re.compile(f"[0-9A-Fa-f]{{{2 * FABRIC_KEY_BYTES}}}")


def _fabric_key(text: str, key: str) -> bytes:
    """The fabric key of a hex text (surrounding whitespace is dropped). Never quoted in a
    message: it is a secret."""
    text = text.strip()
    if not _HEX_KEY_RE.fullmatch(text):
        what = (f"{len(text)} characters" if len(text) != 2 * FABRIC_KEY_BYTES
                else "a character that is not a hex digit")
        raise _fail(key, f"the fabric key must be {2 * FABRIC_KEY_BYTES} hex digits "
                    f"({FABRIC_KEY_BYTES} bytes) and nothing else, not {what}")
    return bytes.fromhex(text)


IFNAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")


def parse_group_address(text: object, key: str) -> Address:
    """``"239.77.0.1:47480"`` -> ``("239.77.0.1", 47480)``: a multicast group and a port."""
    address, port = _address(text, key, "group", "239.77.0.1:47480", 1)
    if not address.is_multicast:
        raise _fail(key, f"{address} is not a multicast group (224.0.0.0/4); use e.g. "
                    "239.77.0.1")
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
    if not _IPV4_RE.fullmatch(value):
        if not IFNAME_RE.fullmatch(value) or value[0].isdigit():
            raise _fail(key, f"{show(value)} is neither an IPv4 address nor an interface "
                        "name")
        return value
    address = _ipv4(value, key)
    if address.is_unspecified or address.is_multicast or address == BROADCAST:
        raise _fail(key, f"{value} is not one interface's address; the wildcard would send "
                    "through the default route: give this host's address on the fabric")
    return str(address)


def _groups(value: object) -> tuple[GroupConfig, ...]:
    value = _list(value, "fabric.groups", MAX_GROUPS, "tables ([[fabric.groups]])")
    out: list[GroupConfig] = []
    for i, g in enumerate(value):
        where = f"fabric.groups[{i}]."
        if not isinstance(g, dict):
            raise _fail(f"fabric.groups[{i}]", "must be a table with name, address and "
                        "interface")
        _known(g, {"name", "address", "interface", "ttl", "loopback"}, where)
        gname = g.get("name")
        if not isinstance(gname, str) or not NAME_RE.fullmatch(gname):
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
    """An interface's IPv4 address, given as one or as a host name (resolved now)."""
    if isinstance(value, str) and value and not _IPV4_RE.fullmatch(value):
        from appliance.addresses import resolve

        address = resolve(value, key, ipv6=False)
    else:
        address = _ipv4(value, key)
    if address.is_unspecified or address.is_multicast or address == BROADCAST:
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
    if device is not None and not NAME_RE.fullmatch(device):
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


def _entitlements(value: object, key: str, base: Path) -> dict[str, IdentityConfig]:
    """``pm.entitlements``: a TOML file of ``[identities.NAME]`` tables."""
    path = existing_file(value, key, base)
    ents = parse_toml(read_text(path, key, MAX_CONFIG_BYTES), path, MAX_NESTING, key)
    try:
        _check_tree(ents)
        _known(ents, {"identities"}, "")
        return _identities(ents.get("identities", {}), "identities")
    except ConfigError as exc:
        raise ConfigError(f"{key}: {path}: {str(exc).removeprefix('config: ')}") from None


def _token(text: object, key: str, path: Path | None = None) -> None:
    """A management token: printable ASCII (it travels in an HTTP header), not empty."""
    what = "must be a non-empty string" if path is None else f"{path} is empty; put the token in it"
    if not isinstance(text, str) or not text.strip():
        raise _fail(key, what)
    token = text.strip()
    if not (token.isascii() and token.isprintable()):
        raise _fail(key, "the token must be printable ASCII on one line (it is sent in an "
                    "HTTP header)")


def _mgmt(doc: dict, base: Path) -> dict[str, Any]:
    """``[mgmt]``: checked here, read by the management API when it starts."""
    mgmt = _table(doc, "mgmt", {"listen", "token", "token_file", "tls_cert_file",
                                "tls_key_file", "tls_client_ca_file", "process"}, "")
    p = "mgmt."
    if "process" in mgmt and not isinstance(mgmt["process"], bool):
        raise _fail(p + "process", "must be true (the API runs in a process of its own) or "
                    "false (on a thread of the appliance's process)")
    if "listen" in mgmt:
        parse_address(mgmt["listen"], p + "listen", allow_zero_port=True, ipv6=True)
    if "token" in mgmt and "token_file" in mgmt:
        raise _fail(p + "token", "give mgmt.token or mgmt.token_file, not both")
    if "token" in mgmt:
        _token(mgmt["token"], p + "token")
    if "token_file" in mgmt:
        path = existing_file(mgmt["token_file"], p + "token_file", base)
        _token(read_text(path, p + "token_file", MAX_KEY_FILE_BYTES), p + "token_file", path)
    out = dict(mgmt)
    tls = [k for k in ("tls_cert_file", "tls_key_file") if k in mgmt]
    if len(tls) == 1 or ("tls_client_ca_file" in mgmt and not tls):
        raise _fail(p + (tls[0] if tls else "tls_client_ca_file"),
                    "TLS needs mgmt.tls_cert_file and mgmt.tls_key_file together (and "
                    "mgmt.tls_client_ca_file only with them)")
    if tls:
        from appliance.ops.tls import TlsFileError, server_context

        for key in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            if key in mgmt:
                out[key] = str(existing_file(mgmt[key], p + key, base))
        try:
            server_context(out["tls_cert_file"], out["tls_key_file"],
                           out.get("tls_client_ca_file"))
        except TlsFileError as exc:
            raise _fail(p + "tls_cert_file", str(exc)) from None
    return out


def node_id_of(name: str) -> int:
    """The default node id of an appliance name: stable across restarts and machines."""
    digest = hashlib.blake2b(name.encode(), digest_size=4, person=b"topicwire-node").digest()
    return int.from_bytes(digest, "big") % MAX_NODE_ID + 1


def parse_config(doc: dict, source: Path | None = None) -> ApplianceConfig:
    """Check a parsed TOML document (see the module docstring): returns the config or raises
    ``ConfigError``, whatever the document holds."""
    from appliance.cache.settings import parse_cache
    from appliance.ops.telemetry.settings import parse_routes, parse_telemetry

    if not isinstance(doc, dict):
        raise ConfigError(f"the config must be a table of tables, not {show(doc)}")
    _check_tree(doc)
    base = source.parent if source else Path.cwd()
    _known(doc, {"appliance", "fabric", "neighbours", "clients", "pm", "mgmt", "log",
                 "telemetry", "routes", "mqtt", "cache", "routing"}, "")
    app = _table(doc, "appliance", {"name", "id", "role", "namespaces", "dataplane", "idle",
                                    "idle_spin_us",
                                    "priority", "dataplane_cpus", "switch_interval_us",
                                    "drain_timeout_ms",
                                    "parked_ttl_ms", "retransmit_buffer_messages",
                                    "heartbeat_interval_ms",
                                    "neighbour_dead_ms", "lsa_refresh_ms"}, "")
    p = "appliance."
    name = app.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise _fail(p + "name", "required: 1..64 letters, digits, '.', '_' or '-'"
                    + ("" if name is None else f", not {show(name)}"))
    node_id = _int(app, "id", p, node_id_of(name), 1, MAX_NODE_ID)
    role = _str(app, "role", p, "core", ("core", "edge"))
    namespaces = _namespaces(app.get("namespaces", [0]), p + "namespaces")
    dataplane = _str(app, "dataplane", p, "process", ("process", "thread"))
    idle = _str(app, "idle", p, "block", ("block", "busy", "backoff", "sleep"))
    idle_spin_us = _int(app, "idle_spin_us", p, IDLE_SPIN_US, 0, 1_000_000)
    priority = _int(app, "priority", p, DATAPATH_PRIORITY, -20, 19)
    cpus = _list(app.get("dataplane_cpus", []), p + "dataplane_cpus", MAX_CPUS, "CPU numbers")
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < MAX_CPUS
               for c in cpus) or len(set(cpus)) != len(cpus):
        raise _fail(p + "dataplane_cpus", "must be an array of distinct CPU numbers (0 and up, "
                    f"as in /proc/cpuinfo), not {show(cpus)}")
    switch_us = _int(app, "switch_interval_us", p, SWITCH_INTERVAL_US, 10, 100_000)
    heartbeat = _int(app, "heartbeat_interval_ms", p, HEARTBEAT_INTERVAL_MS, 10, 60_000)
    dead = _int(app, "neighbour_dead_ms", p, heartbeat * NEIGHBOUR_DEAD_INTERVALS,
                2 * heartbeat, 600_000)
    lsa = _int(app, "lsa_refresh_ms", p, LSA_REFRESH_MS, 10, 600_000)
    drain = _int(app, "drain_timeout_ms", p, DRAIN_TIMEOUT_MS, 0, 60_000)
    parked_ttl = _int(app, "parked_ttl_ms", p, PARKED_MESSAGE_TTL_NS // 1_000_000, 1, 600_000)
    retransmit_messages = _int(app, "retransmit_buffer_messages", p,
                               GUARANTEED_RETRANSMIT_BUFFER_MESSAGES, 16, 1 << 20)
    if retransmit_messages & (retransmit_messages - 1):
        raise _fail(p + "retransmit_buffer_messages", "must be a power of two (16 .. 1048576), "
                    f"not {retransmit_messages}")

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
        path = existing_file(fab["key_file"], p + "key_file", base)
        key = _fabric_key(read_text(path, p + "key_file", MAX_KEY_FILE_BYTES), p + "key_file")
    key_id = _int(fab, "key_id", p, 1, 1, 2**32 - 1)
    max_frame = _int(fab, "max_frame_bytes", p, FABRIC_MAX_FRAME_BYTES, 512, 65_504)
    if max_frame % 8:
        raise _fail(p + "max_frame_bytes", f"must be a multiple of 8, not {max_frame}")

    groups = _groups(fab.get("groups", []))

    raw_neighbours = _list(doc.get("neighbours", []), "neighbours", MAX_NEIGHBOURS,
                           "tables ([[neighbours]])")
    neighbours = []
    for i, n in enumerate(raw_neighbours):
        where = f"neighbours[{i}]."
        if not isinstance(n, dict):
            raise _fail(f"neighbours[{i}]", "must be a table with name and address")
        _known(n, {"name", "address", "cost", "group", "transport", *RDMA_KEYS}, where)
        nname = n.get("name")
        if not isinstance(nname, str) or not NAME_RE.fullmatch(nname):
            raise _fail(where + "name", "required: the neighbour's appliance name")
        if nname == name or any(x.name == nname for x in neighbours):
            raise _fail(where + "name", f"{nname!r} is this appliance or listed twice")
        if "address" not in n:
            raise _fail(where + "address", "required: \"IPv4:port\" of the neighbour's "
                        "fabric.listen")
        group = n.get("group")
        if group is not None and not any(g.name == group for g in groups):
            raise _fail(where + "group", f"{show(group)} is not a group of fabric.groups; known: "
                        + (", ".join(repr(g.name) for g in groups) or "none (add "
                           "[[fabric.groups]] with name, address and interface)"))
        address = parse_address(n["address"], where + "address", destination=True)
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
                                 "max_pending_requests", "mirror_to"}, "")
    p = "clients."
    clients_udp = parse_address(cl["udp"], p + "udp") if "udp" in cl else None
    clients_rdma = _rdma_clients(cl, clients_udp)
    shm = _str(cl, "shm", p, None)
    if shm is not None and not NAME_RE.fullmatch(shm):
        raise _fail(p + "shm", f"must be a ring name (letters, digits, '.', '_', '-'), not "
                    f"{shm!r}")
    max_sessions = _int(cl, "max_sessions", p, CLIENT_MAX_SESSIONS, 1, CLIENT_SESSIONS_LIMIT)
    dead_ms = cl.get("session_dead_ms")
    if isinstance(dead_ms, int) and not isinstance(dead_ms, bool) \
            and 0 < dead_ms < CLIENT_SESSION_DEAD_MIN_MS:
        raise _fail(p + "session_dead_ms", f"must be at least {CLIENT_SESSION_DEAD_MIN_MS} "
                    f"(three of the clients' {CLIENT_HEARTBEAT_INTERVAL_NS // 1_000_000} ms "
                    f"heartbeats, so an idle client is not logged out), not {dead_ms}")
    session_dead = _int(cl, "session_dead_ms", p, CLIENT_SESSION_DEAD_MS,
                        CLIENT_SESSION_DEAD_MIN_MS, 3_600_000)
    client_ports = EGRESS_PORTS - APPLIANCE_EGRESS_PORTS
    max_guaranteed = _int(cl, "max_guaranteed_sessions", p,
                          min(CLIENT_MAX_GUARANTEED_SESSIONS, client_ports - max_sessions), 0,
                          CLIENT_SESSIONS_LIMIT)
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
                            "schemas", "require_passwords", "acl_classes", "flow_policy"}, "")
    p = "pm."
    mode = _str(pm, "mode", p, "embedded", ("embedded", "remote"))
    identities: dict[str, IdentityConfig] = {}
    registry = None
    anonymous = pm.get("anonymous", False)
    if not isinstance(anonymous, bool):
        raise _fail(p + "anonymous", "must be true or false")
    require_passwords = pm.get("require_passwords", True)
    if not isinstance(require_passwords, bool):
        raise _fail(p + "require_passwords", "must be true or false")
    if anonymous and require_passwords:
        raise _fail(p + "anonymous", "logs in identities P&M does not list, which have no "
                    "password: set pm.require_passwords = false with it (demos)")
    schemas = _schemas(pm.get("schemas", {}), p + "schemas")
    pm_flow_policy = _flow_policy(pm, p + "flow_policy")
    acl_classes: tuple[dict[str, Any], ...] = ()
    if mode == "remote":
        for k in ("entitlements", "registry", "identities", "anonymous", "schemas",
                  "require_passwords", "acl_classes", "flow_policy"):
            if k in pm:
                raise _fail(p + k, "only for pm.mode = \"embedded\" (the P&M appliance)")
    else:
        if "entitlements" in pm:
            identities.update(_entitlements(pm["entitlements"], p + "entitlements", base))
        identities.update(_identities(pm.get("identities", {}), p + "identities"))
        acl_classes = _acl_classes(pm.get("acl_classes", {}), p + "acl_classes", schemas)
        names = {c["name"] for c in acl_classes}
        for identity, ident in identities.items():
            undeclared = [n for n in ident.namespaces if n not in namespaces]
            if undeclared:
                raise _fail(f"{p}identities.{identity}.namespaces", f"namespace "
                            f"{undeclared[0]} is not declared in appliance.namespaces "
                            f"({', '.join(map(str, namespaces))})")
            if ident.acl_class is not None and ident.acl_class not in names:
                raise _fail(f"{p}identities.{identity}.acl_class", f"no class "
                            f"{ident.acl_class!r} in pm.acl_classes (known: "
                            f"{', '.join(sorted(names)) or 'none'})")
        if "registry" in pm:
            registry = existing_file(pm["registry"], p + "registry", base)

    routing = _table(doc, "routing", {"content", "popular_share", "counts_interval_ms"}, "")
    content = _str(routing, "content", "routing.", "flood", ROUTING_CONTENT_MODES)
    share = routing.get("popular_share", 0.5)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise _fail("routing.popular_share", f"must be a number between 0 and 1 (exclusive), "
                    f"not {show(share)}")
    counts_ms = _int(routing, "counts_interval_ms", "routing.", RENDEZVOUS_COUNTS_INTERVAL_MS,
                     10, 3_600_000)
    mqtt = _mqtt(doc, role, clients_udp, shm, max_sessions, max_subscriptions, base,
                 identities if mode == "embedded" else None)
    mgmt = _mgmt(doc, base)
    log = _table(doc, "log", {"format", "level"}, "")
    _str(log, "format", "log.", "text", ("text", "json"))
    _str(log, "level", "log.", "info", ("debug", "info", "warning", "error"))

    from appliance.cache.settings import RemotePersist

    cache = parse_cache(doc.get("cache"), base, clients_udp is not None or shm is not None)
    persist_remote = serve_from = None
    if isinstance(cache, RemotePersist):
        cache, persist_remote, serve_from = None, cache.remote, cache.serve_from
    elif cache is not None:
        serve_from = cache.serve_from
    known = [nb.name for nb in neighbours]
    if serve_from is not None and serve_from != persist_remote:
        if serve_from not in known:
            raise _fail("cache.serve_from", f"must name one of [[neighbours]] "
                        f"({', '.join(known) or 'none configured'}), not {serve_from!r}: "
                        "requests are forwarded over the link between the two")
        if serve_from == name:
            raise _fail("cache.serve_from", "names this appliance")
    if persist_remote is not None:
        if persist_remote not in known:
            raise _fail("cache.remote", f"must name one of [[neighbours]] "
                        f"({', '.join(known) or 'none configured'}), not {persist_remote!r}: "
                        "the caching appliance reports what it persisted over the link "
                        "between the two")
        if persist_remote == name:
            raise _fail("cache.remote", "names this appliance")
    mirror_to = cl.get("mirror_to")
    if mirror_to is not None:
        known = [nb.name for nb in neighbours]
        if not isinstance(mirror_to, str) or mirror_to not in known:
            raise _fail("clients.mirror_to", f"must name one of [[neighbours]] "
                        f"({', '.join(known) or 'none configured'}), not {show(mirror_to)}: "
                        "the sessions' subscriptions are mirrored over the link to it")
    config = ApplianceConfig(
        name=name, node_id=node_id, role=role, namespaces=tuple(namespaces), idle=idle,
        dataplane=dataplane, idle_spin_us=idle_spin_us, priority=priority,
        dataplane_cpus=tuple(cpus),
        switch_interval_us=switch_us,
        drain_timeout_ms=drain, parked_ttl_ms=parked_ttl,
        retransmit_buffer_messages=retransmit_messages, heartbeat_interval_ms=heartbeat,
        neighbour_dead_ms=dead,
        lsa_refresh_ms=lsa, fabric_listen=listen, fabric_key=key, fabric_key_id=key_id,
        fabric_max_frame_bytes=max_frame, neighbours=tuple(neighbours), groups=groups,
        clients_udp=clients_udp, clients_shm=shm, clients_rdma=clients_rdma,
        max_sessions=max_sessions, max_guaranteed_sessions=max_guaranteed,
        max_subscriptions=max_subscriptions, max_registrations=max_registrations,
        max_pending_requests=max_pending, session_dead_ms=session_dead, pm_mode=mode,
        pm_registry=registry,
        pm_anonymous=anonymous, pm_require_passwords=require_passwords, identities=identities,
        pm_flow_policy=pm_flow_policy,
        schemas=schemas, acl_classes=acl_classes, mgmt=mgmt,
        log=dict(log), source=source, telemetry=parse_telemetry(doc.get("telemetry"), base),
        routes=parse_routes(doc.get("routes"), base, mode), mqtt=mqtt,
        cache=cache, persist_remote=persist_remote, cache_serve_from=serve_from,
        mirror_to=mirror_to,
        routing_content=content, popular_share=float(share), counts_interval_ms=counts_ms)
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
    """Read and check a TOML config file (raises ConfigError): at most ``MAX_CONFIG_BYTES``
    of UTF-8, nested at most ``MAX_NESTING`` deep, then ``parse_config``."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"no such config file: {path}; pass --config FILE") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    text = decode(data, path, MAX_CONFIG_BYTES)
    return parse_config(parse_toml(text, path, MAX_NESTING), path.resolve())
