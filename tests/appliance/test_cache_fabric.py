"""The cache keeps what is published anywhere in the fabric: two appliances on loopback, the
cache at ``a``; guaranteed and best-effort messages published at ``b`` and at ``a`` are each
kept once, in each publisher's order, and a durable subscriber at ``a`` gets them all."""

from __future__ import annotations

import time

from appliance.cache.node import CachingAppliance
from appliance.client import connect
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for

IDENTITIES = {"feed": {"publish": ["orders/#"], "subscribe": ["#"]},
              "viewer": {"subscribe": ["orders/#"]}}


def _pair(cache_dir):
    fa, fb = free_port(), free_port()
    common = {"heartbeat_interval_ms": 50, "lsa_refresh_ms": 500}
    a = parse_config({
        "appliance": {"name": f"ca{fa}", **common},
        "fabric": {"listen": f"127.0.0.1:{fa}", "key": FABRIC_KEY},
        "neighbours": [{"name": f"cb{fb}", "address": f"127.0.0.1:{fb}"}],
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        "cache": {"dir": str(cache_dir), "patterns": ["orders/#"]},
        "pm": {"require_passwords": False, "identities": IDENTITIES}})
    b = parse_config({
        "appliance": {"name": f"cb{fb}", **common},
        "fabric": {"listen": f"127.0.0.1:{fb}", "key": FABRIC_KEY},
        "neighbours": [{"name": f"ca{fa}", "address": f"127.0.0.1:{fa}"}],
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        "pm": {"mode": "remote"}})
    app_a = CachingAppliance(a).start()
    app_b = Appliance(b).start()
    return app_a, app_b


def _url(app) -> str:
    host, port = app.config.clients_udp
    return f"udp://{host}:{port}"


def _interest(app_b, qos: str) -> bool:
    return any(s["pattern"] == "orders/#" and s["qos"] == qos
               for s in app_b.status()["subscriptions"] if s["origin"] != app_b.config.name)


def test_guaranteed_and_best_effort_messages_from_anywhere_are_kept_once(tmp_path):
    a, b = _pair(tmp_path / "cache")
    try:
        assert a.cache.ready.wait(60), "the cache's session did not subscribe"
        wait_for(lambda: _interest(b, "guaranteed") and _interest(b, "best-effort"), 30,
                 what="the cache's interest at b")
        with connect(_url(a), "viewer") as reader:
            durable = reader.subscribe("orders/#", durable="all")
            expected: dict[str, list[bytes]] = {}
            got: dict[str, list[bytes]] = {}
            for where, app in (("b", b), ("a", a)):
                with connect(_url(app), "feed") as client:
                    for qos in ("guaranteed", "best-effort"):
                        topic = f"orders/{where}/{qos}"
                        expected[topic], got[topic] = [], []
                        for i in range(400):
                            payload = f"{topic}:{i}".encode()
                            client.publish(topic, payload, qos=qos)
                            expected[topic].append(payload)
                            if i % 16 == 15:
                                client.flush()
                                time.sleep(0.004)  # paced: best-effort hops may drop a burst
                    client.flush(timeout=30)  # every guaranteed message acknowledged
                    # an end marker after the best-effort ones, on their stream, published
                    # again until the durable subscriber has it (a best-effort one may be
                    # lost): everything of that stream the cache kept is before it
                    topic = f"orders/{where}/best-effort"
                    deadline = time.monotonic() + 30
                    while b"end" not in got[topic][-1:]:
                        client.publish(topic, b"end", flush=True)
                        until = time.monotonic() + 1.0
                        while b"end" not in got[topic][-1:] and time.monotonic() < until:
                            msg = durable.get(timeout=0.1)
                            if msg is not None:
                                got[msg.topic].append(msg.payload)
                        assert time.monotonic() < deadline, (
                            f"no end marker: kept {dict(a.cache.counters)}, the durable "
                            f"subscriber got { {t: len(p) for t, p in got.items()} }")
            for where in ("a", "b"):
                guaranteed = f"orders/{where}/guaranteed"
                while len(got[guaranteed]) < len(expected[guaranteed]):
                    msg = durable.get(timeout=30)
                    assert msg is not None, f"{guaranteed}: {len(got[guaranteed])} of 400"
                    got[msg.topic].append(msg.payload)
            for topic, payloads in got.items():
                payloads[:] = [p for p in payloads if p != b"end"]
                if "guaranteed" in topic:  # every one, once, in order
                    assert payloads == expected[topic], topic
                else:  # those the fabric did not lose, once, in order
                    wanted = iter(expected[topic])
                    assert all(p in wanted for p in payloads), topic  # an ordered subset
                    assert len(payloads) >= len(expected[topic]) // 2, (topic, len(payloads))
            assert a.cache.lost_guaranteed == 0 and a.cache.dropped_queue_full == 0
            replayed = [m for m in reader.replay("orders/b/guaranteed")]
            assert [m.payload for m in replayed] == expected["orders/b/guaranteed"]
            assert all(m.qos == 2 and m.origin == b.config.node_id for m in replayed)
            # each kept once: the log holds what the durable subscriber got, markers too
            kept = list(reader.replay("orders/#"))
            assert len(kept) == len({(m.origin, m.stream, m.topic_key, m.sequence)
                                     for m in kept})
            assert sorted(m.payload for m in kept if m.payload != b"end") == sorted(
                p for payloads in got.values() for p in payloads)
    finally:
        b.stop()
        a.stop()
