"""A config is checked as strictly as network input: whatever a config file or a file it names
holds, ``load_config``/``parse_config`` return a config or raise ``ConfigError`` naming the key,
and ``topicwire run`` exits 2 with one line (never a traceback).

The cases first (each one a mutation that once ended in a traceback or was accepted), then the
property: mutated valid configs give a config or a ``ConfigError``, nothing else.
"""

from __future__ import annotations

import copy
import datetime
import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.config import (
    MAX_CONFIG_BYTES,
    MAX_NESTING,
    ApplianceConfig,
    ConfigError,
    load_config,
    parse_config,
)
from tests.appliance.helpers import CLI, FABRIC_KEY, ROOT

LATIN1 = "é".encode("latin-1")


def _write(tmp_path, text: str, name: str = "c.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _refused(path, key: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"config: {key}"), message
    assert "\n" not in message
    return message


def _deep(text: str, depth: int) -> str:
    return "[" * depth + text + "]" * depth


HEAD = '[appliance]\nname = "core1"\n'
SCHEMA = HEAD + '[pm.schemas.quote]\nid = 7\nfields = {}\n'


# --- schema fields ------------------------------------------------------------------------------

@pytest.mark.parametrize("fields", [
    '"price"',                                  # not an array
    '[[]]',                                     # a field of nothing
    '[["price"]]',                              # too short
    '[["price", 0, "u32", 4, 1]]',              # too long
    '[[1, 0, "u32"]]',                          # the name is a number
    '[["not a name", 0, "u32"]]',               # the name is no identifier
    '[["price", "0", "u32"]]',                  # the offset as a string
    '[["price", 1.5, "u32"]]',                  # ... as a float
    '[["price", true, "u32"]]',                 # ... as a bool
    '[["price", -1, "u32"]]',                   # ... negative
    '[["price", 1099511627776, "u32"]]',        # ... 2^40
    '[["price", 65429, "u32"]]',                # ... ending past the largest payload
    '[["price", 0, ["u32"]]]',                  # the type as an array
    '[["price", 0, "u128"]]',                   # an unknown type
    '[["symbol", 0, "ascii"]]',                 # ascii without a width
    '[["symbol", 0, "ascii", "8"]]',            # the width as a string
    '[["symbol", 0, "ascii", 0]]',              # a width of 0
    '[["symbol", 0, "ascii", 1099511627776]]',  # ... 2^40
    '[["price", 0, "u32", 8]]',                 # a u32 is 4 bytes wide
    '[{name = "price", offset = 0, type = "u32"}]',  # a table, not an array
    '[["a", 0, "u32"], ["b", 2, "u16"]]',       # overlapping
])
def test_schema_fields_of_the_wrong_shape_or_type_are_refused(tmp_path, fields):
    _refused(_write(tmp_path, SCHEMA.format(fields)), "pm.schemas.quote.fields")


def test_the_offset_bound_is_the_largest_payload(tmp_path):
    from datapath.protocol.message_layout import MAX_PAYLOAD_BYTES

    fields = f'[["price", {MAX_PAYLOAD_BYTES - 4}, "u32"], ["symbol", 0, "ascii", 8]]'
    cfg = load_config(_write(tmp_path, SCHEMA.format(fields)))
    assert cfg.schemas[0]["fields"][0]["offset"] == MAX_PAYLOAD_BYTES - 4


# --- nesting and sizes --------------------------------------------------------------------------

@pytest.mark.parametrize("text, key", [
    (HEAD + "namespaces = " + _deep("0", 5000), "appliance.namespaces"),  # once: RecursionError
    (HEAD + "namespaces = " + _deep("0", MAX_NESTING + 1), "appliance.namespaces"),
    (HEAD + "[mgmt]\ntoken = " + "{a = " * 3000 + "1" + "}" * 3000, "mgmt.token"),
    (HEAD + '[pm.schemas.quote]\nid = 7\nfields = ' + _deep('"p", 0, "u32"', 100),
     "pm.schemas.quote.fields"),
])
def test_deeply_nested_arrays_or_inline_tables_are_refused_naming_the_key(tmp_path, text, key):
    assert "nested deeper than" in _refused(_write(tmp_path, text), key)


def test_brackets_in_strings_and_comments_are_no_nesting(tmp_path):
    text = (HEAD + "# [[[[[[[[[[[[[[[[\n[log] # [[[[[[[[[[[[\nlevel = 'info' # [[[[[[[[[[[[[\n"
            '[pm.identities."[[[[[[[[[[[["]\npublish = ["a/[[[[[[[[[[[[[[[[[[/#", """\n'
            '[[[[[[[[[[[[[[[[[[[["""]\n')
    assert load_config(_write(tmp_path, text)).identities["[[[[[[[[[[[["].publish == (
        "a/[[[[[[[[[[[[[[[[[[/#", "[[[[[[[[[[[[[[[[[[[[")


def test_nesting_made_of_tables_is_bounded_too(tmp_path):
    text = HEAD + "[pm.identities." + ".".join("a" * MAX_NESTING) + "]\npublish = []\n"
    message = _refused(_write(tmp_path, text), "pm.identities.a")
    assert "nested deeper than" in message


@pytest.mark.parametrize("text, key", [
    (HEAD + "id = " + "1" * 5000, "c.toml"),                 # once: ValueError (int digits)
    (HEAD + "id = 99999999999999999999", "appliance.id"),      # beyond 64 bits
    (HEAD + "id = 1e3", "appliance.id"),
    (HEAD + 'name2 = "' + "x" * 5000 + '"', "appliance.name2"),
])
def test_integers_and_strings_are_bounded(tmp_path, text, key):
    path = _write(tmp_path, text)
    _refused(path, str(path) if key == "c.toml" else key)


def test_a_config_file_is_utf8_and_bounded(tmp_path):
    latin = tmp_path / "latin.toml"
    latin.write_bytes(HEAD.encode() + b'[log]\nlevel = "' + LATIN1 + b'"\n')
    assert "not UTF-8 text (byte 0xe9" in _refused(latin, str(latin))
    big = tmp_path / "big.toml"
    big.write_bytes(HEAD.encode() + b"#" * MAX_CONFIG_BYTES)
    assert "larger than" in _refused(big, str(big))
    assert "cannot read it" in _refused(tmp_path, str(tmp_path))  # a directory


# --- files a config names -----------------------------------------------------------------------

def test_a_latin1_key_file_is_refused(tmp_path):
    (tmp_path / "fabric.key").write_bytes(LATIN1 * 64)
    text = HEAD + '[fabric]\nlisten = "127.0.0.1:47470"\nkey_file = "fabric.key"\n'
    assert "not UTF-8 text" in _refused(_write(tmp_path, text), "fabric.key_file")


@pytest.mark.parametrize("content", [
    "11" * 31,                     # too short
    "11 " * 32,                    # spaces between the bytes
    "zz" * 32,                     # not hex
    "11" * 32 + "\n" + "11" * 32,  # two keys
])
def test_a_fabric_key_is_64_hex_digits_and_never_quoted(tmp_path, content):
    (tmp_path / "fabric.key").write_text(content)
    text = HEAD + '[fabric]\nlisten = "127.0.0.1:47470"\nkey_file = "fabric.key"\n'
    message = _refused(_write(tmp_path, text), "fabric.key_file")
    assert "11111111" not in message and "zzzz" not in message


def test_key_files_are_regular_files_outside_proc_and_sys(tmp_path):
    for value, why in (("/proc/self/environ", "under /proc"), ("/sys/kernel/notes", "under /sys"),
                       (str(tmp_path), "not a regular file"), ("a" * 4000, "cannot look at"),
                       ("missing", "no such file")):
        text = HEAD + f'[fabric]\nlisten = "127.0.0.1:47470"\nkey_file = "{value}"\n'
        assert why in _refused(_write(tmp_path, text), "fabric.key_file")


def test_a_latin1_or_malformed_entitlements_file_is_refused(tmp_path):
    text = HEAD + '[pm]\nentitlements = "ents.toml"\n'
    path = _write(tmp_path, text)
    ents = tmp_path / "ents.toml"
    ents.write_bytes(b'[identities.feed]\npublish = ["caf' + LATIN1 + b'/#"]\n')
    assert "not UTF-8 text" in _refused(path, "pm.entitlements")
    ents.write_text("[identities.feed]\npublish = " + _deep('"a"', 3000) + "\n")
    assert "nested deeper than" in _refused(path, "pm.entitlements: identities.feed.publish")
    ents.write_text("[identities.feed]\npublish = [1]\n")
    assert "identities.feed.publish" in _refused(path, "pm.entitlements")
    ents.write_text('[identities.feed]\npublish = ["a/#"]\n')
    assert load_config(path).identities["feed"].publish == ("a/#",)


def test_a_deeply_nested_registry_is_refused_at_start_naming_the_key(tmp_path):
    from appliance.node import Appliance
    from datapath.topics.registry import KeyRegistry, RegistryError

    registry = tmp_path / "registry.json"
    registry.write_text("{}")
    cfg = load_config(_write(tmp_path, HEAD + '[pm]\nregistry = "registry.json"\n'))
    for text in (_deep("0", 100_000),  # once: RecursionError
                 '{"kind": "topicwire.key-registry", "format_version": ' + _deep("1", 200) + "}",
                 '{"version": ' + "9" * 5000 + "}"):  # once: ValueError (int digits)
        registry.write_text(text)
        with pytest.raises(RegistryError):
            KeyRegistry.load(registry)
        with pytest.raises(ConfigError) as info:
            Appliance(cfg).start()  # the registry is read first: nothing opened yet
        assert str(info.value).startswith("config: pm.registry: ")
    registry.write_bytes(b'{"kind": "' + LATIN1 + b'"}')
    with pytest.raises(ConfigError, match="pm.registry: .*not UTF-8"):
        Appliance(cfg).start()


@pytest.mark.parametrize("directory, why", [
    ("/proc/topicwire", "under /proc"),
    ("/sys/fs/topicwire", "under /sys"),
    ("/proc", "under /proc"),
    ("c.toml/telemetry", "under the file"),  # a file of the path
    ("c.toml", "exists and is not a directory"),
])
def test_telemetry_dir_must_be_a_directory_that_can_be_made(tmp_path, directory, why):
    text = HEAD + f'[telemetry]\ndir = "{directory}"\n'
    assert why in _refused(_write(tmp_path, text), "telemetry.dir")


def test_telemetry_dir_under_a_directory_made_later_is_accepted(tmp_path):
    cfg = load_config(_write(tmp_path, HEAD + '[telemetry]\ndir = "store/telemetry"\n'))
    assert cfg.telemetry.dir == tmp_path / "store" / "telemetry"
    assert not (tmp_path / "store").exists()  # checked, not made


# --- addresses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("clients.udp", "127.0.0.1: 47490"),
    ("clients.udp", " 127.0.0.1:47490"),
    ("clients.udp", "127.0.0.1:47490 "),
    ("clients.udp", "127.0.0.1:+47490"),
    ("clients.udp", "127.0.0.1:47_490"),
    ("clients.udp", "127.0.0.1:\u0664\u0667\u0664\u0669\u0660"),  # Arabic-Indic digits
    ("clients.udp", "127.0.0.1:047490"),
    ("clients.udp", "127.0.0.01:47490"),
    ("clients.udp", "127.0.0.1:65536"),
    ("clients.udp", "127.0.0.1:0"),
    ("clients.udp", "255.255.255.255:47490"),
    ("clients.udp", "239.1.1.1:47490"),
    ("fabric.listen", "255.255.255.255:47470"),
    ("fabric.listen", "127.0.0.1:47470\n"),
    ("mgmt.listen", "255.255.255.255:8470"),
    ("mgmt.listen", "127.0.0.1 :8470"),
])
def test_addresses_are_parsed_strictly(tmp_path, key, value):
    table, name = key.split(".")
    text = HEAD + f"[{table}]\n{name} = {json.dumps(value)}\n"
    _refused(_write(tmp_path, text), key)


@pytest.mark.parametrize("neighbour, key", [
    ({"address": "255.255.255.255:47471"}, "neighbours[0].address"),
    ({"address": "0.0.0.0:47471"}, "neighbours[0].address"),
    ({"address": "127.0.0.1:47471", "transport": "rdma", "rdma_port": 47490,
      "rdma_local": 2130706433}, "neighbours[0].rdma_local"),  # an integer is no address
    ({"address": "127.0.0.1:47471", "transport": "rdma", "rdma_port": 47490,
      "rdma_remote": "255.255.255.255"}, "neighbours[0].rdma_remote"),
])
def test_a_neighbour_is_sent_to_a_unicast_address(neighbour, key):
    doc = {"appliance": {"name": "core1"},
           "fabric": {"listen": "127.0.0.1:47470", "key": FABRIC_KEY},
           "neighbours": [{"name": "core2", **neighbour}]}
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert str(info.value).startswith(f"config: {key}")


def test_valid_addresses_still_load():
    cfg = parse_config({"appliance": {"name": "core1"},
                        "fabric": {"listen": "0.0.0.0:47470", "key": FABRIC_KEY},
                        "neighbours": [{"name": "core2", "address": "10.77.0.2:47470"}],
                        "clients": {"udp": "127.0.0.1:65535"},
                        "mgmt": {"listen": "127.0.0.1:0"}})
    assert cfg.fabric_listen == ("0.0.0.0", 47470) and cfg.clients_udp == ("127.0.0.1", 65535)


# --- messages are one line ----------------------------------------------------------------------

def test_a_refusal_is_one_line_whatever_the_key_holds(tmp_path):
    message = _refused(_write(tmp_path, HEAD + '"a\\nb\\u2028c" = 1\n'), "appliance.a")
    assert "a\\nb\\u2028c" in message


# --- end to end: topicwire run ------------------------------------------------------------------

def _run(path):
    return subprocess.run([*CLI, "run", "--config", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def _cli_cases(tmp_path):
    (tmp_path / "latin1.key").write_bytes(LATIN1 * 64)
    (tmp_path / "registry.json").write_text(_deep("0", 100_000))
    return [
        (HEAD + '[clients]\nudp = "127.0.0.1: 47490"\n', "clients.udp"),
        (HEAD + '[fabric]\nlisten = "255.255.255.255:47470"\n', "fabric.listen"),
        (SCHEMA.format('[["price", "0", "u32"]]'), "pm.schemas.quote.fields[0]"),
        (SCHEMA.format(_deep('"p"', 2000)), "pm.schemas.quote.fields"),
        (HEAD + '[fabric]\nlisten = "127.0.0.1:47470"\nkey_file = "latin1.key"\n',
         "fabric.key_file"),
        (HEAD + '[telemetry]\ndir = "/proc/topicwire"\n', "telemetry.dir"),
        (HEAD + '[pm]\nregistry = "registry.json"\n', "pm.registry"),
        (HEAD + '[clients]\nudp = "127.0.0.1:47491"\n[cache]\ndir = "cache"\n'
         'patterns = ["orders/#"]\nfsync = "sometimes"\n', "cache.fsync"),
    ]


def test_run_exits_2_with_one_line_naming_the_key(tmp_path):
    for i, (text, key) in enumerate(_cli_cases(tmp_path)):
        proc = _run(_write(tmp_path, text, f"c{i}.toml"))
        assert proc.returncode == 2, (key, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"topicwire: config: {key}"), lines
        assert "ready" not in proc.stdout


# --- the property: mutated valid configs --------------------------------------------------------

VALID = [
    {"appliance": {"name": "core1", "id": 1, "role": "core", "namespaces": [0, 7],
                   "idle": "block", "idle_spin_us": 1000, "priority": 0,
                   "drain_timeout_ms": 500, "heartbeat_interval_ms": 100,
                   "neighbour_dead_ms": 400, "lsa_refresh_ms": 2000},
     "fabric": {"listen": "127.0.0.1:47470", "key_file": "fabric.key", "key_id": 1,
                "max_frame_bytes": 1472,
                "groups": [{"name": "g", "address": "239.77.0.1:47480",
                            "interface": "127.0.0.1", "ttl": 1, "loopback": True}]},
     "neighbours": [{"name": "core2", "address": "127.0.0.1:47471", "cost": 3, "group": "g"},
                    {"name": "core3", "address": "10.0.0.3:47470", "transport": "rdma",
                     "rdma_port": 47490, "rdma_local": "10.0.0.1", "rdma_device": "rxe0",
                     "rdma_gid_index": 1}],
     "clients": {"udp": "127.0.0.1:47999", "shm": "core1", "rdma": "10.0.0.1:47472",
                 "max_sessions": 256, "session_dead_ms": 5000, "max_guaranteed_sessions": 128,
                 "max_subscriptions": 1024, "max_registrations": 16384,
                 "max_pending_requests": 256},
     "pm": {"mode": "embedded", "entitlements": "ents.toml", "registry": "registry.json",
            "anonymous": False,
            "identities": {"md-feed": {"publish": ["prices/#"], "subscribe": ["prices/#"]}},
            "schemas": {"quote": {"id": 7, "fields": [["price", 0, "u32"],
                                                      ["symbol", 4, "ascii", 8]]}}},
     "mgmt": {"listen": "127.0.0.1:8470", "token_file": "mgmt.token"},
     "log": {"format": "json", "level": "info"},
     "telemetry": {"dir": "telemetry", "window_ms": 1000, "probe_interval_ms": 10,
                   "retention_hours": 24},
     "routes": {"switch_grace_ms": 500, "switch_hold_ms": 100, "table": "routes.json",
                "poll_ms": 1000, "duplicate": ["md/fast/#"]},
     "cache": {"dir": "cache", "patterns": ["orders/#", "md/+/trade"], "fsync": "interval",
               "fsync_interval_ms": 5, "retention_bytes": 8_388_608, "retention_hours": 24}},
    {"appliance": {"name": "edge1", "role": "edge"},
     "fabric": {"listen": "0.0.0.0:47470", "key": FABRIC_KEY},
     "neighbours": [{"name": "core1", "address": "127.0.0.1:47470"}],
     "clients": {"udp": "127.0.0.1:47998"},
     "pm": {"mode": "remote"},
     "mgmt": {"listen": "127.0.0.1:0", "token": "secret-token"}},
    {"appliance": {"name": "solo"}, "clients": {"shm": "solo"},
     "pm": {"anonymous": True, "require_passwords": False}},
]

ODD_STRINGS = ["", " ", "127.0.0.1: 47490", "255.255.255.255:47470", "0.0.0.0:0",
               "239.1.1.1:1", "10.0.0.1", "a\nb", "\x00", "\u2028", "/proc/self/environ",
               "/sys", "/etc/passwd", "../../..", "x" * 5_000, "é", "#", "a/#/b", "+", "1e9",
               "u32", "ascii", "rdma", "block", "remote", "telemetry"]
SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 7, 65535, 65536, 2**31, 2**32, 2**40, 2**63 - 1, 2**63, 2**64]),
    st.floats(), st.booleans(), st.text(max_size=20), st.sampled_from(ODD_STRINGS),
    st.datetimes(), st.dates(), st.times(),
    st.just(datetime.datetime(1979, 5, 27, 7, 32, tzinfo=datetime.UTC)),
)


def _deeply(value, depth: int, table: bool):
    for _ in range(depth):
        value = {"a": value} if table else [value]
    return value


VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=5),
    st.dictionaries(st.text(max_size=8), SCALARS, max_size=4),
    st.lists(st.lists(SCALARS, max_size=4), max_size=3),
    st.builds(_deeply, SCALARS, st.integers(1, 60), st.booleans()),
)


def _paths(value, path=()):
    """Every place in a document: (path of keys and indexes, value)."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


@st.composite
def mutated(draw):
    doc = copy.deepcopy(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 3))):
        path, target = draw(st.sampled_from(list(_paths(doc))))
        action = draw(st.sampled_from(["replace", "drop", "add", "wrap"]))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        if action == "add" and isinstance(target, dict | list):
            key = draw(st.one_of(st.text(min_size=1, max_size=8),
                                 st.sampled_from(sorted({str(k) for p, _ in _paths(doc)
                                                         for k in p[-1:]}))))
            if isinstance(target, dict):
                target[key] = draw(VALUES)
            else:
                target.append(draw(VALUES))
        elif not path:
            continue
        elif action == "drop":
            del parent[path[-1]]
        elif action == "wrap":
            parent[path[-1]] = _deeply(target, draw(st.integers(1, 40)), draw(st.booleans()))
        else:
            parent[path[-1]] = draw(VALUES)
    return doc


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("strict")
    (base / "fabric.key").write_text(FABRIC_KEY + "\n")
    (base / "ents.toml").write_text('[identities.ops]\nsubscribe = ["#"]\n')
    (base / "registry.json").write_text("{}")
    (base / "mgmt.token").write_text("secret-token\n")
    return base


def test_the_valid_configs_load(config_dir):
    for doc in VALID:
        assert isinstance(parse_config(copy.deepcopy(doc), config_dir / "c.toml"),
                          ApplianceConfig)


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=mutated())
def test_a_mutated_config_gives_a_config_or_a_config_error(config_dir, doc):
    try:
        cfg = parse_config(doc, config_dir / "c.toml")
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("config: ")
    else:
        assert isinstance(cfg, ApplianceConfig)


VALID_TEXT = f'''# a config with most keys
[appliance]
name = "core1"          # [not a table]
namespaces = [0, 7]
idle = 'block'

[fabric]
listen = "127.0.0.1:47470"
key = "{FABRIC_KEY}"

[[fabric.groups]]
name = "g"
address = "239.77.0.1:47480"
interface = "127.0.0.1"

[[neighbours]]
name = "core2"
address = "127.0.0.1:47471"
group = "g"

[clients]
udp = "127.0.0.1:47999"

[pm.identities."md-feed"]
publish = ["prices/#", """
[[not/a/table"""]
subscribe = ['prices/#']

[pm.schemas.quote]
id = 7
fields = [["price", 0, "u32"], ["symbol", 4, "ascii", 8]]

[mgmt]
listen = "127.0.0.1:8470"
token = "secret"

[routes]
duplicate = ["md/fast/#"]
'''
TEXT_BITS = st.one_of(st.text(max_size=6), st.sampled_from(
    ["[", "]", "{", "}", "[" * 40, "{a=" * 20, '"', "'", '"""', "#", "=", "\n", "\\", ".",
     "\x00", "\u2028", "99999999999999999999", "1" * 5000, "-0", "inf", "nan",
     "1979-05-27T07:32:00Z", "2023-02-30", "true", "[[neighbours]]\n", "[pm]\n"]))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, len(VALID_TEXT)), st.integers(0, 12), TEXT_BITS),
                      min_size=1, max_size=4),
       latin1=st.booleans())
def test_a_mutated_config_file_gives_a_config_or_a_config_error(config_dir, edits, latin1):
    text = VALID_TEXT
    for at, cut, bit in edits:  # replace text[at:at + cut] with bit
        text = text[:at] + bit + text[at + cut:]
    path = config_dir / "mutated.toml"
    path.write_bytes(text.encode("latin-1", "replace") if latin1 else
                     text.encode("utf-8"))
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("config: ")
    else:
        assert isinstance(cfg, ApplianceConfig)


def test_the_valid_text_loads(config_dir):
    path = config_dir / "valid.toml"
    path.write_text(VALID_TEXT)
    assert load_config(path).identities["md-feed"].publish == ("prices/#", "[[not/a/table")
