"""Namespaces enforced: a session registers, publishes, subscribes, replays and resolves only
in its identity's namespaces (``pm.identities.X.namespaces``, each declared in P&M's
``appliance.namespaces``); a remote-P&M appliance enforces the same from P&M's document."""

import pytest

from appliance.client import EntitlementError, connect
from appliance.config import ConfigError, parse_config
from appliance.node import Appliance
from datapath.protocol import admin_layout as al
from datapath.topics.registry import KeyRegistry
from tests.appliance.helpers import (
    appliance_pair,
    counter,
    free_port,
    until_marker,
    wait_for,
)

ALL = {"publish": ["#"], "subscribe": ["#"]}
IDENTITIES = {"red": {**ALL, "namespaces": [0]}, "blue": {**ALL, "namespaces": [7]},
              "both": {**ALL, "namespaces": [0, 7]}}


def _doc(port: int, pm: dict | None = None, **more: dict) -> dict:
    """A config declaring namespaces 0 and 7, clients on ``port``, P&M with IDENTITIES (or
    ``pm``), no passwords."""
    return {"appliance": {"name": f"ns{port}", "namespaces": [0, 7]},
            "clients": {"udp": f"127.0.0.1:{port}"},
            "pm": {"require_passwords": False, **(pm or {"identities": IDENTITIES})}, **more}


@pytest.fixture
def served():
    port = free_port()
    app = Appliance(parse_config(_doc(port))).start()
    yield app, f"udp://127.0.0.1:{port}"
    app.stop()


def _end(m) -> bool:
    return m.payload == b"end"


def _payloads(messages) -> list:
    return [(m.namespace, m.topic, m.payload) for m in messages]


def _isolated(url_red: str, url_blue: str, url_both: str) -> None:
    """Red (namespace 0) and blue (7) each subscribe '#' and publish the same topic name;
    each gets only its own namespace's messages, 'both' gets each namespace's."""
    with connect(url_red, "red") as red, connect(url_blue, "blue") as blue, \
            connect(url_both, "both") as both:
        red_sub = red.subscribe("#")
        blue_sub = blue.subscribe("#", namespace=7)
        both0, both7 = both.subscribe("#"), both.subscribe("#", namespace=7)
        red.publish("a/x", b"red", flush=True)
        blue.publish("a/x", b"blue", namespace=7, flush=True)
        # both saw each one: the data path took them before the markers below
        assert _payloads(until_marker(both0, lambda m: m.payload == b"red")) == [
            (0, "a/x", b"red")]
        assert _payloads(until_marker(both7, lambda m: m.payload == b"blue")) == [
            (7, "a/x", b"blue")]
        red.publish("a/end", b"end", flush=True)
        blue.publish("a/end", b"end", namespace=7, flush=True)
        assert _payloads(until_marker(red_sub, _end)) == [(0, "a/x", b"red"),
                                                           (0, "a/end", b"end")]
        assert _payloads(until_marker(blue_sub, _end)) == [(7, "a/x", b"blue"),
                                                            (7, "a/end", b"end")]
        assert _payloads(until_marker(both0, _end)) == [(0, "a/end", b"end")]
        assert _payloads(until_marker(both7, _end)) == [(7, "a/end", b"end")]


def test_each_identity_sees_only_its_namespaces(served):
    _, url = served
    _isolated(url, url, url)


def test_another_namespace_is_refused_counted_and_its_topics_stay_unknown(served):
    app, url = served
    with connect(url, "red") as red, connect(url, "blue") as blue:
        red.publish("secret/topic", b"x", flush=True)  # registered in namespace 0
        with pytest.raises(EntitlementError, match="identity 'blue' may not use namespace 0"):
            blue.subscribe("#", namespace=0)
        with pytest.raises(EntitlementError, match="identity 'blue' may not use namespace 0"):
            blue.publish("secret/topic", b"y", namespace=0)
        with pytest.raises(EntitlementError, match="identity 'red' may not use namespace 7"):
            red.subscribe("#", namespace=7)
        # a namespace P&M does not declare is no one's
        with pytest.raises(EntitlementError, match="may not use namespace 9"):
            blue.publish("a/x", b"z", namespace=9)
        # RESOLVE of namespace 0's key names nothing; the own key in the same request
        # (answered in the same frame) is the marker
        blue.publish("own/topic", b"o", namespace=7, flush=True)
        secret, own = (KeyRegistry().key_of("secret/topic", 0),
                       KeyRegistry().key_of("own/topic", 7))
        blue._topics.pop(own, None)
        blue._control(al.ControlKind.RESOLVE, {"keys": [secret, own]})
        wait_for(lambda: own in blue._topics, what="the resolve answer")
        assert blue._topics[own] == (7, "own/topic") and secret not in blue._topics
        wait_for(lambda: counter(app, "control_namespace_denials") == 5,
                 what=f"5 namespace denials: {app.status()['counters']}")
        denials = {(d["identity"], d["action"], d["pattern"]): d["count"]
                   for d in app.status()["denials"]}
        assert denials == {("blue", "subscribe", "namespace 0"): 1,
                           ("blue", "publish", "namespace 0"): 1,
                           ("red", "subscribe", "namespace 7"): 1,
                           ("blue", "publish", "namespace 9"): 1,
                           ("blue", "resolve", "namespace 0"): 1}


def test_the_pm_document_carries_namespaces_and_a_remote_appliance_enforces_them():
    with appliance_pair(IDENTITIES, namespaces=(0, 7)) as (a, b, url_a, url_b):
        doc = b.control.pm_doc
        assert doc["namespaces"] == [0, 7]
        assert {n: i["namespaces"] for n, i in doc["identities"].items()} == {
            "red": [0], "blue": [7], "both": [0, 7]}
        with connect(url_b, "blue") as blue:
            with pytest.raises(EntitlementError, match="may not use namespace 0"):
                blue.subscribe("#", namespace=0)
        wait_for(lambda: counter(b, "control_namespace_denials") == 1)
        # red at A, blue and both at B: across the fabric too, each sees its own
        _isolated(url_a, url_b, url_b)


def _cfg(identity: dict, namespaces: object = (0, 7)) -> dict:
    return {"appliance": {"name": "c1", "namespaces": list(namespaces)}
            if isinstance(namespaces, tuple) else {"name": "c1", "namespaces": namespaces},
            "pm": {"require_passwords": False, "identities": {"x": {**ALL, **identity}}}}


@pytest.mark.parametrize(("doc", "key"), [
    (_cfg({"namespaces": [3]}), "pm.identities.x.namespaces"),  # not declared
    (_cfg({"namespaces": [2**32]}), "pm.identities.x.namespaces"),
    (_cfg({"namespaces": []}), "pm.identities.x.namespaces"),
    (_cfg({"namespaces": [0, 0]}), "pm.identities.x.namespaces"),
    (_cfg({"namespaces": [True]}), "pm.identities.x.namespaces"),
    (_cfg({"namespaces": "0"}), "pm.identities.x.namespaces"),
    (_cfg({}, [-1]), "appliance.namespaces"),
    (_cfg({}, [7, 7]), "appliance.namespaces"),
])
def test_bad_namespaces_are_refused_naming_the_key(doc, key):
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert str(info.value).startswith(f"config: {key}:")


def test_an_identity_defaults_to_namespace_0():
    cfg = parse_config(_cfg({}))
    assert cfg.identities["x"].namespaces == (0,)


def test_a_reload_moves_an_identity_to_another_namespace():
    port = free_port()

    def config(blue: list) -> dict:
        return _doc(port, {"identities": {**IDENTITIES, "blue": {**ALL, "namespaces": blue}}})
    app = Appliance(parse_config(config([7]))).start()
    url = f"udp://127.0.0.1:{port}"
    try:
        with connect(url, "red") as red, connect(url, "blue") as blue, \
                connect(url, "both") as both:
            blue7 = blue.subscribe("#", namespace=7)
            blue.publish("k/x", b"mine", namespace=7, flush=True)
            assert blue7.get(timeout=10).payload == b"mine"
            out = app.reload(parse_config(config([0])))
            assert out.result["ok"] and "pm.identities" in out.summary()
            wait_for(lambda: counter(app, "control_entitlement_withdrawn_subscriptions") == 1
                     and counter(app, "control_entitlement_revoked_topics") == 1)
            with pytest.raises(EntitlementError, match="may not use namespace 7"):
                blue.subscribe("k/#", namespace=7)
            blue0 = blue.subscribe("#")
            both7 = both.subscribe("#", namespace=7)
            both.publish("k/x", b"gone", namespace=7, flush=True)
            assert both7.get(timeout=10).payload == b"gone"  # the data path took it
            red.publish("k/end", b"end", flush=True)
            assert _payloads(until_marker(blue0, _end)) == [(0, "k/end", b"end")]
            assert blue7.get(timeout=0) is None  # withdrawn: "gone" never came
    finally:
        app.stop()


def test_anonymous_logins_may_use_every_declared_namespace():
    port = free_port()
    app = Appliance(parse_config(_doc(port, {"anonymous": True}))).start()
    try:
        with connect(f"udp://127.0.0.1:{port}", "ghost") as ghost:
            sub = ghost.subscribe("#", namespace=7)
            ghost.publish("g/x", b"seven", namespace=7, flush=True)
            assert sub.get(timeout=10).payload == b"seven"
            ghost.subscribe("#")
            with pytest.raises(EntitlementError, match="may not use namespace 8"):
                ghost.subscribe("#", namespace=8)
    finally:
        app.stop()


def test_a_replay_in_another_namespace_is_refused(tmp_path):
    from appliance.cache.node import CachingAppliance

    port = free_port()
    app = CachingAppliance(parse_config(_doc(port, cache={
        "dir": str(tmp_path), "patterns": ["orders/#"]}))).start()
    try:
        assert app.cache.ready.wait(60), "the cache's session did not subscribe"
        with connect(f"udp://127.0.0.1:{port}", "blue") as blue:
            with pytest.raises(EntitlementError, match="identity 'blue' may not use "
                               "namespace 0"):
                list(blue.replay("orders/#"))
        wait_for(lambda: ("blue", "replay", "namespace 0") in {
            (d["identity"], d["action"], d["pattern"]) for d in app.status()["denials"]})
    finally:
        app.stop()


def test_a_forged_header_namespace_changes_nothing(served):
    """A raw frame of blue's namespace-7 key whose header says namespace 0 goes where the key
    goes (namespace 7's subscribers) and is delivered as namespace 7."""
    import time

    from datapath.protocol.codec import encode_data_frame

    _, url = served
    with connect(url, "blue") as blue, connect(url, "both") as both:
        both0, both7 = both.subscribe("#"), both.subscribe("#", namespace=7)
        blue.publish("f/x", b"first", namespace=7, flush=True)
        assert both7.get(timeout=10).payload == b"first"
        blue._send(encode_data_frame(
            [{"topic_key": KeyRegistry().key_of("f/x", 7), "sequence": 99,
              "publish_ts_ns": time.time_ns(), "namespace_id": 0, "payload": b"forged"}],
            source_session=blue.session, stream_id=blue.session))
        m = both7.get(timeout=10)
        assert (m.namespace, m.topic, m.payload) == (7, "f/x", b"forged")
        assert both0.get(timeout=0) is None  # it came on the same path, before m
