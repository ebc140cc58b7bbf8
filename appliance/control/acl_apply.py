"""Content ACL classes from P&M's document into the tables and the data path.

Every appliance, at start (an embedded P&M) and whenever a newer document arrives (a remote
P&M's flood, a reload), compiles the document's ``acl_classes`` into its ``OffloadCompiler``
(the snapshot's ACL stage entries, the software NIC's ACL arrays and the P4 entries all come
from there), tells the data path the classes (names and rules, for the audit lines) and
tells it each client session's class: the ``acl_class`` of the session's identity, applied
to every message the session publishes (docs/offload.md, "Content ACLs").

A class this appliance cannot compile (a document from a P&M with other schemas or ACL
fields) rejects everything its identities publish, and is logged: content rules fail closed.
"""

from __future__ import annotations

from typing import Any

from appliance.control import pm as pmod
from appliance.control.state import log
from nic_offload.acl import AclClass, Verdict
from nic_offload.errors import OffloadError
from nic_offload.model import MAX_ACL_CLASS
from nic_offload.schema import Schema


def classes_of(doc: dict[str, Any]) -> dict[int, tuple[str, AclClass]]:
    """id -> (name, class) of the document's classes (a class that does not compile: one
    that rejects everything)."""
    schemas: dict[str, Schema] = {}
    for spec in doc.get("schemas", ()):
        try:
            schemas[spec["name"]] = Schema.from_dict(spec)
        except OffloadError as exc:
            log.error("P&M's schema %r is unusable here (%s)", spec.get("name"), exc)
    out = {}
    ids = pmod.acl_class_ids(doc)
    for class_id, spec in enumerate(doc.get("acl_classes", ()), 1):
        name = spec["name"]
        if ids[name] != class_id:
            continue  # a name given twice: its first definition stands
        try:
            acl = pmod.acl_class_of(spec, schemas, class_id)
        except (OffloadError, KeyError) as exc:
            log.error("content ACL class %r of P&M's document does not compile here (%s); "
                      "it rejects every message of its identities", name, exc)
            acl = AclClass(class_id, next(iter(schemas.values()), Schema.of(name, 1, [])), (),
                           Verdict.REJECT)
        out[class_id] = (name, acl)
    return out


def apply_acl(agent: Any, doc: dict[str, Any] | None) -> None:
    """Compile ``doc``'s classes into ``agent.compiler``, hand them to the data path and give
    every session its identity's class (see the module docstring)."""
    if doc is None:
        return
    classes = classes_of(doc)
    compiler = agent.compiler
    for class_id in set(compiler.acl_classes) - set(classes):
        compiler.remove_acl_class(class_id)
    for class_id, (_, acl) in classes.items():
        old = compiler.acl_classes.get(class_id)
        if old is None or old.rules != acl.rules or old.default != acl.default or (
                old.schema != acl.schema):
            compiler.define_acl_class(class_id, acl.schema, [r.text for r in acl.rules],
                                      acl.default)
    agent.acl_ids = {name: class_id for class_id, (name, _) in classes.items()}
    agent.dp.command("set_acl_classes", classes)
    agent._tables_dirty = True
    for session in agent.sessions.values():
        agent.dp.command("set_session_acl", session.session_id, session_class(agent, session))


def session_class(agent: Any, session: Any) -> int:
    """The class id of ``session``'s identity: 0 when it has none; a class the document does
    not define gets an id no class has, whose messages the tables reject (fail closed)."""
    name = getattr(session.ents, "acl_class", None)
    return 0 if name is None else agent.acl_ids.get(name, MAX_ACL_CLASS)
