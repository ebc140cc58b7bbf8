"""``[[mqtt.bridges]]``: bridges from an edge appliance to external MQTT brokers (docs/mqtt.md,
"Bridges to external brokers").

```toml
[[mqtt.bridges]]
name = "cloud"                         # required; letters, digits, '-' and '_' (1..32)
address = "127.0.0.1:1883"             # required: the remote broker, "host:port"
identity = "bridge"                    # required: the P&M identity the bridge acts as
client_id = "edge1-cloud"              # default: "<appliance name>-<bridge name>"
protocol = "5"                         # "5" or "3.1.1"
username = "edge1"                     # optional, with password_file
password_file = "cloud.password"       # its first line is the password
tls = false                            # true: TLS to the remote (with the tls_* files)
tls_ca_file = "cloud-ca.crt"           # CAs of the remote's certificate (default: the system's)
tls_cert_file = "edge1.crt"            # optional client certificate ...
tls_key_file = "edge1.key"             # ... and its key
keep_alive_s = 30
session_expiry_s = 3600                # the remote keeps the bridge's session this long (0: clean)
max_inflight = 64                      # QoS 1 unacknowledged (at most the remote Receive Maximum)
reconnect_min_ms = 500                 # backoff: doubles from this ...
reconnect_max_ms = 30000               # ... to this, with jitter
backlog_dir = "/var/lib/topicwire/bridges"   # required with a QoS 1 out mapping
backlog_max_messages = 100000
backlog_max_bytes = 67108864
in = [{ remote = "cmd/#", local_prefix = "cloud/", qos = 1 }]
out = [{ local = "plant/#", remote_prefix = "edge1/", qos = 1 }]
```

``appliance/config.py`` hands the raw array here; every check raises the config's own
``ConfigError`` naming the key (``mqtt.bridges[0].address: ...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from appliance.config_files import existing_file, path_of
from appliance.errors import ConfigError

MAX_BRIDGES = 16
"""Bridges one edge runs (each holds a native session and a thread)."""
MAX_MAPPINGS = 64
"""``in`` and ``out`` mappings of one bridge, each."""
MAX_PREFIX_CHARS = 256
BRIDGE_KEEP_ALIVE_S = 30
BRIDGE_SESSION_EXPIRY_S = 3_600
BRIDGE_MAX_INFLIGHT = 64
BRIDGE_RECONNECT_MIN_MS = 500
BRIDGE_RECONNECT_MAX_MS = 30_000
BRIDGE_BACKLOG_MAX_MESSAGES = 100_000
BRIDGE_BACKLOG_MAX_BYTES = 64 * 1024 * 1024
PASSWORD_FILE_MAX_BYTES = 4_096
PROTOCOLS = {"5": 5, "3.1.1": 4}
_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,32}")
_KEYS = {"name", "address", "identity", "client_id", "protocol", "username", "password_file",
         "tls", "tls_ca_file", "tls_cert_file", "tls_key_file", "keep_alive_s",
         "session_expiry_s", "max_inflight", "reconnect_min_ms", "reconnect_max_ms",
         "backlog_dir", "backlog_max_messages", "backlog_max_bytes", "in", "out"}


@dataclass(frozen=True)
class InMapping:
    """Remote filter -> local topic: ``local_prefix`` + the remote topic."""

    remote: str
    local_prefix: str
    qos: int


@dataclass(frozen=True)
class OutMapping:
    """Local pattern -> remote topic: ``remote_prefix`` + the local topic."""

    local: str
    remote_prefix: str
    qos: int


@dataclass(frozen=True)
class BridgeConfig:
    name: str
    host: str
    port: int
    identity: str
    client_id: str | None = None
    protocol: int = 5
    """4 (3.1.1) or 5."""
    username: str | None = None
    password: str | None = None
    tls: bool = False
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    keep_alive_s: int = BRIDGE_KEEP_ALIVE_S
    session_expiry_s: int = BRIDGE_SESSION_EXPIRY_S
    max_inflight: int = BRIDGE_MAX_INFLIGHT
    reconnect_min_ms: int = BRIDGE_RECONNECT_MIN_MS
    reconnect_max_ms: int = BRIDGE_RECONNECT_MAX_MS
    backlog_dir: Path | None = None
    backlog_max_messages: int = BRIDGE_BACKLOG_MAX_MESSAGES
    backlog_max_bytes: int = BRIDGE_BACKLOG_MAX_BYTES
    ins: tuple[InMapping, ...] = ()
    outs: tuple[OutMapping, ...] = ()


def _fail(key: str, what: str) -> ConfigError:
    return ConfigError(f"{key}: {what}")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(table: dict, key: str, p: str, default: int, low: int, high: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(p + key, f"must be an integer in [{low}, {high}], not {_show(value)}")
    return value


def _text(table: dict, key: str, p: str, required: bool = False) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            raise _fail(p + key, "required")
        return None
    if not isinstance(value, str) or not value:
        raise _fail(p + key, f"must be a non-empty string, not {_show(value)}")
    return value


def _prefix(value: object, key: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_PREFIX_CHARS:
        raise _fail(key, f"must be a string of at most {MAX_PREFIX_CHARS} characters, not "
                    f"{_show(value)}")
    if "+" in value or "#" in value:
        raise _fail(key, "a topic prefix takes no wildcards ('+', '#')")
    if value.startswith("$"):
        raise _fail(key, "a topic prefix may not start with '$'")
    return value


def _qos(spec: dict, key: str) -> int:
    value = spec.get("qos", 1)
    if isinstance(value, bool) or value not in (0, 1):
        raise _fail(key, f"must be 0 or 1, not {_show(value)} (QoS 2 is not bridged)")
    return value


def _filter(value: object, key: str) -> str:
    from appliance.edge.mqtt.topics import filter_problem

    if not isinstance(value, str):
        raise _fail(key, f"must be an MQTT topic filter such as \"plant/#\", not {_show(value)}")
    problem = filter_problem(value)
    if problem is not None:
        raise _fail(key, f"{value!r} is not a valid topic filter: {problem}")
    return value


def _mappings(value: object, key: str, direction: str) -> tuple:
    if not isinstance(value, list) or len(value) > MAX_MAPPINGS:
        raise _fail(key, f"must be an array of at most {MAX_MAPPINGS} tables, such as "
                    + ('[{ remote = "cmd/#", local_prefix = "cloud/" }]' if direction == "in"
                       else '[{ local = "plant/#", remote_prefix = "edge1/" }]'))
    out = []
    for i, spec in enumerate(value):
        where = f"{key}[{i}]"
        match_key, prefix_key = ("remote", "local_prefix") if direction == "in" else (
            "local", "remote_prefix")
        if not isinstance(spec, dict):
            raise _fail(where, f"must be a table with {match_key}, {prefix_key} and qos")
        for k in spec:
            if k not in (match_key, prefix_key, "qos"):
                raise _fail(f"{where}.{k}", f"unknown key; known keys here: {match_key}, "
                            f"{prefix_key}, qos")
        if match_key not in spec:
            raise _fail(f"{where}.{match_key}", "required: a topic filter")
        topic_filter = _filter(spec[match_key], f"{where}.{match_key}")
        prefix = _prefix(spec.get(prefix_key, ""), f"{where}.{prefix_key}")
        qos = _qos(spec, f"{where}.qos")
        out.append(InMapping(topic_filter, prefix, qos) if direction == "in"
                   else OutMapping(topic_filter, prefix, qos))
    return tuple(out)


def _password(table: dict, p: str, base: Path) -> str | None:
    if "password_file" not in table:
        return None
    key = p + "password_file"
    if "username" not in table:
        raise _fail(key, "only with a username")
    path = existing_file(table["password_file"], key, base)
    try:
        data = path.read_bytes()[:PASSWORD_FILE_MAX_BYTES]
    except OSError as exc:
        raise _fail(key, f"cannot read {path}: {exc.strerror}") from None
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise _fail(key, f"{path} is not UTF-8") from None
    if not lines or not lines[0]:
        raise _fail(key, f"{path} is empty: its first line is the password")
    return lines[0]


def parse_bridges(value: object, base: Path, identities: dict | None) -> tuple[BridgeConfig, ...]:
    """``mqtt.bridges``: an array of tables. ``identities``: the embedded P&M's identities
    (a bridge's identity must be one of them), or None (P&M is remote: its login decides)."""
    from appliance.addresses import host_address, split_host_port

    key = "mqtt.bridges"
    if not isinstance(value, list) or len(value) > MAX_BRIDGES:
        raise _fail(key, f"must be an array of at most {MAX_BRIDGES} tables ([[mqtt.bridges]])")
    bridges: list[BridgeConfig] = []
    for i, table in enumerate(value):
        p = f"{key}[{i}]."
        if not isinstance(table, dict):
            raise _fail(f"{key}[{i}]", "must be a table ([[mqtt.bridges]])")
        for k in table:
            if k not in _KEYS:
                raise _fail(p + k, "unknown key; known keys here: " + ", ".join(sorted(_KEYS)))
        name = _text(table, "name", p, required=True)
        assert name is not None
        if not _NAME_RE.fullmatch(name):
            raise _fail(p + "name", f"{name!r}: 1..32 letters, digits, '-' or '_'")
        if any(b.name == name for b in bridges):
            raise _fail(p + "name", f"{name!r} names two bridges")
        if "address" not in table:
            raise _fail(p + "address", "required: the remote broker's \"host:port\"")
        _, port = host_address(table["address"], p + "address", example="127.0.0.1:1883")
        # connect (and check a TLS certificate) by the name given, resolved at each connect
        host, _, _ = split_host_port(table["address"], p + "address", "127.0.0.1:1883")
        if not 1 <= port <= 65535:
            raise _fail(p + "address", f"port {port} is outside [1, 65535]")
        identity = _text(table, "identity", p, required=True)
        assert identity is not None
        if identities is not None and identity not in identities:
            raise _fail(p + "identity", f"{identity!r} is no identity of pm.identities: the "
                        "bridge acts as a P&M identity (its entitlements apply)")
        client_id = _text(table, "client_id", p)
        if client_id is not None and len(client_id.encode()) > 256:
            raise _fail(p + "client_id", "at most 256 bytes")
        protocol = table.get("protocol", "5")
        if protocol not in PROTOCOLS:
            raise _fail(p + "protocol", f"must be \"5\" or \"3.1.1\", not {_show(protocol)}")
        username = _text(table, "username", p)
        tls = table.get("tls", False)
        if not isinstance(tls, bool):
            raise _fail(p + "tls", "must be true or false")
        files = {}
        for k in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
            if k in table:
                if not tls:
                    raise _fail(p + k, "only with tls = true")
                files[k] = existing_file(table[k], p + k, base)
        if ("tls_cert_file" in files) != ("tls_key_file" in files):
            missing = "tls_key_file" if "tls_cert_file" in files else "tls_cert_file"
            raise _fail(p + missing, "a client certificate needs both tls_cert_file and "
                        "tls_key_file")
        ins = _mappings(table.get("in", []), p + "in", "in")
        outs = _mappings(table.get("out", []), p + "out", "out")
        if not ins and not outs:
            raise _fail(p + "in", "a bridge needs at least one in or out mapping")
        reconnect_min = _int(table, "reconnect_min_ms", p, BRIDGE_RECONNECT_MIN_MS, 10, 600_000)
        reconnect_max = _int(table, "reconnect_max_ms", p, max(BRIDGE_RECONNECT_MAX_MS,
                                                               reconnect_min), 10, 3_600_000)
        if reconnect_max < reconnect_min:
            raise _fail(p + "reconnect_max_ms", f"{reconnect_max} is below reconnect_min_ms "
                        f"({reconnect_min})")
        backlog_dir = None
        if "backlog_dir" in table:
            backlog_dir = path_of(table["backlog_dir"], p + "backlog_dir", base)
            if backlog_dir.exists() and not backlog_dir.is_dir():
                raise _fail(p + "backlog_dir", f"{backlog_dir} is not a directory")
        elif any(m.qos == 1 for m in outs):
            raise _fail(p + "backlog_dir", "required with a QoS 1 out mapping: the durable "
                        "backlog of messages the remote has not acknowledged")
        bridges.append(BridgeConfig(
            name=name, host=host, port=port, identity=identity, client_id=client_id,
            protocol=PROTOCOLS[protocol], username=username,
            password=_password(table, p, base), tls=tls, **files,
            keep_alive_s=_int(table, "keep_alive_s", p, BRIDGE_KEEP_ALIVE_S, 5, 65_535),
            session_expiry_s=_int(table, "session_expiry_s", p, BRIDGE_SESSION_EXPIRY_S, 0,
                                  2**32 - 1),
            max_inflight=_int(table, "max_inflight", p, BRIDGE_MAX_INFLIGHT, 1, 65_535),
            reconnect_min_ms=reconnect_min, reconnect_max_ms=reconnect_max,
            backlog_dir=backlog_dir,
            backlog_max_messages=_int(table, "backlog_max_messages", p,
                                      BRIDGE_BACKLOG_MAX_MESSAGES, 1, 10_000_000),
            backlog_max_bytes=_int(table, "backlog_max_bytes", p, BRIDGE_BACKLOG_MAX_BYTES,
                                   1_024, 1 << 36),
            ins=ins, outs=outs))
    return tuple(bridges)
