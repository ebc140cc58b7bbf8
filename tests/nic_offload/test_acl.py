"""Content ACLs: parsing the seed's rule form, the reference semantics, and the compiled
stage entries deciding exactly like the reference."""

from __future__ import annotations

import random

import numpy as np
import pytest

from nic_offload import model
from nic_offload.acl import AclClass, Verdict, compile_class, parse_rule
from nic_offload.errors import AclError
from nic_offload.model import AclField, EntrySet, KeyRows, PipelineSpec, TableEntry
from nic_offload.schema import Schema
from nic_offload.snapshot import Snapshot
from tests.nic_offload.helpers import QUOTE, random_acl_class, random_payload

VERDICT_OF_ACTION = {model.ACTION_ACL_ACCEPT: Verdict.ACCEPT,
                     model.ACTION_ACL_REJECT: Verdict.REJECT, model.ACTION_ACL_LOG: Verdict.LOG}


def run_entries(entries: list[TableEntry], spec: PipelineSpec, acl_class: int,
                payload: bytes) -> Verdict:
    """What a match-action pipeline does with the entries: per stage, the one entry of
    (class, state) whose range holds the field (none: the table's default, reject)."""
    state = 0
    for stage, field in enumerate(spec.acl_fields):
        value = int.from_bytes(payload[field.offset:field.end], "big")
        hits = [e for e in entries if e.table == model.acl_table(stage)
                and e.match_dict[model.ACL_CLASS_FIELD].value == acl_class
                and e.match_dict[model.ACL_STATE_FIELD].value == state
                and e.match_dict[model.acl_field(stage)].low <= value
                <= e.match_dict[model.acl_field(stage)].high]
        assert len(hits) <= 1, "ranges of one (class, state) overlap"
        if not hits:
            return Verdict.REJECT
        if hits[0].action != model.ACTION_ACL_NEXT:
            return VERDICT_OF_ACTION[hits[0].action]
        state = hits[0].params_dict[model.PARAM_STATE]
    return Verdict.REJECT


def test_the_seed_example_accepts_below_the_value_and_rejects_the_rest():
    acl = AclClass.parse(9, QUOTE, ["(FIELD(1) < 50, ACCEPT, REJECT)"])
    entries = compile_class(acl, model.DEFAULT_SPEC)
    assert [(e.table, e.match[2][1], e.action) for e in entries] == [
        (model.acl_table(0), model.Range(0, 2**32 - 1), model.ACTION_ACL_NEXT),
        (model.acl_table(1), model.Range(0, 49), model.ACTION_ACL_ACCEPT),
        (model.acl_table(1), model.Range(50, 2**32 - 1), model.ACTION_ACL_REJECT)]
    for price, verdict in ((0, Verdict.ACCEPT), (49, Verdict.ACCEPT), (50, Verdict.REJECT),
                           (2**32 - 1, Verdict.REJECT)):
        payload = QUOTE.encode({"price": price})
        assert acl.evaluate(payload) is verdict
        assert run_entries(entries, model.DEFAULT_SPEC, 9, payload) is verdict


def test_the_first_rule_that_decides_wins_and_continue_passes_on():
    acl = AclClass.parse(1, QUOTE, ["(symbol == 'IBM', LOG)", "(price > 100, REJECT, ACCEPT)"])
    ibm = QUOTE.encode({"symbol": "IBM", "price": 500})
    assert acl.evaluate(ibm) is Verdict.LOG
    assert acl.evaluate(QUOTE.encode({"symbol": "MSFT", "price": 500})) is Verdict.REJECT
    assert acl.evaluate(QUOTE.encode({"symbol": "MSFT", "price": 5})) is Verdict.ACCEPT
    assert AclClass.parse(1, QUOTE, ["(price > 100, ACCEPT)"], "LOG").evaluate(
        QUOTE.encode({"price": 1})) is Verdict.LOG


def test_signed_fields_compare_as_signed_values():
    acl = AclClass.parse(1, QUOTE, ["(size < 0, REJECT, ACCEPT)"])
    entries = compile_class(acl, model.DEFAULT_SPEC)
    for size, verdict in ((-1, Verdict.REJECT), (-(2**31), Verdict.REJECT), (0, Verdict.ACCEPT),
                          (2**31 - 1, Verdict.ACCEPT)):
        payload = QUOTE.encode({"size": size})
        assert acl.evaluate(payload) is verdict
        assert run_entries(entries, model.DEFAULT_SPEC, 1, payload) is verdict


@pytest.mark.parametrize("seed", range(40))
def test_compiled_entries_decide_like_the_reference_on_random_classes(seed):
    rng = random.Random(seed)
    acl = random_acl_class(rng, 3)
    entries = compile_class(acl, model.DEFAULT_SPEC)
    for _ in range(40):
        payload = random_payload(rng)
        assert run_entries(entries, model.DEFAULT_SPEC, 3, payload) is acl.evaluate(payload), (
            [r.text for r in acl.rules], QUOTE.decode(payload))


@pytest.mark.parametrize("seed", range(10))
def test_compiled_ranges_are_disjoint_and_cover_every_field(seed):
    acl = random_acl_class(random.Random(seed), 2, max_rules=6)
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for e in compile_class(acl, model.DEFAULT_SPEC):
        stage = int(e.table.rsplit("_", 1)[1])
        span = e.match_dict[model.acl_field(stage)]
        groups.setdefault((stage, e.match_dict[model.ACL_STATE_FIELD].value), []).append(
            (span.low, span.high))
        assert e.priority == model.ACL_ENTRY_PRIORITY
    for spans in groups.values():
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == 2**32 - 1
        assert all(b[0] == a[1] + 1 for a, b in zip(spans, spans[1:]))


def first_hit(entries: list[TableEntry], spec: PipelineSpec, acl_class: int,
              payload: bytes) -> Verdict:
    """An executor that depends on entry order: per stage, the first entry in list order
    whose range holds the field (a TCAM whose entries all have the same priority)."""
    state = 0
    for stage, field in enumerate(spec.acl_fields):
        value = int.from_bytes(payload[field.offset:field.end], "big")
        hit = next((e for e in entries if e.table == model.acl_table(stage)
                    and e.match_dict[model.ACL_CLASS_FIELD].value == acl_class
                    and e.match_dict[model.ACL_STATE_FIELD].value == state
                    and e.match_dict[model.acl_field(stage)].low <= value
                    <= e.match_dict[model.acl_field(stage)].high), None)
        if hit is None:
            return Verdict.REJECT
        if hit.action != model.ACTION_ACL_NEXT:
            return VERDICT_OF_ACTION[hit.action]
        state = hit.params_dict[model.PARAM_STATE]
    return Verdict.REJECT


@pytest.mark.parametrize("seed", range(6))
def test_the_decision_does_not_depend_on_entry_order(seed):
    rng = random.Random(seed)
    classes = [random_acl_class(rng, c, max_rules=6) for c in (1, 2)]
    entries = [e for c in classes for e in compile_class(c, model.DEFAULT_SPEC)]
    orders = [entries, entries[::-1], *(rng.sample(entries, len(entries)) for _ in range(3))]
    tables = [Snapshot.build(EntrySet(model.DEFAULT_SPEC, KeyRows.empty(), tuple(order))).tables
              for order in orders]
    for t in tables[1:]:  # the software NIC compiles every order to the same arrays
        for name in ("class_root", "groups", "bound_lo", "bound_result"):
            assert np.array_equal(getattr(t, name), getattr(tables[0], name)), name
    for _ in range(30):
        payload = random_payload(rng)
        for acl in classes:
            want = acl.evaluate(payload)
            assert [first_hit(order, model.DEFAULT_SPEC, acl.class_id, payload)
                    for order in orders] == [want] * len(orders)


def test_equal_residual_rule_lists_share_one_state():
    acl = AclClass.parse(1, QUOTE, ["(symbol in {'A', 'Z'} and price < 10, ACCEPT)"])
    entries = compile_class(acl, model.DEFAULT_SPEC)
    nexts = {e.params_dict[model.PARAM_STATE] for e in entries
             if e.table == model.acl_table(0) and e.action == model.ACTION_ACL_NEXT}
    assert nexts == {0}  # 'A' and 'Z' lead to the same "price < 10" state


def test_a_field_the_pipeline_does_not_read_is_refused_with_the_fields_it_reads():
    schema = Schema.of("wide", 1, [("a", 0, "u32"), ("b", 20, "u32")])
    acl = AclClass.parse(1, schema, ["(b < 5, ACCEPT)"])
    with pytest.raises(AclError, match=r"not an ACL field of the pipeline \(field_0@0/4"):
        compile_class(acl, model.DEFAULT_SPEC)
    spec = PipelineSpec((AclField("a", 0), AclField("b", 20)))
    assert run_entries(compile_class(acl, spec), spec, 1,
                       schema.encode({"b": 4})) is Verdict.ACCEPT


@pytest.mark.parametrize(("rule", "advice"), [
    ("(price < 5, ACCEPT, REJECT|LOG)", "write one verdict"),
    ("(prise < 5, ACCEPT)", "no field 'prise'"),
    ("(price < 5 ACCEPT)", "does not parse"),
    ("(symbol == 5, ACCEPT)", "quote the constant"),
    ("(price == 'x', ACCEPT)", "is an integer, not text"),
    ("(price < 5, CONTINUE)", "CONTINUE is for ON_MISS"),
    ("(symbol == 'TOOLONG', ACCEPT)", "at most 4 ASCII bytes"),
    ("(FIELD(9) < 1, ACCEPT)", r"not FIELD\(9\)"),
])
def test_bad_rules_are_refused_with_what_to_do(rule, advice):
    with pytest.raises(AclError, match=advice) as info:
        parse_rule(rule, QUOTE)
    assert str(info.value).startswith("offload: ")


def test_float_fields_are_refused_in_acls():
    schema = Schema.of("f", 1, [("x", 0, "f32")])
    with pytest.raises(AclError, match="float"):
        parse_rule("(x < 1, ACCEPT)", schema)


def test_class_ids_outside_sixteen_bits_are_refused():
    with pytest.raises(AclError, match="0 means no ACL"):
        AclClass.parse(0, QUOTE, ["(price < 1, ACCEPT)"])
