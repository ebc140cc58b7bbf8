"""The clients' UDP receive of the express path (``Express.receive``, kernel
``receive_forward``): one appliance, a publisher and a subscriber as raw UDP clients, frames
sent one at a time so each arrives alone. Every message reaches the subscriber in order, the
forwards went out in the receive's own call, and what the kernel counted in its arrays is in
the published status after the fold: the sessions' published and delivered counts,
the agent's counters and the clients' UDP channel's frames out."""

import threading
import time

from appliance.config import parse_config
from appliance.node import Appliance
from bench.fabric import _login, _request
from channels.base import FrameBatch
from channels.udp import UdpChannel
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.batch import decode_frames, new_message_batch
from datapath.protocol.codec import FrameWriter
from datapath.topics.registry import KeyRegistry
from tests.appliance.helpers import free_port, wait_for

ALLOWED, FORBIDDEN = "e/x", "f/y"
FRAMES = 40


def _frame(session: int, key: int, seq: int, payload: bytes) -> FrameBatch:
    batch = FrameBatch(1, 512)
    writer = FrameWriter(memoryview(batch.buf), 0, 512)
    writer.begin(source_session=session, stream_id=session)
    writer.append(key, seq, time.time_ns(), payload)
    batch.lengths[0] = writer.finish()
    batch.count = 1
    return batch


def _status_of(app: Appliance) -> tuple[dict, dict, dict, dict]:
    """(clients by identity, counters, the clients' UDP channel, offload) of one snapshot."""
    status = app.status()
    clients = {c["identity"]: c for c in status.get("clients", [])}
    udp = next((c for c in status.get("channels", []) if c["name"] == "clients-udp"), {})
    return clients, status.get("counters", {}), udp, status.get("offload", {})


def _barrier(app: Appliance) -> None:
    """Return once the data path has received after this call: commands run at the start of
    a duty cycle, before its receive, so once one has run in a later cycle than the first,
    the first's cycle received what was in the sockets when this was called."""
    dp = app.dataplane
    cycles: list[int] = []
    while len(set(cycles)) < 2:
        ran = threading.Event()
        dp.commands.offer(lambda ran=ran: (cycles.append(dp.cycle_ns), ran.set()))
        assert ran.wait(10), "the data path ran no cycle within 10 s"


def test_single_frames_are_received_forwarded_and_sent_in_one_call_and_counted():
    config = parse_config({
        "appliance": {"name": f"ex{free_port()}", "dataplane": "thread"},
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        "pm": {"require_passwords": False,
               "identities": {"pub": {"publish": ["e/#"], "subscribe": []},
                              "owner": {"publish": ["f/#"], "subscribe": []},
                              "sub": {"publish": [], "subscribe": ["#"]}}}})
    app = Appliance(config).start()
    host, port = config.clients_udp
    pub = UdpChannel(("127.0.0.1", 0), dest=(host, port))
    sub = UdpChannel(("127.0.0.1", 0), dest=(host, port))
    keeper = UdpChannel(("127.0.0.1", 0), dest=(host, port))
    scratch = FrameBatch(64, 65_504)
    try:
        sub_session = _login(sub, scratch, "sub")
        _request(sub, scratch, fl.FrameType.SUBSCRIBE, [al.Subscription(1, 0, 0, 0, "#")],
                 sub_session)
        keyer = KeyRegistry()
        keys = {t: keyer.key_of(t, 0) for t in (ALLOWED, FORBIDDEN)}
        # the owner registers the topic the publisher may not publish: its key is known, so
        # the publisher's messages on it are denied (not parked as unknown)
        owner = _login(keeper, scratch, "owner")
        _request(keeper, scratch, fl.FrameType.REGISTRY_UPDATE,
                 [al.RegistryEntry(keys[FORBIDDEN], 0, FORBIDDEN)], owner, {"version": 0})
        session = _login(pub, scratch, "pub")
        _request(pub, scratch, fl.FrameType.REGISTRY_UPDATE,
                 [al.RegistryEntry(keys[ALLOWED], 0, ALLOWED)], session, {"version": 0})
        # the allowed key reaches the tables: a probe comes through
        probes = []

        def probed():
            probes.append(pub.send(_frame(session, keys[ALLOWED], 0, b"probe")))
            return sub.receive(scratch, 50_000_000)
        wait_for(probed)
        # every probe is accounted for in a published status (published, denied before the
        # session's entitlement arrived, or parked and expired) before the counts are taken
        def settled():
            clients, counters, udp, offload = _status_of(app)
            if "pub" not in clients or "sub" not in clients:
                return None
            published = clients["pub"]["published"]
            done = (published + counters.get("publish_denied", 0)
                    + counters.get("parked_expired", 0) == sum(probes)
                    and offload.get("parked") == 0 and clients["sub"]["delivered"] == published)
            return (clients, counters, udp) if done else None
        before_clients, before, before_udp = wait_for(settled)
        while sub.receive(scratch, 0):
            pass
        out = new_message_batch(1024)
        status = scratch.peer_ids.astype("u1")
        types = status.copy()
        got = []
        for seq in range(1, FRAMES + 1):
            topic = FORBIDDEN if seq % 4 == 0 else ALLOWED
            assert pub.send(_frame(session, keys[topic], seq, b"m%d" % seq)) == 1
            if topic == FORBIDDEN:  # nothing comes of it; it is taken alone before the next
                _barrier(app)
                continue
            assert sub.receive(scratch, 2_000_000_000) == 1
            res = decode_frames(scratch.buf, scratch.offsets[:1], scratch.lengths[:1], out,
                                status, types)
            got += [(int(m["sequence"]), bytes(scratch.buf[m["payload_offset"]:][
                :m["payload_len"]])) for m in out[:res.messages]]
        allowed = [s for s in range(1, FRAMES + 1) if s % 4]
        assert got == [(s, b"m%d" % s) for s in allowed]
        # a status that has every frame: each was published or denied
        def counted():
            clients, counters, udp, _ = _status_of(app)
            done = (clients["pub"]["published"] - before_clients["pub"]["published"]
                    + counters.get("publish_denied", 0) - before.get("publish_denied", 0)) >= FRAMES
            return (clients, counters, udp) if done else None
        clients, counters, udp = wait_for(counted)
        # the denied frames were taken in the cycles that counted them: anything they had
        # sent the subscriber would be in its socket now (the allowed ones all came, in order)
        assert sub.receive(scratch, 0) == 0  # nothing of the denied topic
        assert counters["express_receives"] - before.get("express_receives", 0) == FRAMES
        assert counters["express_bursts"] - before.get("express_bursts", 0) == FRAMES
        assert counters["publish_denied"] - before.get("publish_denied", 0) == FRAMES // 4
        assert clients["pub"]["published"] - before_clients["pub"]["published"] == len(allowed)
        assert clients["sub"]["delivered"] - before_clients["sub"]["delivered"] == len(allowed)
        assert udp["frames_out"] - before_udp["frames_out"] == len(allowed)
        assert udp["frames_in"] - before_udp["frames_in"] == FRAMES
    finally:
        for channel in (pub, sub, keeper):
            channel.close()
        app.stop()
