"""The table model: the names p4/ is written against, entry validation, key rows."""

from __future__ import annotations

import numpy as np
import pytest

from datapath.protocol import frame_layout, message_layout
from nic_offload import model
from nic_offload.errors import ModelError
from nic_offload.model import (
    AclField,
    EntrySet,
    Exact,
    KeyAction,
    KeyRows,
    MatchKind,
    MulticastGroup,
    PipelineSpec,
    Range,
    TableEntry,
    Ternary,
)


def test_names_are_the_ones_the_p4_program_is_written_against():
    names = [t.name for t in model.DEFAULT_SPEC.tables]
    assert names == ["TopicwireIngress.topic_key", "TopicwireIngress.acl_0",
                     "TopicwireIngress.acl_1", "TopicwireIngress.acl_2", "TopicwireIngress.acl_3"]
    key_table = model.DEFAULT_SPEC.table(model.TOPIC_KEY_TABLE)
    assert [(k.field, k.kind, k.bits) for k in key_table.keys] == [
        ("hdr.msg.topic_key", MatchKind.EXACT, 64)]
    assert {a.name: [(p.name, p.bits) for p in a.params] for a in key_table.actions} == {
        "TopicwireIngress.drop": [], "TopicwireIngress.punt": [],
        "TopicwireIngress.forward": [("egress_port", 16), ("acl_class", 16)],
        "TopicwireIngress.forward_group": [("group", 16), ("acl_class", 16)]}
    acl_2 = model.DEFAULT_SPEC.table("TopicwireIngress.acl_2")
    assert [(k.field, k.kind, k.bits) for k in acl_2.keys] == [
        ("meta.acl_class", MatchKind.EXACT, 16), ("meta.acl_state", MatchKind.EXACT, 16),
        ("meta.field_2", MatchKind.RANGE, 32)]
    assert {a.name: [(p.name, p.bits) for p in a.params] for a in acl_2.actions} == {
        "TopicwireIngress.acl_next": [("state", 16)], "TopicwireIngress.acl_accept": [],
        "TopicwireIngress.acl_reject": [], "TopicwireIngress.acl_log": []}
    assert (key_table.default_action, acl_2.default_action) == (
        "TopicwireIngress.punt", "TopicwireIngress.acl_reject")


def test_header_offsets_agree_with_the_protocol_layouts():
    assert model.FRAME_HEADER_BYTES == frame_layout.FRAME_HEADER_BYTES
    assert model.MESSAGE_HEADER_BYTES == message_layout.MESSAGE_HEADER_BYTES
    fields = {f.name: f.frame_offset for f in model.DEFAULT_SPEC.header_fields()}
    assert fields["hdr.msg.topic_key"] == 32 + message_layout.TOPIC_KEY_OFFSET
    assert fields["meta.field_1"] == 32 + message_layout.PAYLOAD_OFFSET + 4


def _acl(**overrides) -> TableEntry:
    entry = dict(match={"meta.acl_class": Exact(1), "meta.acl_state": Exact(0),
                        "meta.field_0": Range(0, 9)},
                 action=model.ACTION_ACL_ACCEPT, params={}, priority=1)
    entry.update(overrides)
    return TableEntry.make("TopicwireIngress.acl_0", entry["match"], entry["action"],
                           entry["params"], entry["priority"])


@pytest.mark.parametrize(("entry", "message"), [
    (_acl(priority=None), "needs a priority"),
    (_acl(match={"meta.acl_class": Exact(1), "meta.acl_state": Exact(0),
                 "meta.field_0": Ternary(1, 1)}), "is a range key"),
    (_acl(match={"meta.acl_class": Exact(1), "meta.field_0": Range(0, 1)}), "keys are"),
    (_acl(match={"meta.acl_class": Exact(1 << 16), "meta.acl_state": Exact(0),
                 "meta.field_0": Range(0, 1)}), "does not fit 16 bits"),
    (_acl(match={"meta.acl_class": Exact(1), "meta.acl_state": Exact(0),
                 "meta.field_0": Range(5, 1)}), "low 5 > high 1"),
    (_acl(action=model.ACTION_ACL_NEXT), r"takes \['state'\]"),
    (_acl(action="TopicwireIngress.forward"), "has no action"),
])
def test_entries_that_do_not_fit_their_table_are_refused(entry, message):
    with pytest.raises(ModelError, match=message):
        model.validate_entry(model.DEFAULT_SPEC, entry)


def test_a_valid_entry_passes():
    model.validate_entry(model.DEFAULT_SPEC, _acl())
    model.validate_entry(model.DEFAULT_SPEC, _acl(action=model.ACTION_ACL_NEXT,
                                                  params={"state": 3}))


def _rows(keys, actions=None, targets=None) -> KeyRows:
    n = len(keys)
    return KeyRows(np.array(keys, np.uint64),
                   np.array(actions or [KeyAction.DROP] * n, np.uint8),
                   np.array(targets or [0] * n, np.uint32), np.zeros(n, np.uint16))


@pytest.mark.parametrize(("rows", "message"), [
    (_rows([0, 5]), "key 0 is reserved"),
    (_rows([5, 5]), "a key twice"),
    (_rows([5], [9]), "unknown key action"),
    (_rows([5], [KeyAction.FORWARD], [65_536]), r"16 bits \(0\.\.65535\)"),
    (_rows([5], [KeyAction.FORWARD_GROUP], [0]), "1..65535"),
])
def test_key_rows_refuse_what_no_executor_could_run(rows, message):
    with pytest.raises(ModelError, match=message):
        rows.validate(model.DEFAULT_SPEC)


def test_key_rows_expand_to_p4runtime_entries():
    rows = _rows([7, 8], [KeyAction.FORWARD, KeyAction.FORWARD_GROUP], [3, 2])
    assert [(e.match, e.action, e.params) for e in rows.entries()] == [
        ((("hdr.msg.topic_key", Exact(7)),), "TopicwireIngress.forward",
         (("egress_port", 3), ("acl_class", 0))),
        ((("hdr.msg.topic_key", Exact(8)),), "TopicwireIngress.forward_group",
         (("group", 2), ("acl_class", 0)))]


def test_an_entry_set_refuses_groups_it_does_not_define():
    rows = _rows([7], [KeyAction.FORWARD_GROUP], [4])
    with pytest.raises(ModelError, match=r"undefined multicast groups \[4\]"):
        EntrySet(model.DEFAULT_SPEC, rows).validate()
    EntrySet(model.DEFAULT_SPEC, rows, groups=(MulticastGroup(4, (1, 2)),)).validate()


def test_a_pipeline_spec_round_trips_through_a_dict_and_checks_its_fields():
    spec = PipelineSpec((AclField("price", 8, 8), AclField("qty", 0, 2)), key_table_entries=99)
    assert PipelineSpec.from_dict(spec.to_dict()) == spec
    assert spec.acl_fields_end == 16
    assert [t.name for t in spec.tables][1:] == ["TopicwireIngress.acl_0",
                                                 "TopicwireIngress.acl_1"]
    with pytest.raises(ModelError, match="width must be one of"):
        PipelineSpec((AclField("x", 0, 3),))
    with pytest.raises(ModelError, match="1..4 ACL fields"):
        PipelineSpec(tuple(AclField(f"f{i}", 4 * i) for i in range(5)))
