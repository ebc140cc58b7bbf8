"""P&M: the authority's document and the entitlement checks every appliance makes with its copy.

The embedded P&M builds its document from the config (``pm.identities``, ``pm.anonymous``,
namespaces, route overrides); every appliance keeps the newest version it has received
(floods carry it, docs/appliance.md) and checks logins, subscriptions and publishes with it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from datapath.topics.algebra import (
    MULTI,
    SINGLE,
    includes,
    matches_levels,
    split_pattern,
    split_topic,
)

if TYPE_CHECKING:
    from appliance.config import ApplianceConfig
    from nic_offload.acl import AclClass


def embedded_document(config: ApplianceConfig) -> dict[str, Any]:
    """The P&M document of an embedded P&M, versioned by wall-clock microseconds (a restarted
    P&M's document is newer than its previous one)."""
    return {
        "pm": config.name,
        "version": time.time_ns() // 1_000,
        "identities": {name: _identity(ident) for name, ident in
                       sorted(config.identities.items())},
        "anonymous": config.pm_anonymous,
        "require_passwords": config.pm_require_passwords,
        "namespaces": list(config.namespaces),
        "schemas": list(config.schemas),
        "acl_classes": [dict(c) for c in config.acl_classes],
        "routes": [],
        **({"flow_policy": config.pm_flow_policy} if config.pm_flow_policy else {}),
    }


def _identity(ident: Any) -> dict[str, Any]:
    """An identity in the document: its entitlements, and its login verifier when it has a
    password (appliance/control/credentials.py; never the password's hash)."""
    out: dict[str, Any] = {"publish": list(ident.publish), "subscribe": list(ident.subscribe),
                           "namespaces": list(ident.namespaces)}
    if ident.acl_class is not None:
        out["acl_class"] = ident.acl_class
    if ident.flow_policy is not None:
        out["flow_policy"] = ident.flow_policy
    if ident.move_on is not None:
        out["move_on"] = dict(ident.move_on)
    if ident.password is not None:
        from appliance.control.credentials import verifier_of

        out["verifier"] = verifier_of(ident.password)
    if ident.scram_sha256 is not None:
        from appliance.control.credentials import parse_scram

        out["scram_sha256"] = parse_scram(ident.scram_sha256).document()  # stored keys only
    return out


def verifier_of(document: dict[str, Any] | None, identity: str) -> dict[str, Any] | None:
    """The login verifier of ``identity`` in a P&M document; None when it has no password
    (it logs in without one, as every identity did before credentials)."""
    if document is None:
        return None
    spec = document.get("identities", {}).get(identity)
    return None if spec is None else spec.get("verifier")


@dataclass(frozen=True)
class Entitlements:
    """What one identity may do."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    acl_class: str | None = None
    """The content ACL class (``acl_classes`` of the document) every message it publishes
    must pass at its ingress appliance; None: none."""
    namespaces: frozenset[int] | None = None
    """The namespaces it may register, publish, subscribe, replay and resolve in (its own
    ``namespaces`` that the document declares); None: any (the appliance's own sessions)."""
    flow_policy: str | None = None
    """The flow-control policy of its subscriptions that ask for none (its own
    ``flow_policy`` in the document, else the document's ``flow_policy``); None: the QoS's
    default (docs/flow-control.md)."""
    move_on: tuple[tuple[str, float], ...] | None = None
    """Its ``move_on`` bounds in the document as (field, value) pairs (given to its
    clients at login), or None."""

    def may_use(self, namespace: int) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    def may_publish(self, topic: str) -> bool:
        """Whether it may publish to (and register) ``topic``; TopicError when ``topic`` is
        not a concrete topic (or an entitlement not a pattern)."""
        return publish_checker(self.publish)(topic)

    def may_subscribe(self, pattern: str) -> bool:
        return any(includes(p, pattern) for p in self.subscribe)


@functools.lru_cache(maxsize=1024)
def publish_checker(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """``topic -> bool``: whether a topic matches one of ``patterns`` (publish entitlements),
    made once per distinct tuple: a pattern ``#`` allows every topic, a prefix ``a/b/#`` is a
    string comparison and a pattern without wildcards an equality, the rest match the
    topic's levels (split once per topic, not once per pattern). A registration of 100,000
    topics checks each in a few microseconds (issue 19). Same answers as ``any(matches(p,
    topic) for p in patterns)``, TopicError included."""
    plan: list[tuple[int, Any]] = []
    for pattern in patterns:
        levels = split_pattern(pattern)
        if levels == (MULTI,):
            plan.append((_ALL, None))
        elif MULTI not in levels and SINGLE not in levels:
            plan.append((_EXACT, pattern))
        elif levels[-1] == MULTI and MULTI not in levels[:-1] and SINGLE not in levels:
            plan.append((_PREFIX, pattern[:-1]))  # "a/b/#" -> "a/b/": "a/b" or "a/b/..."
        else:
            plan.append((_LEVELS, levels))

    def check(topic: str) -> bool:
        levels = split_topic(topic)
        for kind, arg in plan:
            if kind == _ALL:
                return True
            if kind == _PREFIX:
                if topic.startswith(arg) or topic == arg[:-1]:
                    return True
            elif kind == _EXACT:
                if topic == arg:
                    return True
            elif matches_levels(arg, levels):
                return True
        return False

    return check


_ALL, _EXACT, _PREFIX, _LEVELS = range(4)


NONE = Entitlements((), (), namespaces=frozenset())
"""What a session keeps when P&M no longer knows its identity (it stays logged in)."""


def entitlements_of(document: dict[str, Any] | None, identity: str) -> Entitlements | None:
    """The entitlements of ``identity`` in a P&M document; None when it may not log in."""
    if document is None:
        return None
    declared = frozenset(document.get("namespaces", (0,)))
    spec = document.get("identities", {}).get(identity)
    flow = document.get("flow_policy")
    if spec is None:  # anonymous: every namespace P&M declares
        return Entitlements(("#",), ("#",), namespaces=declared, flow_policy=flow) \
            if document.get("anonymous") else None
    return Entitlements(tuple(spec.get("publish", ())), tuple(spec.get("subscribe", ())),
                        spec.get("acl_class"),
                        frozenset(spec.get("namespaces", (0,))) & declared,
                        spec.get("flow_policy", flow),
                        tuple(sorted(spec["move_on"].items())) if "move_on" in spec else None)


def namespace_refusal(ents: Entitlements, identity: str, namespace: int) -> str | None:
    """Why ``identity`` may not act in ``namespace`` (None: it may)."""
    if ents.may_use(namespace):
        return None
    held = ", ".join(str(n) for n in sorted(ents.namespaces or ())) or "none"
    return (f"identity {identity!r} may not use namespace {namespace} (its namespaces in "
            f"P&M: {held})")


def requires_passwords(document: dict[str, Any] | None) -> bool:
    """Whether P&M refuses native logins of identities without a password (a document
    that does not say, from an older P&M, requires them)."""
    return document is None or bool(document.get("require_passwords", True))


def is_newer(document: dict[str, Any], current: dict[str, Any] | None) -> bool:
    return current is None or int(document.get("version", 0)) > int(current.get("version", 0))


# --- content ACL classes ---------------------------------------------------------------------
ACL_VERDICTS = ("ACCEPT", "REJECT", "LOG")
"""What a class's ``default`` may be."""


def acl_class_of(spec: dict[str, Any], schemas: dict[str, Any], class_id: int) -> AclClass:
    """The ``AclClass`` of one ``acl_classes`` entry (``{"name", "schema", "rules",
    "default"}``) over ``schemas`` (name -> ``Schema``), compiled once against the pipeline's
    ACL fields so a rule the tables cannot run is refused here. Raises ``AclError`` (a rule
    that does not parse or compile: its text is in the message) or ``KeyError`` (no such
    schema)."""
    from nic_offload.acl import AclClass, compile_class
    from nic_offload.model import DEFAULT_SPEC

    schema = schemas[spec["schema"]]
    acl = AclClass.parse(class_id, schema, spec["rules"], spec.get("default", "REJECT"))
    compile_class(acl, DEFAULT_SPEC)
    return acl


def acl_class_ids(document: dict[str, Any] | None) -> dict[str, int]:
    """Class name -> its ``acl_class`` id in the tables: 1.. in the document's order (every
    appliance numbers one document the same way; a name given twice keeps its first)."""
    ids: dict[str, int] = {}
    for i, c in enumerate((document or {}).get("acl_classes", ()), 1):
        ids.setdefault(c["name"], i)
    return ids
