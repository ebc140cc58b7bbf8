"""p4/topicwire: the P4 program, its hand-written P4Info and nic_offload.model agree on every
name, width, id and constant (golden comparisons; p4c is not needed)."""

import re

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from appliance.ops.cli import p4_cmd
from datapath.config import NATIVE_UDP_PORT
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from nic_offload import model
from nic_offload.model import DEFAULT_SPEC, MatchKind
from tests.p4.p4text import P4INFO, read_program

PROGRAM = read_program()
INFO = p4_cmd.P4Info.parse(P4INFO.read_text())
CONTROL = PROGRAM.control
KIND = {"exact": "EXACT", "range": "RANGE", "ternary": "TERNARY", "lpm": "LPM"}
PREFIX = {"table": 0x02, "action": 0x01, "direct_counter": 0x13, "digest": 0x17}


def jenkins_one_at_a_time(name: str) -> int:
    """p4c's name hash (control-plane/p4RuntimeSymbolTable.cpp)."""
    h = 0
    for byte in name.encode():
        h = (h + byte) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    h = (h + (h << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    return (h + (h << 15)) & 0xFFFFFFFF


def p4c_id(kind: str, name: str) -> int:
    return PREFIX[kind] << 24 | jenkins_one_at_a_time(name) & 0xFFFFFF


def test_the_control_is_named_as_the_model_says():
    assert CONTROL == model.CONTROL


def test_every_program_table_is_in_the_p4info_with_its_keys_actions_and_size():
    assert {f"{CONTROL}.{t}" for t in PROGRAM.tables} == set(INFO.tables)
    for name, table in PROGRAM.tables.items():
        info = INFO.tables[f"{CONTROL}.{name}"]
        assert [(f.name, f.bitwidth, f.match_type) for f in info.match_fields] == [
            (expr, PROGRAM.field_bits(expr), KIND[kind]) for expr, kind in table.keys]
        action_ids = {INFO.actions[f"{CONTROL}.{a}"].id for a in table.actions}
        assert info.action_ids == action_ids
        assert info.size == table.size


def test_every_program_action_is_in_the_p4info_with_its_parameters():
    assert {f"{CONTROL}.{a}" for a in PROGRAM.actions} == set(INFO.actions)
    for name, params in PROGRAM.actions.items():
        assert INFO.actions[f"{CONTROL}.{name}"].params == params


def test_the_p4info_has_the_model_tables_keys_actions_and_sizes():
    assert set(INFO.tables) == {t.name for t in DEFAULT_SPEC.tables} | {model.PORT_MAP_TABLE}
    for spec in DEFAULT_SPEC.tables:
        info = INFO.tables[spec.name]
        assert [(f.name, f.bitwidth, f.match_type) for f in info.match_fields] == [
            (k.field, k.bits, k.kind.name) for k in spec.keys]
        assert info.action_ids == {INFO.actions[a.name].id for a in spec.actions}
        for action in spec.actions:
            assert INFO.actions[action.name].params == tuple((p.name, p.bits)
                                                             for p in action.params)
        assert info.size == spec.size
        assert PROGRAM.tables[spec.name.split(".", 1)[1]].default_action == \
            spec.default_action.split(".", 1)[1]


def test_there_is_one_acl_stage_table_per_model_stage_applied_in_order():
    stages = [t for t in PROGRAM.tables if t.startswith("acl_")]
    assert stages == [model.acl_table(k).split(".", 1)[1] for k in range(model.ACL_STAGES)]
    applied = re.findall(r"\b(acl_\d+)\.apply\(\)", PROGRAM.apply_body)
    assert applied == stages
    for k, stage in enumerate(stages):
        keys = PROGRAM.tables[stage].keys
        assert keys[-1] == (model.acl_field(k), "range")
        assert DEFAULT_SPEC.table(model.acl_table(k)).keys[-1].kind is MatchKind.RANGE


def test_the_key_counter_and_the_digest_are_the_models():
    assert INFO.direct_counters == {model.KEY_COUNTER: INFO.tables[model.TOPIC_KEY_TABLE].id}
    assert PROGRAM.direct_counters == {model.KEY_COUNTER.split(".", 1)[1]: "packets_and_bytes"}
    assert PROGRAM.tables["topic_key"].counters == "topic_key_counter"
    assert set(PROGRAM.digests) == {model.DIGEST_STRUCT}
    expected = (("reason", model.DIGEST_REASON_BITS), ("topic_key", model.TOPIC_KEY_BITS),
                ("acl_class", model.ACL_CLASS_BITS))
    assert INFO.digests == {model.DIGEST_STRUCT: expected}
    assert PROGRAM.layouts[model.DIGEST_STRUCT] == expected


def test_p4info_ids_are_the_ones_p4c_assigns_from_the_names():
    ids = [(p4c_id("table", t.name), t.id) for t in INFO.tables.values()]
    ids += [(p4c_id("action", a.name), a.id) for a in INFO.actions.values()]
    ids += [(p4c_id("direct_counter", model.KEY_COUNTER), _id_of("direct_counters"))]
    ids += [(p4c_id("digest", model.DIGEST_STRUCT), _id_of("digests"))]
    assert all(expected == got for expected, got in ids), ids
    assert len({got for _, got in ids}) == len(ids)


def _id_of(section):
    doc = p4_cmd.parse_text_proto(P4INFO.read_text())
    (entry,) = doc[section]
    return entry["preamble"][0]["id"][0]


def test_the_topic_key_table_counts_into_its_direct_counter():
    doc = p4_cmd.parse_text_proto(P4INFO.read_text())
    table = next(t for t in doc["tables"]
                 if t["preamble"][0]["name"][0] == model.TOPIC_KEY_TABLE)
    assert table["direct_resource_ids"] == [_id_of("direct_counters")]
    assert doc["pkg_info"][0]["arch"] == ["v1model"]


def _layout_of(dtype):
    return [(name, dtype.fields[name][0].itemsize * 8) for name in dtype.names]


def test_frame_and_message_headers_have_the_native_protocol_layout():
    assert list(PROGRAM.layouts["frame_t"]) == _layout_of(fl.FRAME_HEADER_DTYPE)
    assert list(PROGRAM.layouts["msg_t"]) == _layout_of(ml.MESSAGE_HEADER_DTYPE)
    assert sum(b for _, b in PROGRAM.layouts["frame_t"]) == fl.FRAME_HEADER_BYTES * 8
    assert sum(b for _, b in PROGRAM.layouts["msg_t"]) == ml.MESSAGE_HEADER_BYTES * 8


def test_acl_fields_header_is_the_default_spec_layout_read_right_after_the_message_header():
    fields = PROGRAM.layouts["acl_fields_t"]
    offsets, offset = [], 0
    for _, bits in fields:
        offsets.append((offset, bits // 8))
        offset += bits // 8
    assert [name for name, _ in fields] == [f"field_{k}" for k in range(model.ACL_STAGES)]
    assert tuple(offsets) == tuple((f.offset, f.width) for f in DEFAULT_SPEC.acl_fields)
    assert tuple(offsets) == p4_cmd.PROGRAM_ACL_FIELDS
    for k, f in enumerate(DEFAULT_SPEC.acl_fields):
        assert PROGRAM.field_bits(model.acl_field(k)) == f.bits


def const(name):
    return PROGRAM.consts[name][1]


def test_program_constants_agree_with_the_protocol():
    assert const("NATIVE_UDP_PORT") == NATIVE_UDP_PORT
    assert const("NATIVE_MAGIC") == fl.FRAME_MAGIC
    assert const("NATIVE_VERSION") == fl.PROTOCOL_VERSION
    assert const("FRAME_DATA") == fl.FrameType.DATA
    assert const("FRAME_RETRANSMISSION") == fl.FrameType.RETRANSMISSION
    assert const("FRAME_HEADER_BYTES") == fl.FRAME_HEADER_BYTES
    assert const("MESSAGE_HEADER_BYTES") == ml.MESSAGE_HEADER_BYTES
    assert const("MAX_FRAME_BYTES") == fl.MAX_FRAME_BYTES
    assert const("MAX_PAYLOAD_BYTES") == ml.MAX_PAYLOAD_BYTES
    assert const("KNOWN_MESSAGE_FLAGS") == ml.KNOWN_MESSAGE_FLAGS
    assert const("MAX_QOS") == ml.MAX_QOS


def test_program_header_sizes_are_those_of_ethernet_ipv4_and_udp():
    assert const("ETHERNET_HEADER_BYTES") == len(Ether()) == 14
    assert const("IPV4_HEADER_BYTES") == len(IP()) == 20  # no options
    assert const("UDP_HEADER_BYTES") == len(UDP()) == 8
    for header, scapy_layer in (("ethernet_t", Ether()), ("ipv4_t", IP()), ("udp_t", UDP())):
        assert sum(bits for _, bits in PROGRAM.layouts[header]) == len(scapy_layer) * 8


def test_program_constants_agree_with_the_model():
    assert const("CPU_PORT") == model.CPU_PORT
    assert const("NO_ACL_CLASS") == model.NO_ACL_CLASS
    for action in model.KeyAction:
        assert const(f"KEY_{action.name}") == action
    for action in (model.AclAction.ACCEPT, model.AclAction.REJECT, model.AclAction.LOG):
        assert const(f"ACL_{action.name}") == action
    for reason in model.DigestReason:
        assert const(f"DIGEST_{reason.name}") == reason
    end = DEFAULT_SPEC.acl_fields_end
    assert const("ACL_FIELDS_END") == end
    assert end & (end - 1) == 0, "the parser's short-payload mask needs a power of two"
    assert const("ACL_FIELDS_SHORT_MASK") == ~(end - 1) & 0xFFFFFFFF
    assert PROGRAM.tables["topic_key"].size == model.KEY_TABLE_ENTRIES
    assert all(PROGRAM.tables[f"acl_{k}"].size == model.ACL_TABLE_ENTRIES
               for k in range(model.ACL_STAGES))


def test_the_port_map_takes_a_logical_port_to_a_physical_one_or_the_cpu():
    """The forward's logical port (16 bits) is what port_map matches; its action sets
    v1model's 9-bit egress_spec; a miss goes to the CPU port."""
    table = INFO.tables[model.PORT_MAP_TABLE]
    assert [(f.name, f.bitwidth, f.match_type) for f in table.match_fields] == [
        (model.PORT_MAP_FIELD, model.EGRESS_PORT_BITS, "EXACT")]
    assert table.size == model.MAX_EGRESS_PORT + 1
    assert INFO.actions[model.ACTION_TO_PORT].params == (
        (model.PARAM_PORT, model.PHYSICAL_PORT_BITS),)
    assert INFO.actions[model.ACTION_TO_CPU].params == ()
    assert INFO.actions[model.ACTION_FORWARD].params[0] == (model.PARAM_EGRESS_PORT, 16)
    assert PROGRAM.tables["port_map"].default_action == "to_cpu"
    assert "port_map.apply();" in PROGRAM.apply_body
    assert "standard_metadata.egress_spec = meta.egress_port" not in PROGRAM.apply_body
    assert PROGRAM.consts["CPU_PORT"] == (model.PHYSICAL_PORT_BITS, model.CPU_PORT)


@pytest.mark.parametrize("width_name, bits", [
    ("egress_port", model.EGRESS_PORT_BITS), ("group", model.GROUP_BITS),
    ("acl_class", model.ACL_CLASS_BITS), ("acl_state", model.ACL_STATE_BITS)])
def test_metadata_widths_are_the_models(width_name, bits):
    assert dict(PROGRAM.layouts["metadata"])[width_name] == bits
