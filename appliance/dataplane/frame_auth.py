"""The data path's signer and checker of plain DATA frames between appliances.

Plain DATA frames (published messages, frames in transit, telemetry probes) are signed as
their out queue is sent (``sign``: the fabric's unicast queue for the neighbour each frame
goes to, a group's queue for the group) and checked as they are received, by the forwarding
pipeline's kernel (appliance/dataplane/_kernels.py) or, for a burst it did not take, by
``check`` before the general loop reads it; the MAC, its link binding and the replay window
are datapath/protocol/frame_mac.py's. Admin frames and reliable-stream frames carry the
same trailer, signed and checked by their own planes (control/auth.py).

Windows: one per link (neighbour, this node) and (group member, group), allocated as the
neighbours and group members become known, at most AUTH_MAX_LINKS (a frame of a link beyond
them is refused, ``links_full``). Counters: ``data_auth_<reason>`` in ``/status``.
Without a fabric key (no neighbours) nothing is signed and every plain DATA frame from a
neighbour is refused (``unknown_key``).

``SessionAuth`` holds the keys and replay windows of client sessions that logged in with a
password (appliance/control/credentials.py): every frame such a session sends carries the
trailer under its session key, bound to (session id, this node); the pipeline's kernel
checks its DATA frames, the general loop (``SessionAuth.check``) the others. A LOGIN (source
session 0) needs none: a new login from a session's address proves its password anew.

The other way, every frame the data path sends such a session carries the trailer under the
same key (frame_mac.py: ``DOWN_PERSON``): deliveries, control replies, registry updates,
guaranteed streams. The out queue of the clients' UDP socket and of their shared memory is
signed as it is sent (``SessionAuth.sign``: one call per queue, ``sign_session_frames``; the
pipeline's fused receive-and-send signs its UDP queue in the kernel before ``sendmmsg``), for
the destinations of sessions with a key; the others' frames leave as they are. Counters
``client_mac_signed`` and ``client_mac_unsigned`` (a frame with no room for the trailer: the
client refuses it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from appliance.config import AUTH_MAX_LINKS
from appliance.dataplane.names import GROUP_RX, GROUP_TX
from datapath.protocol import frame_mac as fm
from datapath.protocol._kernels import (
    check_frames,
    check_session_frame,
    sign_frames,
    sign_session_frames,
)

_EMPTY = np.zeros(0, np.int64)
SESSION_AUTH_INITIAL_ROWS = 256
"""Rows a SessionAuth starts with (it doubles up to its bound as sessions with a key come)."""
SESSION_AUTH_ROW_BYTES = fm.SESSION_KEY_AT + fm.MAX_KEY_BYTES + (1 + fm.WINDOW_WORDS) * 8
"""A session's key (72 bytes) and replay window (136 bytes)."""


class DataAuth:
    """See the module docstring. Runs on the data-path thread."""

    def __init__(self, key: bytes | None, key_id: int, epoch: int, node_id: int,
                 start_ns: int, group_links: dict[str, int] | None = None,
                 max_links: int = AUTH_MAX_LINKS) -> None:
        """``group_links``: the link id (control/auth.py ``group_link_id``) of each fabric
        group channel, by the names of its receive and send channels."""
        self.keyed = key is not None
        self.abytes, self.actl = fm.new_state(key or b"\x00", key_id, epoch, node_id,
                                              start_ns)
        if key is None:
            self.actl[fm.A_KEY_ID] = -1  # no frame's key id matches: unknown_key
        self.node_id = node_id
        self.group_links = dict(group_links or {})
        self.windows = fm.new_windows(max_links)
        self._rows: dict[tuple[int, int], int] = {}
        self._arrays: dict[str, tuple[Any, tuple[np.ndarray, ...]]] = {}
        self.verdicts = np.zeros(0, np.int8)

    def row(self, sender: int, link: int) -> int:
        """The window row of link (sender, link), allocated on first use; -1 when none is
        left."""
        key = (sender, link)
        row = self._rows.get(key)
        if row is None:
            if len(self._rows) >= self.windows.shape[0]:
                return -1
            row = self._rows[key] = len(self._rows)
        return row

    def link_of(self, channel: str) -> int:
        """The receiver id in the MAC of frames on ``channel``: a group's link id (0 for a
        group without one: no key), else this node's id."""
        if channel.startswith(GROUP_RX):
            return self.group_links.get(channel, 0)
        return self.node_id

    def receive_arrays(self, tables: Any, channel: str) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray, int]:
        """(peer ids sorted, their node ids, their window rows, the receiver id) of the
        neighbours (or ``channel``'s group members) whose frames come in on ``channel``;
        made once per tables."""
        cached = self._arrays.get(channel)
        if cached is not None and cached[0] is tables:
            return cached[1]  # type: ignore[return-value]
        link = self.link_of(channel)
        if channel.startswith(GROUP_RX):
            pairs = sorted((peer, node) for (name, peer), node in tables.group_peers.items()
                           if name == channel)
        else:
            pairs = sorted(tables.peer_node.items())
        out = (np.asarray([p for p, _ in pairs], np.int64) if pairs else _EMPTY,
               np.asarray([n for _, n in pairs], np.int64) if pairs else _EMPTY,
               np.asarray([self.row(n, link) for _, n in pairs], np.int64) if pairs
               else _EMPTY, link)
        self._arrays[channel] = (tables, out)
        return out

    def check(self, channel: str, batch: Any, tables: Any, reliable_bit: int) -> list[int]:
        """Check the plain DATA frames of a received burst from the fabric (``check_frames``):
        the indexes of the frames to go on with (the refused ones are dropped, counted)."""
        n = batch.count
        if self.verdicts.shape[0] < n:
            self.verdicts = np.zeros(batch.capacity, np.int8)
        peers, senders, rows, link = self.receive_arrays(tables, channel)
        check_frames(batch.buf, batch.offsets, batch.lengths, batch.peer_ids,
                        np.arange(n, dtype=np.int64), n, reliable_bit, peers, senders, rows,
                        link, self.abytes, self.actl, self.windows, self.verdicts)
        return np.flatnonzero(self.verdicts[:n] != fm.REFUSED).tolist()

    def sign(self, channel: str, batch: Any, tables: Any, now_ns: int) -> None:
        """Sign the frames of an out queue's batch about to be sent on ``channel`` (the
        fabric's: for each frame's neighbour; a group's: for the group)."""
        if not self.keyed or not batch.count:
            return
        if channel.startswith(GROUP_TX):
            peers, receivers, link = _EMPTY, _EMPTY, self.group_links.get(channel, 0)
        else:
            peers, receivers, _, _ = self.receive_arrays(tables, channel)
            link = -1
        sign_frames(batch.buf, batch.offsets, batch.lengths, batch.peer_ids, batch.count,
                       batch.slot_bytes, peers, receivers, link, now_ns, self.abytes,
                       self.actl)

    def counters(self) -> dict[str, int]:
        """``data_auth_<reason>`` of the frames checked, and of the frames signed or left
        unsigned (no room, no neighbour behind their peer id)."""
        c = self.actl
        out = _verdict_counts(c, "data_auth_", fm.REASONS)
        out["data_auth_signed"] = int(c[fm.A_SIGNED])
        out["data_auth_unsigned"] = int(c[fm.A_UNSIGNED])
        return out


class SessionAuth:
    """Keys and replay windows of the client sessions with a key, one row each (see the
    module docstring). Runs on the data-path thread."""

    def __init__(self, node_id: int, rows: int, start_ns: int = 0,
                 initial_rows: int = SESSION_AUTH_INITIAL_ROWS) -> None:
        """``rows``: the most sessions with a key at once (one per egress port at most);
        the arrays start at ``initial_rows`` and double as sessions come (a row is
        ``SESSION_AUTH_ROW_BYTES``: 65,536 rows would be 13.6 MB, 256 are 53 KB)."""
        # scratch, counts, and the sequence of the frames it signs (from ``start_ns``)
        self.abytes, self.actl = fm.new_state(b"\x00", 0, 0, node_id, start_ns)
        self.node_id = node_id
        self.max_rows = rows
        first = max(1, min(rows, initial_rows))
        self.keys = fm.new_session_keys(first)
        self.windows = fm.new_windows(first)
        self._free = list(range(first - 1, -1, -1))
        self.version = 0
        """Changes when the arrays are replaced by larger ones (the kernels' cached
        arguments must be made again)."""
        self._dests: dict[str, dict[int, int]] = {}
        """Channel -> the destination (peer id, or session id on shared memory) of each
        session with a key -> its slot."""
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        """Channel -> (destinations sorted, 0..n-1, their slots): ``sign``'s arguments."""

    def attach(self, session: Any) -> None:
        """Give a session with a key its row (a session without one keeps -1)."""
        if session.key is None:
            return
        if not self._free:
            self._grow()
            if not self._free:
                return
        row = self._free.pop()
        key = session.key
        self.keys[row] = 0
        self.keys[row, 0] = len(key)
        self.keys[row, fm.SESSION_KEY_AT:fm.SESSION_KEY_AT + len(key)] = np.frombuffer(
            key, np.uint8)
        self.windows[row] = 0
        self.windows[row, 0] = -1
        session.auth_slot = row
        self._dests.setdefault(session.channel, {})[session.dest] = row
        self._arrays.pop(session.channel, None)

    def _grow(self) -> None:
        """Double the rows (up to ``max_rows``); the rows given keep their places."""
        rows = len(self.keys)
        more = min(self.max_rows, 2 * rows)
        if more <= rows:
            return
        keys, windows = fm.new_session_keys(more), fm.new_windows(more)
        keys[:rows] = self.keys
        windows[:rows] = self.windows
        self.keys, self.windows = keys, windows
        self._free = list(range(more - 1, rows - 1, -1))
        self.version += 1

    def detach(self, session: Any) -> None:
        row = session.auth_slot
        if row >= 0:
            self.keys[row] = 0
            self._free.append(row)
            session.auth_slot = -1
            dests = self._dests.get(session.channel, {})
            if dests.get(session.dest) == row:
                del dests[session.dest]
            self._arrays.pop(session.channel, None)

    def sign_arrays(self, channel: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(destinations sorted, their rows 0..n-1, their slots) of the sessions with a key
        on ``channel``; made again when one comes or goes."""
        got = self._arrays.get(channel)
        if got is None:
            pairs = sorted(self._dests.get(channel, {}).items())
            got = self._arrays[channel] = (
                np.asarray([d for d, _ in pairs], np.int64) if pairs else _EMPTY,
                np.arange(len(pairs), dtype=np.int64),
                np.asarray([s for _, s in pairs], np.int64) if pairs else _EMPTY)
        return got

    def sign(self, channel: str, batch: Any, now_ns: int) -> None:
        """Sign the frames of an out queue's batch about to be sent on ``channel`` to
        sessions with a key (one kernel call; the others are left as they are)."""
        if not batch.count or not self._dests.get(channel):
            return
        sign_session_frames(batch.buf, batch.offsets, batch.lengths, batch.peer_ids,
                            batch.count, batch.slot_bytes, *self.sign_arrays(channel), now_ns,
                            self.abytes, self.actl, self.keys)

    def check(self, batch: Any, i: int, session: Any) -> int:
        """Check frame ``i`` of a received burst from ``session`` (which has a key): its
        length without the trailer (updated in the batch), or -1 (refused, counted)."""
        got = check_session_frame(batch.buf, int(batch.offsets[i]), int(batch.lengths[i]),
                                  session.session_id, self.node_id, session.auth_slot,
                                  self.abytes, self.actl, self.keys, self.windows)
        if got >= 0:
            batch.lengths[i] = got
        return int(got)

    def counters(self) -> dict[str, int]:
        """``client_auth_<reason>`` of the sessions' frames checked (a session has its own
        row: never ``links_full``)."""
        out = _verdict_counts(self.actl, "client_auth_", fm.REASONS[:-1])
        out["client_mac_signed"] = int(self.actl[fm.A_SIGNED])
        out["client_mac_unsigned"] = int(self.actl[fm.A_UNSIGNED])
        return out


def _verdict_counts(actl: np.ndarray, prefix: str, reasons: tuple[str, ...]
                    ) -> dict[str, int]:
    """The receive verdicts a checker counted in ``actl`` (``fm.REASONS`` order), named."""
    return {prefix + name: int(v)
            for name, v in zip(reasons, actl[fm.A_ACCEPTED:fm.A_ACCEPTED + len(reasons)])}


def warm_frame_auth() -> None:
    """Load (or, with a cold cache, compile) the frame MAC's kernels with the argument types
    the data path calls them with, on throwaway state, before the data path runs: a compile
    on the data-path thread would stall it for seconds at the first fabric frame."""
    buf = np.zeros(fm.AUTH_BYTES, np.uint8)
    one = np.zeros(1, np.int64)
    ab, ac = fm.new_state(b"\x00", 0, 0, 1, 0)
    windows = fm.new_windows(1)
    sign_frames(buf, one, one, one, 0, 0, _EMPTY, _EMPTY, -1, 0, ab, ac)
    check_frames(buf, one, one, one, one, 0, 0, _EMPTY, _EMPTY, _EMPTY, 0, ab, ac, windows,
                 np.zeros(1, np.int8))
    check_session_frame(buf, 0, 0, 0, 0, 0, ab, ac, fm.new_session_keys(1), windows)
    sign_session_frames(buf, one, one, one, 0, 0, _EMPTY, _EMPTY, _EMPTY, 0, ab, ac,
                        fm.new_session_keys(1))
