"""Compile the numba kernels the hardware tests and the RDMA benchmark use, into the cache the
guest reads (``NUMBA_CACHE_DIR``, with ``NUMBA_CPU_NAME=generic`` on both sides so that code
compiled on the host loads in the emulated CPU). Compiling there instead costs minutes under
TCG; loading costs seconds. Run by ``launch.py`` on the host before each boot (a no-op when
the cache is current)."""

from __future__ import annotations


def main() -> None:
    import numpy as np

    import channels
    from channels import _rdma_kernels
    from channels.base import FrameBatch, decode_batch
    from datapath.protocol.batch import new_message_batch
    from datapath.protocol.codec import encode_data_frame

    channels.warm_up()
    _rdma_kernels.warm_up()
    batch = FrameBatch(2, 2048)
    batch.append(encode_data_frame([{"sequence": 1, "payload": b"x" * 16}]))
    decode_batch(batch, new_message_batch(64), np.zeros(2, np.uint8), np.zeros(2, np.uint8),
                 channels.ChannelStats())


if __name__ == "__main__":
    main()
