"""Batched requests of the client API against a real appliance (issue 19, issue 16):
``register_many`` (one REGISTRY_UPDATE request for many topics), ``subscribe_many`` and
``unsubscribe_many`` (one SUBSCRIBE/UNSUBSCRIBE request for many patterns): per topic and per
pattern the same outcome as one request each, entitlement refusals included, and the accepted
ones usable at once."""

from __future__ import annotations

import pytest

from appliance.client import ClientError, EntitlementError, connect
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import free_port, wait_for

IDENTITIES = {
    "feed": {"publish": ["batch/ok/#", "batch/exact"], "subscribe": ["batch/ok/#"]},
    "all": {"publish": ["#"], "subscribe": ["#"]},
}


@pytest.fixture(scope="module")
def app():
    port = free_port()
    appliance = Appliance(parse_config({
        "appliance": {"name": f"batched{port}"},
        "clients": {"udp": f"127.0.0.1:{port}", "max_subscriptions": 8_192},
        "pm": {"require_passwords": False, "identities": IDENTITIES}})).start()
    try:
        yield appliance, f"udp://127.0.0.1:{port}"
    finally:
        appliance.stop()


def test_register_many_refuses_exactly_the_topics_not_entitled(app) -> None:
    appliance, url = app
    topics = [f"batch/ok/{i}" for i in range(3_000)]
    refused = {5: "batch/no/5", 1_700: "batch/other", 2_999: "batch/exactly"}
    for i, topic in refused.items():
        topics[i] = topic
    topics.append("batch/exact")
    topics.append("batch/ok/0")  # twice in one call: the same outcome twice
    before = len(appliance.control.registry)
    with connect(url, identity="feed") as feed, connect(url, identity="all") as reader:
        sub = reader.subscribe("batch/#")
        results = feed.register_many(topics)
        assert len(results) == len(topics)
        bad = {i for i, r in enumerate(results) if r is not None}
        assert bad == set(refused), [results[i] for i in bad]
        for i in refused:
            assert isinstance(results[i], EntitlementError)
            assert topics[i] in str(results[i]) and "may not publish" in str(results[i])
        # registered in the appliance's registry, all of them at once
        assert len(appliance.control.registry) == before + len(set(topics)) - len(refused)
        # usable at once: a publish needs no registration round trip any more
        asked = feed._request
        feed._request = lambda *a, **k: pytest.fail(f"a publish made a request {a[0]}")
        feed.publish("batch/ok/2998", b"x", flush=True)
        feed.publish("batch/exact", b"y", flush=True)
        feed._request = asked
        got = {sub.get(timeout=10).payload for _ in range(2)}
        assert got == {b"x", b"y"}
        with pytest.raises(EntitlementError, match="batch/no/5"):
            feed.publish("batch/no/5", b"z", flush=True)
        # already registered: answered without asking
        assert feed.register_many(["batch/ok/1", "batch/ok/2"]) == [None, None]


def test_register_many_refuses_a_malformed_topic_before_sending(app) -> None:
    _, url = app
    with connect(url, identity="feed") as feed:
        with pytest.raises(ClientError, match="topic"):
            feed.register_many(["batch/ok/a", "batch/+/b"])


def test_subscribe_many_reports_refusals_per_pattern_and_delivers_to_the_rest(app) -> None:
    appliance, url = app
    patterns = [f"batch/ok/s{i}" for i in range(500)] + ["batch/no/x", "batch/ok/w/+"]
    with connect(url, identity="feed") as feed, connect(url, identity="all") as pub:
        got: list = []
        results = feed.subscribe_many(patterns, callback=got.append)
        assert len(results) == len(patterns)
        assert isinstance(results[500], EntitlementError)
        assert "batch/no/x" in str(results[500])
        subs = [r for i, r in enumerate(results) if i != 500]
        assert all(not isinstance(r, ClientError) for r in subs)
        assert [s.pattern for s in subs] == patterns[:500] + ["batch/ok/w/+"]
        # each accepted one is live when its answer came: no wait before publishing
        pub.publish("batch/ok/s499", b"a", flush=True)
        pub.publish("batch/ok/w/7", b"b", flush=True)
        pub.publish("batch/no/x", b"never", flush=True)
        pub.publish("batch/ok/s0", b"c", flush=True)
        wait_for(lambda: len(got) >= 3, 10, what="the three messages")
        assert sorted(m.payload for m in got) == [b"a", b"b", b"c"]
        session = next(s for s in appliance.control.sessions.values()
                       if s.identity == "feed")
        assert (0, "batch/ok/s250") in session.patterns
        assert (0, "batch/no/x") not in session.patterns
        # unsubscribe_many: the withdrawn ones stop, the others stay
        assert feed.unsubscribe_many([f"batch/ok/s{i}" for i in range(499)]) == [None] * 499
        assert all(s.closed for s in subs[:499])
        assert not subs[499].closed
        wait_for(lambda: (0, "batch/ok/s3") not in session.patterns, 10,
                 what="the withdrawn patterns to leave the session")
        assert (0, "batch/ok/s499") in session.patterns
        got.clear()
        pub.publish("batch/ok/s3", b"gone", flush=True)
        pub.publish("batch/ok/s499", b"kept", flush=True)
        wait_for(lambda: got, 10, what="the kept subscription's message")
        assert [m.payload for m in got] == [b"kept"]


def test_subscribe_many_takes_more_than_the_pending_limit_and_several_frames(app) -> None:
    """2,000 patterns, more than clients.max_pending_requests (256) and too many bytes for
    one frame: every one accepted (a frame is admitted whole; the client sends the next
    frame once the previous one is answered); then 100 withdrawn in one request."""
    appliance, url = app
    patterns = [f"batch/many/{'x' * 40}/{i}" for i in range(2_000)]
    with connect(url, identity="all") as client:
        results = client.subscribe_many(patterns)
        errors = [r for r in results if isinstance(r, ClientError)]
        assert not errors, errors[:3]
        session = next(s for s in appliance.control.sessions.values()
                       if s.session_id == client.session)
        assert len(session.patterns) == 2_000
        # (a native unsubscribe costs time in proportion to the list: 100 of them)
        assert client.unsubscribe_many(patterns[:100], timeout_s=60) == [None] * 100
        assert all(s.closed for s in results[:100]) and not results[100].closed
        wait_for(lambda: len(session.patterns) == 1_900, 10, what="100 patterns to go")


def test_subscribe_many_refuses_a_malformed_pattern_before_sending(app) -> None:
    _, url = app
    with connect(url, identity="all") as client:
        with pytest.raises(ClientError, match="pattern"):
            client.subscribe_many(["batch/a", "batch/b#"])
        with pytest.raises(ClientError, match="qos"):
            client.subscribe_many(["batch/a"], qos="sometimes")
        assert client.subscribe_many([]) == []
