"""The data path's names of its channels (the keys of ``DataPlaneAgent.channels``), in one
place for every module that sends through or tells them apart."""

FABRIC = "fabric"
"""The fabric's unicast UDP socket (with its RDMA links behind it, when configured)."""
CLIENT_UDP = "clients-udp"
"""The clients' UDP socket (with RDMA clients behind it, when configured)."""
CLIENT_SHM = "clients-shm"
"""The clients' shared-memory bus (the appliance's receive ring)."""
GROUP_RX = "group:"
"""Prefix of a fabric group's receiving channel (``group:NAME``)."""
GROUP_TX = "group-tx:"
"""Prefix of a fabric group's send-only channel (``group-tx:NAME``)."""
CACHE_NAK_CHANNEL = "cache-nak"
"""Not a channel: the name under which the data path puts its requests to the cache (NAKs
its senders' buffers no longer answer) in the inbox; the control agent hands them to the
cache (appliance/dataplane/cache_naks.py)."""
PERSISTED_CHANNEL = "persisted"
"""Not a channel: the name under which the data path puts its persisted reports for a
neighbour's publishers in the inbox; the control agent sends them to that neighbour as a
CONTROL ``PERSISTED`` entry (appliance/dataplane/remote_persist.py)."""
