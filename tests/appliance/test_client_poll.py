"""The client's throughput forms against a real appliance: poll subscriptions read with
``Client.poll`` (a flyweight per call, no object per message) and ``publish_batch``, over
UDP and shared memory, beside the callback and iterator forms."""

import time

import numpy as np
import pytest

from appliance.client import ClientError, connect
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import free_port, wait_for


@pytest.fixture(scope="module")
def appliance():
    port = free_port()
    cfg = parse_config({"appliance": {"name": f"poll{port}"},
                        "clients": {"udp": f"127.0.0.1:{port}", "shm": f"poll{port}"},
                        "pm": {"anonymous": True, "require_passwords": False}})
    app = Appliance(cfg).start()
    yield {"udp": f"udp://127.0.0.1:{port}", "shm": f"shm://poll{port}"}
    app.stop()


def _poll_until(client, count, handler, limit=4096, timeout_s=20.0):
    """Poll until ``handler`` was given ``count`` messages (or fail at the deadline);
    returns what each poll call returned."""
    deadline = time.monotonic() + timeout_s
    returns = []
    total = 0
    while total < count:
        got = client.poll(handler, limit, timeout_s=0.05)
        returns.append(got)
        total += got
        assert time.monotonic() < deadline, f"polled {total} of {count} messages"
    return returns


@pytest.mark.parametrize("transport", ["udp", "shm"])
def test_poll_hands_over_exactly_the_published_messages_in_order(appliance, transport):
    url = appliance[transport]
    with connect(url, "poller") as sub, connect(url, "feed") as pub:
        sub.subscribe("poll/+", poll=True)
        expected = []
        for i in range(300):  # one by one (frames the budget or flush sends) ...
            payload = f"one {i}".encode()
            pub.publish("poll/a", payload)
            expected.append(("poll/a", i + 1, payload))
        pub.flush()
        batch = [f"batch {i}".encode() * (1 + i % 5) for i in range(5_000)]  # ... and batched
        last = pub.publish_batch("poll/b", batch)
        assert last == 5_000
        expected += [("poll/b", i + 1, p) for i, p in enumerate(batch)]
        got = []

        def handler(view):
            got.append((view.topic, view.sequence, bytes(view.payload)))
            assert view.latency_ns > 0 and view.origin and view.stream
            assert view.namespace == 0 and view.qos == 0 and view.headers == {}

        _poll_until(sub, len(expected), handler)
        # per topic in publish order; across topics as they arrived
        assert [g for g in got if g[0] == "poll/a"] == expected[:300]
        assert [g for g in got if g[0] == "poll/b"] == expected[300:]
        assert sub.poll(handler, timeout_s=0.2) == 0  # nothing more: each message once
        counters = sub.poll_counters()
        assert counters["polled"] == len(expected)
        assert counters["dropped_messages"] == counters["unresolved"] == 0


def test_poll_honours_its_limit(appliance):
    with connect(appliance["shm"], "poller") as sub, connect(appliance["udp"], "feed") as pub:
        sub.subscribe("limit/x", poll=True)
        pub.publish_batch("limit/x", [bytes([i]) for i in range(100)])
        seqs = []
        wait_for(lambda: sub.poll_counters()["queued_frames"], what="the frame")
        returns = _poll_until(sub, 100, lambda v: seqs.append(v.sequence), limit=7)
        # (the first calls may hand over nothing: the poll waits at the first message until
        # the appliance has told the client its topic key's name); then the frame is there
        # and every call takes its limit
        assert [r for r in returns if r] == [7] * 14 + [2]
        assert seqs == list(range(1, 101))


def test_a_view_is_not_valid_after_its_handler_call(appliance):
    with connect(appliance["udp"], "poller") as sub, connect(appliance["udp"], "feed") as pub:
        sub.subscribe("views/#", poll=True)
        pub.publish("views/a", b"kept", flush=True)
        kept = []
        _poll_until(sub, 1, kept.append)
        view = kept[0]
        with pytest.raises(ClientError, match="valid only during the handler call"):
            view.payload  # noqa: B018
        with pytest.raises(ClientError, match="valid only during the handler call"):
            view.sequence  # noqa: B018
        assert "not valid" in repr(view)

        def nested(v):
            sub.poll(lambda w: None)

        pub.publish("views/a", b"again", flush=True)
        with pytest.raises(ClientError, match="being polled already"):
            _poll_until(sub, 1, nested)


def test_poll_and_callback_subscriptions_of_one_client_each_get_their_own(appliance):
    with connect(appliance["shm"], "mixed") as sub, connect(appliance["shm"], "feed") as pub:
        called = []
        sub.subscribe("mix/cb/#", callback=lambda m: called.append((m.topic, m.payload)))
        it = sub.subscribe("mix/it")
        sub.subscribe("mix/poll/#", poll=True)
        rows = np.arange(64 * 1_000, dtype=np.uint32).astype(np.uint8).reshape(1_000, 64)
        pub.publish_batch("mix/poll/n", rows)
        pub.publish_batch("mix/cb/x", [b"c%d" % i for i in range(500)])
        pub.publish("mix/it", b"iterated", flush=True)
        polled = []
        _poll_until(sub, 1_000, lambda v: polled.append((v.sequence, bytes(v.payload))))
        assert polled == [(i + 1, rows[i].tobytes()) for i in range(1_000)]
        wait_for(lambda: len(called) == 500, what="the callback's messages")
        assert called == [("mix/cb/x", b"c%d" % i) for i in range(500)]
        assert it.get(timeout=10).payload == b"iterated"
        assert sub.poll(lambda v: polled.append(v.topic), timeout_s=0.2) == 0


def test_bad_poll_and_batch_arguments_are_refused_clearly(appliance):
    with connect(appliance["udp"], "feed") as c:
        with pytest.raises(ClientError, match="no poll subscription"):
            c.poll(lambda v: None)
        sub = c.subscribe("bad/#", poll=True)
        with pytest.raises(ClientError, match="poll subscription"):
            sub.get(timeout=0)
        with pytest.raises(ClientError, match="takes a handler"):
            c.poll(None)
        with pytest.raises(ClientError, match="limit"):
            c.poll(lambda v: None, 0)
        with pytest.raises(ClientError, match="timeout_s"):
            c.poll(lambda v: None, timeout_s=-1)
        with pytest.raises(ClientError, match="no qos other than best-effort"):
            c.subscribe("bad/x", selector="price > 1", poll=True)
        with pytest.raises(ClientError, match="sequence of payloads"):
            c.publish_batch("bad/x", b"one payload")
        with pytest.raises(ClientError, match="encode text first"):
            c.publish_batch("bad/x", [b"a", "b"])
        with pytest.raises(ClientError, match="guaranteed"):
            c.publish_batch("bad/x", [b"a"], qos="guaranteed")
        with pytest.raises(ClientError, match="2-D uint8"):
            c.publish_batch("bad/x", np.zeros(4, np.int32))
        with pytest.raises(ClientError, match="does not fit one frame"):
            c.publish_batch("bad/x", [bytes(70_000)])
        assert c.publish_batch("bad/x", []) == 0


def test_a_publish_without_flush_wakes_the_client_thread_for_its_budget(appliance):
    with connect(appliance["shm"], "poller") as sub, connect(appliance["shm"], "feed") as pub:
        sub.subscribe("budget/x", poll=True)
        idle = pub._runner.idle
        woken = idle.wakes_command
        pub.publish("budget/x", b"left open")  # no flush: the client thread sends it
        got = []
        _poll_until(sub, 1, lambda v: got.append(bytes(v.payload)))
        assert got == [b"left open"]
        # the publish signalled the thread (a park ends at once; one in progress or a spin
        # sees the signal at its next park)
        wait_for(lambda: idle.wakes_command > woken, what="the publish's wakeup")
