"""``topicwire p4 entries``: golden runtime.json and commands for a small snapshot, and
refusals of entries the P4 program cannot take."""

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from appliance.ops.cli import p4_cmd
from datapath.errors import UserError
from nic_offload import runtime_json
from nic_offload.model import AclField, EntrySet, KeyRows, MulticastGroup, PipelineSpec
from tests.p4.p4text import P4INFO
from tests.p4.snapshot import entry_set

GOLDEN = Path(__file__).parent / "golden"
SNAPSHOT = GOLDEN / "snapshot.json"


def cli(argv):
    parser = argparse.ArgumentParser(prog="topicwire")
    p4_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_the_stored_snapshot_is_the_documented_one():
    stored = runtime_json.load(SNAPSHOT)
    expected = entry_set()
    assert list(stored.table_entries()) == list(expected.table_entries())
    assert stored.groups == expected.groups and stored.version == expected.version


def test_entries_for_the_small_snapshot_equal_the_golden_files(tmp_path, capsys):
    assert cli(["p4", "entries", "--snapshot", str(SNAPSHOT), "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "runtime.json").read_text()) == json.loads(
        (GOLDEN / "runtime.json").read_text())
    assert (tmp_path / "commands.txt").read_text() == (GOLDEN / "commands.txt").read_text()
    assert (tmp_path / "topicwire.p4info.txt").read_bytes() == P4INFO.read_bytes()
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'runtime.json'}" in out


def test_runtime_json_uses_the_p4lang_tutorials_layout(tmp_path):
    p4_cmd.write_entries(SNAPSHOT, tmp_path)
    doc = json.loads((tmp_path / "runtime.json").read_text())
    assert (doc["target"], doc["p4info"], doc["bmv2_json"]) == (
        "bmv2", "topicwire.p4info.txt", "topicwire.json")
    forward = next(e for e in doc["table_entries"]
                   if e.get("match") == {"hdr.msg.topic_key": 0x1005})
    assert forward["action_name"] == "TopicwireIngress.forward"
    assert forward["action_params"] == {"egress_port": 4, "acl_class": 1}
    ranges = [e for e in doc["table_entries"] if e["table"] == "TopicwireIngress.acl_1"
              and not e.get("default_action")]
    assert all(e["priority"] == 1 and len(e["match"]["meta.field_1"]) == 2 for e in ranges)
    # no port map given: every logical port goes to the CPU port (the host delivers it)
    assert doc["multicast_group_entries"][0] == {
        "multicast_group_id": 1, "replicas": [{"egress_port": 255, "instance": 1}]}
    assert doc["topicwire"]["logical_groups"][0] == {
        "multicast_group_id": 1,
        "replicas": [{"egress_port": 2, "instance": 1}, {"egress_port": 3, "instance": 1}]}
    assert [e for e in doc["table_entries"] if e["table"] == "TopicwireIngress.port_map"] == [
        {"table": "TopicwireIngress.port_map", "default_action": True,
         "action_name": "TopicwireIngress.to_cpu", "action_params": {}}]


def _wide_snapshot(tmp_path):
    """The small snapshot with key 0x1001 forwarding to logical port 40,000 and group 1
    replicating to 2 and 40,001 (ports past the 9 bits of a switch port)."""
    entries = entry_set()
    rows = entries.key_rows
    targets = rows.targets.copy()
    targets[list(rows.keys).index(0x1001)] = 40_000
    wide = EntrySet(entries.spec, KeyRows(rows.keys, rows.actions, targets, rows.acl_classes),
                    entries.acl_entries,
                    (MulticastGroup(1, (2, 40_001)), *entries.groups[1:]), entries.version)
    wide.validate()
    runtime_json.save(wide, tmp_path / "wide.json")
    return wide, tmp_path / "wide.json"


def test_logical_ports_are_16_bits_and_the_port_map_takes_them_to_switch_ports(tmp_path):
    wide, path = _wide_snapshot(tmp_path)
    assert cli(["p4", "entries", "--snapshot", str(path), "--out", str(tmp_path / "o"),
                "--port", "40000=7", "--port", "2=2"]) == 0
    doc = json.loads((tmp_path / "o" / "runtime.json").read_text())
    forward = next(e for e in doc["table_entries"]
                   if e.get("match") == {"hdr.msg.topic_key": 0x1001})
    assert forward["action_params"] == {"egress_port": 40_000, "acl_class": 0}
    port_map = [e for e in doc["table_entries"] if e["table"] == "TopicwireIngress.port_map"]
    assert port_map[1:] == [
        {"table": "TopicwireIngress.port_map", "match": {"meta.egress_port": p},
         "action_name": "TopicwireIngress.to_port", "action_params": {"port": q}}
        for p, q in ((2, 2), (40_000, 7))]
    groups = {g["multicast_group_id"]: [r["egress_port"] for r in g["replicas"]]
              for g in doc["multicast_group_entries"]}
    assert groups == {1: [2, 255], 2: [255]}  # 40,001 has no entry: the CPU port
    commands = (tmp_path / "o" / "commands.txt").read_text().splitlines()
    assert "table_add TopicwireIngress.port_map TopicwireIngress.to_port 40000 => 7" in commands
    assert "mc_node_create 1 2 255" in commands
    loaded = runtime_json.load(tmp_path / "o" / "runtime.json")  # the software NIC's view
    assert loaded.groups == wide.groups
    assert list(loaded.table_entries()) == list(wide.table_entries())


@pytest.mark.parametrize("port, message", [
    ("65536=1", "logical port 65536: 0..65535"), ("255=1", "not the CPU port 255"),
    ("40000=512", "physical port 512: 0..511"), ("x", "give LOGICAL=PHYSICAL")])
def test_a_port_map_entry_outside_its_widths_is_refused(tmp_path, capsys, port, message):
    with pytest.raises(SystemExit):
        cli(["p4", "entries", "--snapshot", str(SNAPSHOT), "--out", str(tmp_path / "o"),
             "--port", port])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_p4info_with_9_bit_egress_ports_refuses_a_wide_logical_port(tmp_path):
    _, path = _wide_snapshot(tmp_path)
    p4info = _edited_p4info(tmp_path, 'name: "egress_port"\n    bitwidth: 16',
                            'name: "egress_port"\n    bitwidth: 9')
    with pytest.raises(p4_cmd.P4Error, match="egress_port\\) = 40000 does not fit the "
                                             "program's 9 bits"):
        p4_cmd.write_entries(path, tmp_path / "out", p4info=p4info)


def test_a_compiled_program_is_copied_next_to_the_entries(tmp_path):
    program = tmp_path / "built.json"
    program.write_text('{"program": "topicwire"}')
    written = p4_cmd.write_entries(SNAPSHOT, tmp_path / "out", bmv2_json=program)
    assert (tmp_path / "out" / "topicwire.json").read_text() == program.read_text()
    assert tmp_path / "out" / "topicwire.json" in written
    with pytest.raises(p4_cmd.P4Error, match="no compiled program at"):
        p4_cmd.write_entries(SNAPSHOT, tmp_path / "out2", bmv2_json=tmp_path / "missing.json")


def _edited_p4info(tmp_path, old, new, count=1):
    text = P4INFO.read_text()
    assert old in text
    path = tmp_path / "edited.p4info.txt"
    path.write_text(text.replace(old, new, count))
    return path


@pytest.mark.parametrize("old, new, message", [
    ('name: "TopicwireIngress.acl_3"', 'name: "TopicwireIngress.acl_9"',
     "entry 4 (TopicwireIngress.acl_3): the P4 program has no table 'TopicwireIngress.acl_3'"),
    ('name: "hdr.msg.topic_key"\n    bitwidth: 64', 'name: "hdr.msg.topic_key"\n    bitwidth: 8',
     "hdr.msg.topic_key = 4097 does not fit the program's 8 bits"),
    ('name: "egress_port"\n    bitwidth: 16', 'name: "egress_port"\n    bitwidth: 16\n  }\n'
     '  params {\n    id: 3\n    name: "extra"\n    bitwidth: 8',
     "action TopicwireIngress.forward takes parameters ['egress_port', 'extra', 'acl_class']"),
    ('name: "meta.field_1"\n    bitwidth: 32\n    match_type: RANGE',
     'name: "meta.field_1"\n    bitwidth: 32\n    match_type: TERNARY',
     "meta.field_1 is a TERNARY field in the program, the entry gives a RANGE match"),
    ("size: 65536", "size: 2", "gets 4 entries; the program's table holds 2"),
])
def test_entries_the_p4info_does_not_allow_are_refused(tmp_path, old, new, message):
    p4info = _edited_p4info(tmp_path, old, new)
    out = tmp_path / "out"
    with pytest.raises(p4_cmd.P4Error, match=re.escape(message)) as info:
        p4_cmd.write_entries(SNAPSHOT, out, p4info=p4info)
    assert str(info.value).startswith("p4: ") and isinstance(info.value, UserError)
    assert not out.exists()  # nothing written


def test_an_action_missing_from_a_table_is_refused(tmp_path):
    doc = p4_cmd.parse_text_proto(P4INFO.read_text())
    log_id = next(a["preamble"][0]["id"][0] for a in doc["actions"]
                  if a["preamble"][0]["name"][0] == "TopicwireIngress.acl_log")
    text = P4INFO.read_text().replace(f"  action_refs {{\n    id: {log_id}\n  }}\n", "")
    p4info = tmp_path / "p4info.txt"
    p4info.write_text(text)
    with pytest.raises(p4_cmd.P4Error, match="table TopicwireIngress.acl_1 has no action "
                                             "'TopicwireIngress.acl_log'"):
        p4_cmd.write_entries(SNAPSHOT, tmp_path / "out", p4info=p4info)


def test_a_snapshot_with_other_acl_field_offsets_is_refused(tmp_path):
    entries = entry_set()
    spec = PipelineSpec(acl_fields=tuple(AclField(f"f{k}", 16 + 4 * k) for k in range(4)))
    moved = EntrySet(spec, entries.key_rows, entries.acl_entries, entries.groups, 1)
    runtime_json.save(moved, tmp_path / "moved.json")
    with pytest.raises(p4_cmd.P4Error, match=r"ACL fields .* are \[\(16, 4\).*the P4 program "
                                             r"parses \[\(0, 4\)"):
        p4_cmd.write_entries(tmp_path / "moved.json", tmp_path / "out")


def test_unreadable_inputs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="cannot read entry file"):
        p4_cmd.write_entries(tmp_path / "missing.json", tmp_path / "out")
    with pytest.raises(p4_cmd.P4Error, match="cannot read the P4Info"):
        p4_cmd.write_entries(SNAPSHOT, tmp_path / "out", p4info=tmp_path / "none.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("tables { preamble { id: 1 }")
    with pytest.raises(p4_cmd.P4Error, match="is never closed"):
        p4_cmd.write_entries(SNAPSHOT, tmp_path / "out", p4info=bad)
    bad.write_text("tables { preamble { id: 1 } }")
    with pytest.raises(p4_cmd.P4Error, match="not a P4Info this tool understands"):
        p4_cmd.write_entries(SNAPSHOT, tmp_path / "out", p4info=bad)


def test_text_format_reader_handles_comments_strings_and_repeats():
    doc = p4_cmd.parse_text_proto(
        '# comment\na { b: 1 b: -2 c: "x\\"y\\000" }\na { d { e: ENUM } }\n')
    assert doc == {"a": [{"b": [1, -2], "c": ['x"y\0']}, {"d": [{"e": ["ENUM"]}]}]}


def test_the_cli_reports_a_missing_compiled_program(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(p4_cmd, "DEFAULT_BMV2_JSON", tmp_path / "none.json")
    shutil.copyfile(SNAPSHOT, tmp_path / "snap.json")
    assert cli(["p4", "entries", "--snapshot", str(tmp_path / "snap.json"), "--out",
                str(tmp_path / "o")]) == 0
    assert "note: no compiled program copied" in capsys.readouterr().out


def test_the_written_runtime_json_loads_back_as_the_snapshot_the_software_nic_runs(tmp_path):
    p4_cmd.write_entries(SNAPSHOT, tmp_path)
    loaded = runtime_json.load(tmp_path / "runtime.json")
    expected = entry_set()
    assert list(loaded.table_entries()) == list(expected.table_entries())
    assert loaded.groups == expected.groups and loaded.spec == expected.spec
    commands = (tmp_path / "commands.txt").read_text().splitlines()
    assert sum(c.startswith("table_add ") for c in commands) == len(
        [e for e in expected.table_entries() if not e.is_default])
    assert sum(c.startswith("mc_mgrp_create ") for c in commands) == len(expected.groups)
