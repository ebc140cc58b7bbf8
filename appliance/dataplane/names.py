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
