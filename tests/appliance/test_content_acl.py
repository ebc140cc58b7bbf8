"""Content ACL classes from P&M, end to end: a publisher whose identity has a class
publishes over UDP on 127.0.0.1; what its class rejects never reaches a subscriber (counted
per class), what it logs arrives and is logged and counted; another appliance whose P&M is
remote gets the class in P&M's document and enforces it the same way."""

import contextlib
import logging

import pytest

from appliance.client import connect
from appliance.config import parse_config
from appliance.node import Appliance
from nic_offload.schema import Schema
from tests.appliance.helpers import counter, free_port, until_marker, wait_for

QUOTE = {"id": 7, "fields": [["price", 0, "u32"], ["qty", 4, "u32"], ["symbol", 8, "ascii", 4]]}
SCHEMA = Schema.of("quote", 7, [("price", 0, "u32"), ("qty", 4, "u32"),
                                ("symbol", 8, "ascii", 4)])
CLASSES = {"capped": {"schema": "quote", "default": "ACCEPT", "rules": [
    "(price >= 5000, REJECT)",              # too expensive: dropped
    "(symbol == 'LOGX', LOG)",              # delivered, and logged
    "(FIELD(1) between 1 and 100, ACCEPT, REJECT)",  # a quantity of 1..100 only
]}}
IDENTITIES = {"feed": {"publish": ["#"], "subscribe": ["#"], "acl_class": "capped"},
              "free": {"publish": ["#"], "subscribe": ["#"]}}


def _quote(price: int, qty: int, symbol: str) -> bytes:
    return SCHEMA.encode({"price": price, "qty": qty, "symbol": symbol}) + bytes(4)


def _config(port: int, dataplane: str = "thread") -> dict:
    """An embedded-P&M appliance's config with the class and identities above, clients on
    UDP ``port``."""
    return {"appliance": {"name": f"acl{port}", "dataplane": dataplane},
            "clients": {"udp": f"127.0.0.1:{port}"},
            "pm": {"schemas": {"quote": QUOTE}, "require_passwords": False,
                   "acl_classes": CLASSES, "identities": IDENTITIES}}


@pytest.fixture
def served():
    """One appliance whose data path runs on a thread of the test's process (its audit
    lines reach ``caplog``)."""
    port = free_port()
    app = Appliance(parse_config(_config(port))).start()
    yield app, f"udp://127.0.0.1:{port}"
    app.stop()


SENT = [(100, 10, "IBM"), (5000, 10, "IBM"), (4999, 100, "SAP"), (10, 0, "IBM"),
        (10, 101, "IBM"), (20, 5, "LOGX"), (9000, 5, "LOGX"), (30, 1, "IBM")]
"""(price, qty, symbol): accepted, rejected (price), accepted, rejected (qty), rejected
(qty), logged, rejected (the price rule comes first), accepted."""
MARKER = (42, 42, "MARK")


def _publish_all(client, topic="quotes/nyse"):
    for price, qty, symbol in [*SENT, MARKER]:
        client.publish(topic, _quote(price, qty, symbol), schema_id=7)
    client.flush()


def _received(sub):
    got = until_marker(sub, lambda m: SCHEMA.decode(m.payload)["symbol"] == "MARK")
    return [(d["price"], d["qty"], d["symbol"]) for d in (SCHEMA.decode(m.payload)
                                                         for m in got)]


EXPECTED = [(100, 10, "IBM"), (4999, 100, "SAP"), (20, 5, "LOGX"), (30, 1, "IBM"), MARKER]


@contextlib.contextmanager
def _feed_and_subscriber(url: str):
    """(subscription of identity ``free`` to quotes/#, a client of identity ``feed``)."""
    with connect(url, "free") as sub_client, connect(url, "feed") as feed:
        yield sub_client.subscribe("quotes/#"), feed


def _round(sub, feed) -> None:
    """``feed`` publishes SENT and the marker: ``sub`` receives exactly EXPECTED."""
    _publish_all(feed)
    assert _received(sub) == EXPECTED


def test_a_publisher_class_rejects_at_ingress_and_logs(served, caplog):
    app, url = served
    caplog.set_level(logging.WARNING, logger="topicwire.appliance")
    with _feed_and_subscriber(url) as (sub, feed):
        _round(sub, feed)
        assert sub.get(timeout=0) is None
    wait_for(lambda: counter(app, "content_acl_rejected_class_capped") == 4, what="4 rejections")
    assert counter(app, "content_acl_rejected") == 4
    assert counter(app, "content_acl_logged_class_capped") == 1
    assert counter(app, "content_acl_accepted_class_capped") == 4  # 3 and the marker
    assert counter(app, "publish_denied") == 0
    lines = [r.getMessage() for r in caplog.records if "content ACL LOG" in r.getMessage()]
    assert len(lines) == 1
    assert "'feed'" in lines[0] and "'quotes/nyse'" in lines[0] and "'capped'" in lines[0]
    assert "(symbol == 'LOGX', LOG)" in lines[0]


def test_an_identity_without_a_class_publishes_everything(served):
    _, url = served
    with connect(url, "free") as sub_client, connect(url, "free") as pub:
        sub = sub_client.subscribe("quotes/#")
        _publish_all(pub)
        assert len(_received(sub)) == len(SENT) + 1


def test_a_short_payload_is_rejected(served):
    app, url = served
    with _feed_and_subscriber(url) as (sub, feed):
        feed.publish("quotes/nyse", b"\x00\x00\x00\x01", schema_id=7)  # 4 of 16 bytes
        _round(sub, feed)
    wait_for(lambda: counter(app, "content_acl_short_payload_class_capped") == 1)


def test_a_remote_pm_appliance_gets_the_class_and_enforces_it():
    """Both data paths in processes of their own (the default)."""
    pm_port, edge_port, pm_clients, edge_clients = (free_port() for _ in range(4))
    key = "ab" * 32
    pm_cfg = parse_config({
        "appliance": {"name": "pm", "heartbeat_interval_ms": 50, "lsa_refresh_ms": 500},
        "fabric": {"listen": f"127.0.0.1:{pm_port}", "key": key},
        "neighbours": [{"name": "edge", "address": f"127.0.0.1:{edge_port}"}],
        "clients": {"udp": f"127.0.0.1:{pm_clients}"},
        "pm": {"schemas": {"quote": QUOTE}, "require_passwords": False,
               "acl_classes": CLASSES, "identities": IDENTITIES}})
    edge_cfg = parse_config({
        "appliance": {"name": "edge", "heartbeat_interval_ms": 50, "lsa_refresh_ms": 500},
        "fabric": {"listen": f"127.0.0.1:{edge_port}", "key": key},
        "neighbours": [{"name": "pm", "address": f"127.0.0.1:{pm_port}"}],
        "clients": {"udp": f"127.0.0.1:{edge_clients}"}, "pm": {"mode": "remote"}})
    pm, edge = Appliance(pm_cfg).start(), Appliance(edge_cfg).start()
    try:
        wait_for(lambda: (edge.control.pm_doc or {}).get("acl_classes"), timeout_s=30,
                 what="P&M's document at the edge")
        assert edge.control.acl_ids == {"capped": 1}
        with _feed_and_subscriber(f"udp://127.0.0.1:{edge_clients}") as (sub, feed):
            _round(sub, feed)
        wait_for(lambda: counter(edge, "content_acl_rejected_class_capped") == 4)
    finally:
        edge.stop()
        pm.stop()


def test_the_p4_entries_of_the_appliance_snapshot_hold_the_class(served, tmp_path):
    """``topicwire p4 entries`` of the running appliance's snapshot: the class's ACL stage
    entries are there, as the software NIC's arrays were built from them."""
    import json

    from appliance.ops.cli import p4_cmd
    from nic_offload import model, runtime_json
    from nic_offload.acl import compile_class

    app, _ = served

    def with_the_class():  # the first snapshot may be built before P&M's classes are
        snapshot = app.control.compiler.snapshot
        acl = app.control.compiler.acl_classes.get(1)
        return snapshot is not None and acl is not None and tuple(
            snapshot.entries.acl_entries) == tuple(compile_class(acl, model.DEFAULT_SPEC)) \
            and snapshot

    snapshot = wait_for(with_the_class, what="a snapshot holding the class's entries")
    runtime_json.save(snapshot.entries, tmp_path / "snapshot.json")
    p4_cmd.write_entries(tmp_path / "snapshot.json", tmp_path / "p4")
    tables = json.loads((tmp_path / "p4" / "runtime.json").read_text())["table_entries"]
    acl = [e for e in tables if e["table"].startswith(model.ACL_TABLE_PREFIX)
           and e.get("match", {}).get(model.ACL_CLASS_FIELD) == 1]
    expected = compile_class(app.control.compiler.acl_classes[1], model.DEFAULT_SPEC)
    assert len(acl) == len(expected) > 0
    assert "TopicwireIngress.acl_0" in (tmp_path / "p4" / "commands.txt").read_text()


def _live_rules(app) -> list[str] | None:
    """The rules of class 1 when the snapshot the data path runs holds exactly its entries."""
    from nic_offload import model
    from nic_offload.acl import compile_class

    acl = app.control.compiler.acl_classes.get(1)
    live = app.dataplane.nic.switch.current.entries.acl_entries
    if acl is None or tuple(compile_class(acl, model.DEFAULT_SPEC)) != tuple(live):
        return None
    return [r.text for r in acl.rules]


def test_a_reload_changes_the_rules_for_the_sessions_already_logged_in():
    """A new class definition (P&M's config reloaded) applies to the publisher's session at
    once; an identity whose class is taken away publishes everything again."""
    port = free_port()
    doc = _config(port)
    app = Appliance(parse_config(doc)).start()
    try:
        url = f"udp://127.0.0.1:{port}"
        with _feed_and_subscriber(url) as (sub, feed):
            _round(sub, feed)
            stricter = {"capped": {**CLASSES["capped"],
                                   "rules": ["(price >= 50, REJECT)", *CLASSES["capped"]["rules"]]}}
            app.reload(parse_config({**doc, "pm": {**doc["pm"], "acl_classes": stricter}}))
            wait_for(lambda: _live_rules(app) == ["(price >= 50, REJECT)"]
                     + CLASSES["capped"]["rules"], what="the new rules in the data path")
            _publish_all(feed)
            assert _received(sub) == [(20, 5, "LOGX"), (30, 1, "IBM"), MARKER]
            unbound = {**IDENTITIES, "feed": {"publish": ["#"], "subscribe": ["#"]}}
            app.reload(parse_config({**doc, "pm": {**doc["pm"], "identities": unbound}}))
            wait_for(lambda: app.dataplane.sessions[feed.session].acl_class == 0)
            _publish_all(feed)
            assert len(_received(sub)) == len(SENT) + 1
    finally:
        app.stop()


def test_a_data_path_process_writes_the_audit_line_to_the_appliance_log(capfd):
    """The default data path runs in a process of its own, forked with the appliance's log
    handlers: its audit lines reach the appliance's standard error."""
    import sys

    handler = logging.StreamHandler(sys.stderr)
    logger = logging.getLogger("topicwire.appliance")
    logger.addHandler(handler)
    port = free_port()
    app = Appliance(parse_config(_config(port, "process"))).start()
    try:
        url = f"udp://127.0.0.1:{port}"
        with _feed_and_subscriber(url) as (sub, feed):
            _round(sub, feed)
        err = []
        wait_for(lambda: err.append(capfd.readouterr().err) or "content ACL LOG" in "".join(err),
                 what="the audit line")
        line = next(x for x in "".join(err).splitlines() if "content ACL LOG" in x)
        assert "'feed'" in line and "'quotes/nyse'" in line and "LOGX" in line
        wait_for(lambda: counter(app, "content_acl_logged_class_capped") == 1)
    finally:
        logger.removeHandler(handler)
        app.stop()


def test_guaranteed_messages_pass_the_same_class(served):
    app, url = served
    with connect(url, "free") as sub_client, connect(url, "feed") as feed:
        sub = sub_client.subscribe("quotes/#", qos="guaranteed")
        for price, qty, symbol in [*SENT, MARKER]:
            feed.publish("quotes/g", _quote(price, qty, symbol), schema_id=7, qos="guaranteed")
        feed.flush(timeout=10)
        assert _received(sub) == EXPECTED
    wait_for(lambda: counter(app, "content_acl_rejected_class_capped") == 4)
