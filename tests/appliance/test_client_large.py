"""Large messages end to end (docs/appliance.md, "Large messages"): segmented by the
publishing client, forwarded by appliances as ordinary messages, put back together by the
subscribing client; up to 16 MiB, guaranteed and best-effort, over UDP and shared memory,
on one appliance and across two, in order with small messages; above 16 MiB refused."""

import hashlib
import random

import pytest

from appliance.client import ClientError, connect
from appliance.config import parse_config
from appliance.node import Appliance
from datapath.protocol import extension_layout as xl
from tests.appliance.helpers import appliance_pair, free_port, subscription_reached, wait_for

IDENTITIES = {"feed": {"publish": ["#"], "subscribe": ["#"]}}
MIB = 1024 * 1024


@pytest.fixture(params=["udp", "shm"])
def served(request):
    """One appliance; the URL its clients connect to over UDP or shared memory."""
    port = free_port()
    clients = {"udp": f"127.0.0.1:{port}"}
    if request.param == "shm":
        clients["shm"] = f"lg-{port}"
    app = Appliance(parse_config({
        "appliance": {"name": f"lg{port}"}, "clients": clients,
        "pm": {"require_passwords": False, "identities": IDENTITIES}})).start()
    yield f"shm://lg-{port}" if request.param == "shm" else f"udp://127.0.0.1:{port}"
    app.stop()


def _payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _receive(sub, count: int, timeout_s: float = 60.0) -> list:
    got = []
    for _ in range(count):
        m = sub.get(timeout=timeout_s)
        assert m is not None, f"{len(got)} of {count} messages arrived: " \
                              f"{[len(g.payload) for g in got]}"
        got.append(m)
    return got


def test_16_mib_guaranteed_and_1_mib_best_effort_arrive_intact(served):
    big, medium = _payload(xl.MAX_MESSAGE_BYTES, 1), _payload(MIB, 2)
    with connect(served, "feed") as pub, connect(served, "feed") as sub_client:
        g = sub_client.subscribe("lg/g/#", qos="guaranteed")
        b = sub_client.subscribe("lg/b/#")
        outcome = pub.publish("lg/g/x", big, qos="guaranteed", headers={"name": "big"},
                              flush=True)
        pub.publish("lg/b/x", medium, headers={"name": "medium"}, flush=True)
        (mg,) = _receive(g, 1)
        (mb,) = _receive(b, 1)
        assert len(mg.payload) == len(big) and _digest(mg.payload) == _digest(big)
        assert _digest(mb.payload) == _digest(medium)
        assert dict(mg.headers) == {"name": "big"} and dict(mb.headers) == {"name": "medium"}
        pub.flush(timeout=30)
        assert outcome.acknowledged
        assert outcome.first_sequence < outcome.sequence  # one outcome for all its segments
        assert pub.segments_published == 2
        counters = sub_client.reassembly.counters
        assert counters["completed"] == 2 and sub_client.reassembly.messages_in_progress == 0
        assert sub_client.reassembly.bytes_in_progress == 0


@pytest.mark.parametrize("qos", ["guaranteed", "best-effort"])
def test_small_and_large_messages_arrive_in_publish_order(served, qos):
    sizes = [10, 300_000, 0, 1_368, 1_369, 70_000, 5, 2 * MIB, 64]
    payloads = [_payload(n, i) for i, n in enumerate(sizes)]
    with connect(served, "feed") as pub, connect(served, "feed") as sub_client:
        sub = sub_client.subscribe("mx/#", qos=qos)
        for i, p in enumerate(payloads):
            pub.publish("mx/x", p, qos=qos, headers={"i": str(i)} if i % 2 else None,
                        schema_id=i)
        pub.flush()
        got = _receive(sub, len(payloads))
        assert [_digest(m.payload) for m in got] == [_digest(p) for p in payloads]
        # a message's schema is its first segment's (the others carry 0: content rules on
        # schema fields see the first segment only, docs/appliance.md, "Large messages")
        assert [m.schema_id for m in got] == list(range(len(sizes)))
        assert [m.headers.get("i") for m in got] == [str(i) if i % 2 else None
                                                      for i in range(len(sizes))]


@pytest.mark.parametrize("qos", ["guaranteed", "best-effort"])
def test_large_messages_cross_two_appliances(qos):
    data = _payload(3 * MIB, 9)
    with appliance_pair(IDENTITIES) as (a, _, url_a, url_b), \
            connect(url_a, "feed") as pub, connect(url_b, "feed") as sub_client:
        sub = sub_client.subscribe("x2/#", qos=qos)
        wait_for(lambda: subscription_reached(a, "x2/#"), 30,
                 what="the subscription to reach the publisher's appliance")
        pub.publish("x2/x", data, qos=qos, headers={"k": b"\x00"}, flush=True)
        pub.publish("x2/x", b"after", qos=qos, flush=True)
        first, second = _receive(sub, 2)
        assert _digest(first.payload) == _digest(data) and dict(first.headers) == {"k": b"\x00"}
        assert second.payload == b"after"


def test_a_payload_above_16_mib_is_refused_naming_the_limit(served):
    with connect(served, "feed") as c:
        for qos in ("best-effort", "guaranteed"):
            with pytest.raises(ClientError, match="at most 16,777,216 bytes"):
                c.publish("big/x", bytes(xl.MAX_MESSAGE_BYTES + 1), qos=qos)


def test_sub_stats_count_no_gaps_for_the_sequences_a_large_guaranteed_message_took(served):
    from appliance.client.stats import SubStats

    with connect(served, "feed") as pub, connect(served, "feed") as sub_client:
        sub = sub_client.subscribe("st/#", qos="guaranteed")
        for p in (b"a", _payload(100_000, 4), b"b", _payload(5_000, 5), b"c"):
            pub.publish("st/x", p, qos="guaranteed")
        pub.flush()
        got = _receive(sub, 5)
        assert [m.segments > 1 for m in got] == [False, True, False, True, False]
        stats = SubStats()
        for m in got:
            stats.on_message(m)
        assert stats.gaps == 0 and stats.duplicates == 0
