"""RDMA clients of an appliance: the client UDP socket plus one RDMA channel per connected
client, behind the one client channel (``[clients] rdma``, docs/appliance.md, docs/rdma.md).

An accept thread waits on an ``RdmaListener`` (``clients.rdma``) and hands each accepted
``RdmaChannel`` to the data path, which gives it a ``ChannelLink``
(appliance/dataplane/fabric_links.py) with a peer id of its own: ``RDMA_CLIENT_PEER_BASE``
plus a count, never reused, above every UDP peer id (``(ipv4 << 16) | port`` < 2**48). The
data path keys client sessions by (channel, peer id), so an RDMA client logs in, publishes,
subscribes and gets its messages exactly as a UDP client does::

    send(batch, EACH_SLOT) --+-- peer ids >= RDMA_CLIENT_PEER_BASE --> ChannelLink --> RdmaChannel
                             +-- every other peer id -------------> UdpChannel (clients.udp)

A client whose channel fails (it closed it, went away, stopped taking packets) has its
channel closed, counted and its link removed; frames for its peer id are then dropped
(``no_link`` on the clients row) and its session expires as a silent client's does
(``clients.session_dead_ms``). A client that connects again is a new peer and logs in again.

Status: each connected client is a channel row ``clients-rdma:N`` (kind ``rdma``); counters
``rdma_clients_up``, ``rdma_clients_accepted``, ``rdma_clients_closed`` (channels that
failed or were closed by the client) and ``rdma_client_setup_errors``.
"""

from __future__ import annotations

import errno
import itertools
import logging
import threading
from collections import deque
from typing import Protocol

import numpy as np

from appliance.config import ApplianceConfig, ConfigError
from appliance.dataplane.fabric_links import (
    SETUP_JOIN_TIMEOUT_S,
    ChannelLink,
    LinkChannel,
    check_rdma_here,
)
from channels.base import Channel, FrameBatch
from channels.errors import ChannelDeviceError, ChannelError
from channels.stats import ChannelStats

log = logging.getLogger("topicwire.appliance")

RDMA_CLIENT_PEER_BASE = 1 << 48
"""Peer ids of RDMA clients start here (UDP peer ids are below)."""
ACCEPT_WAIT_NS = 200_000_000
"""The accept thread looks at its stop flag this often."""
ACCEPT_ERROR_PAUSE_S = 0.05
"""After a failed set-up with a client, the accept thread waits this long before the next."""


class Acceptor(Protocol):
    """What the accept thread waits on: ``accept(timeout_ns)`` returns a channel or raises a
    ``ChannelError`` (``ETIMEDOUT`` when nobody came); ``close`` stops it."""

    def accept(self, timeout_ns: int) -> Channel: ...

    def close(self) -> None: ...


class ClientLinks(LinkChannel):
    """The client channel: the UDP socket and a link per RDMA client (module doc)."""

    def __init__(self, udp: Channel, acceptor: Acceptor) -> None:
        super().__init__(udp, [])
        self.acceptor = acceptor
        self.accepted = 0
        self.closed_links = 0
        self.setup_errors = 0
        self.last_error = ""
        self._handover: deque[Channel] = deque()
        """Accepted channels, from the accept thread to the data path."""
        self._numbers = itertools.count(1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rdma-clients", daemon=True)

    def start(self) -> ClientLinks:
        self._thread.start()
        return self

    def _link_mask(self, ids: np.ndarray) -> np.ndarray:
        return ids >= RDMA_CLIENT_PEER_BASE

    def _is_link_id(self, peer_id: int) -> bool:
        return peer_id >= RDMA_CLIENT_PEER_BASE

    # --- the accept thread ------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                channel = self.acceptor.accept(ACCEPT_WAIT_NS)
            except ChannelError as exc:
                if self._stop.is_set():
                    break
                if getattr(exc, "errno", None) == errno.ETIMEDOUT:
                    continue
                self.setup_errors += 1
                self.last_error = str(exc)
                log.warning("rdma clients: a set-up with a client failed: %s", exc)
                self._stop.wait(ACCEPT_ERROR_PAUSE_S)
                continue
            if self._stop.is_set():
                channel.close()
                break
            self._handover.append(channel)

    # --- the data path ----------------------------------------------------------------------
    def _adopt(self) -> None:
        """Take the accepted channels as links, drop the links whose channel failed."""
        changed = False
        while self._handover:
            channel = self._handover.popleft()
            number = next(self._numbers)
            link = ChannelLink(f"client-{number}", RDMA_CLIENT_PEER_BASE + number,
                               ChannelStats(f"clients-rdma:{number}"))
            channel.stats = link.stats
            link.channel = channel
            self.links.append(link)
            self.accepted += 1
            changed = True
            log.info("rdma clients: client %d connected (%s)", number, channel.name)
        if any(link.channel is None for link in self.links):
            gone = [link for link in self.links if link.channel is None]
            self.links = [link for link in self.links if link.channel is not None]
            self.closed_links += len(gone)
            changed = True
        if changed:
            self._links_changed()

    def _poll(self, batch: FrameBatch) -> int:
        if self._handover or any(link.channel is None for link in self.links):
            self._adopt()
        return super()._poll(batch)

    # --- status -----------------------------------------------------------------------------
    def status_counters(self) -> dict[str, int]:
        return {
            "rdma_clients_up": sum(link.channel is not None for link in self.links),
            "rdma_clients_accepted": self.accepted,
            "rdma_clients_closed": self.closed_links,
            "rdma_client_setup_errors": self.setup_errors,
        }

    def _close(self) -> None:
        self._stop.set()
        self.acceptor.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(SETUP_JOIN_TIMEOUT_S)
        while self._handover:
            self._handover.popleft().close()
        super()._close()


def open_client_links(config: ApplianceConfig, udp: Channel) -> ClientLinks:
    """The client channel over ``udp`` with the RDMA client endpoint of ``config``, the
    accept thread started; ``ConfigError`` naming the key when RDMA or the address is not
    usable here (nothing is left open then, but ``udp``)."""
    from channels.rdma import RdmaListener

    spec = config.clients_rdma
    assert spec is not None
    check_rdma_here(spec.local, spec.device, spec.gid_index, key_transport="clients.rdma",
                    key_local="clients.rdma", instead="remove clients.rdma or run on a host "
                    "with an RDMA device")
    try:
        listener = RdmaListener((spec.local, spec.port), device=spec.device,
                                gid_index=spec.gid_index)
    except ChannelDeviceError as exc:
        raise ConfigError(f"clients.rdma: cannot listen for RDMA clients on "
                          f"{spec.local}:{spec.port}: {exc}") from None
    return ClientLinks(udp, listener).start()
