"""Selectors evaluated in the appliance (docs/selectors.md, "In the fabric"): the SUBSCRIBE
carries the selector, the delivering appliance sends a client only the messages its selector
wants (counted ``selector_filtered``), and a selector it cannot evaluate is refused at
subscribe time with the reason."""

import pytest

from appliance.client import ClientError, SelectorRefusedError, connect
from appliance.config import parse_config
from appliance.node import Appliance
from nic_offload.schema import Schema
from nic_offload.selectors import SelectorSyntaxError
from tests.appliance.helpers import appliance_pair, free_port, until_marker, wait_for

QUOTE = {"id": 7, "fields": [["price", 0, "u32"], ["symbol", 4, "ascii", 8]]}
SCHEMA = Schema.of("quote", 7, [("price", 0, "u32"), ("symbol", 4, "ascii", 8)])


@pytest.fixture
def served():
    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"fs{port}"}, "clients": {"udp": f"127.0.0.1:{port}"},
        "pm": {"schemas": {"quote": QUOTE}, "require_passwords": False,
               "identities": {"feed": {"publish": ["#"], "subscribe": ["#"]}}}})).start()
    yield app, f"udp://127.0.0.1:{port}"
    app.stop()


def _filtered(app) -> int:
    return int(app.status()["offload"].get("selector_filtered", 0))


def _drain(sub):
    out = []
    while (m := sub.get(timeout=0)) is not None:
        out.append(m)
    return out


def _quotes(sub, marker_price=999):
    got = until_marker(sub, lambda m: SCHEMA.decode(m.payload)["price"] == marker_price)
    return [(q["price"], q["symbol"]) for q in map(SCHEMA.decode, (m.payload for m in got))]


def test_each_subscriber_receives_only_what_its_selector_wants(served):
    app, url = served
    with connect(url, "feed") as pub, connect(url, "feed") as c1, connect(url, "feed") as c2:
        s1 = c1.subscribe("quotes/#", selector="price > 100")
        s2 = c2.subscribe("quotes/#", selector="symbol = 'SAP' AND tw_schema_id = 7")
        assert s1.selector_filtered and s2.selector_filtered
        before = _filtered(app)
        sent = [(90, "IBM"), (150, "IBM"), (50, "SAP"), (200, "SAP"), (999, "SAP")]
        for price, symbol in sent:  # the last is the marker both selectors take
            pub.publish("quotes/nyse", SCHEMA.encode({"price": price, "symbol": symbol}),
                        schema_id=7)
        pub.flush()
        assert _quotes(s1) == [(150, "IBM"), (200, "SAP"), (999, "SAP")]
        assert _quotes(s2) == [(50, "SAP"), (200, "SAP"), (999, "SAP")]
        assert _drain(s1) == [] and _drain(s2) == []
        # the appliance did not send them: 2 + 2 filtered there, 3 received by each client
        wait_for(lambda: _filtered(app) - before == 4, what="selector_filtered counted")
        assert c1.received == 3 and c2.received == 3


def test_a_plain_subscription_of_the_same_session_lets_everything_through(served):
    app, url = served
    with connect(url, "feed") as pub, connect(url, "feed") as c:
        picky = c.subscribe("quotes/#", selector="price > 100")
        everything = c.subscribe("quotes/#")
        before = _filtered(app)
        for price in (90, 150, 999):
            pub.publish("quotes/x", SCHEMA.encode({"price": price, "symbol": "A"}),
                        schema_id=7)
        pub.flush()
        assert [p for p, _ in _quotes(everything)] == [90, 150, 999]
        assert [p for p, _ in _quotes(picky)] == [150, 999]  # the client evaluates here
        assert _filtered(app) == before


def test_a_selector_guards_only_the_topics_of_its_own_pattern(served):
    app, url = served
    with connect(url, "feed") as pub, connect(url, "feed") as c:
        narrow = c.subscribe("quotes/a", selector="symbol = 'A'")
        wide = c.subscribe("quotes/#", selector="price > 100")
        pub.publish("quotes/a", SCHEMA.encode({"price": 998, "symbol": "A"}), schema_id=7)
        pub.flush()  # (both topics known: quotes/a guarded by both selectors)
        assert [p for p, _ in _quotes(narrow, 998)] == [998]
        before = _filtered(app)
        # on quotes/b only 'price > 100' applies: symbol 'A' at 50 is not delivered
        for price in (50, 999):
            pub.publish("quotes/b", SCHEMA.encode({"price": price, "symbol": "A"}),
                        schema_id=7)
        pub.flush()
        assert [p for p, _ in _quotes(wide)] == [998, 999]  # (quotes/a's, then quotes/b's)
        wait_for(lambda: _filtered(app) - before == 1, what="selector_filtered counted")
        assert c.received == 2


def test_unsubscribe_removes_the_guard(served):
    app, url = served
    with connect(url, "feed") as pub, connect(url, "feed") as c:
        c.subscribe("quotes/a", selector="price > 100")
        c.unsubscribe("quotes/#")
        sub = c.subscribe("quotes/a")
        for price in (90, 999):
            pub.publish("quotes/a", SCHEMA.encode({"price": price, "symbol": "A"}),
                        schema_id=7)
        pub.flush()
        assert [p for p, _ in _quotes(sub)] == [90, 999]


def test_a_selector_the_appliance_cannot_evaluate_is_refused_with_the_reason(served,
                                                                            monkeypatch):
    app, url = served
    with connect(url, "feed") as c:
        with pytest.raises(SelectorRefusedError, match="'volume'.*cannot evaluate"):
            c.subscribe("quotes/#", selector="price > 1 AND volume > 5")
        with pytest.raises(SelectorRefusedError, match="'tw_nonsense'"):
            c.subscribe("quotes/#", selector="tw_nonsense = 1")
        with pytest.raises(SelectorSyntaxError):  # the client's own check comes first
            c.subscribe("quotes/#", selector="price >")
        with pytest.raises(ClientError, match="at most 1024"):
            c.subscribe("quotes/#", selector="price > 1" + " " * 1100)
        # a client that does not check: the appliance's refusal names the syntax error
        monkeypatch.setattr("nic_offload.selectors.compile_selector", lambda text: None)
        with pytest.raises(SelectorRefusedError, match="syntax error at column"):
            c.subscribe("quotes/#", selector="price >")
        assert app.status()["subscriptions"] == []
        assert app.control.counters["refused_selector"] == 3


def test_selector_subscriptions_per_session_are_bounded(served, monkeypatch):
    _, url = served
    monkeypatch.setattr("appliance.control.selector_apply.MAX_SELECTORS_PER_SESSION", 2)
    with connect(url, "feed") as c:
        c.subscribe("quotes/a", selector="price > 1")
        c.subscribe("quotes/b", selector="price > 2")
        with pytest.raises(SelectorRefusedError, match="at most 2"):
            c.subscribe("quotes/c", selector="price > 3")
        c.subscribe("quotes/c")  # without selector: not bounded by it


def _link_filtered(app) -> int:
    return int(app.status()["offload"].get("selector_filtered_link", 0))


def _selective_at(app, other) -> dict:
    held = app.control.interest_selectors.get(other.control.node_id)
    interest = app.control.interest.get(other.control.node_id)
    return held[1] if held and interest and held[0] == tuple(interest[:2]) else {}


def test_the_link_carries_only_messages_a_selector_behind_it_takes():
    """Publisher on A, subscribers on B: A does not send B what no selector there takes,
    until a subscription without selector on B wants everything."""
    idents = {"feed": {"publish": ["#"], "subscribe": ["#"]}}
    with appliance_pair(idents) as (a, b, url_a, url_b):
        with connect(url_a, "feed") as pub, connect(url_b, "feed") as sub_c:
            sub = sub_c.subscribe("fab/#", selector="tw_schema_id = 2")
            wait_for(lambda: _selective_at(a, b) == {(0, "fab/#"): ("tw_schema_id = 2",)},
                     what="B's selectors to reach A")
            link_before, b_before = _link_filtered(a), _filtered(b)
            for schema_id, payload in ((1, b"no"), (2, b"yes"), (1, b"no"), (2, b"end")):
                pub.publish("fab/t", payload, schema_id=schema_id)
            pub.flush()
            got = until_marker(sub, lambda m: m.payload == b"end")
            assert [m.payload for m in got] == [b"yes", b"end"]
            wait_for(lambda: _link_filtered(a) - link_before == 2, what="A's link filter")
            assert _filtered(b) == b_before  # nothing for B to filter: it never came
            assert sub_c.received == 2

            # a subscription without selector behind the link: everything crosses, B filters
            with connect(url_b, "feed") as plain_c:
                plain = plain_c.subscribe("fab/t")
                wait_for(lambda: _selective_at(a, b) == {}, what="A to drop B's selectors")
                for schema_id, payload in ((1, b"no2"), (2, b"end2")):
                    pub.publish("fab/t", payload, schema_id=schema_id)
                pub.flush()
                assert [m.payload for m in until_marker(plain, lambda m: m.payload == b"end2")
                        ] == [b"no2", b"end2"]
                assert [m.payload for m in until_marker(sub, lambda m: m.payload == b"end2")
                        ] == [b"end2"]
                wait_for(lambda: _filtered(b) - b_before == 1, what="B's filter")
                assert _link_filtered(a) - link_before == 2


def test_a_link_passes_what_it_cannot_judge_without_the_schema_and_the_far_side_filters():
    """An appliance that does not know a message's schema (P&M's document may reach it after
    a neighbour's selectors) cannot judge a selector on that schema's fields: it sends the
    message across the link, and the appliance that holds the subscription filters it. A
    selector on header properties alone is still judged at the link (the test above)."""
    idents = {"feed": {"publish": ["#"], "subscribe": ["#"]}}
    with appliance_pair(idents, schemas={"quote": QUOTE}) as (a, b, url_a, url_b):
        dp = a.dataplane
        set_selectors = dp.set_selectors
        # A's data path is handed its guards but never P&M's schemas
        dp.set_selectors = lambda guards, schemas, nodes=None: set_selectors(guards, [], nodes)
        dp.selector_schemas = {}
        with connect(url_a, "feed") as pub, connect(url_b, "feed") as sub_c:
            sub = sub_c.subscribe("quotes/#", selector="price > 100")
            wait_for(lambda: _selective_at(a, b) == {(0, "quotes/#"): ("price > 100",)},
                     what="B's selectors to reach A")
            link_before, b_before = _link_filtered(a), _filtered(b)
            for price in (50, 150, 60, 999):
                pub.publish("quotes/x", SCHEMA.encode({"price": price, "symbol": "A"}),
                            schema_id=7)
            pub.flush()
            assert [p for p, _ in _quotes(sub)] == [150, 999]
            wait_for(lambda: _filtered(b) - b_before == 2, what="B's filter")
            assert _link_filtered(a) == link_before
            # (A's data path publishes its counters lazily: waited for, not read once)
            wait_for(lambda: a.status()["offload"].get("selector_unknown_schema", 0) >= 4,
                     what="A's count of the messages it could not judge")


def test_a_client_reconnected_to_a_restarted_appliance_sends_its_selectors_again():
    port = free_port()
    config = {"appliance": {"name": f"fr{port}"}, "clients": {"udp": f"127.0.0.1:{port}"},
              "pm": {"schemas": {"quote": QUOTE}, "require_passwords": False,
                     "identities": {"feed": {"publish": ["#"], "subscribe": ["#"]}}}}
    url = f"udp://127.0.0.1:{port}"
    app = Appliance(parse_config(config)).start()
    try:
        with connect(url, "feed", session_timeout_s=600.0) as c:
            sub = c.subscribe("quotes/#", selector="price > 100")
            app.stop()
            app = Appliance(parse_config(config)).start()
            wait_for(lambda: app.status()["subscriptions"], 30, what="the subscription again")
            with connect(url, "feed") as pub:
                for price in (50, 999):
                    pub.publish("quotes/x", SCHEMA.encode({"price": price, "symbol": "A"}),
                                schema_id=7)
                pub.flush()
                assert [p for p, _ in _quotes(sub)] == [999]
                assert sub.selector_filtered
                wait_for(lambda: _filtered(app) == 1, what="the new appliance filtering")
    finally:
        app.stop()
