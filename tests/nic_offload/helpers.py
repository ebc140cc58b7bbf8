"""Generators the offload tests share: a schema, random ACL classes, entry sets and bursts."""

from __future__ import annotations

import random

import numpy as np

from datapath.protocol import admin_layout as al
from datapath.protocol import codec
from datapath.protocol.frame_layout import FrameType
from nic_offload import model
from nic_offload.acl import AclClass, compile_class
from nic_offload.model import EntrySet, KeyAction, KeyRows, MulticastGroup, PipelineSpec
from nic_offload.schema import Schema

QUOTE = Schema.of("quote", 7, [("symbol", 0, "ascii", 4), ("price", 4, "u32"),
                               ("size", 8, "i32"), ("venue", 12, "u32")])
"""Four 4-byte fields on the default pipeline's ACL offsets (0, 4, 8, 12)."""

SYMBOLS = ("IBM", "AAPL", "MSFT", "A", "Z", "")
VERDICTS = ("ACCEPT", "REJECT", "LOG")


def random_keys(rng: random.Random, n: int, low: int = 1, high: int = 2**64) -> list[int]:
    """``n`` distinct keys in ``low..high-1``."""
    keys: dict[int, None] = {}
    while len(keys) < n:
        keys[rng.randrange(low, high)] = None
    return list(keys)


def random_value(rng: random.Random, field: str) -> int | str:
    if field == "symbol":
        return rng.choice(SYMBOLS)
    if field == "size":
        return rng.choice([-5, 0, 1, 100, rng.randint(-(2**31), 2**31 - 1)])
    return rng.choice([0, 1, 50, 100, 1000, 2**32 - 1, rng.randint(0, 2**32 - 1)])


def _const(value: int | str) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value)


def random_condition(rng: random.Random, depth: int = 0) -> str:
    """A random condition over QUOTE's fields: comparisons, sets, ranges, and/or/not."""
    roll = rng.random()
    if depth < 2 and roll < 0.25:
        op = rng.choice(["and", "or"])
        return f"({random_condition(rng, depth + 1)} {op} {random_condition(rng, depth + 1)})"
    if depth < 2 and roll < 0.32:
        return f"not {random_condition(rng, depth + 1)}"
    field = rng.choice(["symbol", "price", "size", "venue"])
    kind = rng.random()
    if kind < 0.15:
        values = ", ".join(_const(random_value(rng, field)) for _ in range(rng.randint(1, 3)))
        return f"{field} in {{{values}}}"
    if kind < 0.3:
        a, b = sorted([random_value(rng, field), random_value(rng, field)],
                      key=lambda v: v.ljust(4, "\0") if isinstance(v, str) else v)
        return f"{field} between {_const(a)} and {_const(b)}"
    op = rng.choice(["<", "<=", ">", ">=", "==", "!="])
    return f"{field} {op} {_const(random_value(rng, field))}"


def random_acl_class(rng: random.Random, class_id: int, max_rules: int = 4) -> AclClass:
    rules = []
    for _ in range(rng.randint(1, max_rules)):
        on_miss = rng.choice(["", "", ", ACCEPT", ", REJECT", ", LOG", ", CONTINUE"])
        rules.append(f"({random_condition(rng)}, {rng.choice(VERDICTS)}{on_miss})")
    return AclClass.parse(class_id, QUOTE, rules, rng.choice(VERDICTS))


def random_payload(rng: random.Random, size: int = 16) -> bytes:
    values = {f: random_value(rng, f) for f in ("symbol", "price", "size", "venue")}
    return QUOTE.encode(values, size)


def random_entry_set(rng: random.Random, n_keys: int, *, n_classes: int = 3, version: int = 1,
                     spec: PipelineSpec = model.DEFAULT_SPEC) -> tuple[EntrySet, list[AclClass]]:
    """Random keys (never 0) with every action, random ACL classes and multicast groups."""
    classes = [random_acl_class(rng, c) for c in range(1, n_classes + 1)]
    keys = random_keys(rng, n_keys)
    groups = [MulticastGroup(g, tuple(sorted(rng.sample(range(1, 40), rng.randint(2, 4)))))
              for g in range(1, 6)]
    actions, targets, acl_classes = [], [], []
    for _ in keys:
        action = rng.choice(list(KeyAction))
        actions.append(action)
        targets.append(rng.randint(0, model.MAX_EGRESS_PORT) if action is KeyAction.FORWARD
                       else rng.choice(groups).group_id if action is KeyAction.FORWARD_GROUP
                       else 0)
        forwards = action in (KeyAction.FORWARD, KeyAction.FORWARD_GROUP)
        # class n_classes + 1 has no entries: it must reject like a table miss
        acl_classes.append(rng.randint(0, n_classes + 1) if forwards else 0)
    rows = KeyRows(np.array(keys, np.uint64), np.array(actions, np.uint8),
                   np.array(targets, np.uint32), np.array(acl_classes, np.uint16))
    acl_entries = tuple(e for c in classes for e in compile_class(c, spec))
    return EntrySet(spec, rows, acl_entries, tuple(groups), version), classes


def random_burst(rng: random.Random, keys: list[int], n_frames: int, *, malformed: float = 0.1,
                 admin: float = 0.05, max_messages: int = 6) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
    """Frames back to back in one buffer: DATA frames of known, unknown and 0 keys, with
    short payloads now and then; some admin frames; some frames damaged."""
    frames = []
    for _ in range(n_frames):
        if rng.random() < admin:
            frames.append(bytes(codec.encode_admin(FrameType.NAK, [al.SeqRange(1, 2)])))
            continue
        msgs = []
        for i in range(rng.randint(1, max_messages)):
            roll = rng.random()
            key = rng.choice(keys) if roll < 0.85 or not keys else (
                0 if roll < 0.9 else rng.randint(1, 2**64 - 1))
            size = rng.choice([16, 16, 16, 20, 3, 0, 15])
            msgs.append({"topic_key": key, "sequence": rng.randint(0, 2**64 - 1),
                         "namespace_id": rng.randint(0, 3), "payload": random_payload(rng, size)
                         [:size], "topic": b"a/b" if rng.random() < 0.1 else b"",
                         "flags": 1 if rng.random() < 0.1 else 0, "qos": rng.randint(0, 2),
                         "schema_id": i})
        frame = bytearray(codec.encode_data_frame(msgs, frame_type=rng.choice(
            [FrameType.DATA, FrameType.DATA, FrameType.RETRANSMISSION])))
        if rng.random() < malformed:
            spot = rng.randrange(len(frame))
            frame[spot] ^= 1 << rng.randrange(8)
        frames.append(bytes(frame))
    lengths = np.array([len(f) for f in frames], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return np.frombuffer(b"".join(frames), np.uint8).copy(), offsets, lengths
