"""The client API against one appliance: selectors with P&M schemas, last-value QoS,
batching, entitlements enforced in the data path, and the status contract."""

import time

import pytest

from appliance.client import EntitlementError, connect
from appliance.config import parse_config
from appliance.node import Appliance
from datapath.protocol.codec import encode_data_frame
from datapath.topics.registry import KeyRegistry
from nic_offload.schema import Schema
from tests.appliance.helpers import free_port, until_marker, wait_for

QUOTE = {"id": 7, "fields": [["price", 0, "u32"], ["symbol", 4, "ascii", 8]]}


@pytest.fixture
def served():
    port = free_port()
    cfg = parse_config({
        "appliance": {"name": f"cl{port}"}, "clients": {"udp": f"127.0.0.1:{port}"},
        "pm": {"schemas": {"quote": QUOTE}, "require_passwords": False,
               "identities": {"feed": {"publish": ["#"], "subscribe": ["#"]},
                              "narrow": {"publish": ["mine/#"], "subscribe": ["#"]}}}})
    app = Appliance(cfg).start()
    yield app, f"udp://127.0.0.1:{port}"
    app.stop()


def _drain(sub):
    """What the subscription holds now (nothing is on its way: see the callers)."""
    out = []
    while (m := sub.get(timeout=0)) is not None:
        out.append(m)
    return out


def test_selectors_read_schema_fields_from_pm(served):
    _, url = served
    schema = Schema.of("quote", 7, [("price", 0, "u32"), ("symbol", 4, "ascii", 8)])
    with connect(url, "feed") as c:
        sub = c.subscribe("quotes/#", selector="price > 100 AND symbol = 'IBM'")
        everything = c.subscribe("quotes/#")
        # the last (999, IBM) is the end marker: both subscriptions take it
        for price, symbol in [(90, "IBM"), (150, "IBM"), (150, "SAP"), (101, "IBM"),
                              (999, "IBM")]:
            c.publish("quotes/nyse", schema.encode({"price": price, "symbol": symbol}),
                      schema_id=7)
        c.flush()

        def marker(m):
            return schema.decode(m.payload)["price"] == 999
        got = [schema.decode(m.payload) for m in until_marker(sub, marker)]
        assert [(g["price"], g["symbol"]) for g in got] == [(150, "IBM"), (101, "IBM"),
                                                            (999, "IBM")]
        assert len(until_marker(everything, marker)) == 5
        assert _drain(sub) == [] and _drain(everything) == []


def test_last_value_keeps_the_newest_message_per_topic_for_a_slow_reader(served):
    app, url = served
    with connect(url, "feed") as c:
        sub = c.subscribe("lv/#", qos="last-value")
        for i in range(10):
            c.publish("lv/a", f"a{i}".encode())
        for i in range(5):
            c.publish("lv/b", f"b{i}".encode())
        c.flush()
        wait_for(lambda: sub.delivered == 15)
        got = {(m.topic, m.payload) for m in _drain(sub)}
        assert got == {("lv/a", b"a9"), ("lv/b", b"b4")}
        wait_for(lambda: [s["qos"] for s in app.status()["subscriptions"]] == ["last-value"])


def test_publishes_are_batched_into_few_frames(served):
    app, url = served
    with connect(url, "feed") as c:
        sub = c.subscribe("batch/x")
        c.publish("batch/x", b"first", flush=True)
        assert sub.get(timeout=10) is not None

        def frames_in_once(published):
            """The clients' UDP frames in, from a status that counted ``published`` of this
            client's messages (every frame that carried them is in the count)."""
            status = app.status()
            if next((x["published"] for x in status.get("clients", [])
                     if x["session"] == c.session), None) != published:
                return None
            return next(ch["frames_in"] for ch in status["channels"]
                        if ch["name"] == "clients-udp")
        before = wait_for(lambda: frames_in_once(1))
        for i in range(500):
            c.publish("batch/x", i.to_bytes(4, "big"))
        c.flush()
        assert len([m for m in (sub.get(timeout=5) for _ in range(500)) if m]) == 500
        after = wait_for(lambda: frames_in_once(501))
        assert after - before < 100  # 500 messages, a few frames (plus heartbeats)


def test_the_data_path_drops_messages_a_session_was_not_entitled_to_publish(served):
    app, url = served
    with connect(url, "feed") as feed, connect(url, "narrow") as narrow:
        sub = feed.subscribe("orders/#")
        feed.publish("orders/x", b"legit", flush=True)  # registered: the key is known
        assert sub.get(timeout=10).payload == b"legit"
        with pytest.raises(EntitlementError):
            narrow.publish("orders/x", b"refused")
        # bypass the API: a raw DATA frame with the key narrow was refused
        key = KeyRegistry().key_of("orders/x")
        narrow._send(encode_data_frame(
            [{"topic_key": key, "sequence": 1, "publish_ts_ns": time.time_ns(),
              "payload": b"sneaky"}], source_session=narrow.session, stream_id=narrow.session))
        # the data path took the frame (and denied it); a message published after that
        # comes next: the sneaky one went nowhere
        wait_for(lambda: app.status()["offload"]["publish_denied"] >= 1)
        feed.publish("orders/x", b"after", flush=True)
        assert sub.get(timeout=10).payload == b"after"
        assert app.status()["offload"]["publish_denied"] == 1
        denials = {(d["identity"], d["action"]) for d in app.status()["denials"]}
        assert ("narrow", "publish") in denials


def test_status_has_every_key_of_the_contract_and_is_json(served):
    import json

    app, url = served
    with connect(url, "feed") as c:
        c.subscribe("s/#")
        status = wait_for(lambda: (s := app.status())["clients"] and s["subscriptions"] and s)
    json.dumps(status)
    assert set(status) >= {"node", "neighbours", "subscriptions", "routes", "channels",
                           "offload", "denials", "auth"}
    assert set(status["node"]) >= {"name", "id", "role", "epoch", "uptime_s"}
    assert set(status["subscriptions"][0]) >= {"origin", "pattern", "namespace", "qos",
                                               "clients"}
    assert set(status["channels"][0]) >= {"name", "kind", "frames_in", "frames_out",
                                          "bytes_in", "bytes_out", "loss", "naks",
                                          "retransmissions", "p50_us", "p99_us", "jitter_us"}
    assert set(status["offload"]) >= {"verdicts", "malformed", "keys"}
    assert set(status["auth"]) >= {"rejected"}
    assert app.submit("disconnect_client", {"session": 12345})["ok"] is False
    assert app.submit("no_such_thing", {})["ok"] is False


def test_management_can_disconnect_a_client(served):
    app, url = served
    with connect(url, "feed") as c:
        sub = c.subscribe("d/#")
        assert app.submit("disconnect_client", {"session": c.session}) == {"ok": True}
        wait_for(lambda: c.logged_out_reason)
        wait_for(lambda: sub.closed)  # the subscription ended with the session: empty
        assert sub.get(timeout=0) is None
        wait_for(lambda: not app.status()["clients"])


def test_a_publish_after_the_session_ended_is_a_client_error_naming_why(served):
    """When a session ends under the client (the client thread closes the channel, as it does
    when an RDMA connection is lost), publishing says so as a ClientError, whichever way the
    message would have left (batched or at once)."""
    from appliance.client import ClientError

    _, url = served
    client = connect(url, "feed")
    try:
        client.publish("t/a", b"before", flush=True)
        with client._lock:  # as the client thread closes it
            client.logged_out_reason = "connection lost: the appliance went away"
            client.channel.close()
        for flush in (True, False):
            with pytest.raises(ClientError, match="connection is closed .connection lost"):
                client.publish("t/a", b"after", flush=flush)
                client.flush()
    finally:
        client.close()
