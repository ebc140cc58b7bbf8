"""The schema of every CONTROL document, and the one check made before any field is read.

A CONTROL entry carries a JSON document whose ``kind`` says what it is (docs/appliance.md:
link state, interest, P&M's document, a login and its result, request results, resolve,
logout, echo, replay and its result). Whoever sent it (a client, a neighbour, the appliance
a client talks to) may be broken or hostile, so a receiver reads no field before
``validate(kind, text)`` has returned the document: a dict holding only the keys declared
for its kind, every one of them with the declared type and within its bounds (string
lengths, integer ranges, list lengths, the text of a topic pattern or an appliance name).
Anything else raises ``DocumentError`` (``control: bad lsa document: $.links[2][0]: ...``)
whose ``reason`` is one of ``REASONS``; receivers count it per reason
(``bad_document_<reason>``) and drop the entry. ``ACCEPTED`` says which kinds each kind of
sender may send at all.

Why a small hand-written checker rather than a JSON Schema library: the appliance takes no
dependency for ten small tables; the check runs on the control thread for every CONTROL
entry, and walking the document once against a few node types (``Str``, ``Int``, ``Bool``,
``Nullable``, ``List``, ``Row``, ``Obj``, ``Map``) costs microseconds with nothing compiled or
built beside it; the bounds are the protocol's own constants, written next to the keys they
bound; and an error names the path of the bad value.

Size and nesting are bounded before anything large is built: a document longer than its
kind's ``max_bytes`` is refused before parsing; ``json.loads`` refuses nesting deeper than
Python's recursion limit (``too_deep``); the checker descends only where a schema declares a
list or an object, so a value nested deeper than its schema is refused at the first level
that does not fit (the deepest schema, P&M's document, has 5 levels). Integers must be JSON
integers (no floats, no booleans, no NaN); strings must be encodable as UTF-8 (no lone
surrogates).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datapath.config import MAX_TOPIC_BYTES
from datapath.errors import TopicwireError
from datapath.protocol.admin_layout import MAX_CONTROL_DOCUMENT_BYTES, ControlKind
from datapath.protocol.replay_layout import MAX_PAGE_FRAMES
from datapath.topics.algebra import TopicError, split_pattern
from nic_offload.schema import MAX_SCHEMA_ID, TYPE_NAMES

REASONS = ("too_large", "not_json", "too_deep", "not_allowed", "wrong_type", "missing_key",
           "unknown_key", "out_of_range", "bad_text")
"""Why a document is refused (the suffix of the ``bad_document_<reason>`` counters)."""

MAX_NODE_ID = 2**31 - 1
MAX_U32 = 2**32 - 1
MAX_U63 = 2**63 - 1
MAX_U64 = 2**64 - 1
MAX_REASON_CHARS = 16_384
"""A reason quotes what it refused (a pattern of up to 1,024 bytes, escaped)."""
MAX_IDENTITY_CHARS = 255
MAX_RING_CHARS = 255
MAX_RESOLVE_KEYS = 4_096
"""Keys one RESOLVE may ask for (the client library sends at most this many)."""
MAX_LIST_ITEMS = 16_384
"""Bound of the long lists (links, interest patterns, routes): more than a frame can hold."""
MAX_PERSISTED_STREAMS = 64
"""Publishing streams one ``PERSISTED`` document names at most (a frame holds fewer)."""
MAX_CACHE_PATTERNS = 64
"""Patterns a ``PERSISTED`` beacon names at most (``cache.patterns`` holds no more)."""
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class DocumentError(TopicwireError, ValueError):
    """A CONTROL document that does not fit its kind's schema (``reason``: one of REASONS)."""

    component = "control"

    def __init__(self, kind: str, reason: str, path: str, detail: str) -> None:
        self.kind = kind
        self.reason = reason
        self.path = path
        super().__init__(f"bad {kind} document: {path}: {detail}; the entry is dropped and "
                         "counted")


class _Bad(Exception):
    def __init__(self, reason: str, path: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.path = path


def _type_name(value: object) -> str:
    return "null" if value is None else {dict: "object", list: "list", str: "string",
                                         bool: "boolean", int: "integer",
                                         float: "number"}.get(type(value), type(value).__name__)


# --- node types ----------------------------------------------------------------------------------
class Node:
    """One value's schema: ``check`` raises ``_Bad`` or returns."""

    def check(self, value: Any, path: str) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Str(Node):
    max_chars: int
    min_chars: int = 0
    choices: frozenset[str] | None = None
    text: Callable[[str], bool] | None = None
    """An extra test of the text (a topic pattern, an appliance name)."""
    what: str = ""
    """What ``text`` wants, for the error."""

    def check(self, value: Any, path: str) -> None:
        if type(value) is not str:
            raise _Bad("wrong_type", path, f"a string expected, got {_type_name(value)}")
        if not self.min_chars <= len(value) <= self.max_chars:
            raise _Bad("out_of_range", path, f"a string of {self.min_chars}..{self.max_chars} "
                       f"characters expected, got {len(value)}")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _Bad("bad_text", path, "the string is not valid UTF-8 (a lone "
                           "surrogate)") from None
        if self.choices is not None and value not in self.choices:
            raise _Bad("out_of_range", path, f"one of {', '.join(sorted(self.choices))} "
                       f"expected, got {value[:64]!r}")
        if self.text is not None and not self.text(value):
            raise _Bad("bad_text", path, f"{self.what} expected, got {value[:64]!r}")


@dataclass(frozen=True)
class Int(Node):
    low: int
    high: int

    def check(self, value: Any, path: str) -> None:
        if type(value) is not int:
            raise _Bad("wrong_type", path, f"an integer expected, got {_type_name(value)}")
        if not self.low <= value <= self.high:
            raise _Bad("out_of_range", path, f"an integer in [{self.low}, {self.high}] "
                       f"expected, got {value}")


@dataclass(frozen=True)
class Num(Node):
    """A finite number (an integer or a JSON number with a fraction) in [low, high]."""

    low: float
    high: float

    def check(self, value: Any, path: str) -> None:
        if type(value) not in (int, float) or value != value or value in (math.inf, -math.inf):
            raise _Bad("wrong_type", path, f"a number expected, got {_type_name(value)}")
        if not self.low <= value <= self.high:
            raise _Bad("out_of_range", path, f"a number in [{self.low:g}, {self.high:g}] "
                       f"expected, got {value}")


@dataclass(frozen=True)
class Bool(Node):
    def check(self, value: Any, path: str) -> None:
        if type(value) is not bool:
            raise _Bad("wrong_type", path, f"true or false expected, got {_type_name(value)}")


@dataclass(frozen=True)
class Nullable(Node):
    inner: Node

    def check(self, value: Any, path: str) -> None:
        if value is not None:
            self.inner.check(value, path)


@dataclass(frozen=True)
class List(Node):
    item: Node
    max_items: int
    min_items: int = 0

    def check(self, value: Any, path: str) -> None:
        if type(value) is not list:
            raise _Bad("wrong_type", path, f"a list expected, got {_type_name(value)}")
        if not self.min_items <= len(value) <= self.max_items:
            raise _Bad("out_of_range", path, f"a list of {self.min_items}..{self.max_items} "
                       f"items expected, got {len(value)}")
        check = self.item.check
        for i, item in enumerate(value):
            check(item, f"{path}[{i}]")


@dataclass(frozen=True)
class Row(Node):
    """A list of a fixed length whose items each have their own schema (``[node, cost]``)."""

    items: tuple[Node, ...]

    def check(self, value: Any, path: str) -> None:
        if type(value) is not list:
            raise _Bad("wrong_type", path, f"a list expected, got {_type_name(value)}")
        if len(value) != len(self.items):
            raise _Bad("out_of_range", path, f"a list of {len(self.items)} items expected, "
                       f"got {len(value)}")
        for i, (node, item) in enumerate(zip(self.items, value)):
            node.check(item, f"{path}[{i}]")


@dataclass(frozen=True)
class Obj(Node):
    """An object with these keys and no others."""

    required: Mapping[str, Node]
    optional: Mapping[str, Node] = field(default_factory=dict)
    rule: Callable[[dict], str | None] | None = None
    """A test across keys once each key passed (says what is missing, or None)."""

    def check(self, value: Any, path: str) -> None:
        if type(value) is not dict:
            raise _Bad("wrong_type", path, f"an object expected, got {_type_name(value)}")
        for key in value:
            if key not in self.required and key not in self.optional:
                raise _Bad("unknown_key", path, f"unknown key {str(key)[:64]!r} (known: "
                           f"{', '.join(sorted({*self.required, *self.optional}))})")
        for key, node in self.required.items():
            if key not in value:
                raise _Bad("missing_key", path, f"key {key!r} is required")
            node.check(value[key], f"{path}.{key}")
        for key, node in self.optional.items():
            if key in value:
                node.check(value[key], f"{path}.{key}")
        if self.rule is not None:
            missing = self.rule(value)
            if missing is not None:
                raise _Bad("missing_key", path, missing)


@dataclass(frozen=True)
class Map(Node):
    """An object whose keys are data (identities): each key and value checked."""

    key: Str
    value: Node
    max_items: int

    def check(self, value: Any, path: str) -> None:
        if type(value) is not dict:
            raise _Bad("wrong_type", path, f"an object expected, got {_type_name(value)}")
        if len(value) > self.max_items:
            raise _Bad("out_of_range", path, f"at most {self.max_items} keys expected, got "
                       f"{len(value)}")
        for key, item in value.items():
            self.key.check(key, f"{path} key")
            self.value.check(item, f"{path}[{key[:64]!r}]")


# --- the kinds -----------------------------------------------------------------------------------
def _is_pattern(text: str) -> bool:
    try:
        split_pattern(text)
    except TopicError:
        return False
    return True


NODE_ID = Int(1, MAX_NODE_ID)
EPOCH = Int(0, MAX_U63)
"""An appliance's epoch: its start time in ms (64 bits: control/auth.py)."""
SEQ = Int(0, MAX_U63)
NAMESPACE = Int(0, MAX_U32)
COST = Int(1, 65_535)
NAME = Str(64, 1, text=_NAME_RE.fullmatch, what="an appliance name (letters, digits, '.', "
           "'_', '-')")
IDENTITY = Str(MAX_IDENTITY_CHARS)


def _is_hex(text: str) -> bool:
    return len(text) % 2 == 0 and all(c in "0123456789abcdef" for c in text)


NONCE = Str(32, 32, text=_is_hex, what="16 bytes in lower-case hex")
KEY_HEX = Str(64, 64, text=_is_hex, what="32 bytes in lower-case hex")
VERIFIER = Obj({"n": Int(2, 1 << 20), "r": Int(1, 32), "p": Int(1, 16),
                "salt": Str(128, 32, text=_is_hex, what="16..64 bytes in lower-case hex"),
                "stored_key": KEY_HEX, "server_key": KEY_HEX})
"""An identity's login verifier (appliance/control/credentials.py): scrypt's parameters and
salt, StoredKey, ServerKey."""
SCRAM = Obj({"i": Int(4096, 10_000_000),
             "salt": Str(128, 24, text=_is_hex, what="12..64 bytes in lower-case hex"),
             "stored_key": KEY_HEX, "server_key": KEY_HEX})
"""An identity's SCRAM-SHA-256 stored keys (appliance/control/credentials.py ``ScramKeys``):
iteration count, salt, StoredKey, ServerKey (MQTT 5.0 enhanced authentication at edges)."""
CHALLENGE = Obj({"nonce": NONCE, "n": Int(2, 1 << 20), "r": Int(1, 32), "p": Int(1, 16),
                 "salt": Str(128, 32, text=_is_hex, what="16..64 bytes in lower-case hex")})
PATTERN = Str(MAX_TOPIC_BYTES, 1, text=_is_pattern, what="a topic pattern")
TEXT = Str(MAX_TOPIC_BYTES)
"""A topic or pattern echoed back (not necessarily valid: it may be the one refused)."""
REASON = Str(MAX_REASON_CHARS)
PATTERNS = List(Row((NAMESPACE, PATTERN)), MAX_LIST_ITEMS)
SELECTOR = Str(MAX_TOPIC_BYTES, 1)
"""``[[namespace, pattern], ...]``"""
ROUTES = List(Row((NODE_ID, NODE_ID, List(NODE_ID, 256, 2))), MAX_LIST_ITEMS)
"""``[[source, destination, [node, ...]], ...]``"""
SCHEMA = Obj({"name": Str(255, 1), "schema_id": Int(0, MAX_SCHEMA_ID),
              "fields": List(Obj({"name": Str(255, 1), "offset": Int(0, MAX_U32),
                                  "type": Str(8, choices=frozenset(TYPE_NAMES)),
                                  "width": Int(0, MAX_U32)}), 1_024)})
"""A payload schema (``nic_offload.schema.Schema.to_dict``)."""
ACL_NAME = Str(64, 1, text=_NAME_RE.fullmatch, what="a class name (letters, digits, '.', "
               "'_', '-')")
ACL_CLASS = Obj({"name": ACL_NAME, "schema": Str(255, 1), "rules": List(Str(4_096, 1), 256),
                 "default": Str(8, choices=frozenset({"ACCEPT", "REJECT", "LOG"}))})
"""A content ACL class (``[pm.acl_classes.NAME]``; appliance/control/pm.py): its rules are
parsed and compiled by each appliance against the document's schemas."""


MAX_REPLAY_MESSAGES = 65_535
"""Messages one replay page may name (the appliance's pages hold far fewer: their frames
bound them first)."""
REPLAY_ID = Int(1, MAX_U32)


DURABLE_NAME = Str(64, 1)
"""A durable subscription's name (its characters are checked by the cache's book)."""
MAX_DURABLE_WAIT_MS = 10_000
"""The longest a durable subscription's request may be held for new messages."""


MAX_REPLAY_LOSSES = 32
"""A durable page's answer names at most this many losses (appliance/cache/agent.py: 16 loss
markers and 16 deleted ranges at most)."""
REPLAY_LOSS = Obj({"at": SEQ, "reason": Str(32, 1), "messages": Int(0, MAX_U63)},
                  {"topic": TEXT, "origin": Int(0, MAX_NODE_ID), "stream": Int(0, MAX_U32),
                   "first_seq": Int(0, MAX_U64), "last_seq": Int(0, MAX_U64)})
"""One loss a durable page names in its place (cache sequence ``at``)."""


def _replay_rule(doc: dict) -> str | None:
    if "from_seq" in doc and "from_time_ns" in doc:
        return "give from_seq or from_time_ns, not both"
    if "durable" in doc and "from_time_ns" in doc:
        return "a durable subscription reads from its position (from_seq), not a time"
    if ("wait_ms" in doc or "delete" in doc or "ack" in doc) and "durable" not in doc:
        return "ack, wait_ms and delete are for a durable subscription (key 'durable')"
    return None


def _replay_result_rule(doc: dict) -> str | None:
    if doc["accepted"]:
        return None if {"count", "next_seq", "done"} <= doc.keys() else \
            "an accepted replay result needs keys 'count', 'next_seq' and 'done'"
    return None if "reason" in doc else "a refused replay result needs key 'reason'"


REPLAY_DOC = Obj({"id": REPLAY_ID, "pattern": PATTERN},
                 {"namespace": NAMESPACE, "from_seq": SEQ,
                  "from_time_ns": Int(0, MAX_U63), "durable": DURABLE_NAME,
                  "ack": SEQ, "wait_ms": Int(0, MAX_DURABLE_WAIT_MS),
                  "delete": Bool()},
                 _replay_rule)
"""A client's REPLAY (also inside a forwarded one, REMOTE_REPLAY)."""
REPLAY_WHY = Str(16, choices=frozenset(
    {"no_cache", "entitlement", "pattern", "busy", "storage", "durable", "remote"}))
"""Why a replay was refused (``remote``: the neighbour's cache it was forwarded to is down,
did not answer in time, or the forwarding appliance has no room for it)."""
REPLAY_RESULT_DOC = Obj(
    {"id": REPLAY_ID, "accepted": Bool()},
    {"count": Int(0, MAX_REPLAY_MESSAGES), "page": Int(0, MAX_U32),
     "frames": Int(0, MAX_PAGE_FRAMES), "next_seq": SEQ, "done": Bool(),
     "position": SEQ, "lost": Row((SEQ, SEQ)), "deleted": Bool(),
     "losses": List(REPLAY_LOSS, MAX_REPLAY_LOSSES),
     "reason": REASON, "why": REPLAY_WHY},
    _replay_result_rule)
FORWARD_ID = Int(1, MAX_U32)
"""A forwarded replay request's id at the forwarding appliance."""
MAX_FRAME_PARTS = 1_024
"""Parts one page frame travels in at most between appliances (65,504 bytes in parts of at
least 64)."""
MAX_PART_CHARS = 65_536
"""A part's base64 text at most (a frame on the link holds less)."""
MAX_RESULT_PARTS = 64
"""Parts a REPLAY_RESULT too large for one frame on the link travels in at most."""


def _remote_result_rule(doc: dict) -> str | None:
    if "result" in doc:
        return None if not {"part", "parts", "text"} & doc.keys() else \
            "give result, or part, parts and text, not both"
    if {"part", "parts", "text"} <= doc.keys():
        return None if doc["part"] < doc["parts"] else "part must be below parts"
    return "a forwarded replay's result needs key 'result', or 'part', 'parts' and 'text'"


_BASE64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


def _is_base64(text: str) -> bool:
    return len(text) % 4 == 0 and _BASE64.issuperset(text)


def _login_result_rule(doc: dict) -> str | None:
    if doc["accepted"] and "session" not in doc:
        return "an accepted login needs key 'session'"
    return None


def _request_result_rule(doc: dict) -> str | None:
    if doc["request"] == "register":
        return None if "topic" in doc and "namespace" in doc else \
            "a register result needs keys 'topic' and 'namespace'"
    return None if "sub_id" in doc else f"a {doc['request']} result needs key 'sub_id'"


SUCCESSOR_OPS = ("announce", "withdraw", "candidates", "set", "clear", "route", "unroute")
"""A SUCCESSOR document's ``op``: the first five a client's requests (answered with the same
op, ``ok`` and ``req``), the last two the appliance's notices to a successor."""
SUCCESSOR_NAME = Str(64, 1, text=str.isprintable, what="printable text")
"""A client id or vendor id of successor delivery (1..64 printable characters)."""


@dataclass(frozen=True)
class Kind:
    """One kind's document: its schema and its largest size (UTF-8 bytes)."""

    schema: Obj
    max_bytes: int = MAX_CONTROL_DOCUMENT_BYTES


FLOW_POLICY = Str(16, 1, frozenset({"throttle", "drop-oldest", "conflate"}))
"""A flow-control policy's name (datapath/flow_control.py ``POLICY_NAMES``)."""

MOVE_WHY = Str(16, 1, frozenset({"silence", "logout", "refused", "latency", "jitter",
                                  "loss", "asked"}))
"""Why a client's session moved (``LOGIN.moved_from.why``; ``Client.moves_by_reason``)."""
MAX_MIRROR_SUBSCRIPTIONS = 1_024
"""Subscriptions one mirrored session holds at most (a session with more is not mirrored)."""
MAX_MIRROR_SESSIONS = 4_096
"""Sessions (and ended sessions) one SESSION_MIRROR document names at most."""
MIRROR_SUBSCRIPTION = Row((NAMESPACE, PATTERN, Int(0, 2)))
"""(namespace, pattern, QoS number) of a mirrored or restored subscription."""
MOVE_BOUNDS = Obj({}, {"latency_ms": Num(0, 600_000), "jitter_ms": Num(0, 600_000),
                       "loss_ratio": Num(0, 1), "window_s": Num(0.5, 3_600),
                       "probe_interval_ms": Num(10, 10_000), "hold_down_s": Num(0, 86_400)})
"""An identity's move bounds (``pm.identities.NAME.move_on``: appliance/client/pathwatch.py
``MoveBounds`` checks them whole)."""

KINDS: dict[ControlKind, Kind] = {
    ControlKind.LSA: Kind(Obj({"origin": NODE_ID, "name": NAME, "epoch": EPOCH, "seq": SEQ,
                               "links": List(Row((NODE_ID, COST)), MAX_LIST_ITEMS)})),
    ControlKind.INTEREST: Kind(Obj({"origin": NODE_ID, "epoch": EPOCH, "seq": SEQ,
                                    "patterns": PATTERNS}, {"guaranteed": PATTERNS})),
    ControlKind.INTEREST_SELECTORS: Kind(Obj(
        {"origin": NODE_ID, "epoch": EPOCH, "seq": SEQ,
         "selective": List(Row((NAMESPACE, PATTERN, List(SELECTOR, MAX_LIST_ITEMS))),
                           MAX_LIST_ITEMS)})),
    ControlKind.RENDEZVOUS_COUNTS: Kind(Obj(
        {"origin": NODE_ID, "epoch": EPOCH, "seq": SEQ, "events": Int(0, MAX_U63),
         "counts": List(Row((Str(255, 1), Int(0, MAX_U63))), 256),
         "routes": List(Row((NAMESPACE, PATTERN, List(Str(255, 1), MAX_LIST_ITEMS))),
                        MAX_LIST_ITEMS)})),
    ControlKind.RENDEZVOUS_REGISTER: Kind(Obj(
        {"origin": NODE_ID, "epoch": EPOCH, "seq": SEQ, "target": NODE_ID,
         "rules": List(Row((NAMESPACE, PATTERN, SELECTOR, Str(255, 1))), MAX_LIST_ITEMS)})),
    ControlKind.PM_UPDATE: Kind(Obj(
        {"pm": NAME, "version": Int(0, MAX_U63),
         "identities": Map(IDENTITY, Obj({"publish": List(PATTERN, MAX_LIST_ITEMS),
                                          "subscribe": List(PATTERN, MAX_LIST_ITEMS)},
                                         {"verifier": VERIFIER, "scram_sha256": SCRAM,
                                          "acl_class": ACL_NAME,
                                          "namespaces": List(NAMESPACE, 4_096),
                                          "flow_policy": FLOW_POLICY,
                                          "move_on": MOVE_BOUNDS}),
                           MAX_LIST_ITEMS),
         "anonymous": Bool(), "namespaces": List(NAMESPACE, 4_096),
         "schemas": List(SCHEMA, 1_024), "routes": ROUTES},
        {"backups": ROUTES, "duplicate": PATTERNS, "require_passwords": Bool(),
         "acl_classes": List(ACL_CLASS, 256), "flow_policy": FLOW_POLICY})),
    ControlKind.POLICY_DROPS: Kind(Obj(
        {"drops": List(Row((Int(0, 2**64 - 1), FLOW_POLICY, Int(1, MAX_U63))),
                       MAX_LIST_ITEMS)})),
    ControlKind.PERSISTED: Kind(Obj(
        {"streams": List(Row((Int(0, MAX_U32), SEQ, SEQ, SEQ, REASON)),
                         MAX_PERSISTED_STREAMS)},
        {"patterns": List(PATTERN, MAX_CACHE_PATTERNS)})),
    ControlKind.LOGIN: Kind(Obj({"identity": IDENTITY},
                                {"ring": Nullable(Str(MAX_RING_CHARS, 1)),
                                 "token": Nullable(Int(0, MAX_U63)), "nonce": NONCE,
                                 "server_nonce": NONCE, "proof": KEY_HEX,
                                 "trusted": KEY_HEX, "probe": Int(0, MAX_U63),
                                 "standby": Bool(), "client_id": SUCCESSOR_NAME,
                                 "moved_from": Obj({"node_id": NODE_ID,
                                                    "session": Int(1, MAX_U32)},
                                                   {"why": MOVE_WHY})}), 4_096),
    ControlKind.SUCCESSOR: Kind(Obj(
        {"op": Str(16, choices=frozenset(SUCCESSOR_OPS))},
        {"req": Int(0, MAX_U32), "vendor": SUCCESSOR_NAME, "successor": SUCCESSOR_NAME,
         "ok": Bool(), "why": Str(32, 1), "error": REASON,
         "candidates": List(SUCCESSOR_NAME, 64), "ancestor": SUCCESSOR_NAME,
         "patterns": List(Row((NAMESPACE, PATTERN)), MAX_LIST_ITEMS)}), 16_384),
    ControlKind.SESSION_MIRROR: Kind(Obj(
        {"sessions": List(Row((Int(1, MAX_U32), IDENTITY,
                               List(MIRROR_SUBSCRIPTION, MAX_MIRROR_SUBSCRIPTIONS))),
                          MAX_MIRROR_SESSIONS)},
        {"ended": List(Int(1, MAX_U32), MAX_MIRROR_SESSIONS)})),
    ControlKind.LOGIN_RESULT: Kind(Obj(
        {"accepted": Bool()},
        {"session": Int(1, MAX_NODE_ID), "node": NAME, "node_id": NODE_ID,
         "restored": List(MIRROR_SUBSCRIPTION, MAX_MIRROR_SUBSCRIPTIONS),
         "schemas": List(SCHEMA, 1_024), "reason": REASON, "challenge": CHALLENGE,
         "server_signature": KEY_HEX, "probe": Int(0, MAX_U63), "move_on": MOVE_BOUNDS},
        _login_result_rule)),
    ControlKind.REQUEST_RESULT: Kind(Obj(
        {"request": Str(16, choices=frozenset({"subscribe", "unsubscribe", "register"})),
         "accepted": Bool()},
        {"sub_id": Int(0, MAX_U32), "pattern": TEXT, "topic": TEXT, "namespace": NAMESPACE,
         "reason": REASON, "selector_filtered": Bool(), "flow_policy": FLOW_POLICY,
         "own_class": Bool()},
        _request_result_rule)),
    ControlKind.RESOLVE: Kind(Obj({"keys": List(Int(0, MAX_U64), MAX_RESOLVE_KEYS)})),
    ControlKind.LOGOUT: Kind(Obj({}, {"reason": REASON, "move": Bool()}), 16_384),
    ControlKind.ECHO: Kind(Obj({"ts": Int(0, MAX_U64)}), 256),
    ControlKind.REPLAY: Kind(REPLAY_DOC, 8_192),
    ControlKind.REPLAY_RESULT: Kind(REPLAY_RESULT_DOC),
    ControlKind.REMOTE_REPLAY: Kind(Obj(
        {"fid": FORWARD_ID, "session": Int(1, MAX_U32), "identity": IDENTITY,
         "request": REPLAY_DOC}), 8_192),
    ControlKind.REMOTE_REPLAY_RESULT: Kind(Obj(
        {"fid": FORWARD_ID},
        {"result": REPLAY_RESULT_DOC, "part": Int(0, MAX_RESULT_PARTS - 1),
         "parts": Int(1, MAX_RESULT_PARTS), "text": Str(MAX_PART_CHARS, 1)},
        _remote_result_rule)),
    ControlKind.REMOTE_REPLAY_PART: Kind(Obj(
        {"fid": FORWARD_ID, "page": Int(0, MAX_U32), "frame": Int(0, MAX_PAGE_FRAMES - 1),
         "part": Int(0, MAX_FRAME_PARTS - 1), "parts": Int(1, MAX_FRAME_PARTS),
         "data": Str(MAX_PART_CHARS, 1, text=_is_base64, what="base64")})),
}
"""Every kind's schema (docs/appliance.md describes the documents)."""

ACCEPTED: dict[str, frozenset[ControlKind]] = {
    "client": frozenset({ControlKind.LOGIN, ControlKind.RESOLVE, ControlKind.LOGOUT,
                         ControlKind.REPLAY, ControlKind.SUCCESSOR}),
    "neighbour": frozenset({ControlKind.LSA, ControlKind.INTEREST, ControlKind.PM_UPDATE,
                            ControlKind.INTEREST_SELECTORS,
                            ControlKind.RENDEZVOUS_COUNTS, ControlKind.RENDEZVOUS_REGISTER,
                            ControlKind.LOGOUT, ControlKind.ECHO,
                            ControlKind.PERSISTED, ControlKind.REMOTE_REPLAY,
                            ControlKind.REMOTE_REPLAY_RESULT,
                            ControlKind.REMOTE_REPLAY_PART, ControlKind.SESSION_MIRROR}),
    "appliance": frozenset({ControlKind.LOGIN_RESULT, ControlKind.REQUEST_RESULT,
                            ControlKind.LOGOUT, ControlKind.REPLAY_RESULT,
                            ControlKind.POLICY_DROPS, ControlKind.SUCCESSOR}),
}
"""The kinds each sender may send: a client to its appliance, a neighbour to an appliance
(fabric groups carry no CONTROL frames), an appliance to its clients."""


def _name(kind: object) -> str:
    return kind.name.lower() if isinstance(kind, ControlKind) else str(kind)


def validate(kind: ControlKind, text: str | bytes, sender: str | None = None
             ) -> dict[str, Any]:
    """The document of a CONTROL entry of ``kind``, checked against the kind's schema; raises
    ``DocumentError`` (see the module docstring). ``sender`` (a key of ``ACCEPTED``): a kind
    that sender may not send is refused (``not_allowed``) before its document is looked at."""
    spec = KINDS.get(kind)  # type: ignore[call-overload]
    name = _name(kind)
    if spec is None:
        raise DocumentError(name, "not_allowed", "$", "no such CONTROL kind")
    if sender is not None and kind not in ACCEPTED[sender]:
        raise DocumentError(name, "not_allowed", "$", f"a {sender} does not send {name}")
    size = len(text)
    if size * 4 > spec.max_bytes and isinstance(text, str):
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise DocumentError(name, "bad_text", "$", "the document is not valid UTF-8") \
                from None
    if size > spec.max_bytes:
        raise DocumentError(name, "too_large", "$", f"{size} bytes, at most {spec.max_bytes}")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise DocumentError(name, "too_deep", "$", "nested too deeply to parse") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise DocumentError(name, "not_json", "$", f"not JSON ({str(exc)[:120]})") from None
    try:
        spec.schema.check(doc, "$")
    except _Bad as bad:
        raise DocumentError(name, bad.reason, bad.path, str(bad)) from None
    return doc
