"""The data path of an appliance: what every message crosses.

``agent.py`` the data-path agent (receive bursts, the offload pipeline, forwarding, the out
queues; its general loop is the pipeline's test oracle and takes what the pipeline punts),
``express.py`` and ``_kernels.py`` the compiled forwarding pipeline every DATA burst takes,
``guaranteed.py`` the reliable streams of guaranteed messages,
``fabric_links.py`` and ``client_links.py`` the RDMA links, ``status_channels.py`` the
channels' rows of the status. The control plane reaches it only through its command queue,
its inbox/outbox and immutable table snapshots.
"""
