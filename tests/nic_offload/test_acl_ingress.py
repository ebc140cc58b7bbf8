"""The ingress verdict of a publisher's content ACL class (nic_offload/softnic/ingress_acl.py)
against the reference: 10,000 random rules compiled by the appliance's path (the
``OffloadCompiler``, a snapshot, the software NIC's ACL arrays), 10,000 random messages, each
decided by the kernel the data path runs, by its Python twin and by ``AclClass.evaluate``."""

from __future__ import annotations

import random

import numpy as np

from datapath.topics.registry import KeyRegistry
from nic_offload import model
from nic_offload.acl import Verdict
from nic_offload.compiler import OffloadCompiler
from nic_offload.model import AclAction
from nic_offload.softnic import ingress_acl
from nic_offload.softnic.twin import acl_twin
from tests.nic_offload.helpers import QUOTE, random_acl_class, random_payload

RULES = 10_000
MESSAGES = 10_000
VERDICT_OF = {int(AclAction.ACCEPT): Verdict.ACCEPT, int(AclAction.REJECT): Verdict.REJECT,
              int(AclAction.LOG): Verdict.LOG}


def test_ten_thousand_rules_and_messages_decide_like_the_reference():
    rng = random.Random(20_017)
    compiler = OffloadCompiler(KeyRegistry(), model.PipelineSpec(acl_table_entries=1 << 22))
    compiler.define_schema(QUOTE)
    classes = []
    rules = 0
    while rules < RULES:
        drawn = random_acl_class(rng, len(classes) + 1, max_rules=min(8, RULES - rules))
        classes.append(compiler.define_acl_class(
            drawn.class_id, QUOTE.name, [r.text for r in drawn.rules], drawn.default))
        rules += len(drawn.rules)
    assert rules == RULES
    tables = compiler.build().tables
    undefined = len(classes) + 1  # a class without entries rejects everything
    buf = np.zeros(8 + 64, np.uint8)
    accepted_but_rejected = 0
    for _ in range(MESSAGES):
        class_id = rng.randint(1, undefined)
        payload = random_payload(rng, rng.choice((16, 16, 16, 24)))
        buf[8:8 + len(payload)] = np.frombuffer(payload, np.uint8)
        got = ingress_acl.verdict(buf, 8, len(payload), class_id, tables)
        twin = acl_twin(bytes(buf), 8, int(tables.class_root[class_id]), tables)
        want = classes[class_id - 1].evaluate(payload) if class_id < undefined \
            else Verdict.REJECT
        assert VERDICT_OF[got] is want and VERDICT_OF[twin] is want, (class_id, payload)
        if want is Verdict.REJECT and got != int(AclAction.REJECT):
            accepted_but_rejected += 1
    assert accepted_but_rejected == 0


def test_a_payload_shorter_than_the_acl_fields_is_refused():
    compiler = OffloadCompiler(KeyRegistry())
    compiler.define_schema(QUOTE)
    compiler.define_acl_class(1, QUOTE.name, [], "ACCEPT")
    tables = compiler.build().tables
    buf = np.zeros(64, np.uint8)
    assert ingress_acl.verdict(buf, 0, 16, 1, tables) == int(AclAction.ACCEPT)
    assert ingress_acl.verdict(buf, 0, 15, 1, tables) == ingress_acl.SHORT_PAYLOAD
