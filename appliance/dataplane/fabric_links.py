"""The fabric channel of an appliance with RDMA neighbours: the UDP socket plus one RDMA link
per such neighbour, behind the one channel interface (docs/appliance.md, docs/rdma.md).

The data path stays as it is: it sends fabric frames with ``send(batch, EACH_SLOT)``, each
slot's peer id naming the neighbour (``peer_id_of`` its configured ``address``), and receives
frames with the sender's peer id. ``FabricLinks`` splits a send by peer id (frames for an
RDMA neighbour go to its link, the rest to the UDP socket, unchanged when no slot names an
RDMA neighbour) and hands out, per ``receive``, the frames of one source with something
waiting, taking the sources in turn (no copy: the source fills the caller's batch); frames
from a link carry the neighbour's peer id, so the control plane's bookkeeping of neighbours
is the same for both transports::

    send(batch, EACH_SLOT) --+-- peer ids of RDMA neighbours --> RdmaLink --> RdmaChannel
                             +-- every other peer id ----------> UdpChannel (fabric.listen)

An ``RdmaLink`` owns a set-up thread that makes its ``RdmaChannel`` (the end whose name
sorts first listens, the other connects; ``RdmaLinkSetup``) and hands it to the data path.
When the channel fails (the peer closed it, went away, stopped taking packets) the data path
closes it and the thread makes a new one, trying every ``RDMA_LINK_RETRY_NS``; meanwhile the
neighbour's frames are dropped (counted as ``link_down``) and the neighbour goes down by the
usual heartbeat timeout, and up again once the link is back. A link that pushes back (the
peer's credits are used up) holds the refused frames in a bounded backlog and sends them,
in order, before newer ones (``RDMA_LINK_BACKLOG_FRAMES``/``_BYTES``).

Status: each link is a channel row ``fabric-rdma:NAME`` (kind ``rdma``, counted across
reconnects); counters ``rdma_links_up``, ``rdma_link_connects``, ``rdma_link_failures``,
``rdma_link_setup_errors``, ``rdma_link_refused`` and ``rdma_link_up_NAME`` (0/1).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import numpy as np

from appliance.config import (
    RDMA_LINK_BACKLOG_BYTES,
    RDMA_LINK_BACKLOG_FRAMES,
    RDMA_LINK_RETRY_NS,
    ApplianceConfig,
    ConfigError,
    RdmaLinkConfig,
)
from channels.base import EACH_SLOT, Channel, Dest, FrameArrays, FrameBatch, as_frame_arrays
from channels.errors import ChannelDeviceError, ChannelError
from channels.stats import ChannelStats
from channels.udp import UdpChannel, peer_id_of

log = logging.getLogger("topicwire.appliance")

RECEIVE_WAIT_SLICE_NS = 1_000_000
"""``receive`` with a timeout waits on the UDP socket this long at a time between looks at
the links (the data path itself only polls, timeout 0)."""
SETUP_JOIN_TIMEOUT_S = 2.0
"""``close`` waits this long for a set-up thread (one in the middle of a set-up exchange
cannot be woken; it is a daemon thread and closes what it made)."""


class LinkSetup(Protocol):
    """Makes a link's channel (blocking, raising on failure); ``close`` wakes a waiting
    ``open`` where it can."""

    def open(self) -> Channel: ...

    def close(self) -> None: ...


class RdmaLinkSetup:
    """The RDMA set-up of one neighbour: listen on ``local:port`` and accept the neighbour at
    ``remote``, or connect from ``local`` to ``remote:port`` (``RdmaLinkConfig.listen``)."""

    def __init__(self, spec: RdmaLinkConfig) -> None:
        from channels.rdma import RdmaListener

        self.spec = spec
        self.refused = 0
        """Set-up connections from an address other than the neighbour's (closed)."""
        options = {"device": spec.device, "gid_index": spec.gid_index}
        self._listener = RdmaListener((spec.local, spec.port), **options) if spec.listen \
            else None

    def open(self) -> Channel:
        from channels.rdma import RdmaChannel

        spec = self.spec
        if self._listener is None:
            return RdmaChannel(connect=(spec.remote, spec.port), bind=spec.local,
                               device=spec.device, gid_index=spec.gid_index)
        while True:
            channel = self._listener.accept()
            host = channel.peer_address(channel.peer_id)[0]
            if host == spec.remote:
                return channel
            self.refused += 1
            log.warning("rdma link: refused a set-up from %s on %s:%d (the neighbour is %s)",
                        host, spec.local, spec.port, spec.remote)
            channel.close()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()


class ChannelLink:
    """Frames to and from one peer over one channel of its own: the channel while up, and a
    bounded backlog of frames it refused, sent in order before newer ones (module doc).

    ``send``/``receive``/``close`` run on the data-path thread. A failed channel is closed
    and counted (``failures``), the frames held for it dropped; ``_on_down`` says what comes
    next (a reconnect for an ``RdmaLink``, nothing for a link an accepted client made).
    """

    kind = "rdma"

    def __init__(self, name: str, peer_id: int, stats: ChannelStats, *,
                 backlog_frames: int = RDMA_LINK_BACKLOG_FRAMES,
                 backlog_bytes: int = RDMA_LINK_BACKLOG_BYTES) -> None:
        self.name = name
        self.peer_id = peer_id
        self.stats = stats
        """The link's figures (across reconnects: every channel it takes reports here)."""
        self.channel: Channel | None = None
        self.failures = 0
        self.last_error = ""
        self._backlog_frames = backlog_frames
        self._backlog_bytes = backlog_bytes
        # the backlog, made when first needed: frames [head, count) at offsets into buf,
        # used bytes at the end
        self._buf = np.zeros(0, np.uint8)
        self._offsets = np.zeros(0, np.int64)
        self._lengths = np.zeros(0, np.int64)
        self._head = self._count = self._used = 0

    def current(self) -> Channel | None:
        """The channel; None while down."""
        return self.channel

    def _on_down(self) -> None:
        """Called (data-path thread) once the failed channel is closed."""

    def _fail(self, exc: Exception) -> None:
        self.failures += 1
        self.last_error = str(exc)
        log.warning("rdma link %s: down: %s", self.name, exc)
        channel, self.channel = self.channel, None
        self._head = self._count = self._used = 0  # those frames went down with the link
        if channel is not None:
            try:
                channel.close()
            except ChannelError:
                pass
        self._on_down()

    @property
    def backlog(self) -> int:
        """Frames held back, waiting for the link to take them."""
        return self._count - self._head

    def send(self, buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> int:
        """Frames for the peer: sent, held back or (link down) dropped and counted;
        returns how many were taken (fewer: the backlog is full)."""
        n = len(offsets)
        channel = self.current()
        if channel is None:
            self.stats.on_drop("link_down", n)
            return n
        if self.backlog and not self.flush():
            self.stats.on_drop("link_down", n)
            return n
        taken = 0
        if not self.backlog:
            try:
                taken = channel.send(FrameArrays(buf, offsets, lengths, n))
            except ChannelDeviceError as exc:
                self._fail(exc)
                self.stats.on_drop("link_down", n)
                return n
        return taken + self._hold(buf, offsets[taken:], lengths[taken:])

    def flush(self) -> bool:
        """Offer the backlog to the channel; False when the link failed doing so."""
        channel = self.channel
        if channel is None:
            return False
        head, count = self._head, self._count
        try:
            taken = channel.send(FrameArrays(self._buf, self._offsets[head:count],
                                             self._lengths[head:count], count - head))
        except ChannelDeviceError as exc:
            self._fail(exc)
            return False
        self._head = head + taken
        if self._head == self._count:
            self._head = self._count = self._used = 0
        return True

    def _hold(self, buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> int:
        n = len(offsets)
        if not n:
            return 0
        if not len(self._offsets):
            self._buf = np.zeros(self._backlog_bytes, np.uint8)
            self._offsets = np.zeros(self._backlog_frames, np.int64)
            self._lengths = np.zeros(self._backlog_frames, np.int64)
        if self._head and (self._count + n > len(self._offsets)
                           or self._used + int(lengths.sum()) > len(self._buf)):
            self._compact()
        ends = self._used + np.cumsum(lengths)
        fits = min(n, len(self._offsets) - self._count,
                   int(np.searchsorted(ends, len(self._buf), side="right")))
        at, k = self._used, self._count
        for off, length in zip(offsets[:fits].tolist(), lengths[:fits].tolist(), strict=True):
            self._buf[at:at + length] = buf[off:off + length]
            self._offsets[k] = at
            self._lengths[k] = length
            at += length
            k += 1
        self._used, self._count = at, k
        return fits

    def _compact(self) -> None:
        """Move the held frames to the front of the backlog."""
        head, count = self._head, self._count
        start = int(self._offsets[head])
        size = self._used - start
        self._buf[:size] = self._buf[start:self._used].copy()
        self._offsets[:count - head] = self._offsets[head:count] - start
        self._lengths[:count - head] = self._lengths[head:count]
        self._head, self._count, self._used = 0, count - head, size

    def receive(self, batch: FrameBatch) -> int:
        """Frames from the peer (its peer id set), 0 while the link is down."""
        channel = self.current()
        if channel is None:
            return 0
        try:
            n = channel.receive(batch, 0)
        except ChannelDeviceError as exc:
            self._fail(exc)
            batch.count = 0
            return 0
        if n:
            batch.peer_ids[:n] = self.peer_id
        return n

    def close(self) -> None:
        """Close the channel (safe twice)."""
        if self.channel is not None:
            self.channel.close()
        self.channel = None


class RdmaLink(ChannelLink):
    """One RDMA neighbour: a ``ChannelLink`` whose set-up thread makes its channel, and
    makes a new one after a failure (module doc).

    The set-up thread only makes channels and hands each over through one attribute.
    """

    def __init__(self, name: str, peer_id: int, setup: LinkSetup, *,
                 retry_ns: int = RDMA_LINK_RETRY_NS,
                 backlog_frames: int = RDMA_LINK_BACKLOG_FRAMES,
                 backlog_bytes: int = RDMA_LINK_BACKLOG_BYTES) -> None:
        super().__init__(name, peer_id, ChannelStats(f"fabric-rdma:{name}"),
                         backlog_frames=backlog_frames, backlog_bytes=backlog_bytes)
        self.setup = setup
        self.connects = 0
        self.setup_errors = 0
        self._retry_s = retry_ns / 1e9
        self._handover: Channel | None = None
        self._wanted = threading.Event()
        self._wanted.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rdma-link-{name}", daemon=True)

    # --- the set-up thread ------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            self._wanted.wait()
            if self._stop.is_set():
                break
            try:
                channel = self.setup.open()
            except ChannelError as exc:
                if self._stop.is_set():
                    break
                self.setup_errors += 1
                self.last_error = str(exc)
                if not failing:
                    log.info("rdma link %s: set-up failed, retrying every %.1f s: %s",
                             self.name, self._retry_s, exc)
                failing = True
                self._stop.wait(self._retry_s)
                continue
            if self._stop.is_set():
                channel.close()
                break
            failing = False
            channel.stats = self.stats
            self._wanted.clear()
            self._handover = channel

    # --- the data path ----------------------------------------------------------------------
    def current(self) -> Channel | None:
        """The channel, taking over one the set-up thread made; None while down."""
        channel = self.channel
        if channel is None and self._handover is not None:
            channel = self.channel = self._handover
            self._handover = None
            self.connects += 1
            log.info("rdma link %s: up (%s)", self.name, channel.name)
        return channel

    def _on_down(self) -> None:
        log.info("rdma link %s: setting it up again", self.name)
        self._wanted.set()

    def close(self) -> None:
        """Stop the set-up thread and close the channel (safe twice)."""
        self._stop.set()
        self._wanted.set()
        self.setup.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(SETUP_JOIN_TIMEOUT_S)
        if self._handover is not None:
            self._handover.close()
        self._handover = None
        super().close()


class LinkChannel(Channel):
    """A UDP socket and links to some peers behind one channel (module doc): a send is split
    by peer id, receives take the sources in turn. Subclasses say which peer ids are links'
    (``_link_mask``); frames for a link's peer id without a live link are dropped and
    counted on the socket's figures (``no_link``)."""

    kind = "udp"

    def __init__(self, udp: Channel, links: list[ChannelLink]) -> None:
        super().__init__(name=udp.name)
        self.udp = udp
        self.links = links
        self.stats = udp.stats  # the channel's row stays the socket's; links have their own
        self._by_peer: dict[int, ChannelLink] = {}
        self._link_ids = np.zeros(0, np.int64)
        self._next = 0
        self._links_changed()

    def _links_changed(self) -> None:
        """Index ``links`` again (after adding or removing one, data-path thread)."""
        self._by_peer = {link.peer_id: link for link in self.links}
        self._link_ids = np.array(sorted(self._by_peer), np.int64)

    def _link_mask(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` are links' peer ids (not the socket's)."""
        return np.isin(ids, self._link_ids)

    def _is_link_id(self, peer_id: int) -> bool:
        return peer_id in self._by_peer

    @property
    def local_address(self) -> Any:
        return self.udp.local_address

    @property
    def max_frame_bytes(self) -> int:
        return self.udp.max_frame_bytes

    def peer_address(self, peer_id: int) -> Any:
        link = self._by_peer.get(peer_id)
        if link is not None and link.channel is not None:
            return link.channel.peer_address(peer_id)
        return self.udp.peer_address(peer_id)

    def fileno(self) -> int:
        return self.udp.fileno()

    def wait_fds(self) -> None:
        """None: the RDMA links have no descriptor to poll (the agent must not block)."""
        return None

    # --- send -------------------------------------------------------------------------------
    def _send_to_link(self, peer: int, buf: np.ndarray, offsets: np.ndarray,
                      lengths: np.ndarray) -> int:
        link = self._by_peer.get(peer)
        if link is None:
            self.stats.on_drop("no_link", len(offsets))
            return len(offsets)
        return link.send(buf, offsets, lengths)

    def send(self, frames: FrameBatch | FrameArrays | tuple, dest: Dest = None) -> int:
        self._check_open()
        if dest != EACH_SLOT or not isinstance(frames, FrameBatch):
            if not (isinstance(dest, int) and self._is_link_id(dest)):
                return self.udp.send(frames, dest)
            arrays = as_frame_arrays(frames)
            n = arrays.count
            return self._send_to_link(dest, arrays.buf, arrays.offsets[:n],
                                      arrays.lengths[:n]) if n else 0
        n = frames.count
        if not n:
            return 0
        ids = frames.peer_ids[:n]
        to_link = self._link_mask(ids)
        if not to_link.any():
            return self.udp.send(frames, EACH_SLOT)
        taken = 0
        linked = np.flatnonzero(to_link)
        for peer in np.unique(ids[linked]).tolist():
            sel = linked[ids[linked] == peer]
            taken += self._send_to_link(int(peer), frames.buf, frames.offsets[sel],
                                        frames.lengths[sel])
        rest = np.flatnonzero(~to_link)
        if rest.size:
            for peer in np.unique(ids[rest]).tolist():
                sel = rest[ids[rest] == peer]
                taken += self.udp.send(FrameArrays(frames.buf, frames.offsets[sel],
                                                   frames.lengths[sel], sel.size), int(peer))
        return taken

    # --- receive ----------------------------------------------------------------------------
    def receive(self, batch: FrameBatch, timeout_ns: int = 0) -> int:
        self._check_open()
        n = self._poll(batch)
        if n or timeout_ns == 0:
            return n
        deadline = None if timeout_ns < 0 else time.monotonic_ns() + timeout_ns
        while True:
            left = RECEIVE_WAIT_SLICE_NS if deadline is None else min(
                RECEIVE_WAIT_SLICE_NS, deadline - time.monotonic_ns())
            if left <= 0:
                batch.count = 0
                return 0
            n = self.udp.receive(batch, left) or self._poll(batch)
            if n:
                return n

    def _poll(self, batch: FrameBatch) -> int:
        """The frames of the first source, in turn from the one after the last that gave
        frames, with something waiting; backlogs are offered to their links first."""
        links = self.links
        for link in links:
            if link.backlog:
                link.flush()
        sources = len(links) + 1
        start = self._next % sources
        for j in range(sources):
            i = (start + j) % sources
            n = self.udp.receive(batch, 0) if i == 0 else links[i - 1].receive(batch)
            if n:
                self._next = (i + 1) % sources
                return n
        batch.count = 0
        return 0

    def status_parts(self) -> list[tuple[str, Any]]:
        """(row name, object with ``kind`` and ``stats``) of each link, for the status."""
        return [(link.stats.name, link) for link in self.links]

    def _close(self) -> None:
        for link in self.links:
            link.close()
        self.udp.close()


class FabricLinks(LinkChannel):
    """The fabric channel: the UDP socket and the RDMA neighbours' links (module doc)."""

    links: list[RdmaLink]  # type: ignore[assignment]

    def start(self) -> FabricLinks:
        for link in self.links:
            link.start()
        return self

    def status_counters(self) -> dict[str, int]:
        links = self.links
        counters = {
            "rdma_links_up": sum(link.channel is not None for link in links),
            "rdma_link_connects": sum(link.connects for link in links),
            "rdma_link_failures": sum(link.failures for link in links),
            "rdma_link_setup_errors": sum(link.setup_errors for link in links),
            "rdma_link_refused": sum(getattr(link.setup, "refused", 0) for link in links),
        }
        for link in links:
            counters[f"rdma_link_up_{link.name}"] = int(link.channel is not None)
        return counters


def check_rdma_here(local: str, device: str | None, gid_index: int | None, *,
                    key_transport: str, key_local: str, instead: str) -> None:
    """``ConfigError`` naming the key when this host has no RDMA (``key_transport``; the
    error says to ``instead``) or ``local`` has no usable RDMA device and GID (``key_local``)."""
    from channels import _rdma_verbs
    from channels.rdma import rdma_available

    available, why = rdma_available()
    if not available:
        raise ConfigError(f"{key_transport}: RDMA is not available here ({why}); {instead}")
    try:
        _rdma_verbs.choose_port_gid(local, device=device, gid_index=gid_index)
    except ChannelError as exc:
        raise ConfigError(f"{key_local}: {local} has no usable RDMA device and GID here: "
                          f"{exc}") from None


def open_fabric_links(config: ApplianceConfig, udp: UdpChannel) -> FabricLinks:
    """The fabric channel over ``udp`` with a link per RDMA neighbour of ``config``, set-up
    threads started; ``ConfigError`` naming the key when RDMA or the link's address is not
    usable here (nothing is left open then, but ``udp``)."""
    links: list[RdmaLink] = []
    try:
        for i, neighbour in enumerate(config.neighbours):
            spec = neighbour.rdma
            if spec is None:
                continue
            key = f"neighbours[{i}]"
            check_rdma_here(spec.local, spec.device, spec.gid_index,
                            key_transport=f"{key}.transport", key_local=f"{key}.rdma_local",
                            instead="use transport = \"udp\" or run on a host with an RDMA "
                            "device")
            try:
                setup = RdmaLinkSetup(spec)
            except ChannelDeviceError as exc:
                raise ConfigError(f"{key}.rdma_port: cannot listen for the set-up on "
                                  f"{spec.local}:{spec.port}: {exc}") from None
            links.append(RdmaLink(neighbour.name, peer_id_of(*neighbour.address), setup))
    except BaseException:
        for link in links:
            link.close()
        raise
    return FabricLinks(udp, links).start()
