"""The RDMA transport of the client API: ``connect("rdma://IP:PORT", ...)`` reaches an
appliance's RDMA client endpoint (``[clients] rdma``, docs/appliance.md, docs/rdma.md).

One ``RdmaChannel`` (channels/rdma.py) to the appliance's listener carries the same frames a
UDP client sends and receives, so the session, publish/subscribe and QoS are the same.
"""

from __future__ import annotations

from typing import Any

SCHEME = "rdma://"


def parse_rdma_url(url: str) -> tuple[str, int]:
    """``rdma://10.0.0.1:47472`` -> ``("10.0.0.1", 47472)``; ``ClientError`` saying what to give."""
    from appliance.client.errors import ClientError
    from appliance.config import ConfigError, parse_address

    if not url.startswith(SCHEME):
        raise ClientError(f"{url!r} is not an rdma:// URL; give rdma://IPv4:PORT")
    try:
        host, port = parse_address(url[len(SCHEME):], "appliance address")
    except ConfigError as exc:
        raise ClientError(f"{url}: {str(exc).removeprefix('config: ')}") from None
    if host == "0.0.0.0":
        raise ClientError(f"{url}: give the appliance's address on its RDMA device, not the "
                          "wildcard")
    return host, port


def open_rdma_channel(url: str, *, device: str | None = None, gid_index: int | None = None,
                      bind: str | None = None, timeout_s: float) -> Any:
    """A connected ``RdmaChannel`` to the appliance at ``url``; ``ClientError`` saying what is
    wrong (no RDMA here, nothing listening, the set-up failed) and what to do."""
    from appliance.client.errors import ClientError
    from channels.errors import ChannelError
    from channels.rdma import RdmaChannel, rdma_available

    host, port = parse_rdma_url(url)
    available, why = rdma_available()
    if not available:
        raise ClientError(f"{url}: RDMA is not available on this host ({why}); connect with "
                          "udp://HOST:PORT instead, or run on a host with an RDMA device")
    try:
        return RdmaChannel(connect=(host, port), bind=bind, device=device, gid_index=gid_index,
                           connect_timeout_ns=int(timeout_s * 1e9),
                           name=f"client:rdma:{host}:{port}")
    except ChannelError as exc:
        raise ClientError(f"{url}: cannot set up the RDMA connection: {exc}; check that an "
                          f"appliance with clients.rdma = \"{host}:{port}\" is running and that "
                          "rdma_device/rdma_bind name this host's RDMA device") from None
