"""``[pm.acl_classes.NAME]`` and ``pm.identities.NAME.acl_class``: each bad value stops the
start with one message naming its key (exit code 2); a good class lands in P&M's document."""

import subprocess

import pytest

from appliance.config import ConfigError, parse_config
from appliance.control.documents import validate
from appliance.control.pm import embedded_document
from datapath.protocol.admin_layout import ControlKind
from tests.appliance.helpers import CLI, ROOT

QUOTE = {"id": 7, "fields": [["price", 0, "u32"], ["qty", 4, "u32"], ["note", 16, "ascii", 8],
                             ["ratio", 24, "f64"]]}


def _doc(classes, acl_class="capped"):
    ident = {"publish": ["#"], "subscribe": ["#"]}
    if acl_class is not None:
        ident["acl_class"] = acl_class
    return {"appliance": {"name": "a1"}, "clients": {"udp": "127.0.0.1:47999"},
            "pm": {"schemas": {"quote": QUOTE}, "acl_classes": classes,
                   "identities": {"feed": ident}}}


GOOD = {"capped": {"schema": "quote", "rules": ["(price < 5000, ACCEPT, REJECT)"]}}


@pytest.mark.parametrize("classes, acl_class, key", [
    ({"capped": {"schema": "nope", "rules": []}}, "capped", "pm.acl_classes.capped.schema"),
    ({"capped": {"rules": []}}, "capped", "pm.acl_classes.capped.schema"),
    ({"capped": {"schema": "quote", "rules": ["(cost < 5, ACCEPT)"]}}, "capped",
     "pm.acl_classes.capped.rules[0]"),  # unknown field
    ({"capped": {"schema": "quote", "rules": ["(FIELD(9) < 5, ACCEPT)"]}}, "capped",
     "pm.acl_classes.capped.rules[0]"),  # no field 9
    ({"capped": {"schema": "quote", "rules": ["(price < 5, ACCEPT)", "price < 5"]}}, "capped",
     "pm.acl_classes.capped.rules[1]"),  # does not parse
    ({"capped": {"schema": "quote", "rules": ["(price < 5, REJECT|LOG)"]}}, "capped",
     "pm.acl_classes.capped.rules[0]"),  # one verdict, not the seed's alternative
    ({"capped": {"schema": "quote", "rules": ["(note == 'x', ACCEPT)"]}}, "capped",
     "pm.acl_classes.capped.rules[0]"),  # not at an ACL field's offset and width
    ({"capped": {"schema": "quote", "rules": ["(ratio < 1, ACCEPT)"]}}, "capped",
     "pm.acl_classes.capped.rules[0]"),  # a float
    ({"capped": {"schema": "quote", "rules": [5]}}, "capped", "pm.acl_classes.capped.rules[0]"),
    ({"capped": {"schema": "quote", "rules": "(price < 5, ACCEPT)"}}, "capped",
     "pm.acl_classes.capped.rules"),
    ({"capped": {"schema": "quote", "rules": [], "default": "DROP"}}, "capped",
     "pm.acl_classes.capped.default"),
    ({"capped": {"schema": "quote", "rules": [], "colour": 1}}, "capped",
     "pm.acl_classes.capped.colour"),
    ({"bad name!": {"schema": "quote", "rules": []}}, None, "pm.acl_classes.bad name!"),
    ({"capped": "x"}, "capped", "pm.acl_classes.capped"),
    (GOOD, "other", "pm.identities.feed.acl_class"),  # unknown class
    (GOOD, 3, "pm.identities.feed.acl_class"),
])
def test_a_bad_acl_value_is_refused_naming_its_key(classes, acl_class, key):
    with pytest.raises(ConfigError) as info:
        parse_config(_doc(classes, acl_class))
    assert str(info.value).startswith(f"config: {key}:"), str(info.value)
    assert "\n" not in str(info.value)


def test_classes_are_for_the_embedded_pm_only():
    doc = _doc(GOOD)
    doc["pm"] = {"mode": "remote", "acl_classes": GOOD}
    with pytest.raises(ConfigError, match=r"^config: pm\.acl_classes:"):
        parse_config(doc)


def test_a_good_class_travels_in_pm_document():
    cfg = parse_config(_doc({**GOOD, "open": {"schema": "quote", "rules": [],
                                              "default": "LOG"}}))
    doc = embedded_document(cfg)
    assert doc["acl_classes"] == [
        {"name": "capped", "schema": "quote", "rules": ["(price < 5000, ACCEPT, REJECT)"],
         "default": "REJECT"},
        {"name": "open", "schema": "quote", "rules": [], "default": "LOG"}]
    assert doc["identities"]["feed"]["acl_class"] == "capped"
    import json

    validate(ControlKind.PM_UPDATE, json.dumps(doc))  # what every appliance checks


def test_run_exits_2_naming_the_key_of_a_bad_rule(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text('[appliance]\nname = "a"\n[clients]\nudp = "127.0.0.1:47998"\n'
                    '[pm.schemas.quote]\nid = 7\nfields = [["price", 0, "u32"]]\n'
                    '[pm.acl_classes.capped]\nschema = "quote"\n'
                    'rules = ["(price < 5000, ACCEPT, REJECT)", "(cost > 1, REJECT)"]\n')
    proc = subprocess.run([*CLI, "run", "--config", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "pm.acl_classes.capped.rules[1]" in proc.stderr and "ready" not in proc.stdout


def test_a_class_an_appliance_cannot_compile_rejects_everything():
    """A document from another P&M (validated, but naming a schema or field this appliance
    cannot use): the class fails closed; a name given twice keeps its first definition."""
    from appliance.control.acl_apply import classes_of
    from nic_offload.acl import Verdict

    schema = {"name": "quote", "schema_id": 7,
              "fields": [{"name": "price", "offset": 0, "type": "u32", "width": 4}]}
    doc = {"schemas": [schema], "acl_classes": [
        {"name": "a", "schema": "quote", "rules": ["(price < 10, ACCEPT, REJECT)"],
         "default": "REJECT"},
        {"name": "b", "schema": "missing", "rules": [], "default": "ACCEPT"},
        {"name": "c", "schema": "quote", "rules": ["(cost < 1, ACCEPT)"], "default": "ACCEPT"},
        {"name": "a", "schema": "quote", "rules": [], "default": "ACCEPT"}]}
    classes = classes_of(doc)
    assert sorted((i, name) for i, (name, _) in classes.items()) == [(1, "a"), (2, "b"),
                                                                   (3, "c")]
    low, high = (5).to_bytes(4, "big") + bytes(12), (50).to_bytes(4, "big") + bytes(12)
    assert classes[1][1].evaluate(low) is Verdict.ACCEPT
    assert classes[1][1].evaluate(high) is Verdict.REJECT
    for failed in (2, 3):
        assert classes[failed][1].evaluate(low) is Verdict.REJECT
