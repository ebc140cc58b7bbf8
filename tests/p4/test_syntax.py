"""p4/topicwire/topicwire.p4 parses and type-checks (tests/p4/p4check.py, for machines
without p4c), and the check finds the mistakes p4c would refuse when they are put in."""

import re

import pytest

from tests.p4.p4check import check
from tests.p4.p4text import PROGRAM

TEXT = PROGRAM.read_text()


def test_the_program_has_no_syntax_or_type_problem():
    assert check(TEXT) == []


def mutated(old: str, new: str) -> str:
    assert TEXT.count(old) == 1, f"{old!r} must occur once in the program"
    return TEXT.replace(old, new)


@pytest.mark.parametrize("old, new, problem", [
    ("    bit<16> etherType;\n", "    bit<16> etherType\n", r"syntax error"),
    ("meta.key_action = KEY_DROP;", "meta.key_action = KEY_DROP", r"syntax error"),
    ("&& hdr.frame.frame_len <= MAX_FRAME_BYTES",
     "&& hdr.frame.frame_len <= hdr.udp.length",
     r"'<=' mixes bit<32> and bit<16> \(cast one\)"),
    ("&& hdr.frame.msg_count == 1", "&& hdr.frame.msg_count == hdr.frame.frame_len",
     r"'==' compares bit<16> with bit<32>"),
    ("standard_metadata.egress_spec = port;",
     "standard_metadata.egress_spec = meta.egress_port;",
     r"assignment: bit<16> where bit<9> is needed"),
    ("meta.egress_port = egress_port;", "meta.egress_port = meta.acl_verdict;",
     r"assignment: bit<8> where bit<16> is needed"),
    ("if (meta.acl_class != NO_ACL_CLASS) {", "if (meta.acl_class) {",
     r"an if condition must be bool"),
    ("{meta.digest_reason, hdr.msg.topic_key,", "{hdr.msg.topic_key, meta.digest_reason,",
     r"digest data: bit<64> where bit<8> is needed"),
    ("hdr.ipv4.flags[0:0] == 0", "hdr.ipv4.flags[3:0] == 0", r"slice \[3:0\] out of bit<3>"),
    ("hdr.msg.topic_key: exact;", "hdr.msg.topic: exact;", r"header msg_t has no field topic"),
    ("            forward_group;\n            punt;",
     "            forward_group;\n            punt_all;",
     r"table topic_key lists unknown action punt_all"),
    ("default_action = punt();", "default_action = forward();",
     r"forward takes 2 arguments, got 0"),
    ("ETHERTYPE_IPV4: parse_ipv4;", "ETHERTYPE_IPV4: parse_ip;",
     r"select case goes to unknown state parse_ip"),
    ("(5, IP_PROTO_UDP, 0): parse_udp;", "(5, IP_PROTO_UDP): parse_udp;",
     r"select on 3 values, case gives 2"),
    ("const bit<8>  MAX_QOS = 2;", "const bit<8>  MAX_QOS = 300;",
     r"constant MAX_QOS = 300 does not fit bit<8>"),
    ("error.NoError", "error.NoErr", r"no error.NoErr in core.p4"),
    ("counters = topic_key_counter;", "counters = topic_key_counters;",
     r"counters = topic_key_counters: not a direct_counter"),
    ("V1Switch(TopicwireParser(), TopicwireVerifyChecksum(), TopicwireIngress(),",
     "V1Switch(TopicwireParser(), TopicwireIngress(), TopicwireVerifyChecksum(),",
     r"TopicwireIngress takes 3 parameters, V1Switch's verify block takes 2"),
    ("packet.emit(hdr.msg);", "packet.emit(meta);", r"emit takes one header"),
    ("mark_to_drop(standard_metadata);\n            } else {",
     "mark_to_drop(meta);\n            } else {", r"mark_to_drop takes standard_metadata"),
    ("hdr.ipv4.hdrChecksum, HashAlgorithm.csum16", "hdr.ipv4.totalLen, HashAlgorithm.crc33",
     r"HashAlgorithm has no member crc33"),
    ("standard_metadata.mcast_grp = meta.group;", "standard_metadata.mcast = meta.group;",
     r"struct standard_metadata_t has no field mcast"),
    ("    bit<8>  acl_verdict;\n", "    bit<8>  acl_verdict;\n    bit<8>  acl_verdict;\n",
     r"field acl_verdict declared twice"),
])
def test_a_mistake_put_into_the_program_is_found(old, new, problem):
    problems = check(mutated(old, new))
    assert any(re.search(problem, p) for p in problems), problems


def test_problems_carry_the_line_they_are_on():
    text = mutated("standard_metadata.egress_spec = port;",
                   "standard_metadata.egress_spec = meta.egress_port;")
    line = text[:text.index("standard_metadata.egress_spec = meta.egress_port;")].count(
        "\n") + 1
    (problem,) = check(text)
    assert problem.startswith(f"line {line}: ")
