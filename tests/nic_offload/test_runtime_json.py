"""Entry sets in p4lang's runtime-JSON layout: the layout, the round trip, refusals."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from datapath.topics.registry import KeyRegistry
from nic_offload import model, runtime_json
from nic_offload.compiler import OffloadCompiler
from nic_offload.errors import ModelError
from nic_offload.snapshot import Snapshot
from nic_offload.softnic import SoftNic
from tests.nic_offload.helpers import QUOTE, random_burst


def _compiled() -> model.EntrySet:
    registry = KeyRegistry()
    for topic in ("us/ibm", "us/aapl", "eu/sap", "eu/asml", "jp/sony"):
        registry.key_for(topic)
    compiler = OffloadCompiler(registry)
    compiler.define_acl_class(1, QUOTE, ["(symbol == 'IBM' and price < 50, LOG)",
                                         "(price between 10 and 20, ACCEPT, REJECT)"])
    compiler.add_egress("a", 1)
    compiler.add_egress("b", 2)
    compiler.add_egress("c", 3, acl_class=1)
    compiler.subscribe("a", "us/#")
    compiler.subscribe("b", "#")
    compiler.unsubscribe("b", "jp/#")
    compiler.subscribe("c", "jp/#")
    return compiler.build().entries


def test_the_file_has_the_p4lang_tutorials_layout(tmp_path):
    entries = _compiled()
    path = tmp_path / "runtime.json"
    runtime_json.save(entries, path)
    doc = json.loads(path.read_text())
    assert {"target", "p4info", "bmv2_json", "table_entries",
            "multicast_group_entries"} <= set(doc)
    defaults = [e for e in doc["table_entries"] if e.get("default_action")]
    assert {(e["table"], e["action_name"]) for e in defaults} == {
        ("TopicwireIngress.topic_key", "TopicwireIngress.punt")} | {
        (f"TopicwireIngress.acl_{k}", "TopicwireIngress.acl_reject") for k in range(4)}
    keyed = [e for e in doc["table_entries"] if e["table"] == "TopicwireIngress.topic_key"
             and not e.get("default_action")]
    assert len(keyed) == 5 and all(isinstance(e["match"]["hdr.msg.topic_key"], int)
                                   for e in keyed)
    group = next(e for e in keyed if e["action_name"] == "TopicwireIngress.forward_group")
    assert set(group["action_params"]) == {"group", "acl_class"}
    acl = [e for e in doc["table_entries"] if e["table"].startswith("TopicwireIngress.acl_")
           and not e.get("default_action")]
    assert acl and all(e["priority"] == 1 and len(e["match"]["meta.field_" + e["table"][-1]])
                       == 2 for e in acl)
    assert doc["multicast_group_entries"] == [
        {"multicast_group_id": 1, "replicas": [{"egress_port": 1, "instance": 1},
                                               {"egress_port": 2, "instance": 1}]}]


def test_an_entry_set_round_trips_through_the_file(tmp_path):
    entries = _compiled()
    path = tmp_path / "runtime.json"
    runtime_json.save(entries, path)
    loaded = runtime_json.load(path)
    assert list(loaded.table_entries()) == list(entries.table_entries())
    assert loaded.groups == entries.groups and loaded.version == entries.version
    assert loaded.spec == entries.spec


def test_a_loaded_file_drives_the_software_nic_to_the_same_decisions(tmp_path):
    entries = _compiled()
    path = tmp_path / "runtime.json"
    runtime_json.save(entries, path)
    original = SoftNic(Snapshot.build(entries))
    loaded = SoftNic(Snapshot.build(runtime_json.load(path)))
    burst = random_burst(random.Random(4), entries.key_rows.keys.tolist(), 30, malformed=0)
    a, b = original.process(*burst), loaded.process(*burst)
    assert a.descriptors == b.descriptors and a.descriptors > 0
    assert np.array_equal(original.verdicts[:a.messages], loaded.verdicts[:b.messages])
    assert np.array_equal(original.descriptors[:a.descriptors], loaded.descriptors[:b.descriptors])


def test_a_file_of_another_kind_is_refused_with_advice(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"target": "bmv2", "table_entries": []}))
    with pytest.raises(ModelError, match="runtime_json.save"):
        runtime_json.load(path)


def test_a_changed_default_action_is_refused():
    doc = runtime_json.to_runtime_json(_compiled())
    for entry in doc["table_entries"]:
        if entry.get("default_action") and entry["table"] == model.TOPIC_KEY_TABLE:
            entry["action_name"] = model.ACTION_DROP
    with pytest.raises(ModelError, match="must default to TopicwireIngress.punt"):
        runtime_json.from_runtime_json(doc)


def test_a_mistyped_match_is_refused_naming_the_entry():
    doc = runtime_json.to_runtime_json(_compiled())
    acl = next(e for e in doc["table_entries"] if e["table"] == "TopicwireIngress.acl_0"
               and not e.get("default_action"))
    acl["match"]["meta.field_0"] = 7
    with pytest.raises(ModelError, match=r"table_entries\[\d+\]: meta.field_0: expected \[a, b\]"):
        runtime_json.from_runtime_json(doc)
