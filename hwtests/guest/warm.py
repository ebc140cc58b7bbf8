"""Compile the numba kernels the hardware tests and the RDMA benchmark use, into the cache the
guest reads (``NUMBA_CACHE_DIR``, with ``NUMBA_CPU_NAME=generic`` on both sides so that code
compiled on the host loads in the emulated CPU). Compiling there instead costs minutes under
TCG; loading costs seconds. The appliance's kernels are run for real by two appliances in
this process (``warm_appliances``). Run by ``launch.py`` on the host before each boot (a no-op when
the cache is current)."""

from __future__ import annotations


def main() -> None:
    import numpy as np

    import channels
    from appliance.ops.warm import run_warm
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
    warm_appliances()
    run_warm()  # what `make setup` runs on a host: the guest's appliances preload it all


WARM_TIMEOUT_S = 120.0
"""Longest wait for the warm-up fabric's messages (a cold cache compiles for a while)."""


def warm_appliances() -> None:
    """Run the kernels the appliance hwtests use (hwtests/appliance): two appliances,
    neighbours over UDP on loopback, best-effort and guaranteed messages from a client on
    one to a client on the other (the RDMA link's own kernels are the channel's)."""
    import socket
    import time

    from appliance.client import ClientError, connect
    from appliance.config import parse_config
    from appliance.node import Appliance

    def port() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    key = "22" * 32
    fabric = {"a": port(), "b": port()}
    clients = {"a": port(), "b": port()}

    def config(name: str, other: str, pm: dict) -> dict:
        return {"appliance": {"name": name, "heartbeat_interval_ms": 50},
                "fabric": {"listen": f"127.0.0.1:{fabric[name]}", "key": key},
                "neighbours": [{"name": other, "address": f"127.0.0.1:{fabric[other]}"}],
                "clients": {"udp": f"127.0.0.1:{clients[name]}"}, "pm": pm}

    pm = {"anonymous": True, "require_passwords": False}
    a = Appliance(parse_config(config("a", "b", pm))).start()
    b = Appliance(parse_config(config("b", "a", {"mode": "remote"}))).start()
    try:
        deadline = time.monotonic() + WARM_TIMEOUT_S
        while len(a.status().get("routes", ())) < 2 or not b.status()["node"].get("pm"):
            if time.monotonic() > deadline:
                raise SystemExit("warm-up: the two appliances did not converge")
            time.sleep(0.05)
        sub = connect(f"udp://127.0.0.1:{clients['b']}")
        pub = connect(f"udp://127.0.0.1:{clients['a']}")
        try:
            subs = [sub.subscribe("w/g/#", qos="guaranteed"), sub.subscribe("w/b/#")]
            want = {"w/g/1", "w/b/1"}
            while want and time.monotonic() < deadline:
                try:  # a cold cache: the appliance compiles while the first requests wait
                    for topic in sorted(want):
                        pub.publish(topic, b"warm", qos="guaranteed" if "/g/" in topic else
                                    "best-effort")
                    pub.flush()
                except ClientError:
                    continue
                for s in subs:
                    msg = s.get(timeout=0.2)
                    if msg is not None:
                        want.discard(msg.topic)
            if want:
                raise SystemExit(f"warm-up: {sorted(want)} did not arrive")
        finally:
            pub.close()
            sub.close()
    finally:
        b.stop()
        a.stop()


if __name__ == "__main__":
    main()
