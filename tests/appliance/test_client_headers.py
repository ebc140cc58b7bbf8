"""Message headers (user properties) end to end: published with ``publish(headers=)``,
carried in the header block of the payload region (docs/protocol.md, "Headers and
segments"), delivered as ``Message.headers`` on the same appliance and across two, for
best-effort and guaranteed; limits refused with the limit named."""

import pytest

from appliance.client import ClientError, connect
from appliance.client.messages import NO_HEADERS
from appliance.config import parse_config
from appliance.node import Appliance
from datapath.protocol import extension_layout as xl
from tests.appliance.helpers import appliance_pair, free_port, subscription_reached, wait_for

HEADERS = {"trace-id": "4bf92f3577b34da6", "content-type": "application/json",
           "blob": b"\x00\x01\xfe\xff", "unicode-\u00e9": "\u2713"}
IDENTITIES = {"feed": {"publish": ["#"], "subscribe": ["#"]}}


@pytest.fixture
def served():
    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"hd{port}"}, "clients": {"udp": f"127.0.0.1:{port}"},
        "pm": {"require_passwords": False, "identities": IDENTITIES}})).start()
    yield f"udp://127.0.0.1:{port}"
    app.stop()


@pytest.fixture
def pair():
    with appliance_pair(IDENTITIES) as apps:
        yield apps


def _round_trip(pub, sub_client, topic, qos, wait_subscribed=lambda: True):
    sub = sub_client.subscribe(f"{topic}/#", qos=qos)
    wait_for(wait_subscribed, 30, what="the subscription to reach the publisher's appliance")
    outcomes = []
    deadline_marker = b"end"
    for i, headers in enumerate([HEADERS, None, {"n": str(1)}, {}]):
        o = pub.publish(f"{topic}/x", f"p{i}".encode(), qos=qos, headers=headers)
        outcomes.append(o)
    pub.publish(f"{topic}/x", deadline_marker, qos=qos, flush=True)
    got = []
    while not got or got[-1].payload != deadline_marker:
        m = sub.get(timeout=20)
        assert m is not None, f"the marker did not arrive: {got}"
        got.append(m)
    assert [m.payload for m in got] == [b"p0", b"p1", b"p2", b"p3", b"end"]
    assert dict(got[0].headers) == HEADERS
    assert got[1].headers is NO_HEADERS and got[3].headers is NO_HEADERS
    assert dict(got[2].headers) == {"n": "1"}
    assert isinstance(got[0].headers["blob"], bytes)
    assert sub_client.malformed_extensions == 0
    if qos == "guaranteed":
        pub.flush(timeout=10)
        assert all(o.acknowledged for o in outcomes)


@pytest.mark.parametrize("qos", ["best-effort", "guaranteed"])
def test_headers_round_trip_on_one_appliance(served, qos):
    with connect(served, "feed") as pub, connect(served, "feed") as sub:
        _round_trip(pub, sub, f"h1/{qos}", qos)


@pytest.mark.parametrize("qos", ["best-effort", "guaranteed"])
def test_headers_round_trip_across_two_appliances(pair, qos):
    a, _, url_a, url_b = pair
    topic = f"h2/{qos}"

    with connect(url_a, "feed") as pub, connect(url_b, "feed") as sub:
        _round_trip(pub, sub, topic, qos, lambda: subscription_reached(a, f"{topic}/#"))


def test_headers_over_a_limit_are_refused_naming_it(served):
    with connect(served, "feed") as c:
        many = {f"k{i}": "v" for i in range(xl.MAX_HEADERS + 1)}
        with pytest.raises(ClientError, match=f"at most {xl.MAX_HEADERS}"):
            c.publish("h3/x", b"", headers=many)
        with pytest.raises(ClientError, match=f"{xl.MAX_HEADER_BLOCK_BYTES} bytes"):
            c.publish("h3/x", b"", headers={"big": "x" * xl.MAX_HEADER_BLOCK_BYTES})
        with pytest.raises(ClientError, match=f"at most {xl.MAX_HEADER_KEY_BYTES}"):
            c.publish("h3/x", b"", headers={"k" * 256: "v"})
        with pytest.raises(ClientError, match="str or bytes, not int"):
            c.publish("h3/x", b"", headers={"k": 5})
        with pytest.raises(ClientError, match="mapping"):
            c.publish("h3/x", b"", headers=[("k", "v")])
        with pytest.raises(ClientError, match="at most"):
            c.publish("h3/x", b"", qos="guaranteed", headers=many)
