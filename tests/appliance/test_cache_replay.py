"""The caching engine's first slice end to end: an appliance with ``[cache]`` keeps what is
published on its patterns in real files; ``Client.replay`` and ``topicwire replay`` get it
back in order, from the start, a time, or a cache sequence, after a restart too; refusals
(entitlements, no cache, a pattern the cache does not keep, bad arguments) say why."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from appliance.cache.node import CachingAppliance
from appliance.client import ClientError, EntitlementError, connect
from appliance.config import ConfigError, parse_config
from appliance.node import Appliance
from tests.appliance.helpers import CLI, ROOT, free_port, wait_for

IDENTITIES = {"feed": {"publish": ["orders/#", "other/#"], "subscribe": ["#"]},
              "viewer": {"subscribe": ["orders/eu/#"]}}
TOPICS = ("orders/eu/x", "orders/us/y", "other/z")


def _config(port: int, cache_dir=None, **cache) -> object:
    doc = {"appliance": {"name": f"cache{port}"},
           "clients": {"udp": f"127.0.0.1:{port}", "shm": f"cache{port}"},
           "pm": {"require_passwords": False, "identities": IDENTITIES}}
    if cache_dir is not None:
        doc["cache"] = {"dir": str(cache_dir), "patterns": ["orders/#"], **cache}
    return parse_config(doc)


def _start(cfg) -> Appliance:
    app = CachingAppliance(cfg).start()
    if app.cache is not None:
        assert app.cache.ready.wait(60), "the cache's session did not subscribe"
    return app


def _publish(url: str, count: int) -> list[tuple[str, bytes]]:
    """``count`` messages round-robin over TOPICS, flushed in small bursts; returns what was
    published on the cache's pattern, in order."""
    kept = []
    with connect(url, "feed") as client:
        for i in range(count):
            topic = TOPICS[i % len(TOPICS)]
            payload = f"{topic}:{i}".encode() + bytes(i % 50)
            client.publish(topic, payload)
            if topic.startswith("orders/"):
                kept.append((topic, payload))
            if i % 64 == 63:
                client.flush()
                time.sleep(0.001)  # paced: the hop to the cache's session is best-effort
        client.flush()
    return kept


def _kept(app: Appliance, count: int) -> None:
    wait_for(lambda: app.cache.counters["kept"] >= count, 60, what=f"{count} messages kept")
    assert app.cache.counters["missed"] == 0 and app.cache.dropped_queue_full == 0


def _rows(messages) -> list[tuple[str, bytes]]:
    return [(m.topic, m.payload) for m in messages]


@pytest.fixture
def cached(tmp_path):
    port = free_port()
    cfg = _config(port, tmp_path / "cache")
    app = _start(cfg)
    try:
        yield app, cfg, f"udp://127.0.0.1:{port}"
    finally:
        app.stop()


def test_replay_returns_exactly_the_kept_messages_in_order_and_survives_a_restart(cached):
    app, cfg, url = cached
    published = _publish(url, 4_500)  # 3,000 on orders/#
    _kept(app, len(published))
    status = wait_for(lambda: app.status()["counters"].get("cache_kept") == len(published)
                      and app.status(), what="the cache's status")
    assert status["cache"]["logs"][0]["durable_seq"] == len(published)
    assert status["cache"]["session"] == "subscribed"
    with connect(url, "feed") as client:
        everything = list(client.replay("orders/#"))
        assert _rows(everything) == published
        assert [m.cache_seq for m in everything] == list(range(1, len(published) + 1))
        assert app.cache.counters["replay_frames"] > 2  # in frames, not one huge answer
        for topic, by in (("orders/eu/x", everything), ):
            assert _rows(client.replay("orders/eu/#")) == [r for r in _rows(by)
                                                          if r[0] == topic]
        middle = everything[1_234]
        from_seq = list(client.replay("orders/#", from_sequence=middle.cache_seq))
        assert _rows(from_seq) == published[1_234:]
        first = next(i for i, m in enumerate(everything)
                     if m.publish_ts_ns >= middle.publish_ts_ns)
        from_time = list(client.replay("orders/#", from_time_ns=middle.publish_ts_ns))
        assert _rows(from_time) == published[first:]
        assert all(m.sequence > 0 and m.origin == cfg.node_id for m in everything)
    app.stop()
    again = _start(cfg)  # the same directory: what was kept is read back from disk
    try:
        with connect(url, "feed") as client:
            assert _rows(client.replay("orders/#")) == published
            more = _publish(url, 30)
            _kept(again, len(more))
            after = list(client.replay("orders/#", from_sequence=len(published) + 1))
            assert _rows(after) == more
            assert after[0].cache_seq == len(published) + 1
    finally:
        again.stop()


def test_replay_is_refused_beyond_the_identitys_entitlements_and_the_caches_patterns(cached):
    app, _, url = cached
    _publish(url, 9)
    _kept(app, 6)
    with connect(f"shm://{app.config.clients_shm}", "viewer") as client:  # answers by ring
        assert len(list(client.replay("orders/eu/#"))) == 3
        with pytest.raises(EntitlementError, match="may not subscribe to 'orders/#'"):
            client.replay("orders/#")
    with connect(url, "feed") as client:
        with pytest.raises(ClientError, match="ask for a pattern within one of them"):
            client.replay("other/#")
        with pytest.raises(ClientError, match="not both"):
            client.replay("orders/#", from_sequence=1, from_time_ns=1)
    counters = wait_for(lambda: app.status()["counters"].get(
        "control_replay_refused_pattern") and app.status()["counters"], what="the counters")
    assert counters["control_replay_refused_entitlement"] == 1
    assert counters["control_replay_refused_pattern"] == 1
    assert any(d["action"] == "replay" for d in app.status()["denials"])


def test_an_appliance_without_a_cache_refuses_replay_saying_so(tmp_path):
    port = free_port()
    with pytest.raises(ConfigError, match="^config: cache: a plain Appliance does not run"):
        Appliance(_config(port, tmp_path)).start()  # never silently without its cache
    app = Appliance(_config(port)).start()
    try:
        with connect(f"udp://127.0.0.1:{port}", "feed") as client:
            with pytest.raises(ClientError, match=r"keeps no messages \(its config has no "
                                                  r"\[cache\]\)"):
                client.replay("orders/#")
    finally:
        app.stop()


def _replay_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "replay", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_topicwire_replay_prints_the_kept_messages_and_refuses_bad_arguments(cached):
    app, _, url = cached
    published = _publish(url, 30)
    _kept(app, len(published))
    out = _replay_cli("orders/#", "--appliance", url, "--identity", "feed", "--json")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(x["topic"], x["payload"].encode()) for x in lines] == published
    out = _replay_cli("orders/#", "--appliance", url, "--identity", "feed", "--from-seq",
                      str(lines[-3]["cache_seq"]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{t} {p.decode()}" for t, p in published[-3:]]
    out = _replay_cli("orders/#", "--appliance", url, "--identity", "feed", "--from-time",
                      lines[5]["published"])
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) >= len(published) - 5
    for bad in (["--from-time", "yesterday"], ["--from-seq", "x"],
                ["--from-seq", "1", "--from-time", "2026-01-01T00:00:00Z"]):
        out = _replay_cli("orders/#", "--appliance", url, *bad)
        assert out.returncode == 2, (bad, out.stderr)
        assert "--from-" in out.stderr.splitlines()[-1], out.stderr
    out = _replay_cli("orders/#", "--appliance", url, "--identity", "viewer")
    assert out.returncode == 1 and "may not subscribe" in out.stderr


def test_replay_then_live_gives_every_message_once_while_a_publisher_goes_on(cached):
    import threading

    app, _, url = cached
    total = 3_000
    published: list[tuple[str, bytes]] = []
    halfway = threading.Event()

    def publish() -> None:
        with connect(url, "feed") as client:
            for i in range(total):
                topic = TOPICS[i % 2]  # both on the cache's pattern
                payload = f"{topic}:{i}".encode()
                client.publish(topic, payload)
                published.append((topic, payload))
                if i % 8 == 7:
                    client.flush()
                    time.sleep(0.005)  # a steady stream for about 2 s, not one burst
                if i == total // 2:
                    halfway.set()
            client.flush()

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        assert halfway.wait(60)
        with connect(url, "feed") as client:
            stream = client.replay("orders/#", then_live=True)
            got = []
            deadline = time.monotonic() + 60
            for msg in stream:
                got.append((msg.topic, msg.payload))
                if msg.payload.endswith(f":{total - 1}".encode()) or \
                        time.monotonic() > deadline:
                    break
    finally:
        publisher.join(60)
    assert app.cache.counters["missed"] == 0
    for topic in TOPICS[:2]:  # per topic: each message once, in publish order
        assert [p for t, p in got if t == topic] == [p for t, p in published if t == topic]
    assert len(got) == total and stream.join_gaps == 0


def test_a_replay_of_100000_messages_comes_whole_in_bounded_pages(cached):
    from appliance.cache.settings import REPLAY_PAGE_MESSAGES

    app, _, url = cached
    total = 100_000
    with connect(url, "feed") as client:
        for i in range(total):
            client.publish("orders/eu/x", b"%d" % (i + 1))
            if i % 64 == 63:
                client.flush()
                time.sleep(0.0005)  # paced: the cache's session is best-effort
        client.flush()
        counters = app.cache.counters
        wait_for(lambda: counters["kept"] + counters["missed"] >= total, 120,
                 what="every message kept or counted missing")
        kept = counters["kept"]
        assert kept + counters["missed"] == total
        count, last = 0, 0
        for msg in client.replay("orders/#"):
            assert msg.sequence > last and msg.payload == b"%d" % msg.sequence
            count, last = count + 1, msg.sequence
    assert count == kept
    assert counters["replay_pages"] >= kept // REPLAY_PAGE_MESSAGES


def test_topicwire_run_keeps_what_is_published_on_its_cache_patterns_through_a_sigkill(
        tmp_path):
    from tests.appliance.helpers import run_appliance, stop

    port = free_port()
    config = tmp_path / "a.toml"
    config.write_text("\n".join([
        "[appliance]", f'name = "run{port}"', "[clients]", f'udp = "127.0.0.1:{port}"',
        "[pm]", "require_passwords = false",
        "[pm.identities.feed]", 'publish = ["orders/#", "other/#"]', 'subscribe = ["#"]',
        "[cache]", f'dir = "{tmp_path / "cache"}"', 'patterns = ["orders/#"]',
        'fsync = "interval"', "fsync_interval_ms = 5"]) + "\n")
    url = f"udp://127.0.0.1:{port}"
    proc = run_appliance(config)
    try:
        def replayed() -> list:
            out = _replay_cli("orders/#", "--appliance", url, "--identity", "feed")
            assert out.returncode == 0, out.stderr
            return out.stdout.splitlines()

        # the cache's session subscribes in the background: publish until one is kept
        wait_for(lambda: _publish(url, 2) and replayed(), 60, interval_s=0.2,
                 what="a message kept by the cache of topicwire run")
        before = len(replayed())
        published = _publish(url, 20)
        lines = wait_for(lambda: len(replayed()) == before + len(published) and replayed(),
                         60, what="the 20 messages kept")
        assert lines[before:] == [f"{t} {p.decode()}" for t, p in published]
        proc.kill()  # SIGKILL: no drain, no close; the logs are read back at the next start
        proc.wait(30)
        proc = run_appliance(config)
        assert replayed() == lines
    finally:
        assert stop(proc) == 0
