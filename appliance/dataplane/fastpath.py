"""Vectorised fast paths of the data-path agent for the common case of a burst (numpy, and
numba kernels for the header checks and the message copies).

The agent (appliance/dataplane/agent.py) classifies frames and frames messages with one Python
loop iteration per frame and per descriptor; at a few microseconds each that loop, not the
software NIC, bounds what one appliance forwards. These functions do the same work on whole
arrays when a burst is uniform, and decline (return ``None``/``False`` before changing
anything) whenever it is not, so the agent's general loop stays the one definition of the
behaviour and handles every other case:

- ``deliver``: the descriptors of one ``SoftNic.process`` call whose frames share one
  context (one publisher's ingress, or one origin's local delivery), of the plain class,
  to client and destination-appliance egresses only (no guaranteed egress, no fabric
  group): the publish entitlement check, the egress lookup and the per-destination framing
  are done per egress with one gather copy per output frame (``add_messages``).

``ENABLED`` switches them off (the differential tests run the same traffic both ways).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from nic_offload.softnic.layout import DescriptorKind

ENABLED = True
"""False: the agent's general loops do everything (tests compare both)."""
FASTPATH_MIN_FRAMES = 16
"""Bursts with fewer frames (or descriptors) than this take the general loop: the numpy
calls' fixed cost (~250 us a burst on the 2-core test machine, then ~2 us a message) is
more than the loop's (~110 us for one frame, then ~10 us a frame) below about 16 frames of
one message each (measured with one publisher and one subscriber)."""

_DATA = int(fl.FrameType.DATA)
_GROUP = int(DescriptorKind.GROUP)
_MAGIC0, _MAGIC1 = fl.FRAME_MAGIC >> 8, fl.FRAME_MAGIC & 0xFF
_HDR = fl.FRAME_HEADER_BYTES


@numba.njit(cache=True, nogil=True)
def _gather(dst: np.ndarray, first: int, src: np.ndarray, offs: np.ndarray,
            lens: np.ndarray, i: int, j: int) -> None:
    """Messages ``i..j`` (``src[offs[k]:offs[k] + lens[k]]``) one after another from
    ``dst[first]``."""
    pos = first
    for k in range(i, j):
        off = offs[k]
        for b in range(lens[k]):
            dst[pos + b] = src[off + b]
        pos += lens[k]


def warm_up() -> None:
    """Compile/load the kernels (the data-path agent calls it when it is made)."""
    buf = np.zeros(64, np.uint8)
    one = np.zeros(1, np.int64)
    _gather(buf, 32, buf, one, one + 8, 0, 1)


def _allowed(session: Any) -> np.ndarray:
    """The session's publishable keys as a sorted array (rebuilt when the set grows)."""
    cached = getattr(session, "_fastpath_allowed", None)
    if cached is None or cached[0] != len(session.allowed):
        cached = (len(session.allowed), np.sort(np.fromiter(
            session.allowed, np.uint64, len(session.allowed))))
        session._fastpath_allowed = cached
    return cached[1]


def _member(keys: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``np.isin(keys, allowed)`` for a sorted ``allowed`` (a binary search: np.isin's set-up
    costs more than a whole small burst)."""
    if not len(allowed):
        return np.zeros(len(keys), bool)
    pos = np.searchsorted(allowed, keys)
    np.minimum(pos, len(allowed) - 1, out=pos)
    return allowed[pos] == keys


def deliver(dp: Any, buf: np.ndarray, result: Any, ctxs: list[tuple]) -> bool:
    """Do the descriptor loop of ``DataPlaneAgent._deliver`` on arrays; False (nothing done)
    when the burst is not one this handles."""
    count = result.descriptors
    if not ENABLED or count < FASTPATH_MIN_FRAMES or not ctxs:
        return False
    c0 = ctxs[0]
    if ctxs.count(c0) != len(ctxs):
        return False
    ingress, origin, stream, session, _deadline, cls = c0[:6]
    if cls:
        return False
    nic = dp.nic
    d = nic.descriptors[:count]
    index = d["index"].astype(np.int64)
    offs = d["offset"].astype(np.int64)
    lens = d["length"].astype(np.int64)
    target = d["target"].astype(np.int64)
    is_group = d["kind"] == _GROUP
    tables = dp.tables
    ports_map = tables.ports
    # -- descriptors -> (descriptor, port) pairs; refuse what the general loop must do
    if is_group.any():
        groups = np.unique(target[is_group])
        ports_of = {int(g): np.asarray(dp._ports_of_group(int(g)), np.int64) for g in groups}
        reps = np.ones(count, np.int64)
        for g, ports in ports_of.items():
            reps[is_group & (target == g)] = len(ports)
        pair_desc = np.repeat(np.arange(count), reps)
        pair_port = np.repeat(target, reps)
        starts = np.cumsum(reps) - reps
        for g, ports in ports_of.items():
            for j in np.flatnonzero(is_group & (target == g)).tolist():
                pair_port[starts[j] : starts[j] + len(ports)] = ports
    else:
        pair_desc = np.arange(count)
        pair_port = target
    unique_ports = sorted(set(pair_port.tolist()))
    longest = int(lens.max()) + _HDR
    plan = []
    for port in unique_ports:
        what = ports_map.get(port)
        if what is None:
            plan.append((port, None, None))
            continue
        kind = what[0]
        if kind == "client":
            client = dp.sessions.get(what[1])
            if client is not None:
                queue = dp._out[client.channel]
                if longest > queue.max_frame_bytes:
                    return False
            plan.append((port, kind, client))
        elif kind == "node":
            if not ingress:
                plan.append((port, "skip", None))
                continue
            if getattr(tables, "group_direct", None) and what[1] in tables.group_direct:
                return False
            if longest > dp._out["fabric"].max_frame_bytes:
                return False
            plan.append((port, kind, what[1]))
        elif kind in ("gclient", "gnode"):
            if kind == "gnode" and not ingress:
                plan.append((port, "skip", None))
                continue
            if kind == "gclient" and not ingress:  # plain class: not for guaranteed egresses
                plan.append((port, "skip", None))
                continue
            return False
        else:
            return False
    # -- from here on the burst is ours: entitlements, then egress by egress
    counters = dp.counters
    counters["fastpath_deliveries"] += 1
    keep = None
    if ingress:
        keys = nic.batch["topic_key"][: result.messages]
        ok = _member(keys, _allowed(session))
        used = np.zeros(len(keys), bool)  # messages with a descriptor
        used[index] = True
        allowed = int(np.count_nonzero(ok & used))
        session.published += allowed
        denied = int(np.count_nonzero(used)) - allowed
        if denied:
            session.denied += denied
            counters["publish_denied"] += denied
        keep = ok[index]
    if keep is not None and not keep.all():
        pair_keep = keep[pair_desc]
        pair_desc = pair_desc[pair_keep]
        pair_port = pair_port[pair_keep]
    me = dp.node_id
    for port, kind, arg in plan:
        sel = pair_desc if len(plan) == 1 else pair_desc[pair_port == port]
        if not len(sel):
            continue
        if kind is None:
            counters["no_port"] += len(sel)
        elif kind == "client":
            if arg is not None:
                add_messages(dp._out[arg.channel], arg.dest, origin, arg.session_id, stream,
                             buf, offs[sel], lens[sel])
                arg.delivered += len(sel)
        elif kind == "node":
            hop = tables.next_hop.get(arg)
            if hop is None:
                counters["unroutable"] += len(sel)
            else:
                add_messages(dp._out["fabric"], hop, me, arg, stream, buf, offs[sel],
                             lens[sel])
    return True


def add_messages(queue: Any, dest: int, src: int, dst: int, stream: int, buf: np.ndarray,
                 offs: np.ndarray, lens: np.ndarray) -> None:
    """``queue.add_message`` for many messages of one (dest, src, dst, stream): the open
    frame is filled, then new frames, each filled with one gather copy."""
    key = (dest, src, dst, stream)
    ends = np.cumsum(lens)
    total_count = len(lens)
    i = 0
    while i < total_count:
        state = queue._open.get(key)
        if state is None:
            slot = queue._new_slot(dest)
            state = queue._open[key] = [slot, _HDR, 0]
        slot, pos, count = state
        base = int(ends[i - 1]) if i else 0
        fit = int(np.searchsorted(ends[i:], base + queue.max_frame_bytes - pos, side="right"))
        fit = min(fit, ml.MAX_MESSAGES_PER_FRAME - count, total_count - i)
        if fit <= 0:
            queue._finish(key, state)
            continue
        j = i + fit
        size = int(ends[j - 1]) - base
        first = int(queue.batch.offsets[slot]) + pos
        _gather(queue.batch.buf, first, buf, offs, lens, i, j)
        state[1] = pos + size
        state[2] = count + fit
        i = j
        if i < total_count:
            queue._finish(key, state)
