"""Entry sets in p4lang's runtime-JSON layout: the layout, the round trip, refusals."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from datapath.topics.registry import KeyRegistry
from nic_offload import model, runtime_json
from nic_offload.compiler import OffloadCompiler
from nic_offload.errors import ModelError
from nic_offload.snapshot import Snapshot
from nic_offload.softnic import SoftNic
from nic_offload.softnic.layout import DescriptorKind
from nic_offload.softnic.layout import MessageVerdict as V
from tests.nic_offload.helpers import QUOTE, random_burst, random_entry_set


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


# --- one file, every executor --------------------------------------------------------------
GOLDEN_RUNTIME = Path(__file__).resolve().parents[1] / "p4" / "golden" / "runtime.json"
DIGEST_OF = {V.UNKNOWN_KEY: model.DigestReason.UNKNOWN_KEY, V.PUNTED: model.DigestReason.PUNT,
             V.LOGGED: model.DigestReason.ACL_LOG}


def _reference(doc: dict, key: int, payload: bytes) -> tuple[int, tuple[int, ...]]:
    """What a P4Runtime target programmed from ``doc`` does with one message, read straight
    off the JSON (p4lang's layout, nothing of nic_offload): (verdict, egress ports)."""
    entries = doc["table_entries"]
    keyed = {e["match"][model.TOPIC_KEY_FIELD]: e for e in entries
             if e["table"] == model.TOPIC_KEY_TABLE and not e.get("default_action")}
    hit = keyed.get(key)
    if hit is None:
        return V.UNKNOWN_KEY, ()
    action, params = hit["action_name"], hit["action_params"]
    if action == model.ACTION_DROP:
        return V.DROPPED, ()
    if action == model.ACTION_PUNT:
        return V.PUNTED, ()
    if action == model.ACTION_FORWARD:
        ports = (params["egress_port"],)
    else:
        # logical ports, as the software NIC decides them (the P4 export's replicas are
        # the switch ports its port_map gives them: tests/p4/test_entries.py)
        groups = doc["topicwire"].get("logical_groups", doc["multicast_group_entries"])
        (group,) = [g for g in groups if g["multicast_group_id"] == params["group"]]
        ports = tuple(sorted(r["egress_port"] for r in group["replicas"]))
    acl_class = params["acl_class"]
    if acl_class == 0:
        return V.FORWARDED, ports
    fields = doc["topicwire"]["pipeline"]["acl_fields"]
    if len(payload) < max(f["offset"] + f["width"] for f in fields):
        return V.ACL_SHORT_PAYLOAD, ()
    state = 0
    for stage, f in enumerate(fields):
        value = int.from_bytes(payload[f["offset"]:f["offset"] + f["width"]], "big")
        field = model.acl_field(stage)
        hits = [e for e in entries if e["table"] == model.acl_table(stage)
                and not e.get("default_action")
                and e["match"][model.ACL_CLASS_FIELD] == acl_class
                and e["match"][model.ACL_STATE_FIELD] == state
                and e["match"][field][0] <= value <= e["match"][field][1]]
        if not hits:
            return V.ACL_REJECTED, ()  # the table's default action
        best = max(hits, key=lambda e: e["priority"])
        if best["action_name"] == model.ACTION_ACL_NEXT:
            state = best["action_params"]["state"]
            continue
        return {model.ACTION_ACL_ACCEPT: (V.FORWARDED, ports),
                model.ACTION_ACL_LOG: (V.LOGGED, ports),
                model.ACTION_ACL_REJECT: (V.ACL_REJECTED, ())}[best["action_name"]]
    return V.ACL_REJECTED, ()  # acl_next after the last stage


def _check_nic_against_reference(doc: dict, burst: tuple[np.ndarray, np.ndarray, np.ndarray]
                                 ) -> set[int]:
    """Load ``doc`` into a software NIC, run ``burst``, and hold every message's verdict and
    ports, the digest queue and the per-key packet counters to the reference; return the
    verdicts seen."""
    nic = SoftNic(Snapshot.build(runtime_json.from_runtime_json(doc)))
    buf = burst[0]
    result = nic.process(*burst)
    snap = nic.snapshot
    ports = {int(d["index"]): (int(d["target"]),) if d["kind"] == DescriptorKind.PORT
             else snap.group_ports(int(d["target"])) for d in nic.descriptors[:result.descriptors]}
    got = [(int(v), ports.get(i, ())) for i, v in enumerate(nic.verdicts[:result.messages])]
    keys = [int(r["topic_key"]) for r in nic.batch[:result.messages]]
    payloads = [bytes(buf[r["payload_offset"]:r["payload_offset"] + r["payload_len"]])
                for r in nic.batch[:result.messages]]
    want = [_reference(doc, key, payload) for key, payload in zip(keys, payloads)]
    assert got == want
    digests = [(int(d["index"]), int(d["reason"])) for d in nic.drain_digests()]
    assert digests == [(i, DIGEST_OF[v]) for i, (v, _) in enumerate(want) if v in DIGEST_OF]
    hits = Counter(k for k, (v, _) in zip(keys, want) if v != V.UNKNOWN_KEY)
    counted = nic.key_counters()
    assert {int(k): int(p) for k, p in zip(counted.keys, counted.packets) if p} == hits
    return {v for v, _ in got}


def test_the_file_the_p4_program_is_loaded_with_drives_the_software_nic_the_same_way():
    doc = json.loads(GOLDEN_RUNTIME.read_text())
    keys = [e["match"][model.TOPIC_KEY_FIELD] for e in doc["table_entries"]
            if e["table"] == model.TOPIC_KEY_TABLE and not e.get("default_action")]
    burst = random_burst(random.Random(11), keys, 200, malformed=0, admin=0)
    assert _check_nic_against_reference(doc, burst) == {
        V.FORWARDED, V.LOGGED, V.DROPPED, V.PUNTED, V.UNKNOWN_KEY, V.ACL_REJECTED,
        V.ACL_SHORT_PAYLOAD}


@pytest.mark.parametrize("seed", range(4))
def test_random_entry_files_drive_the_software_nic_as_their_entries_say(seed):
    rng = random.Random(seed)
    entries, _ = random_entry_set(rng, 40)
    doc = json.loads(json.dumps(runtime_json.to_runtime_json(entries)))
    burst = random_burst(rng, entries.key_rows.keys.tolist(), 120, malformed=0, admin=0)
    assert len(_check_nic_against_reference(doc, burst)) >= 5
