"""The one table model of the offload pipeline: names, pipeline spec, entries (P4Runtime model).

Every executor (the software NIC, the P4 program in ``p4/``, later XDP) runs the same
match-action pipeline, described here once. The names below are a contract with ``p4/``:
they never change without changing the P4 program in the same commit.

    message (first message of a frame for P4; every message for the software NIC)
       |
       v
    TopicwireIngress.topic_key        key: hdr.msg.topic_key (64 bits, exact)
       |   drop                        -> dropped (per-key counter counts it)
       |   punt / table miss           -> to the CPU, a digest (reason, key) in a bounded queue
       |   forward(egress_port, acl_class)        -> one egress port
       |   forward_group(group, acl_class)        -> multicast group -> [egress ports]
       |   (direct counter TopicwireIngress.topic_key_counter: packets and bytes per key)
       v   acl_class == 0: no ACL, the forward stands
    TopicwireIngress.acl_0            key: meta.acl_class exact, meta.acl_state exact,
       |                                   meta.field_0 range      (acl_state starts at 0)
       |   acl_next(state)             -> meta.acl_state = state, go on to acl_1
       |   acl_accept                  -> the forward stands; ACL done
       |   acl_reject / table miss     -> dropped; ACL done
       |   acl_log                     -> the forward stands, plus a digest (log); ACL done
       v
    TopicwireIngress.acl_1 ... acl_<ACL_STAGES-1>   (same keys over meta.field_1, ...)
       (a stage applies only while the ACL is not done; stage k reads field k)

ACL fields are unsigned big-endian integers of 1, 2, 4 or 8 bytes read from the message
payload at fixed offsets (``AclField``; 4 bytes by default). The payload starts at byte 40 of
its message (docs/protocol.md), so for the first message of a frame field k sits at frame
offset 32 + 40 + offset. A message with an ACL class whose payload ends before the last byte
of the last ACL field is rejected (the parser cannot extract the fields).

Entries follow P4Runtime: ``(table, {field: Exact | Ternary | Range | Lpm}, priority, action,
params)``, multicast groups ``group -> [egress ports]``, counters by name. The compiler
(nic_offload.compiler) writes ACL entries whose ranges never overlap within one
(class, state), so the decision never depends on entry order or priority (every ACL entry
has priority ``ACL_ENTRY_PRIORITY``, since P4Runtime requires one for range keys).

The topic_key table can hold millions of entries, so ``KeyRows`` keeps it as columns (numpy)
and expands it to ``TableEntry`` objects only when asked (serialization, tests).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from nic_offload.errors import ModelError

# --- names: the contract with p4/ ------------------------------------------------------------
CONTROL = "TopicwireIngress"

TOPIC_KEY_TABLE = f"{CONTROL}.topic_key"
TOPIC_KEY_FIELD = "hdr.msg.topic_key"

ACTION_DROP = f"{CONTROL}.drop"
ACTION_FORWARD = f"{CONTROL}.forward"
ACTION_FORWARD_GROUP = f"{CONTROL}.forward_group"
ACTION_PUNT = f"{CONTROL}.punt"

PARAM_EGRESS_PORT = "egress_port"
PARAM_GROUP = "group"
PARAM_ACL_CLASS = "acl_class"
PARAM_STATE = "state"

ACL_STAGES = 4
"""ACL range tables ``acl_0 .. acl_<ACL_STAGES-1>``; stage k matches ACL field k."""

ACL_TABLE_PREFIX = f"{CONTROL}.acl_"
ACL_CLASS_FIELD = "meta.acl_class"
ACL_STATE_FIELD = "meta.acl_state"
ACL_FIELD_PREFIX = "meta.field_"

ACTION_ACL_NEXT = f"{CONTROL}.acl_next"
ACTION_ACL_ACCEPT = f"{CONTROL}.acl_accept"
ACTION_ACL_REJECT = f"{CONTROL}.acl_reject"
ACTION_ACL_LOG = f"{CONTROL}.acl_log"

KEY_COUNTER = f"{CONTROL}.topic_key_counter"
"""Direct counter (packets and bytes) of the topic_key table."""

DIGEST_STRUCT = "topicwire_digest_t"
"""Digest of a punt or an ACL log: ``reason`` (DigestReason), ``topic_key``, ``acl_class``."""

# --- widths (bits) ---------------------------------------------------------------------------
TOPIC_KEY_BITS = 64
EGRESS_PORT_BITS = 16
"""A logical egress port: what the topic_key table's forward and the multicast groups name
(65,536 ports: sessions, guaranteed subscribers, destination appliances). The P4 program
maps it to v1model's 9-bit physical port in its ``port_map`` table (docs/offload.md)."""
PHYSICAL_PORT_BITS = 9
"""v1model's ``egress_spec``: a physical port of the switch (the P4 program only)."""
GROUP_BITS = 16
ACL_CLASS_BITS = 16
ACL_STATE_BITS = 16
DIGEST_REASON_BITS = 8
BITS_PER_BYTE = 8
ACL_FIELD_WIDTHS_BYTES = (1, 2, 4, 8)
"""Widths an ACL field may have (unsigned big-endian)."""
DEFAULT_ACL_FIELD_BYTES = 4

MAX_EGRESS_PORT = (1 << EGRESS_PORT_BITS) - 1
MAX_PHYSICAL_PORT = (1 << PHYSICAL_PORT_BITS) - 1
MAX_GROUP = (1 << GROUP_BITS) - 1
MAX_ACL_CLASS = (1 << ACL_CLASS_BITS) - 1
MAX_ACL_STATE = (1 << ACL_STATE_BITS) - 1

CPU_PORT = 255
"""Egress port of the CPU (BMv2's ``--cpu-port 255``): punts go there. Not a data port; the
same number as a logical port and as a physical one."""

PORT_MAP_TABLE = f"{CONTROL}.port_map"
"""The P4 program's logical -> physical port table (key ``meta.egress_port``): a table of the
P4 program only, not of the pipeline spec; the software NIC hands logical ports to the host's
data path itself. A logical port without an entry goes to the CPU port."""
PORT_MAP_FIELD = "meta.egress_port"
ACTION_TO_PORT = f"{CONTROL}.to_port"
ACTION_TO_CPU = f"{CONTROL}.to_cpu"
PARAM_PORT = "port"

NO_ACL_CLASS = 0
"""``acl_class`` 0: the forward needs no ACL."""

NO_GROUP = 0
"""Multicast group 0 means none (BMv2); groups are 1..MAX_GROUP."""

ACL_ENTRY_PRIORITY = 1
"""Priority of every ACL entry: their ranges never overlap, so one value serves all."""

# --- table sizes (entries) -------------------------------------------------------------------
KEY_TABLE_ENTRIES = 2_097_152
"""Default size of the topic_key table (P4 ``size``), in entries."""

ACL_TABLE_ENTRIES = 65_536
"""Default size of each ACL stage table, in entries."""

DIGEST_QUEUE_ENTRIES = 4_096
"""Default bound of the digest queue (punts and logs), in digests; more are dropped and
counted."""

# --- payload position ------------------------------------------------------------------------
FRAME_HEADER_BYTES = 32
MESSAGE_HEADER_BYTES = 40
"""Same as datapath.protocol (frame_layout, message_layout); repeated here because the P4
program needs them and nic_offload.model must stay importable on its own. A test checks
that they agree."""


class KeyAction(IntEnum):
    """Actions of the topic_key table, as the software NIC encodes them (0 = empty slot)."""

    DROP = 1
    FORWARD = 2
    FORWARD_GROUP = 3
    PUNT = 4


class AclAction(IntEnum):
    """Actions of the ACL tables, as the software NIC encodes them."""

    NEXT = 1
    ACCEPT = 2
    REJECT = 3
    LOG = 4


class DigestReason(IntEnum):
    """Why a digest was queued."""

    UNKNOWN_KEY = 1
    """topic_key table miss: the control plane does not know the key (yet)."""
    PUNT = 2
    """A punt entry: the control plane decides (e.g. egresses with different ACL classes)."""
    ACL_LOG = 3
    """acl_log: the message was forwarded and logged."""


KEY_ACTION_NAMES = {
    KeyAction.DROP: ACTION_DROP,
    KeyAction.FORWARD: ACTION_FORWARD,
    KeyAction.FORWARD_GROUP: ACTION_FORWARD_GROUP,
    KeyAction.PUNT: ACTION_PUNT,
}
ACL_ACTION_NAMES = {
    AclAction.NEXT: ACTION_ACL_NEXT,
    AclAction.ACCEPT: ACTION_ACL_ACCEPT,
    AclAction.REJECT: ACTION_ACL_REJECT,
    AclAction.LOG: ACTION_ACL_LOG,
}
KEY_ACTION_OF_NAME = {name: action for action, name in KEY_ACTION_NAMES.items()}
ACL_ACTION_OF_NAME = {name: action for action, name in ACL_ACTION_NAMES.items()}


def sorted_unique(values: Any, return_counts: bool = False) -> Any:
    """``np.unique(values)`` (sorted distinct values, and their counts when asked) by a sort
    and a comparison of neighbours. numpy 2's ``np.unique`` hashes, and on this project's
    arrays (100,000 int64 rows or uint64 keys) it took 200 to 390 ms against 1.5 ms for the
    sort: a subscribe or unsubscribe of 100,000 keys called it a dozen times."""
    ordered = np.sort(np.asarray(values).ravel())
    keep = np.empty(len(ordered), bool)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    distinct = ordered[keep]
    if not return_counts:
        return distinct
    starts = np.flatnonzero(keep)
    return distinct, np.diff(np.append(starts, len(ordered)))


def acl_table(stage: int) -> str:
    """Name of ACL stage table ``stage``."""
    return f"{ACL_TABLE_PREFIX}{stage}"


def acl_field(stage: int) -> str:
    """Name of the metadata field ACL stage ``stage`` matches."""
    return f"{ACL_FIELD_PREFIX}{stage}"


# --- match kinds -----------------------------------------------------------------------------
class MatchKind(IntEnum):
    EXACT = 1
    TERNARY = 2
    RANGE = 3
    LPM = 4


@dataclass(frozen=True, slots=True)
class Exact:
    value: int


@dataclass(frozen=True, slots=True)
class Ternary:
    value: int
    mask: int


@dataclass(frozen=True, slots=True)
class Range:
    low: int
    high: int
    """Inclusive, as in P4Runtime."""


@dataclass(frozen=True, slots=True)
class Lpm:
    value: int
    prefix_len: int


Match = Exact | Ternary | Range | Lpm
MATCH_KIND_OF = {Exact: MatchKind.EXACT, Ternary: MatchKind.TERNARY, Range: MatchKind.RANGE,
                 Lpm: MatchKind.LPM}


# --- pipeline spec ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AclField:
    """An ACL field: ``width`` bytes, unsigned big-endian, at ``offset`` bytes into the payload."""

    name: str
    offset: int
    width: int = DEFAULT_ACL_FIELD_BYTES

    @property
    def bits(self) -> int:
        return self.width * BITS_PER_BYTE

    @property
    def end(self) -> int:
        """First payload byte after the field."""
        return self.offset + self.width


@dataclass(frozen=True, slots=True)
class KeySpec:
    field: str
    kind: MatchKind
    bits: int


@dataclass(frozen=True, slots=True)
class ParamSpec:
    name: str
    bits: int


@dataclass(frozen=True, slots=True)
class ActionSpec:
    name: str
    params: tuple[ParamSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class TableSpec:
    name: str
    keys: tuple[KeySpec, ...]
    actions: tuple[ActionSpec, ...]
    default_action: str
    size: int

    @property
    def needs_priority(self) -> bool:
        return any(k.kind in (MatchKind.TERNARY, MatchKind.RANGE) for k in self.keys)

    def action(self, name: str) -> ActionSpec:
        for action in self.actions:
            if action.name == name:
                return action
        raise ModelError(f"table {self.name} has no action {name!r}; its actions are "
                         f"{', '.join(a.name for a in self.actions)}")


@dataclass(frozen=True, slots=True)
class CounterSpec:
    name: str
    unit: str
    """``packets_and_bytes`` (P4Runtime CounterSpec.Unit BOTH)."""
    direct_table: str


@dataclass(frozen=True, slots=True)
class HeaderField:
    """A header or metadata field a table reads, with its place in the first message."""

    name: str
    bits: int
    frame_offset: int | None
    """Byte offset in the frame (first message), or None for metadata set by actions."""


DEFAULT_ACL_FIELDS = tuple(
    AclField(f"field_{k}", k * DEFAULT_ACL_FIELD_BYTES) for k in range(ACL_STAGES))
"""Four 4-byte fields at payload offsets 0, 4, 8, 12."""

_KEY_PARAMS_FORWARD = (ParamSpec(PARAM_EGRESS_PORT, EGRESS_PORT_BITS),
                       ParamSpec(PARAM_ACL_CLASS, ACL_CLASS_BITS))
_KEY_PARAMS_GROUP = (ParamSpec(PARAM_GROUP, GROUP_BITS), ParamSpec(PARAM_ACL_CLASS, ACL_CLASS_BITS))


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """Header fields, tables (order, keys, actions, sizes), counters: what every executor runs."""

    acl_fields: tuple[AclField, ...] = DEFAULT_ACL_FIELDS
    key_table_entries: int = KEY_TABLE_ENTRIES
    acl_table_entries: int = ACL_TABLE_ENTRIES
    digest_queue_entries: int = DIGEST_QUEUE_ENTRIES
    tables: tuple[TableSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= len(self.acl_fields) <= ACL_STAGES:
            raise ModelError(f"a pipeline has 1..{ACL_STAGES} ACL fields, not "
                             f"{len(self.acl_fields)}; drop fields or raise ACL_STAGES in p4/ "
                             "and nic_offload.model together")
        names = set()
        for f in self.acl_fields:
            if f.width not in ACL_FIELD_WIDTHS_BYTES or f.offset < 0 or f.name in names:
                raise ModelError(f"ACL field {f.name!r}: width must be one of "
                                 f"{ACL_FIELD_WIDTHS_BYTES} bytes, offset >= 0, names unique")
            names.add(f.name)
        for size in (self.key_table_entries, self.acl_table_entries,
                     self.digest_queue_entries):
            if size < 1:
                raise ModelError("table and queue sizes must be >= 1 entries")
        object.__setattr__(self, "tables", self._build_tables())

    @property
    def stages(self) -> int:
        return len(self.acl_fields)

    @property
    def acl_fields_end(self) -> int:
        """Payload bytes a message needs for its ACL fields to be read."""
        return max(f.end for f in self.acl_fields)

    def _build_tables(self) -> tuple[TableSpec, ...]:
        key_table = TableSpec(
            TOPIC_KEY_TABLE, (KeySpec(TOPIC_KEY_FIELD, MatchKind.EXACT, TOPIC_KEY_BITS),),
            (ActionSpec(ACTION_DROP), ActionSpec(ACTION_FORWARD, _KEY_PARAMS_FORWARD),
             ActionSpec(ACTION_FORWARD_GROUP, _KEY_PARAMS_GROUP), ActionSpec(ACTION_PUNT)),
            ACTION_PUNT, self.key_table_entries)
        acl_actions = (ActionSpec(ACTION_ACL_NEXT, (ParamSpec(PARAM_STATE, ACL_STATE_BITS),)),
                       ActionSpec(ACTION_ACL_ACCEPT), ActionSpec(ACTION_ACL_REJECT),
                       ActionSpec(ACTION_ACL_LOG))
        acl_tables = tuple(
            TableSpec(acl_table(k), (KeySpec(ACL_CLASS_FIELD, MatchKind.EXACT, ACL_CLASS_BITS),
                                     KeySpec(ACL_STATE_FIELD, MatchKind.EXACT, ACL_STATE_BITS),
                                     KeySpec(acl_field(k), MatchKind.RANGE, f.bits)),
                      acl_actions, ACTION_ACL_REJECT, self.acl_table_entries)
            for k, f in enumerate(self.acl_fields))
        return (key_table, *acl_tables)

    def table(self, name: str) -> TableSpec:
        for spec in self.tables:
            if spec.name == name:
                return spec
        raise ModelError(f"no table {name!r} in the pipeline; tables are "
                         f"{', '.join(t.name for t in self.tables)}")

    def counters(self) -> tuple[CounterSpec, ...]:
        return (CounterSpec(KEY_COUNTER, "packets_and_bytes", TOPIC_KEY_TABLE),)

    def header_fields(self) -> tuple[HeaderField, ...]:
        """Fields the tables read; frame offsets are those of the frame's first message."""
        payload = FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES
        return (
            HeaderField(TOPIC_KEY_FIELD, TOPIC_KEY_BITS, FRAME_HEADER_BYTES),
            HeaderField(ACL_CLASS_FIELD, ACL_CLASS_BITS, None),
            HeaderField(ACL_STATE_FIELD, ACL_STATE_BITS, None),
            *(HeaderField(acl_field(k), f.bits, payload + f.offset)
              for k, f in enumerate(self.acl_fields)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "acl_fields": [{"name": f.name, "offset": f.offset, "width": f.width}
                           for f in self.acl_fields],
            "key_table_entries": self.key_table_entries,
            "acl_table_entries": self.acl_table_entries,
            "digest_queue_entries": self.digest_queue_entries,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> PipelineSpec:
        try:
            return cls(
                acl_fields=tuple(AclField(str(f["name"]), int(f["offset"]), int(f["width"]))
                                 for f in doc["acl_fields"]),
                key_table_entries=int(doc["key_table_entries"]),
                acl_table_entries=int(doc["acl_table_entries"]),
                digest_queue_entries=int(doc["digest_queue_entries"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"pipeline spec is incomplete or mistyped ({exc!r}); write it "
                             "with PipelineSpec.to_dict()") from None


DEFAULT_SPEC = PipelineSpec()


# --- entries ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TableEntry:
    """One P4Runtime table entry; ``match`` and ``params`` keep the spec's order."""

    table: str
    match: tuple[tuple[str, Match], ...]
    action: str
    params: tuple[tuple[str, int], ...] = ()
    priority: int | None = None
    is_default: bool = False

    @classmethod
    def make(cls, table: str, match: Mapping[str, Match], action: str,
             params: Mapping[str, int] | None = None, priority: int | None = None,
             ) -> TableEntry:
        return cls(table, tuple(match.items()), action, tuple((params or {}).items()), priority)

    @property
    def match_dict(self) -> dict[str, Match]:
        return dict(self.match)

    @property
    def params_dict(self) -> dict[str, int]:
        return dict(self.params)


@dataclass(frozen=True, slots=True)
class MulticastGroup:
    """Multicast group ``group_id`` replicates to ``ports`` (sorted, distinct)."""

    group_id: int
    ports: tuple[int, ...]


def _check_width(what: str, value: int, bits: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < (1 << bits):
        raise ModelError(f"{what} = {value!r} does not fit {bits} bits unsigned")


def validate_entry(spec: PipelineSpec, entry: TableEntry) -> None:
    """Raise ModelError unless ``entry`` fits its table in ``spec`` (keys, kinds, widths,
    action, params, priority)."""
    table = spec.table(entry.table)
    action = table.action(entry.action)
    where = f"entry of {entry.table}"
    if entry.is_default:
        if entry.match:
            raise ModelError(f"default {where} has match fields; a default has none")
    else:
        got = [name for name, _ in entry.match]
        want = [k.field for k in table.keys]
        if got != want:
            raise ModelError(f"{where} matches {got}; the table's keys are {want}, in order")
        for key, (_, match) in zip(table.keys, entry.match):
            if MATCH_KIND_OF.get(type(match)) is not key.kind:
                raise ModelError(f"{where}: {key.field} is a {key.kind.name.lower()} key, "
                                 f"got {match!r}")
            _check_match(where, key, match)
        if table.needs_priority and not entry.priority:
            raise ModelError(f"{where} needs a priority >= 1 (range/ternary keys)")
    got_params = [name for name, _ in entry.params]
    want_params = [p.name for p in action.params]
    if got_params != want_params:
        raise ModelError(f"{where}: action {entry.action} takes {want_params}, got {got_params}")
    for param, (_, value) in zip(action.params, entry.params):
        _check_width(f"{where}: {entry.action}({param.name})", value, param.bits)


def _check_match(where: str, key: KeySpec, match: Match) -> None:
    name = f"{where}: {key.field}"
    if isinstance(match, Exact):
        _check_width(name, match.value, key.bits)
    elif isinstance(match, Ternary):
        _check_width(name, match.value, key.bits)
        _check_width(f"{name} mask", match.mask, key.bits)
    elif isinstance(match, Range):
        _check_width(f"{name} low", match.low, key.bits)
        _check_width(f"{name} high", match.high, key.bits)
        if match.low > match.high:
            raise ModelError(f"{name}: range low {match.low} > high {match.high}")
    else:
        _check_width(name, match.value, key.bits)
        if not 0 <= match.prefix_len <= key.bits:
            raise ModelError(f"{name}: prefix length {match.prefix_len} outside 0..{key.bits}")


_KNOWN_ACTIONS = np.zeros(256, bool)
_KNOWN_ACTIONS[[int(a) for a in KeyAction]] = True


@dataclass(frozen=True, eq=False)
class KeyRows:
    """The topic_key table as columns: row i is ``keys[i] -> actions[i](targets[i],
    acl_classes[i])``; ``targets`` holds the egress port (FORWARD) or group (FORWARD_GROUP).

    Row order is stable across snapshots (a key keeps its row), so per-key counters can be
    indexed by row. Arrays are read-only.
    """

    keys: np.ndarray
    actions: np.ndarray
    targets: np.ndarray
    acl_classes: np.ndarray

    KEY_DTYPE = np.dtype(np.uint64)
    ACTION_DTYPE = np.dtype(np.uint8)
    TARGET_DTYPE = np.dtype(np.uint32)
    CLASS_DTYPE = np.dtype(np.uint16)

    def __post_init__(self) -> None:
        cols = {"keys": (self.keys, self.KEY_DTYPE), "actions": (self.actions, self.ACTION_DTYPE),
                "targets": (self.targets, self.TARGET_DTYPE),
                "acl_classes": (self.acl_classes, self.CLASS_DTYPE)}
        n = len(self.keys)
        for name, (array, dtype) in cols.items():
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1 \
                    or len(array) != n:
                raise ModelError(f"KeyRows.{name} must be a 1-D {dtype} array of {n} rows")
            if array.flags.writeable:
                array = array.copy()
                array.flags.writeable = False
                object.__setattr__(self, name, array)

    @classmethod
    def empty(cls) -> KeyRows:
        return cls(np.zeros(0, cls.KEY_DTYPE), np.zeros(0, cls.ACTION_DTYPE),
                   np.zeros(0, cls.TARGET_DTYPE), np.zeros(0, cls.CLASS_DTYPE))

    def __len__(self) -> int:
        return len(self.keys)

    def validate(self, spec: PipelineSpec) -> None:
        """Raise ModelError on key 0, duplicate keys, unknown actions or targets too wide."""
        if len(self) > spec.key_table_entries:
            raise ModelError(f"{len(self)} topic keys exceed the topic_key table "
                             f"({spec.key_table_entries} entries); raise key_table_entries")
        if len(self) and not self.keys.all():
            raise ModelError("topic key 0 is reserved (unknown topic) and cannot have an entry")
        if len(sorted_unique(self.keys)) != len(self):
            raise ModelError("the topic_key table holds a key twice; one entry per key")
        known = _KNOWN_ACTIONS[self.actions]  # (a look-up: np.isin costs 0.1 ms a call)
        if not known.all():
            raise ModelError(f"unknown key action code {int(self.actions[~known][0])}")
        ports = self.actions == KeyAction.FORWARD
        groups = self.actions == KeyAction.FORWARD_GROUP
        if (self.targets[ports] > MAX_EGRESS_PORT).any():
            raise ModelError(f"an egress port exceeds {EGRESS_PORT_BITS} bits "
                             f"(0..{MAX_EGRESS_PORT})")
        if ((self.targets[groups] > MAX_GROUP) | (self.targets[groups] == NO_GROUP)).any():
            raise ModelError(f"a multicast group is outside 1..{MAX_GROUP}")

    def entry(self, row: int) -> TableEntry:
        """Row ``row`` as a P4Runtime entry."""
        action = KeyAction(int(self.actions[row]))
        target = int(self.targets[row])
        acl_class = int(self.acl_classes[row])
        if action is KeyAction.FORWARD:
            params: tuple[tuple[str, int], ...] = ((PARAM_EGRESS_PORT, target),
                                                   (PARAM_ACL_CLASS, acl_class))
        elif action is KeyAction.FORWARD_GROUP:
            params = ((PARAM_GROUP, target), (PARAM_ACL_CLASS, acl_class))
        else:
            params = ()
        return TableEntry(TOPIC_KEY_TABLE, ((TOPIC_KEY_FIELD, Exact(int(self.keys[row]))),),
                          KEY_ACTION_NAMES[action], params)

    def entries(self) -> Iterator[TableEntry]:
        for row in range(len(self)):
            yield self.entry(row)


def key_rows_from_entries(entries: list[TableEntry]) -> KeyRows:
    """Columns from topic_key entries (validated by ``validate_entry`` beforehand)."""
    n = len(entries)
    keys = np.zeros(n, KeyRows.KEY_DTYPE)
    actions = np.zeros(n, KeyRows.ACTION_DTYPE)
    targets = np.zeros(n, KeyRows.TARGET_DTYPE)
    classes = np.zeros(n, KeyRows.CLASS_DTYPE)
    for row, entry in enumerate(entries):
        match = entry.match[0][1]
        assert isinstance(match, Exact)
        keys[row] = match.value
        action = KEY_ACTION_OF_NAME[entry.action]
        actions[row] = action
        params = entry.params_dict
        targets[row] = params.get(PARAM_EGRESS_PORT, params.get(PARAM_GROUP, 0))
        classes[row] = params.get(PARAM_ACL_CLASS, NO_ACL_CLASS)
    return KeyRows(keys, actions, targets, classes)


def default_entries(spec: PipelineSpec) -> tuple[TableEntry, ...]:
    """The default (miss) action of every table: punt for topic_key, reject for ACL stages."""
    return tuple(TableEntry(t.name, (), t.default_action, (), None, True) for t in spec.tables)


@dataclass(frozen=True, eq=False)
class EntrySet:
    """Everything an executor needs: spec, topic_key rows, ACL entries, multicast groups.

    ``version`` is the snapshot version the set was compiled as (0 for hand-made sets).
    """

    spec: PipelineSpec
    key_rows: KeyRows
    acl_entries: tuple[TableEntry, ...] = ()
    groups: tuple[MulticastGroup, ...] = ()
    version: int = 0

    def validate(self, *, keys: bool = True, rows: np.ndarray | None = None) -> None:
        """Raise ModelError unless every entry and group fits the spec and each other
        (``keys=False`` skips the per-row checks of the topic_key table; ``rows``: only these
        topic_key rows are checked for undefined multicast groups, the others having been
        checked when they last changed: a snapshot made from the one before, whose groups
        are freed only once no row holds them)."""
        if keys:
            self.key_rows.validate(self.spec)
        seen: set[tuple] = set()
        per_table: dict[str, int] = {}
        for entry in self.acl_entries:
            if not entry.table.startswith(ACL_TABLE_PREFIX) or entry.is_default:
                raise ModelError(f"acl_entries holds a {entry.table} entry; only ACL stage "
                                 "entries (not defaults) belong there")
            validate_entry(self.spec, entry)
            identity = (entry.table, entry.match)
            if identity in seen:
                raise ModelError(f"duplicate match in {entry.table}: {entry.match}")
            seen.add(identity)
            per_table[entry.table] = per_table.get(entry.table, 0) + 1
        for table, count in per_table.items():
            if count > self.spec.acl_table_entries:
                raise ModelError(f"{table} needs {count} entries, its size is "
                                 f"{self.spec.acl_table_entries}; raise acl_table_entries")
        ids = set()
        for group in self.groups:
            if not 1 <= group.group_id <= MAX_GROUP or group.group_id in ids:
                raise ModelError(f"multicast group {group.group_id}: ids are 1..{MAX_GROUP}, "
                                 "each once")
            if not group.ports or any(not 0 <= p <= MAX_EGRESS_PORT for p in group.ports):
                raise ModelError(f"multicast group {group.group_id} needs ports in "
                                 f"0..{MAX_EGRESS_PORT}")
            ids.add(group.group_id)
        targets, actions = self.key_rows.targets, self.key_rows.actions
        if rows is not None:
            targets, actions = targets[rows], actions[rows]
        used = targets[actions == KeyAction.FORWARD_GROUP]
        known = np.zeros(MAX_GROUP + 1, bool)  # a look-up per row, no sort of the rows
        known[list(ids)] = True
        missing = set(used[(used > MAX_GROUP) | ~known[np.minimum(used, MAX_GROUP)]].tolist())
        if missing:
            raise ModelError(f"topic keys forward to undefined multicast groups "
                             f"{sorted(missing)[:5]}; define them in groups")

    def table_entries(self) -> Iterator[TableEntry]:
        """Defaults first, then topic_key rows, then ACL entries (P4Runtime order)."""
        yield from default_entries(self.spec)
        yield from self.key_rows.entries()
        yield from self.acl_entries
