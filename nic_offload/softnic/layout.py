"""Layouts of the software NIC: the key hash table, output descriptors, digests, counters.

Key table: open addressing over one ``uint64`` array in buckets of four slots, each bucket
one 64-byte cache line (the array starts on a line boundary). ``slots`` is a power of two,
at least twice the keys (``KEY_TABLE_MAX_LOAD``); key 0 marks an empty slot (the registry
never hands out key 0). The home bucket is ``(key * HASH_MULTIPLIER) >> (64 - log2(buckets))``
(Fibonacci hashing: keys are hashes already, the multiply only guards against clustered
test keys). A bucket fills from slot 0 up and a key is never removed (rows keep their key
for ever), so a lookup reads the home bucket's line, compares its four keys at once, and
goes on to the next bucket only when the bucket is full and does not hold the key (linear
probing by buckets).

    bucket b = words 8b .. 8b+7 (64 bytes, one cache line):
    +-------+---------+-------+---------+-------+---------+-------+---------+
    | key 0 | value 0 | key 1 | value 1 | key 2 | value 2 | key 3 | value 3 |
    +-------+---------+-------+---------+-------+---------+-------+---------+

    value word:
     63                       36 35    32 31             16 15              0
    +---------------------------+--------+-----------------+-----------------+
    |  row (per-key counters)   | action |    acl_class    | port or group   |
    +---------------------------+--------+-----------------+-----------------+

ACL tables: every (stage, class, state) of the entry set whose field really decides
something is a *group* g: a run of sorted interval starts ``bound_lo[start:end]`` covering
the whole field (the first start is 0), read from one ACL field; ``groups[4g:4g+4]`` holds

    +-------+-----+------------------------------+-------------------+
    | start | end | payload offset of the field  | field width bytes |
    +-------+-----+------------------------------+-------------------+

(one load brings everything a hop needs) and ``group_field[g]`` the stage it belongs to.
Each interval has a *result* word ``bound_result[i]``: >= 0 is the group to go on to
(``acl_next``), < 0 is a verdict ``-AclAction`` (ACCEPT, REJECT, LOG).
``class_root[acl_class]`` is the result of entering (stage 0, class, state 0). A (stage,
class, state) with a single interval does not depend on its field, so it gets no group:
whatever leads to it holds its result instead (path compression; a class that tests one
field costs one search, whatever the stage). Entering a state without entries, or going on
past the last stage, is REJECT (the tables' miss action). The interval holding a value is
found by ``ACL_FIXED_SEARCH_STEPS`` halving steps without branches in groups of at most
``2 ** ACL_FIXED_SEARCH_STEPS`` intervals, by a binary search in larger ones.

Output descriptor (one per forwarded message, in message order)::

    offset i8   message start in the receive buffer (its 40-byte header)
    length i4   message bytes (header, payload, topic, padding)
    target u4   egress port (kind PORT) or multicast group (kind GROUP)
    kind   u1   DescriptorKind
    index  i4   the message's index in the decoded batch

Digest (a punt or an ACL log)::

    reason u1  model.DigestReason   acl_class u2   namespace_id u4
    topic_key u8   sequence u8   index i4 (message index in its batch)
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

HASH_MULTIPLIER = 0x9E3779B97F4A7C15
"""2^64 / golden ratio, odd (Fibonacci hashing)."""

WORDS_PER_SLOT = 2
KEY_WORD = 0
VALUE_WORD = 1
EMPTY_KEY = 0
SLOTS_PER_BUCKET = 4
WORDS_PER_BUCKET = SLOTS_PER_BUCKET * WORDS_PER_SLOT
CACHE_LINE_BYTES = 64
"""One bucket is one cache line; the key table array starts on a line boundary."""

TARGET_SHIFT = 0
TARGET_MASK = 0xFFFF
CLASS_SHIFT = 16
CLASS_MASK = 0xFFFF
ACTION_SHIFT = 32
ACTION_MASK = 0xF
ROW_SHIFT = 36
MAX_ROWS = 1 << (64 - ROW_SHIFT)
"""Rows (distinct keys) the value word can index."""

KEY_TABLE_MAX_LOAD = 0.5
"""Largest keys/slots ratio of the key table (linear probing: 1.5 probes per hit on average
at 0.5). A tunable; a lower bound trades memory for fewer probes."""

MIN_KEY_TABLE_SLOTS = 16
"""Smallest key table, in slots (four buckets)."""

GROUP_WORDS = 4
GROUP_START = 0
GROUP_END = 1
GROUP_FIELD_OFFSET = 2
GROUP_FIELD_WIDTH = 3

ACL_FIXED_SEARCH_STEPS = 5
"""ACL groups of at most 2**5 = 32 intervals are searched in exactly five branch-free steps
(no mispredicted loop exit whatever the group's size); larger groups by binary search."""



def terminal_result(action: int) -> int:
    """The result word of an ACL verdict (model.AclAction ACCEPT, REJECT or LOG)."""
    return -action


class DescriptorKind(IntEnum):
    PORT = 1
    GROUP = 2


class MessageVerdict(IntEnum):
    """What happened to one decoded message (``BurstResult.verdicts``); also counter indices."""

    NOT_PROCESSED = 0
    FORWARDED = 1
    LOGGED = 2
    """Forwarded, and an ACL log digest was queued."""
    DROPPED = 3
    """The key's action is drop (no egress subscribes)."""
    PUNTED = 4
    """The key's action is punt."""
    UNKNOWN_KEY = 5
    """Key 0 or not in the table: punted to the control plane."""
    ACL_REJECTED = 6
    ACL_SHORT_PAYLOAD = 7
    """The ACL rejected it because the payload ends before the last ACL field."""


class Counter(IntEnum):
    """Indices of the software NIC's global counters (after the verdict counters)."""

    FRAMES = 8
    """Frames looked at (valid, malformed or admin)."""
    ADMIN_FRAMES = 9
    """Valid admin frames (handed to the control path; no messages)."""
    MALFORMED_FRAMES = 10
    MESSAGES = 11
    DIGESTS = 12
    DIGEST_DROPS = 13
    """Digests lost because the queue was full."""


COUNTER_SLOTS = 16
"""Length of the counters array (verdicts 0..7, then Counter)."""

MALFORMED_SLOTS = 16
"""Length of the per-reason malformed counters (MalformedReason values index it)."""

DESCRIPTOR_DTYPE = np.dtype([("offset", "i8"), ("length", "i4"), ("target", "u4"),
                             ("kind", "u1"), ("index", "i4")])
DIGEST_DTYPE = np.dtype([("reason", "u1"), ("acl_class", "u2"), ("namespace_id", "u4"),
                         ("topic_key", "u8"), ("sequence", "u8"), ("index", "i4")])

STATUS_NOT_PROCESSED = 255
"""Status of a frame a burst did not reach (its messages did not fit); the value of
``datapath.protocol.batch.STATUS_NOT_PROCESSED``."""

DIGEST_HEAD = 0
DIGEST_TAIL = 1
DIGEST_STATE_WORDS = 2
"""Digest ring state: [head (next to drain), tail (next to write)], both ever-increasing."""

assert max(MessageVerdict) < min(Counter) and max(Counter) < COUNTER_SLOTS
