"""The CONTROL documents' schemas (appliance/control/documents.py): what the appliances and clients
write is accepted; a document of the wrong shape, size, nesting, type, range or text is
refused with a component-prefixed DocumentError and a reason from REASONS, before any field
is read; nothing else ever escapes ``validate``."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.config import parse_config
from appliance.control import documents as d
from appliance.control.pm import embedded_document
from appliance.control.routing import Lsa
from appliance.control.state import _lsa_to_doc
from datapath.protocol.admin_layout import MAX_CONTROL_DOCUMENT_BYTES, ControlKind

K = ControlKind


def _pm_doc() -> dict:
    cfg = parse_config({
        "appliance": {"name": "docs-pm"},
        "pm": {"identities": {"feed": {"publish": ["prices/#"], "subscribe": ["+/x", "#"]}},
               "schemas": {"quote": {"id": 7, "fields": [["price", 0, "u32"],
                                                         ["symbol", 4, "ascii", 8]]}}}})
    doc = embedded_document(cfg)
    doc["routes"] = [[1, 3, [1, 2, 3]]]
    doc["backups"] = [[1, 3, [1, 4, 3]]]
    doc["duplicate"] = [[0, "prices/#"]]
    return doc


GOOD = {  # documents as the appliance and the client library write them
    K.LSA: _lsa_to_doc(Lsa(5, "core-1", 4_000_000_000, 12, ((6, 1), (7, 65_535)))),
    K.INTEREST: {"origin": 5, "epoch": 3, "seq": 9, "patterns": [[0, "a/#"], [2, "+/b"]],
                 "guaranteed": [[0, "g/#"]]},
    K.INTEREST_SELECTORS: {"origin": 5, "epoch": 3, "seq": 9,
                           "selective": [[0, "a/#", ["price > 100", "symbol = 'IBM'"]]]},
    K.RENDEZVOUS_COUNTS: {"origin": 5, "epoch": 3, "seq": 9, "events": 1_000,
                          "counts": [["price", 1_000], ["symbol", 420]],
                          "routes": [[0, "md/#", ["price", "size"]]]},
    K.RENDEZVOUS_REGISTER: {"origin": 5, "epoch": 3, "seq": 10, "target": 6,
                            "rules": [[0, "md/#", "price > 100", "price"]]},
    K.PM_UPDATE: _pm_doc(),
    K.LOGIN: {"identity": "feed", "ring": "client-1-abcd", "token": 2**63 - 1},
    K.LOGIN_RESULT: {"accepted": True, "session": 77, "node": "core-1", "node_id": 5,
                     "schemas": _pm_doc()["schemas"]},
    K.REQUEST_RESULT: {"request": "subscribe", "sub_id": 3, "pattern": "a/#",
                       "accepted": False, "reason": "identity 'x' may not subscribe"},
    K.RESOLVE: {"keys": [0, 2**64 - 1, 12345]},
    K.LOGOUT: {"reason": "client closed"},
    K.ECHO: {"ts": 1_700_000_000_000_000_000},
    K.REPLAY: {"id": 4, "pattern": "orders/#", "namespace": 0, "from_seq": 17},
    K.REPLAY_RESULT: {"id": 4, "accepted": True, "next_seq": 19, "done": False, "count": 2,
                      "page": 2**32 - 1, "frames": 1},
    K.POLICY_DROPS: {"drops": [[2**64 - 1, "drop-oldest", 12], [7, "conflate", 1]]},
    K.PERSISTED: {"streams": [[0x8000_0007, 1, 420, 0, ""],
                              [0x8000_0009, 3, 8, 9, "the cache's queue was full"]],
                  "patterns": ["orders/#", "fx/+/spot"]},
    K.SESSION_MIRROR: {"sessions": [[77, "reader", [[0, "orders/#", 2], [0, "fx/+", 0]]],
                                    [78, "feed", []]], "ended": [12, 2**32 - 1]},
    K.SUCCESSOR: {"op": "set", "req": 7, "successor": "client-b", "vendor": "acme"},
    K.REMOTE_REPLAY: {"fid": 12, "session": 4, "identity": "reader",
                      "request": {"id": 9, "pattern": "orders/#", "namespace": 0,
                                  "durable": "audit", "ack": 17, "wait_ms": 1_000}},
    K.REMOTE_REPLAY_RESULT: {"fid": 12, "result": {"id": 9, "accepted": True, "count": 2,
                                                   "next_seq": 19, "done": False, "page": 3,
                                                   "frames": 1, "position": 17}},
    K.REMOTE_REPLAY_PART: {"fid": 12, "page": 3, "frame": 0, "part": 1, "parts": 40,
                           "data": "AAECAwQF"},
}
OTHER_GOOD = [
    (K.LOGIN, {"identity": "anonymous", "ring": None}),  # bench/fabric.py's login
    (K.LOGIN_RESULT, {"accepted": False, "reason": "no", "node": "core-1"}),
    (K.REQUEST_RESULT, {"request": "register", "topic": "a/b", "namespace": 0,
                        "accepted": True}),
    (K.INTEREST, {"origin": 5, "epoch": 3, "seq": 9, "patterns": []}),
    (K.RENDEZVOUS_REGISTER, {"origin": 5, "epoch": 3, "seq": 11, "target": 6,
                             "rules": []}),  # a withdrawal
    (K.LOGOUT, {}),
    (K.LOGOUT, {"reason": "maintenance", "move": True}),
    (K.LOGIN_RESULT, {"accepted": True, "session": 5, "restored": [[0, "a/#", 1]],
                      "move_on": {"latency_ms": 0.5, "window_s": 5}}),
    (K.SESSION_MIRROR, {"sessions": []}),
    (K.SUCCESSOR, {"op": "candidates", "req": 2, "ok": True, "candidates": ["b", "c"]}),
    (K.SUCCESSOR, {"op": "set", "req": 3, "ok": False, "why": "vendor_mismatch",
                   "error": "successor: set: ..."}),
    (K.SUCCESSOR, {"op": "route", "ancestor": "a", "patterns": [[0, "orders/#"]]}),
    (K.LOGIN, {"identity": "feed", "ring": None, "client_id": "pump-7"}),
    (K.REPLAY, {"id": 1, "pattern": "a/#", "from_time_ns": 0}),
    (K.REPLAY_RESULT, {"id": 1, "accepted": False, "why": "no_cache", "reason": "no"}),
    (K.REMOTE_REPLAY_RESULT, {"fid": 3, "part": 0, "parts": 2, "text": '{"id":1,'}),
    (K.REPLAY_RESULT, {"id": 1, "accepted": False, "why": "remote",
                       "reason": "the cache of core-c is down"}),
    (K.REPLAY_RESULT, {"id": 1, "accepted": True, "count": 0, "next_seq": 1,
                       "done": True}),
    (K.REPLAY_RESULT, {"id": 1, "accepted": True, "count": 0, "next_seq": 9, "done": True,
                       "losses": [{"at": 3, "reason": "CACHE_QUEUE_FULL", "messages": 4,
                                   "topic": "a/b", "origin": 5, "stream": 2**31 + 7,
                                   "first_seq": 10, "last_seq": 13}]}),
]


def _reason(kind, text, sender=None) -> str:
    with pytest.raises(d.DocumentError) as info:
        d.validate(kind, text, sender)
    err = info.value
    assert str(err).startswith(f"control: bad {kind.name.lower()} document: ")
    assert err.reason in d.REASONS
    return err.reason


def test_every_kind_has_a_schema_and_every_sender_a_list():
    assert set(d.KINDS) == set(ControlKind)
    assert set().union(*d.ACCEPTED.values()) == set(ControlKind)


@pytest.mark.parametrize("kind", list(ControlKind), ids=lambda k: k.name)
def test_what_the_project_writes_is_accepted_as_it_is(kind):
    doc = GOOD[kind]
    assert d.validate(kind, json.dumps(doc)) == doc
    assert d.validate(kind, json.dumps(doc).encode()) == doc


@pytest.mark.parametrize("kind,doc", OTHER_GOOD, ids=lambda x: getattr(x, "name", ""))
def test_optional_keys_may_be_left_out(kind, doc):
    assert d.validate(kind, json.dumps(doc)) == doc


@pytest.mark.parametrize("kind", list(ControlKind), ids=lambda k: k.name)
@pytest.mark.parametrize("text", ["[]", '["identity"]', '"x"', "1", "1.5", "null", "true",
                                  "-7", '""'])
def test_a_document_that_is_not_an_object_is_refused(kind, text):
    assert _reason(kind, text) == "wrong_type"


@pytest.mark.parametrize("kind", list(ControlKind), ids=lambda k: k.name)
def test_unknown_keys_are_refused(kind):
    assert _reason(kind, json.dumps({**GOOD[kind], "extra": 1})) == "unknown_key"


@pytest.mark.parametrize("kind", [k for k in ControlKind if d.KINDS[k].schema.required],
                         ids=lambda k: k.name)
def test_each_required_key_is_required(kind):
    for key in d.KINDS[kind].schema.required:
        doc = {k: v for k, v in GOOD[kind].items() if k != key}
        assert _reason(kind, json.dumps(doc)) == "missing_key", key


@pytest.mark.parametrize("kind", list(ControlKind), ids=lambda k: k.name)
def test_every_field_of_the_wrong_type_is_refused(kind):
    for key, value in GOOD[kind].items():
        for wrong in ([value], {"v": value}, "text", 1.5, None, True, 3):
            if type(wrong) is type(value) or (value is None):
                continue
            if key in ("ring", "token") and wrong is None:
                continue  # nullable
            doc = {**GOOD[kind], key: wrong}
            assert _reason(kind, json.dumps(doc)) in ("wrong_type", "out_of_range"), \
                (key, wrong)


def test_bounds_are_checked():
    lsa = GOOD[K.LSA]
    cases = [
        (K.LSA, {**lsa, "origin": 0}), (K.LSA, {**lsa, "origin": 2**31}),
        (K.LSA, {**lsa, "epoch": -1}), (K.LSA, {**lsa, "epoch": 2**63}),  # 64-bit ms
        (K.LSA, {**lsa, "links": [[6, 0]]}), (K.LSA, {**lsa, "links": [[6, 1, 2]]}),
        (K.LSA, {**lsa, "links": [[6]]}), (K.LSA, {**lsa, "name": ""}),
        (K.RESOLVE, {"keys": [1] * (d.MAX_RESOLVE_KEYS + 1)}), (K.RESOLVE, {"keys": [-1]}),
        (K.RESOLVE, {"keys": [2**64]}),
        (K.LOGIN, {"identity": "x" * (d.MAX_IDENTITY_CHARS + 1)}),
        (K.LOGIN, {"identity": "x", "ring": ""}),
        (K.REQUEST_RESULT, {**GOOD[K.REQUEST_RESULT], "request": "delete"}),
        (K.PM_UPDATE, {**GOOD[K.PM_UPDATE], "routes": [[1, 3, [1]]]}),
        (K.LOGIN_RESULT, {**GOOD[K.LOGIN_RESULT], "schemas": [
            {"name": "q", "schema_id": 7, "fields": [{"name": "p", "offset": 0,
                                                      "type": "u128", "width": 4}]}]}),
    ]
    for kind, doc in cases:
        assert _reason(kind, json.dumps(doc)) == "out_of_range", doc
    # a list bound larger than a frame holds is still a bound
    links = d.KINDS[K.LSA].schema.required["links"]
    links.check([[6, 1]] * d.MAX_LIST_ITEMS, "$")
    with pytest.raises(d._Bad) as info:
        links.check([[6, 1]] * (d.MAX_LIST_ITEMS + 1), "$.links")
    assert info.value.reason == "out_of_range"


def test_texts_are_checked():
    cases = [
        (K.INTEREST, {**GOOD[K.INTEREST], "patterns": [[0, "a/b#"]]}),  # not a pattern
        (K.INTEREST, {**GOOD[K.INTEREST], "patterns": [[0, "a\x00b"]]}),
        (K.LSA, {**GOOD[K.LSA], "name": "core 1"}),  # not an appliance name
        (K.PM_UPDATE, {**GOOD[K.PM_UPDATE], "identities": {"x": {"publish": ["a#"],
                                                                 "subscribe": []}}}),
    ]
    for kind, doc in cases:
        assert _reason(kind, json.dumps(doc)) == "bad_text", doc
    lone = '{"identity": "\\ud800"}'  # a lone surrogate: not UTF-8
    assert _reason(K.LOGIN, lone) == "bad_text"


def test_rules_across_keys():
    assert _reason(K.LOGIN_RESULT, '{"accepted": true}') == "missing_key"
    assert _reason(K.REQUEST_RESULT, '{"request": "register", "accepted": true}') == \
        "missing_key"
    assert _reason(K.REQUEST_RESULT, '{"request": "subscribe", "accepted": true}') == \
        "missing_key"


def test_integers_are_json_integers():
    for value in ("1.0", "true", "NaN", "Infinity", "1e3", '"1"'):
        assert _reason(K.ECHO, f'{{"ts": {value}}}') == "wrong_type", value
    assert _reason(K.ECHO, '{"ts": ' + "9" * 5_000 + "}") in ("not_json", "too_large")


def test_size_is_checked_before_parsing():
    limit = d.KINDS[K.LOGIN].max_bytes
    text = json.dumps({"identity": "x" * limit})
    assert _reason(K.LOGIN, text) == "too_large"
    huge = json.dumps({"keys": [], "pad": "x" * MAX_CONTROL_DOCUMENT_BYTES})
    assert _reason(K.RESOLVE, huge) == "too_large"
    # characters are not bytes: 2,000 three-byte characters are 6,000 bytes
    assert _reason(K.LOGIN, json.dumps({"identity": "\u20ac" * 2_000},
                                       ensure_ascii=False)) == "too_large"


def test_nesting_is_bounded():
    assert _reason(K.PM_UPDATE, "[" * 60_000) == "too_deep"
    assert _reason(K.PM_UPDATE, '{"a":' * 10_000 + "1" + "}" * 10_000) == "too_deep"
    deep = '{"keys": ' + "[" * 500 + "]" * 500 + "}"  # parsed, refused at its 2nd level
    assert _reason(K.RESOLVE, deep) == "wrong_type"
    nested = {**GOOD[K.INTEREST], "patterns": [[0, [[[["a"]]]]]]}
    assert _reason(K.INTEREST, json.dumps(nested)) == "wrong_type"


def test_not_json_is_refused():
    for text in ("{", "", "{'a': 1}", '{"a": 1,}', "\x00", b"\xff\xfe"):
        assert _reason(K.LOGOUT, text) == "not_json", text


def test_kinds_a_sender_may_not_send_are_refused_unread():
    for sender, kinds in d.ACCEPTED.items():
        for kind in ControlKind:
            if kind in kinds:
                assert d.validate(kind, json.dumps(GOOD[kind]), sender) == GOOD[kind]
            else:
                assert _reason(kind, "not even JSON", sender) == "not_allowed"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from(list(ControlKind)), value=_json)
def test_any_json_value_is_a_document_or_a_document_error(kind, value):
    text = json.dumps(value)
    try:
        doc = d.validate(kind, text)
    except d.DocumentError as exc:
        assert exc.reason in d.REASONS
    else:
        assert isinstance(doc, dict)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(list(ControlKind)), data=st.data())
def test_mutated_good_documents_are_refused_or_still_fit(kind, data):
    """A field of a good document replaced by any JSON value: either refused, or the value
    fits the field's schema (checked on its own)."""
    doc = dict(GOOD[kind])
    key = data.draw(st.sampled_from(sorted(doc)))
    doc[key] = data.draw(_json)
    schema = d.KINDS[kind].schema
    node = schema.required.get(key) or schema.optional[key]
    try:
        node.check(doc[key], "$")
        fits = schema.rule is None or schema.rule(doc) is None
    except d._Bad:
        fits = False
    if fits:
        assert d.validate(kind, json.dumps(doc)) == doc
    else:
        _reason(kind, json.dumps(doc))


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(list(ControlKind)), data=st.binary(max_size=200))
def test_random_bytes_never_escape_as_anything_else(kind, data):
    for text in (data, data.decode("latin-1")):
        try:
            d.validate(kind, text)
        except d.DocumentError as exc:
            assert exc.reason in d.REASONS
