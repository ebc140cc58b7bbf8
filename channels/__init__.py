"""Channels: one interface over UDP unicast/multicast, shared memory, RDMA and TCP."""
