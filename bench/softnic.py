"""``topicwire bench softnic``: the software NIC's data path, messages per second on one core.

The question (issue 3): how fast does the software NIC run frames through the offload
tables, with a large topic_key table and content ACLs on? ``topicwire`` is the numba pipeline
(``SoftNic.process_ring``: one call runs a ring of frames in bursts of ``--batch`` frames,
each burst validated, parsed, looked up, counted, filtered by the key's ACL class and turned
into descriptors, as a NIC works through its receive ring); two baselines are measured in
the same run:

- ``python_twin``: the same pipeline in pure Python (``nic_offload.softnic.twin``: the
  reference codec and the kernels' twins), on the first ``--twin-messages`` messages of the
  ring, reported per message;
- ``memory_floor``: one numpy pass that only reads every byte of the same frames
  (``np.bitwise_or.reduce`` over them as 64-bit words): no pipeline can beat it.

The workload: ``--keys`` random 64-bit topic keys (85 % forward to a port, 10 % to a
multicast group, 3 % drop, 2 % punt), every forwarding key with one of the ACL classes
(``--rules`` rules, ``--rules-per-class`` per class, market-data entitlements over a 16-byte
quote payload: symbol, price, size, venue); frames of ``--messages-per-frame`` messages
whose keys are drawn uniformly from the table (the worst case for the caches: every lookup
and every per-key counter lands on a random line of a table far larger than the caches),
``--unknown`` of them keys the table does not hold (punted, with a digest). The digest queue
holds a whole ring, so every digest is written, and is drained between repeats.

Before timing, the numba pipeline and the twin run the twin's sample and must agree on every
verdict, descriptor, counter and digest. The machine is shared, so each figure is measured
twice: ``msgs_per_s``/``ns_per_msg`` from the thread's CPU time (what one core spent), and
``wall_msgs_per_s`` from the wall clock. Progress goes to stderr, the report
(``bench.report``) to stdout.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.report import build_report, positive_int, progress
from datapath.config import BENCH_REPEATS
from datapath.errors import TopicwireError
from datapath.protocol.batch import new_message_batch, pack_frames
from datapath.protocol.frame_layout import FRAME_HEADER_BYTES, align8
from datapath.protocol.message_layout import MAX_MESSAGES_PER_FRAME, MESSAGE_HEADER_BYTES
from nic_offload import model
from nic_offload.acl import AclClass, compile_class
from nic_offload.model import EntrySet, KeyAction, KeyRows, MulticastGroup
from nic_offload.schema import Schema
from nic_offload.snapshot import Snapshot
from nic_offload.softnic import SoftNic
from nic_offload.softnic import layout as L
from nic_offload.softnic.twin import TwinState, run_twin

NAME = "softnic"
HELP = "software NIC: frames -> key table, ACLs, counters, descriptors (numba vs Python twin)"

QUOTE = Schema.of("quote", 1, [("symbol", 0, "ascii", 4), ("price", 4, "u32"),
                               ("size", 8, "u32"), ("venue", 12, "u32")])
"""The payload: four 4-byte fields on the default pipeline's ACL fields."""
PAYLOAD_BYTES = 16
SYMBOLS = tuple(f"S{i:03d}" for i in range(200))
VENUES = 16
PRICE_MAX = 10_000
SIZE_MAX = 1_000_000
PORTS = 64
"""Egress ports the keys forward to (0..63; the CPU port is 255)."""
GROUPS = 32
"""Multicast groups (2..4 ports each) the group keys forward to."""
KEY_ACTIONS = ((KeyAction.FORWARD, 0.85), (KeyAction.FORWARD_GROUP, 0.10),
               (KeyAction.DROP, 0.03), (KeyAction.PUNT, 0.02))
"""Share of each topic_key action in the table."""

RULE_SHAPES: tuple[tuple[float, str], ...] = (
    (0.30, "(venue == {v} and price < {p}, ACCEPT)"),
    (0.20, "(symbol in {{'{s1}', '{s2}', '{s3}'}}, REJECT)"),
    (0.20, "(price between {p} and {p2}, ACCEPT)"),
    (0.15, "(size >= {q} and venue != {v}, ACCEPT)"),
    (0.10, "(venue in {{{v}, {v2}}}, ACCEPT)"),
    (0.05, "(size > {big}, LOG)"),
)
"""Weight and shape of the entitlement rules (each class defaults to REJECT)."""

RING_FRAMES = 1 << 20
"""Frames in the ring each repeat runs (about 92 MB of one-message frames: far beyond the
caches, like a receive ring filled by DMA)."""
TWIN_MESSAGES = 2_000
"""Messages the pure-Python twin runs per repeat (it takes tens of microseconds each)."""
UNKNOWN_FRACTION = 0.01


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--keys", type=positive_int, default=1_000_000,
                        help="topic keys in the topic_key table (default 1000000)")
    parser.add_argument("--rules", type=positive_int, default=1_000,
                        help="ACL rules over all classes (default 1000)")
    parser.add_argument("--rules-per-class", type=positive_int, default=10,
                        help="rules per ACL class (default 10)")
    parser.add_argument("--batch", type=positive_int, default=64,
                        help="frames per burst (default 64)")
    parser.add_argument("--messages-per-frame", type=positive_int, default=1,
                        help="messages in each frame (default 1)")
    parser.add_argument("--ring-frames", type=positive_int, default=RING_FRAMES,
                        help=f"frames in the ring each repeat runs (default {RING_FRAMES})")
    parser.add_argument("--twin-messages", type=positive_int, default=TWIN_MESSAGES,
                        help=f"messages the Python twin runs per repeat (default "
                             f"{TWIN_MESSAGES})")
    parser.add_argument("--unknown", type=_fraction, default=UNKNOWN_FRACTION,
                        help=f"fraction of messages with keys the table does not hold "
                             f"(default {UNKNOWN_FRACTION})")
    parser.add_argument("--repeats", type=positive_int, default=BENCH_REPEATS,
                        help=f"repeats per figure, medians reported (default {BENCH_REPEATS})")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return value


# --- workload ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """Tables and a ring of frames, all built from one seed."""

    entries: EntrySet
    classes: int
    buf: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    messages: int


def rule_texts(count: int, rng: random.Random) -> list[str]:
    """``count`` entitlement rules drawn from ``RULE_SHAPES``."""
    weights = [w for w, _ in RULE_SHAPES]
    shapes = [s for _, s in RULE_SHAPES]
    texts = []
    for shape in rng.choices(shapes, weights, k=count):
        price = rng.randrange(PRICE_MAX)
        s1, s2, s3 = rng.sample(SYMBOLS, 3)
        texts.append(shape.format(
            v=rng.randrange(VENUES), v2=rng.randrange(VENUES), p=price,
            p2=min(PRICE_MAX, price + rng.randrange(1, PRICE_MAX // 4)), s1=s1, s2=s2, s3=s3,
            q=rng.randrange(SIZE_MAX), big=rng.randrange(SIZE_MAX * 98 // 100, SIZE_MAX)))
    return texts


def acl_classes(rules: int, per_class: int, rng: random.Random) -> list[AclClass]:
    """ACL classes 1..ceil(rules / per_class) holding ``rules`` rules in all."""
    classes = []
    for class_id in range(1, -(-rules // per_class) + 1):
        count = min(per_class, rules - (class_id - 1) * per_class)
        classes.append(AclClass.parse(class_id, QUOTE, rule_texts(count, rng), "REJECT"))
    return classes


def build_workload(keys: int, rules: int, rules_per_class: int, ring_frames: int,
                   messages_per_frame: int, unknown: float, seed: int) -> Workload:
    """The tables and the ring of frames of one run (deterministic in ``seed``)."""
    if rules_per_class > rules:
        raise TopicwireError(f"--rules-per-class ({rules_per_class}) exceeds --rules "
                             f"({rules}); lower it", component="bench")
    if messages_per_frame > MAX_MESSAGES_PER_FRAME:
        raise TopicwireError(f"a frame holds at most {MAX_MESSAGES_PER_FRAME} messages",
                             component="bench")
    rng = random.Random(seed)
    gen = np.random.default_rng(seed)
    classes = acl_classes(rules, rules_per_class, rng)
    acl = tuple(e for c in classes for e in compile_class(c, model.DEFAULT_SPEC))
    groups = tuple(MulticastGroup(g, tuple(sorted(rng.sample(range(PORTS), rng.randint(2, 4)))))
                   for g in range(1, GROUPS + 1))

    # keys: distinct, never 0, below 2**63 (unknown keys are drawn above it)
    table_keys = np.unique(gen.integers(1, 1 << 63, keys + keys // 8 + 16, dtype=np.uint64))
    while len(table_keys) < keys:  # pragma: no cover - needs a run of 64-bit collisions
        more = gen.integers(1, 1 << 63, keys, dtype=np.uint64)
        table_keys = np.unique(np.concatenate([table_keys, more]))
    table_keys = gen.permutation(table_keys[:keys])
    actions = gen.choice(np.array([a for a, _ in KEY_ACTIONS], np.uint8), keys,
                         p=[p for _, p in KEY_ACTIONS])
    forward = actions == KeyAction.FORWARD
    group = actions == KeyAction.FORWARD_GROUP
    targets = np.zeros(keys, np.uint32)
    targets[forward] = gen.integers(0, PORTS, int(forward.sum()))
    targets[group] = gen.integers(1, GROUPS + 1, int(group.sum()))
    acl_class = np.zeros(keys, np.uint16)
    acl_class[forward | group] = gen.integers(1, len(classes) + 1, int((forward | group).sum()))
    rows = KeyRows(table_keys, actions, targets, acl_class)
    entries = EntrySet(model.DEFAULT_SPEC, rows, acl, groups, 1)

    # messages: keys uniform over the table, some unknown; quote payloads in one arena
    n = ring_frames * messages_per_frame
    batch = new_message_batch(n)
    msg_keys = table_keys[gen.integers(0, keys, n)]
    strangers = gen.random(n) < unknown
    msg_keys[strangers] = gen.integers(1 << 63, (1 << 64) - 1, int(strangers.sum()),
                                       dtype=np.uint64)
    batch["topic_key"] = msg_keys
    batch["sequence"] = np.arange(n, dtype=np.uint64)
    batch["payload_len"] = PAYLOAD_BYTES
    batch["payload_offset"] = np.arange(n, dtype=np.int64) * PAYLOAD_BYTES
    arena = np.zeros((n, PAYLOAD_BYTES), np.uint8)
    symbols = np.frombuffer(b"".join(s.encode().ljust(4, b"\0") for s in SYMBOLS), ">u4")
    fields = (symbols[gen.integers(0, len(SYMBOLS), n)], gen.integers(0, PRICE_MAX, n),
              gen.integers(0, SIZE_MAX, n), gen.integers(0, VENUES, n))
    for k, values in enumerate(fields):
        arena[:, 4 * k:4 * k + 4] = np.asarray(values, ">u4").view(np.uint8).reshape(n, 4)
    frame_bytes = FRAME_HEADER_BYTES + messages_per_frame * (
        MESSAGE_HEADER_BYTES + align8(PAYLOAD_BYTES))
    buf = np.zeros(ring_frames * frame_bytes, np.uint8)
    offsets = np.zeros(ring_frames, np.int64)
    lengths = np.zeros(ring_frames, np.int64)
    packed = pack_frames(batch, n, arena.reshape(-1), buf, offsets, lengths,
                         max_frame_bytes=frame_bytes)
    assert packed.frames == ring_frames and packed.messages == n
    return Workload(entries, len(classes), buf, offsets, lengths, n)


# --- measurement ------------------------------------------------------------------------------
@dataclass
class Timing:
    """CPU and wall seconds of several runs."""

    cpu_s: list[float]
    wall_s: list[float]

    def add(self, fn: Callable[[], object]) -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        fn()
        self.cpu_s.append(time.thread_time() - cpu)
        self.wall_s.append(time.perf_counter() - wall)

    def figures(self, messages: int) -> dict[str, float]:
        cpu = float(np.median(self.cpu_s))
        wall = float(np.median(self.wall_s))
        return {"msgs_per_s": messages / cpu, "ns_per_msg": cpu * 1e9 / messages,
                "wall_msgs_per_s": messages / wall, "wall_ns_per_msg": wall * 1e9 / messages}


def _twin_frames(work: Workload, messages: int) -> int:
    """Frames holding the first ``messages`` messages (at least one frame)."""
    per_frame = work.messages // len(work.offsets)
    return max(1, min(len(work.offsets), -(-messages // per_frame)))


def check_against_twin(work: Workload, snapshot: Snapshot, frames: int, batch: int
                       ) -> dict[str, int]:
    """Run the first ``frames`` frames through a fresh software NIC and the twin; raise
    unless they agree on everything; return the verdict counters."""
    nic = SoftNic(snapshot, digest_entries=_digest_entries(work.messages))
    state = TwinState(len(nic._digests))
    offsets, lengths = work.offsets[:frames], work.lengths[:frames]
    descriptors, verdicts = SoftNic.ring_outputs(work.messages)
    ring = nic.process_ring(work.buf, offsets, lengths, descriptors, verdicts,
                            burst_frames=batch)
    twin_descs, twin_verdicts, _ = run_twin(
        memoryview(work.buf), offsets.tolist(), lengths.tolist(), snapshot.tables, state, batch,
        len(nic.batch))
    got_descs = [tuple(int(x) for x in d) for d in descriptors[:ring.descriptors]]
    digests = [tuple(int(x) for x in d) for d in nic.drain_digests()]
    if (verdicts[:ring.messages].tolist() != twin_verdicts or got_descs != twin_descs
            or nic._counters.tolist() != state.counters or digests != list(state.digests)):
        raise TopicwireError(
            f"the numba pipeline and its Python twin disagree on the first {frames} frames; "
            "this is a bug in nic_offload/softnic, report it with the seed", component="bench")
    return nic.counters()


def _digest_entries(messages: int) -> int:
    return max(1, messages)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; returns the report (``bench.report.build_report``)."""
    progress(NAME, f"building {args.keys} keys, {args.rules} ACL rules and "
                   f"{args.ring_frames} frames")
    work = build_workload(args.keys, args.rules, args.rules_per_class, args.ring_frames,
                          args.messages_per_frame, args.unknown, args.seed)
    start = time.perf_counter()
    snapshot = Snapshot.build(work.entries)
    build_s = time.perf_counter() - start
    tables = snapshot.tables

    twin_frames = _twin_frames(work, args.twin_messages)
    progress(NAME, f"checking the pipeline against its twin on {twin_frames} frames")
    check_against_twin(work, snapshot, twin_frames, args.batch)

    nic = SoftNic(snapshot, digest_entries=_digest_entries(work.messages))
    descriptors, verdicts = SoftNic.ring_outputs(work.messages)
    words = work.buf.view(np.uint64)
    ours, floor, twin = Timing([], []), Timing([], []), Timing([], [])
    twin_offsets = work.offsets[:twin_frames].tolist()
    twin_lengths = work.lengths[:twin_frames].tolist()
    twin_messages = 0
    verdict_counts: dict[str, int] = {}
    rings = []

    def ring() -> None:
        rings.append(nic.process_ring(work.buf, work.offsets, work.lengths, descriptors,
                                      verdicts, burst_frames=args.batch))

    def python_twin() -> None:
        nonlocal twin_messages
        state = TwinState(_digest_entries(work.messages))
        _, decided, _ = run_twin(memoryview(work.buf), twin_offsets, twin_lengths, tables,
                                 state, args.batch, len(nic.batch))
        twin_messages = len(decided)

    nic.process_ring(work.buf, work.offsets[:args.batch], work.lengths[:args.batch],
                     descriptors, verdicts, burst_frames=args.batch)  # warm up
    nic.drain_digests()
    for repeat in range(args.repeats):
        progress(NAME, f"repeat {repeat + 1}/{args.repeats}: {work.messages} messages")
        before = nic.counters()
        ours.add(ring)
        after = nic.counters()
        verdict_counts = {name: after[name] - before[name] for name in after}
        nic.drain_digests()
        floor.add(lambda: np.bitwise_or.reduce(words))
        twin.add(python_twin)
    last = rings[-1]
    if last.frames != len(work.offsets) or last.messages != work.messages:
        raise TopicwireError(f"the ring stopped after {last.frames} of {len(work.offsets)} "
                             "frames; this is a bug in the benchmark", component="bench")

    params = {
        "keys": args.keys,
        "rules": args.rules,
        "rules_per_class": args.rules_per_class,
        "acl_classes": work.classes,
        "acl_entries": len(work.entries.acl_entries),
        "acl_groups": tables.n_groups,
        "batch": args.batch,
        "messages_per_frame": args.messages_per_frame,
        "frame_bytes": int(work.lengths[0]),
        "ring_frames": len(work.offsets),
        "ring_messages": work.messages,
        "bursts_per_ring": last.bursts,
        "twin_messages": twin_messages,
        "checked_frames": twin_frames,
        "unknown": args.unknown,
        "key_table_bytes": tables.slots.nbytes,
        "key_table_longest_probe": tables.longest_probe,
        "key_counter_bytes": 2 * 8 * args.keys,
        "repeats": args.repeats,
        "seed": args.seed,
        "clock": "msgs_per_s and ns_per_msg from the thread's CPU time; wall_* from the "
                 "wall clock",
        "verdicts": {name: verdict_counts[name] for name in (
            *(v.name.lower() for v in L.MessageVerdict if v is not L.MessageVerdict.NOT_PROCESSED),
            "frames", "messages", "digests", "digest_drops")},
        "descriptors": last.descriptors,
    }
    results = {
        "topicwire": {**ours.figures(work.messages), "build_s": build_s},
        "python_twin": twin.figures(max(1, twin_messages)),
        "memory_floor": floor.figures(work.messages),
    }
    progress(NAME, "done")
    return build_report(NAME, params, results)
