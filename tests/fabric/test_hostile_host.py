"""A hostile host on the fabric's own network (a namespace of its own on the bridge), sending
as a neighbour would with that neighbour's source address, gets nothing delivered, moves no
topology and ends no appliance; every frame it sends is refused and counted.

Two appliances n1 and n2 are neighbours (10.77.0.1 and .2); the attacker is 10.77.0.3 and
writes raw IP packets (scapy) whose source is n1's address and port, to n2's fabric port:
DATA frames for every topic key a young registry may have given (keys 1 to 64, the topics
n2's subscriber receives among them) without a MAC trailer, the same with a forged trailer
under the fabric key's id, forged HELLOs claiming to be n1, and random bytes. The subscriber
at n2 receives the genuine messages published at n1 before and after, and none of the
forged ones; the counters of refused frames grow by what was sent.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections import Counter

import pytest

from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import encode_admin, encode_data_frame
from tests.fabric.harness import FABRIC_PORT, Mesh, wait_until
from tests.netns import requires_netns

pytestmark = [requires_netns, pytest.mark.slow]

KEYS = range(1, 65)
FORGED_PAYLOAD = b"forged"
ATTACKER = """
import json, sys
from scapy.all import IP, UDP, Raw, conf, send
conf.verb = 0
spec = json.load(open(sys.argv[1]))
packets = [IP(src=spec["src"], dst=spec["dst"]) / UDP(sport=spec["sport"], dport=spec["dport"])
           / Raw(bytes.fromhex(f)) for f in spec["frames"]]
send(packets, inter=0.002)
print(len(packets))
"""


def _with_forged_trailer(frame: bytes) -> bytes:
    """``frame`` with an authentication trailer under the fabric key's id and a made-up MAC."""
    out = bytearray(frame)
    out[fl.FLAGS_OFFSET + 1] |= int(fl.FrameFlags.AUTH_TRAILER)
    out += fl.AUTH_TRAILER_STRUCT.pack(1, 1, 2**62 + secrets.randbelow(2**40))
    out += secrets.token_bytes(fl.AUTH_MAC_BYTES)
    out[fl.FRAME_LEN_OFFSET:fl.FRAME_LEN_OFFSET + 4] = len(out).to_bytes(4, "big")
    return bytes(out)


def _forged_frames() -> dict[str, list[bytes]]:
    data = [encode_data_frame([{"topic_key": key, "sequence": 1, "payload": FORGED_PAYLOAD}],
                              source_session=1, dest_session=2) for key in KEYS]
    hello = encode_admin(fl.FrameType.HELLO, [al.Hello(1, 1, 50, al.NodeRole.CORE, 0, "n1")],
                         source_session=1, dest_session=2)
    return {"data_unsigned": data, "data_forged_mac": [_with_forged_trailer(f) for f in data],
            "hello_forged_mac": [_with_forged_trailer(hello)] * 20,
            "garbage": [secrets.token_bytes(64 + i) for i in range(20)]}


def _data_refused(counters: dict) -> int:
    return sum(int(counters.get(f"data_auth_{r}", 0))
               for r in ("no_trailer", "unknown_key", "bad_mac", "replay"))


def test_a_host_spoofing_a_neighbour_gets_nothing_delivered_and_is_counted(tmp_path):
    mesh = Mesh(2, [(1, 2)], tmp_path)
    try:
        attacker = mesh.fabric.add_host()
        n1, n2 = mesh.node(1), mesh.node(2)
        wait_until(lambda: mesh.converged(), 60)
        n2.call({"cmd": "connect", "client": "sub", "identity": "reader"})
        n2.call({"cmd": "subscribe", "client": "sub", "pattern": "#"})
        n1.call({"cmd": "connect", "client": "pub", "identity": "feed"})
        wait_until(lambda: any(s["origin"] == "n2" and s["pattern"] == "#"
                               for s in n1.status()["subscriptions"]), 30)
        topics = [f"t/{i}" for i in range(8)]  # keys among KEYS at n2
        got, duplicates = Counter(), 0

        def arrived() -> Counter:  # the node hands over what arrived since it was last asked
            nonlocal got, duplicates
            more, dups = n2.received("sub")
            got += more
            duplicates += dups
            return got

        def every_topic_arrived() -> bool:  # a new topic's first messages may precede its key
            n1.call({"cmd": "publish", "client": "pub", "topics": topics})
            return all(arrived()[t] > 0 for t in topics)
        wait_until(every_topic_arrived, 30, 0.2)
        n1.call({"cmd": "publish", "client": "pub", "topics": ["t/marker"]})
        wait_until(lambda: arrived()["t/marker"] == 1, 30)  # nothing genuine still on its way
        genuine = Counter(got)

        before = n2.status()
        frames = _forged_frames()
        spec = tmp_path / "attack.json"
        spec.write_text(json.dumps({
            "src": "10.77.0.1", "dst": "10.77.0.2", "sport": FABRIC_PORT, "dport": FABRIC_PORT,
            "frames": [f.hex() for kind in frames.values() for f in kind]}))
        script = tmp_path / "attacker.py"
        script.write_text(ATTACKER)
        sent = attacker.run(sys.executable, str(script), str(spec))
        assert int(sent.stdout.strip()) == sum(len(v) for v in frames.values())

        # every forged DATA frame is refused by the MAC check, before any lookup
        forged_data = len(frames["data_unsigned"]) + len(frames["data_forged_mac"])
        wait_until(lambda: _data_refused(n2.status()["counters"])
                   - _data_refused(before["counters"]) >= forged_data, 30)
        after = n2.status()
        c0, c1 = before["counters"], after["counters"]
        assert int(c1.get("data_auth_no_trailer", 0)) - int(c0.get("data_auth_no_trailer", 0)) \
            >= len(frames["data_unsigned"])
        # the forged HELLOs are refused by the control plane's check: n1 stays what it was
        rejected = (sum(after["auth"]["rejected"].values())
                    - sum(before["auth"]["rejected"].values()))
        assert rejected >= len(frames["hello_forged_mac"])
        assert [nb["state"] for nb in after["neighbours"]] == ["up"]
        # nothing forged reached the subscriber; the genuine traffic still flows
        n1.call({"cmd": "publish", "client": "pub", "topics": topics, "rounds": 5})
        n1.call({"cmd": "publish", "client": "pub", "topics": ["t/marker"]})
        wait_until(lambda: arrived()["t/marker"] == 2, 30)
        want = Counter({t: genuine[t] + 5 for t in topics} | {"t/marker": 2})
        assert got == want and duplicates == 0
        for node, host in ((n1, mesh.hosts[1]), (n2, mesh.hosts[2])):
            assert node.proc.poll() is None, f"{host.name} ended"
    finally:
        mesh.close()
