"""A durable subscriber is told what its appliance's cache did not keep or deleted, in its
place, never a silent gap (docs/fault-tolerance.md, "Durable subscriptions"): a message too
large for the cache, messages dropped from the cache's full queue while its disk was full
(a real tmpfs), and segments deleted by ``cache.max_disk_bytes``; each reaches the durable
subscriber as a ``Loss`` (reason, topic, count, range) once it has taken every message
before it, is counted at the appliance, and ``topicwire sub --durable`` prints it."""

from __future__ import annotations

import subprocess
import time

from appliance.client import connect
from tests.appliance import test_cache_replay
from tests.appliance.helpers import CLI, ROOT, free_port, wait_for
from tests.appliance.test_cache_replay import _config, _start

cached = test_cache_replay.cached
"""The fixture: an appliance with ``[cache]`` keeping orders/# (and its client URL)."""


class _Recorder:
    """A durable subscription's messages as the application takes them and its loss events
    where they were given: each loss with the cache sequence the subscription had handed
    over up to then (every message before it taken), so ``ordered`` puts each where the
    application saw it."""

    def __init__(self) -> None:
        self.sub = None
        self.messages: list = []
        self.losses: list = []

    def on_loss(self, loss) -> None:
        handed = self.sub._fetcher.handed if self.sub is not None else 0
        self.losses.append((handed, loss))

    def take(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.messages) < count:
            msg = self.sub.get(timeout=max(0.0, deadline - time.monotonic()))
            if msg is None:
                raise AssertionError(f"{len(self.messages)} of {count} messages arrived")
            self.messages.append(msg)

    def ordered(self) -> list:
        """("msg", payload) and ("loss", Loss) rows in the order the application saw them."""
        rows = [((m.cache_seq, 1), ("msg", m.payload)) for m in self.messages]
        rows += [((handed, 0), ("loss", loss)) for handed, loss in self.losses]
        return [row for _, row in sorted(rows, key=lambda r: r[0])]


def test_a_message_too_large_for_the_cache_is_a_loss_event_in_its_place(cached):
    app, _, url = cached
    address = url.removeprefix("udp://")
    made = subprocess.run([*CLI, "sub", "orders/eu/#", "--appliance", address, "--identity",
                           "viewer", "--durable", "cli", "--count", "1", "--seconds", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    with connect(url, "viewer") as client:  # made now, then away
        client.subscribe("orders/eu/#", durable="audit").unsubscribe()
    big = bytes(40_000)  # over the 32 KiB the cache keeps
    with connect(url, "feed") as client:
        for payload in (b"before", big, b"after"):
            client.publish("orders/eu/x", payload, qos="guaranteed")
            client.flush(timeout=10)
        client.publish("orders/us/y", big, qos="guaranteed")  # not the durable's topic
        client.flush(timeout=10)
    counters = wait_for(lambda: (c := app.status()["counters"]).get("cache_too_large") == 2
                        and c.get("cache_kept") == 2 and c, 30, what="the cache's counters")
    assert counters["cache_loss_markers"] == 2
    seen = _Recorder()
    with connect(url, "viewer") as client:
        sub = seen.sub = client.subscribe("orders/eu/#", durable="audit", on_loss=seen.on_loss)
        seen.take(2)
        wait_for(lambda: seen.losses, 10, what="the loss event")
        events = seen.ordered()
        assert [row[0] for row in events] == ["msg", "loss", "msg"], events
        assert events[0][1] == b"before" and events[2][1] == b"after"
        loss = events[1][1]
        assert (loss.reason, loss.topic, loss.messages) == ("CACHE_TOO_LARGE", "orders/eu/x", 1)
        assert loss.first_seq == loss.last_seq > 0
        assert sub.lost_messages == 1  # the orders/us/y one is not this subscription's
    counters = wait_for(lambda: (c := app.status()["counters"]).get(
        "cache_durables_loss_events") and c, 10, what="the durable loss counted")
    # (a page read again names its losses again: here the first page, on the subscribing
    # thread, stops at the loss until the application has taken the message before it)
    assert counters["cache_durables_lost_messages"] == counters["cache_durables_loss_events"]
    run = subprocess.run([*CLI, "sub", "orders/eu/#", "--appliance", address, "--identity",
                          "viewer", "--durable", "cli", "--count", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["orders/eu/x", "before", "orders/eu/x", "after"], run.stdout
    assert ("durable 'cli': lost 1 messages on orders/eu/x (CACHE_TOO_LARGE: origin "
            in run.stderr), run.stderr


def test_what_a_full_disk_made_the_cache_drop_is_a_loss_event_with_its_range(
        small_disk, monkeypatch):
    """A full disk (2 MiB tmpfs) and a queue of 100: the cache drops messages; once the disk
    has room, the durable subscriber gets every kept message and loss events whose ranges
    are exactly the publisher's sequences it did not get: together, every one of them."""
    monkeypatch.setattr("appliance.cache.agent.CACHE_QUEUE_MESSAGES", 100)
    port = free_port()
    url = f"udp://127.0.0.1:{port}"
    app = _start(_config(port, small_disk / "cache"))
    try:
        with connect(url, "viewer") as client:
            client.subscribe("orders/eu/#", durable="audit").unsubscribe()
        cache = app.cache
        count = 0  # until the disk is full and the queue drops (~2,300 fill 2 MiB)

        def accounted() -> bool:
            return cache.counters["received"] + cache.dropped_queue_full \
                + cache.counters["missed"] == count and not cache._inbox

        with connect(url, "feed") as client:
            while count < 20_000 and (cache.failing is None or cache.dropped_queue_full < 200):
                for _ in range(50):
                    client.publish("orders/eu/x", f"{count}:".encode() + bytes(900))
                    count += 1
                client.flush()
                time.sleep(0.002)  # paced: the hop to the cache's session is best-effort
            wait_for(lambda: app.status()["cache"]["storage"].startswith("failing"), 10,
                     what="the status to say the storage fails")
            assert cache.dropped_queue_full >= 200
            subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
            wait_for(lambda: app.status()["cache"]["storage"] == "ok", 30,
                     what="the disk back")
            # one more message at a time until the cache has accounted for every one: a
            # message it receives shows the gap before it (the hop lost the last ones?)
            for _ in range(20):
                client.publish("orders/eu/x", f"{count}:end".encode())
                client.flush()
                count += 1
                try:
                    wait_for(accounted, 5, what="")
                    break
                except AssertionError:
                    continue
            assert accounted(), (f"{count} published, {cache.counters['received']} received, "
                                 f"{cache.dropped_queue_full} dropped, "
                                 f"{cache.counters['missed']} missed")
        dropped = app.cache.dropped_queue_full
        missed = app.cache.counters["missed"]
        seen = _Recorder()
        with connect(url, "viewer") as client:
            seen.sub = client.subscribe("orders/eu/#", durable="audit",
                                        on_loss=seen.on_loss)
            seen.take(count - dropped - missed)
            # a loss after the last message kept: given once that one was taken
            lost = wait_for(lambda: sum(x[1].messages for x in seen.losses) == dropped + missed
                            and seen.losses, 10, what="loss events naming every message "
                            f"not kept ({dropped} dropped, {missed} missed)")
        assert len(lost) == len(seen.losses)
        events = seen.ordered()
        seqs: list[int] = []  # the publisher's numbers, from the payloads and the losses
        for kind, value in events:
            if kind == "msg":
                seqs.append(int(value.split(b":")[0]) + 1)
            else:
                assert value.reason in ("CACHE_QUEUE_FULL", "CACHE_MISSED"), value
                assert value.topic == "orders/eu/x"
                assert value.messages == value.last_seq - value.first_seq + 1 > 0
                seqs.extend(range(value.first_seq, value.last_seq + 1))
        assert seqs == list(range(1, count + 1)), (  # each once, in order: no silent gap
            [(h, x.first_seq, x.last_seq) for h, x in seen.losses],
            [(m.cache_seq, m.payload[:6]) for m in seen.messages][:400])
        full = [v for k, v in events if k == "loss" and v.reason == "CACHE_QUEUE_FULL"]
        assert full and sum(v.messages for v in full) == dropped
        counters = app.status()["counters"]
        assert counters["cache_dropped_queue_full"] == dropped
        assert counters["cache_gaps_cache_queue_full"] >= len(full)
    finally:
        app.stop()


def test_the_disk_bound_deletes_the_oldest_and_a_durable_subscriber_is_told(tmp_path):
    """``cache.max_disk_bytes`` = 4 MiB and 7.2 MB published: the cache's logs stay at or
    under the bound (status and counters say what it deleted), and a durable subscriber that
    was away gets one ``CACHE_DISK_LIMIT`` loss naming the deleted cache sequences, then
    exactly the messages still kept."""
    port = free_port()
    url = f"udp://127.0.0.1:{port}"
    bound = 4 << 20
    app = _start(_config(port, tmp_path / "cache", max_disk_bytes=bound))
    try:
        with connect(url, "viewer") as client:
            client.subscribe("orders/eu/#", durable="slow").unsubscribe()
        payloads = [i.to_bytes(4, "big") * 7_500 for i in range(240)]  # 30 KB each
        with connect(url, "feed") as client:
            for payload in payloads:
                client.publish("orders/eu/x", payload, qos="guaranteed")
            client.flush(timeout=60)
        status = wait_for(lambda: (s := app.status())["cache"]["logs"][0]["last_seq"] == len(
            payloads) and s["cache"]["disk"]["segments_deleted"] and s, 30,
                          what="every message kept and the disk bound enforced")
        disk = status["cache"]["disk"]
        assert disk["max_bytes"] == bound and 0 < disk["bytes"] <= bound, disk
        first = status["cache"]["logs"][0]["first_seq"]
        assert first > 1 and disk["records_deleted"] == first - 1
        counters = status["counters"]
        assert counters["cache_disk_limit_segments_deleted"] == disk["segments_deleted"]
        assert counters["cache_disk_limit_records_deleted"] == first - 1
        assert counters["cache_disk_bytes"] <= bound
        seen = _Recorder()
        with connect(url, "viewer") as client:
            seen.sub = client.subscribe("orders/eu/#", durable="slow", on_loss=seen.on_loss)
            assert len(seen.losses) == 1, seen.losses  # named before the first message
            loss = seen.losses[0][1]
            assert (loss.reason, loss.first_seq, loss.last_seq, loss.messages) == (
                "CACHE_DISK_LIMIT", 1, first - 1, first - 1)
            assert loss.topic == "orders/#"
            rest = payloads[first - 1:]
            seen.take(len(rest))
            assert seen.ordered() == [("loss", loss)] + [("msg", p) for p in rest]
    finally:
        app.stop()


def test_a_kill_of_the_caching_appliance_is_a_loss_event_of_unknown_count(tmp_path):
    """``topicwire run`` killed with SIGKILL: what its cache had received and not written is
    gone, how much is not known, so the next start puts a ``CACHE_RESTART`` marker at the end
    of its log; ``topicwire sub --durable`` reading past it says so, between the messages
    kept before the kill and those after. A clean stop (SIGTERM) leaves no such marker."""
    from tests.appliance.helpers import run_appliance, stop

    port = free_port()
    config = tmp_path / "a.toml"
    config.write_text("\n".join([
        "[appliance]", f'name = "kill{port}"', "[clients]", f'udp = "127.0.0.1:{port}"',
        "[pm]", "require_passwords = false",
        "[pm.identities.feed]", 'publish = ["orders/#"]', 'subscribe = ["#"]',
        "[cache]", f'dir = "{tmp_path / "cache"}"', 'patterns = ["orders/#"]',
        'acknowledge = "persisted"']) + "\n")  # ready once the cache's session subscribed
    url = f"udp://127.0.0.1:{port}"
    address = url.removeprefix("udp://")

    def durable(count: int) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, "sub", "orders/eu/#", "--appliance", address,
                               "--identity", "feed", "--durable", "d", "--count", str(count),
                               "--seconds", "60"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)

    def publish(prefix: str) -> list[str]:
        with connect(url, "feed") as client:
            for i in range(5):
                client.publish("orders/eu/x", f"{prefix}{i}".encode(), qos="guaranteed")
            client.flush(timeout=30)  # acknowledged: on the cache's disk
        return [f"{prefix}{i}" for i in range(5)]

    proc = run_appliance(config)
    try:
        made = subprocess.run([*CLI, "sub", "orders/eu/#", "--appliance", address,
                               "--identity", "feed", "--durable", "d", "--count", "1",
                               "--seconds", "2"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert made.returncode == 0, made.stderr
        before = publish("a")
        proc.kill()  # SIGKILL
        proc.wait(30)
        proc = run_appliance(config)
        after = publish("b")
        run = durable(10)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[1::2] == before + after, run.stdout
        assert ("durable 'd': lost an unknown number of messages on orders/# (CACHE_RESTART"
                in run.stderr), run.stderr
        stop(proc)  # a clean stop: nothing to report after it
        proc = run_appliance(config)
        again = publish("c")
        run = durable(5)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[1::2] == again, run.stdout
        assert "lost" not in run.stderr, run.stderr
    finally:
        stop(proc)
