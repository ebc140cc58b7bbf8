"""The data path drains the software NIC's digest queue (punts, unknown keys, ACL logs).

A client publishes more messages with topic keys nobody registered than the NIC's digest
queue holds (4,096 entries); every one must be counted by reason in the appliance's
counters (``digests_unknown_key``), none dropped by the NIC for a full queue, and the status
must name the keys of the latest ones.
"""

import time

from appliance.config import parse_config
from appliance.node import Appliance
from bench.fabric import _login
from channels.base import FrameBatch
from channels.udp import UdpChannel
from datapath.protocol.codec import FrameWriter
from tests.appliance.helpers import free_port, wait_for

FRAMES = 160
PER_FRAME = 32
FRAMES_PER_SEND = 8
FIRST_KEY = 0x5A5A_0000_0000_0000


def test_unknown_key_digests_are_drained_counted_and_named():
    port = free_port()
    app = Appliance(parse_config({"appliance": {"name": f"dig{port}", "dataplane": "thread"},
                                  "clients": {"udp": f"127.0.0.1:{port}"},
                                  "pm": {"anonymous": True, "require_passwords": False}})).start()
    channel = UdpChannel(("127.0.0.1", 0), dest=("127.0.0.1", port))
    try:
        scratch = FrameBatch(8, 65_504)
        session = _login(channel, scratch, "digester")
        capacity = len(app.dataplane.nic._digests)
        total = FRAMES * PER_FRAME
        assert total > capacity  # without draining, the queue overflows
        keys = [FIRST_KEY + i for i in range(total)]
        batch = FrameBatch(FRAMES_PER_SEND, 4_096)
        for first in range(0, FRAMES, FRAMES_PER_SEND):
            batch.count = 0
            for f in range(FRAMES_PER_SEND):
                writer = FrameWriter(memoryview(batch.buf), int(batch.offsets[f]), 4_096)
                writer.begin(source_session=session, stream_id=session)
                for m in range(PER_FRAME):
                    i = (first + f) * PER_FRAME + m
                    writer.append(keys[i], i + 1, time.time_ns(), b"x" * 8)
                batch.lengths[f] = writer.finish()
            batch.count = FRAMES_PER_SEND
            assert channel.send(batch) == FRAMES_PER_SEND
            time.sleep(0.005)  # a few bursts per data-path cycle, not one huge one

        def counted(expected):
            counters = app.status()["counters"]
            return counters.get("digests_unknown_key", 0) >= expected + counters.get(
                "parked_reruns", 0)
        wait_for(lambda: counted(total))
        # one more frame of 8 new keys, alone: the status names exactly those
        last = [FIRST_KEY + total + i for i in range(8)]
        writer = FrameWriter(memoryview(batch.buf), 0, 4_096)
        writer.begin(source_session=session, stream_id=session)
        for i, key in enumerate(last):
            writer.append(key, total + i + 1, time.time_ns(), b"y" * 8)
        batch.lengths[0] = writer.finish()
        batch.count = 1
        assert channel.send(batch) == 1
        wait_for(lambda: counted(total + 8))
        status = app.status()
        counters, verdicts = status["counters"], status["offload"]["verdicts"]
        # parked messages run again when the tables change: each run is a digest again
        assert counters["digests_unknown_key"] == total + 8 + counters.get("parked_reruns", 0)
        assert verdicts["unknown_key"] == counters["digests_unknown_key"]
        assert verdicts["digest_drops"] == 0
        shown = [int(k, 16) for k in status["offload"]["last_unknown_keys"].split()]
        assert shown == last
    finally:
        channel.close()
        app.stop()
