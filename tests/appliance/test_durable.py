"""Durable subscriptions end to end: a real appliance with ``[cache]`` (real files, real
fsync) keeps a named subscriber's place while it is away, across a restart of the appliance
too; on its return it gets what was published meanwhile, in order and once, then follows the
live messages; refusals say why."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from appliance.cache.durables import BOOK_FILE, DurableBook, DurableError
from appliance.client import ClientError, EntitlementError, connect
from tests.appliance import test_cache_replay
from tests.appliance.helpers import CLI, ROOT, free_port, wait_for
from tests.appliance.test_cache_replay import _config, _kept, _publish, _start

cached = test_cache_replay.cached
"""The fixture: an appliance with ``[cache]`` keeping orders/# (and its client URL)."""

WANT = "orders/eu/"


def _eu(published: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [row for row in published if row[0].startswith(WANT)]


def _take(sub, count: int) -> list[tuple[str, bytes]]:
    got = []
    for _ in range(count):
        msg = sub.get(timeout=30)
        assert msg is not None, f"{len(got)} of {count} messages arrived"
        got.append((msg.topic, msg.payload))
    return got


def _nothing_more(url: str, sub, app) -> None:
    """A marker published now is the next message: nothing else (no duplicate) is queued
    before it."""
    with connect(url, "feed") as client:
        client.publish(WANT + "marker", b"marker")
    msg = sub.get(timeout=30)
    assert msg is not None and msg.payload == b"marker", msg


def test_a_durable_subscriber_away_gets_what_was_published_meanwhile_then_live(cached):
    app, cfg, url = cached
    with connect(url, "viewer") as client:
        sub = client.subscribe("orders/eu/#", durable="audit")
        first = _eu(_publish(url, 600))
        assert _take(sub, len(first)) == first
    away = _eu(_publish(url, 6_000))  # published while nobody of that name is connected
    _kept(app, 2 * len(first) + 2 * len(away))
    with connect(url, "viewer") as client:
        sub = client.subscribe("orders/eu/#", durable="audit")
        assert _take(sub, len(away)) == away  # from where it left off, in order
        live = _eu(_publish(url, 90))
        assert _take(sub, len(live)) == live  # then the live ones as they are kept
        _nothing_more(url, sub, app)
        assert sub.lost_messages == 0
    durables = wait_for(lambda: app.status()["cache"]["durables"], what="the durable status")
    assert [(d["identity"], d["name"], d["pattern"]) for d in durables] == [
        ("viewer", "audit", "orders/eu/#")]
    handed = len(first) + len(away) + len(live) + 1  # and the marker
    counters = wait_for(lambda: (c := app.status()["counters"])[
        "cache_durables_delivered"] >= handed and c, what="the status's counters")
    assert counters["cache_durables_made"] == 1


def test_the_place_survives_a_restart_of_the_appliance(cached, tmp_path):
    app, cfg, url = cached
    with connect(url, "viewer") as client:
        sub = client.subscribe("orders/eu/#", durable="audit")
        first = _eu(_publish(url, 300))
        assert _take(sub, len(first)) == first
    app.stop()  # the book is written at stop, and within 100 ms of each change before
    book = json.loads((tmp_path / "cache" / BOOK_FILE).read_text())
    assert book["durables"][0]["position"] == 2 * len(first)  # after the last one handed
    again = _start(cfg)
    try:
        away = _eu(_publish(url, 300))
        _kept(again, 2 * len(away))
        with connect(url, "viewer") as client:
            sub = client.subscribe("orders/eu/#", durable="audit")
            assert _take(sub, len(away)) == away
            _nothing_more(url, sub, again)
    finally:
        again.stop()


def test_a_callback_durable_subscription_and_delete(cached):
    app, cfg, url = cached
    got: list[tuple[str, bytes]] = []
    with connect(url, "viewer") as client:
        client.subscribe("orders/eu/#", durable="cb", callback=lambda m: got.append(
            (m.topic, m.payload)))
        first = _eu(_publish(url, 150))
        wait_for(lambda: len(got) >= len(first), 30, what="the callback's messages")
        assert got == first
        assert client.delete_durable("cb") is True
        assert client.delete_durable("cb") is False
    wait_for(lambda: app.status()["cache"]["durables"] == [], what="the durable deleted")
    _kept(app, len(_publish(url, 30)) + 2 * len(first))
    with connect(url, "viewer") as client:  # made anew: from the newest message on
        sub = client.subscribe("orders/eu/#", durable="cb")
        _nothing_more(url, sub, app)


def test_durable_refusals_say_why(cached):
    app, cfg, url = cached
    with connect(url, "viewer") as client:
        client.subscribe("orders/eu/#", durable="one").unsubscribe()
        with pytest.raises(ClientError, match="is to 'orders/eu/#'.*delete it first"):
            client.subscribe("orders/eu/x", durable="one")
        with pytest.raises(ClientError, match="letters, digits"):
            client.subscribe("orders/eu/#", durable="no spaces")
        with pytest.raises(ClientError, match="no selector"):
            client.subscribe("orders/eu/#", "price > 1", durable="sel")
    with connect(url, "feed") as client:
        with pytest.raises(ClientError, match="keeps orders/#"):
            client.subscribe("other/#", durable="x")
        # another identity's durable of the same name is its own
        client.subscribe("orders/#", durable="one").unsubscribe()
    with connect(url, "viewer") as client, pytest.raises(EntitlementError):
        client.subscribe("orders/#", durable="wide")


# --- the book alone ----------------------------------------------------------------------------
def test_the_book_keeps_positions_across_a_reopen_and_refuses_what_it_cannot_read(tmp_path):
    book = DurableBook(tmp_path, limit=2)
    entry, made = book.open("a", "n", "x/#", 0, 5, 0)
    assert made and entry.position == 5
    book.move(entry, 9, 1)
    book.move(entry, 7, 2)  # a late acknowledgement changes nothing
    assert entry.position == 9
    assert not book.save_if_due(1) and book.save_if_due(10**9)
    again = DurableBook(tmp_path, limit=2)
    assert again.open("a", "n", "x/#", 0, 100, 0) == (again.entries[("a", "n")], False)
    assert again.entries[("a", "n")].position == 9
    again.open("b", "n", "x/#", 0, 1, 0)
    with pytest.raises(DurableError, match="2 durable subscriptions exist"):
        again.open("c", "n", "x/#", 0, 1, 0)
    (tmp_path / BOOK_FILE).write_text("{not json")
    with pytest.raises(DurableError, match="cannot be read.*move the file aside"):
        DurableBook(tmp_path)


def _sub(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "sub", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_topicwire_sub_durable_goes_on_where_the_last_one_stopped(cached):
    app, _, url = cached
    address = url.removeprefix("udp://")
    made = _sub("orders/eu/#", "--appliance", address, "--identity", "viewer",
                "--durable", "cli", "--count", "1", "--seconds", "3")
    assert made.returncode == 0, made.stderr  # made now: nothing kept yet is its
    assert "durable 'cli'" in made.stderr
    published = _eu(_publish(url, 60))  # 20 on orders/eu/
    _kept(app, 40)
    payloads = [p.decode() for _, p in published]
    runs = []
    for _ in range(2):
        run = _sub("orders/eu/#", "--appliance", address, "--identity", "viewer",
                   "--durable", "cli", "--count", "10", "--json")
        assert run.returncode == 0, run.stderr
        runs.append([json.loads(line)["payload"] for line in run.stdout.splitlines()])
    assert runs == [payloads[:10], payloads[10:20]]  # each run from where the last stopped
    bad = _sub("orders/eu/#", "--appliance", address, "--durable", "no spaces")
    assert bad.returncode == 2 and "--durable 'no spaces'" in bad.stderr
    bad = _sub("orders/eu/#", "--appliance", address, "--durable", "d", "--qos", "guaranteed")
    assert bad.returncode == 2 and "takes no --selector or --qos" in bad.stderr


def test_what_retention_deleted_before_it_was_read_is_a_loss_event(tmp_path, monkeypatch):
    import appliance.cache.agent as agent

    monkeypatch.setattr(agent, "RETENTION_CHECK_INTERVAL_NS", 50_000_000)
    port = free_port()
    url = f"udp://127.0.0.1:{port}"
    app = _start(_config(port, tmp_path / "cache", retention_bytes=4 << 20))
    try:
        with connect(url, "viewer") as client:  # made before anything is published
            client.subscribe("orders/eu/#", durable="slow").unsubscribe()
        payloads = [i.to_bytes(4, "big") * 7_500 for i in range(240)]  # 30 KB each: 7.2 MB
        with connect(url, "feed") as client:
            for i, payload in enumerate(payloads):
                client.publish("orders/eu/x", payload)
                client.flush()
                if i % 8 == 7:
                    time.sleep(0.005)  # paced: the hop to the cache's session is best-effort
        _kept(app, len(payloads))
        wait_for(lambda: app.cache.counters["segments_deleted"] >= 1, 30,
                 what="retention deleting the oldest segments")
        losses = []
        with connect(url, "viewer") as client:
            sub = client.subscribe("orders/eu/#", durable="slow", on_loss=losses.append)
            assert len(losses) == 1, losses  # named before the first message handed
            loss = losses[0]
            assert loss.reason == "RETENTION" and loss.first_seq == 1
            rest = payloads[loss.last_seq:]
            got = [m.payload for m in (sub.get(timeout=30) for _ in rest)]
            assert got == rest and loss.messages == len(payloads) - len(rest)
            assert 0 < len(rest) < len(payloads)
    finally:
        app.stop()
