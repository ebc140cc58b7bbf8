"""One class per message (``subscribe(..., own_class=True)``, docs/appliance.md): a client
subscribed to a pattern in both classes with the option receives each message once, in its
class: a best-effort one best-effort, a guaranteed one over the reliable stream, the other
copy left out by the appliance (on one appliance and across two). Without a guaranteed place
(``clients.max_guaranteed_sessions``) everything comes best-effort, as without the option;
a subscription of the same client without the option still gets both copies (the client
then leaves them out of the ``own_class`` one itself)."""

from __future__ import annotations

import threading
import time

import pytest

from appliance.client import connect
from appliance.client.errors import ClientError
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import appliance_pair, free_port, subscription_reached, wait_for

N = 60
"""Messages of each class."""
END_G, END_B = b"end-g", b"end-b"
"""Published after the messages, guaranteed then best-effort: each path to the subscriber
(the best-effort one, the reliable stream) is in publish order, so once the best-effort
subscription has ``END_B`` and the guaranteed one ``END_G``, any copy of a message on
either path has come before them (what the tests check is then complete)."""


def _appliance(**clients) -> tuple[Appliance, str]:
    port = free_port()
    cfg = parse_config({"appliance": {"name": f"oc{port}"},
                        "clients": {"udp": f"127.0.0.1:{port}", **clients},
                        "pm": {"anonymous": True, "require_passwords": False}})
    return Appliance(cfg).start(), f"udp://127.0.0.1:{port}"


@pytest.fixture
def appliance():
    app, url = _appliance()
    yield app, url
    app.stop()


class Got:
    """What each subscription received: (payload, qos, over the reliable stream)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by: dict[str, list[tuple[bytes, int, bool]]] = {}

    def into(self, name: str):
        self.by[name] = []

        def put(msg) -> None:
            with self.lock:
                self.by[name].append((msg.payload, msg.qos, msg.guaranteed))
        return put

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.by.values())


def _publish_both(pub, topic: str) -> tuple[list[bytes], list[bytes]]:
    """N best-effort and N guaranteed messages, interleaved, then the end markers; the
    messages' payloads."""
    plain, guaranteed = [], []
    for i in range(N):
        plain.append(b"b%d" % i)
        pub.publish(topic, plain[-1], flush=True)
        guaranteed.append(b"g%d" % i)
        pub.publish(topic, guaranteed[-1], qos="guaranteed", flush=True)
        if i % 10 == 9:
            time.sleep(0.01)  # (pacing: a best-effort burst over loopback stays in the socket)
    pub.publish(topic, END_G, qos="guaranteed", flush=True)
    pub.publish(topic, END_B, flush=True)
    pub.flush(timeout=10)
    return plain, guaranteed


def _ended(got: Got, ends: dict[str, bytes]) -> None:
    """Wait until each subscription named in ``ends`` has its end marker."""
    def there() -> bool:
        with got.lock:
            return all(any(p == end for p, _, _ in got.by[name]) for name, end in ends.items())
    wait_for(there, 20, what=f"the end markers {ends}")


def _messages(got: Got, name: str) -> list[tuple[bytes, int, bool]]:
    """What subscription ``name`` received, its end markers left out."""
    with got.lock:
        return [m for m in got.by[name] if m[0] not in (END_G, END_B)]


def _each_once_in_its_class(got: Got, plain: list[bytes], guaranteed: list[bytes]) -> None:
    _ended(got, {"best-effort": END_B, "guaranteed": END_G})
    be, g = _messages(got, "best-effort"), _messages(got, "guaranteed")
    assert sorted(p for p, _, _ in be) == sorted(plain)  # each best-effort message once
    assert all(qos == 0 and not reliable for _, qos, reliable in be)
    assert [p for p, _, _ in g] == guaranteed  # each guaranteed one once, in order
    assert all(qos == 2 and reliable for _, qos, reliable in g)


def test_both_classes_with_own_class_get_each_message_once_in_its_class(appliance):
    app, url = appliance
    got = Got()
    with connect(url, "s") as sub, connect(url, "p") as pub:
        be = sub.subscribe("oc/#", callback=got.into("best-effort"), own_class=True)
        g = sub.subscribe("oc/#", qos="guaranteed", callback=got.into("guaranteed"),
                          own_class=True)
        assert be.own_class_applied and g.own_class_applied
        plain, guaranteed = _publish_both(pub, "oc/a")
        _each_once_in_its_class(got, plain, guaranteed)
        assert sub.own_class_copies == 0  # the appliance left them out: none crossed
    assert wait_for(lambda: app.status()["counters"].get("own_class_spared", 0) >= 2 * N)


def test_without_a_guaranteed_place_everything_comes_best_effort():
    app, url = _appliance(max_guaranteed_sessions=0)
    got = Got()
    try:
        with connect(url, "s") as sub, connect(url, "p") as pub:
            sub.subscribe("oc/#", callback=got.into("best-effort"), own_class=True)
            with pytest.raises(ClientError, match="max_guaranteed_sessions"):
                sub.subscribe("oc/#", qos="guaranteed", own_class=True)
            plain, guaranteed = _publish_both(pub, "oc/b")
            _ended(got, {"best-effort": END_B})  # (END_G came before it, best-effort too)
            be = _messages(got, "best-effort")
            assert sorted(p for p, _, _ in be) == sorted(plain + guaranteed)  # each once
            assert {qos for p, qos, _ in be if p in guaranteed} == {2}
            assert not any(reliable for _, _, reliable in be)
    finally:
        app.stop()
    assert app.status()["counters"].get("own_class_spared", 0) == 0


def test_a_subscription_without_the_option_still_gets_both_copies(appliance):
    _, url = appliance
    got = Got()
    with connect(url, "s") as sub, connect(url, "p") as pub:
        sub.subscribe("oc/#", callback=got.into("best-effort"), own_class=True)
        sub.subscribe("oc/c", callback=got.into("plain"))  # needs the guaranteed copies
        sub.subscribe("oc/#", qos="guaranteed", callback=got.into("guaranteed"),
                      own_class=True)
        plain, guaranteed = _publish_both(pub, "oc/c")
        _ended(got, {"best-effort": END_B, "guaranteed": END_G, "plain": END_B})
        assert sorted(p for p, _, _ in _messages(got, "plain")) == sorted(plain + guaranteed)
        got.by.pop("plain")
        _each_once_in_its_class(got, plain, guaranteed)
        # the copies came for "plain": left out here (END_G's too, before END_B)
        assert sub.own_class_copies == N + 1


def test_own_class_is_refused_with_poll_selector_or_durable(appliance):
    _, url = appliance
    with connect(url, "s") as sub:
        for kwargs in ({"poll": True}, {"selector": "price > 1"}, {"durable": "d"}):
            with pytest.raises(ClientError, match="own_class"):
                sub.subscribe("oc/#", own_class=True, **kwargs)
        with pytest.raises(ClientError, match="own_class is True or False"):
            sub.subscribe_many(["oc/#"], own_class=1)


def test_across_two_appliances_each_message_comes_once_in_its_class():
    identities = {"feed": {"publish": ["#"], "subscribe": ["#"]}}
    with appliance_pair(identities) as (a, b, url_a, url_b):
        got = Got()
        with connect(url_b, "feed") as sub, connect(url_a, "feed") as pub:
            sub.subscribe("oc/#", callback=got.into("best-effort"), own_class=True)
            sub.subscribe("oc/#", qos="guaranteed", callback=got.into("guaranteed"),
                          own_class=True)
            wait_for(lambda: subscription_reached(a, "oc/#"), 30, what="B's interest at A")
            # the first message of each class: the interest of both classes is in place
            pub.publish("oc/warm", END_G, qos="guaranteed", flush=True)
            pub.publish("oc/warm", END_B, flush=True)
            _ended(got, {"best-effort": END_B, "guaranteed": END_G})
            with got.lock:  # (what came of them, copies included, is left out below)
                for name in got.by:
                    got.by[name].clear()
            plain, guaranteed = _publish_both(pub, "oc/d")
            _each_once_in_its_class(got, plain, guaranteed)
            assert sub.own_class_copies == 0
        assert wait_for(lambda: b.status()["counters"].get("own_class_spared", 0) >= 2 * N)
