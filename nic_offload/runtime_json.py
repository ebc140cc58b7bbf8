"""Entry sets as p4lang runtime JSON (the ``runtime.json`` of p4lang/tutorials), and back.

One file drives every executor: p4lang's ``simple_controller`` programs BMv2 from it, the
software NIC loads it with ``load``. Layout:

    {"target": "bmv2", "p4info": "...", "bmv2_json": "...",
     "table_entries": [
       {"table": T, "default_action": true, "action_name": A, "action_params": {}},
       {"table": "TopicwireIngress.topic_key", "match": {"hdr.msg.topic_key": 4660},
        "action_name": "TopicwireIngress.forward",
        "action_params": {"egress_port": 3, "acl_class": 1}},
       {"table": "TopicwireIngress.acl_0", "priority": 1,
        "match": {"meta.acl_class": 1, "meta.acl_state": 0, "meta.field_0": [0, 49]},
        "action_name": "TopicwireIngress.acl_accept", "action_params": {}}, ...],
     "multicast_group_entries": [
       {"multicast_group_id": 1, "replicas": [{"egress_port": 1, "instance": 1}, ...]}],
     "topicwire": {"format": "topicwire.offload-entries", "format_version": 1,
                   "version": 7, "pipeline": {...}, "counters": [...]}}

Match values follow p4runtime_lib.helper: exact ``v``, ternary ``[v, mask]``, range
``[low, high]``, lpm ``[v, prefix_len]``; integers throughout. The ``topicwire`` key (ignored
by p4lang's tools) carries the pipeline spec, so the file is self-contained.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nic_offload import model
from nic_offload.errors import ModelError
from nic_offload.model import (
    EntrySet,
    Exact,
    Lpm,
    Match,
    MatchKind,
    MulticastGroup,
    PipelineSpec,
    Range,
    TableEntry,
    Ternary,
)

FORMAT = "topicwire.offload-entries"
FORMAT_VERSION = 1
DEFAULT_TARGET = "bmv2"
DEFAULT_P4INFO = "build/topicwire.p4.p4info.txt"
DEFAULT_BMV2_JSON = "build/topicwire.json"
REPLICA_INSTANCE = 1
"""P4Runtime replica instance of every multicast replica (one copy per port)."""


def _match_json(match: Match) -> int | list[int]:
    if isinstance(match, Exact):
        return match.value
    if isinstance(match, Ternary):
        return [match.value, match.mask]
    if isinstance(match, Range):
        return [match.low, match.high]
    return [match.value, match.prefix_len]


def entry_json(entry: TableEntry) -> dict[str, Any]:
    """One entry in runtime-JSON form."""
    doc: dict[str, Any] = {"table": entry.table}
    if entry.is_default:
        doc["default_action"] = True
    else:
        doc["match"] = {name: _match_json(m) for name, m in entry.match}
    if entry.priority is not None:
        doc["priority"] = entry.priority
    doc["action_name"] = entry.action
    doc["action_params"] = dict(entry.params)
    return doc


def to_runtime_json(entries: EntrySet, *, target: str = DEFAULT_TARGET,
                    p4info: str = DEFAULT_P4INFO, bmv2_json: str = DEFAULT_BMV2_JSON
                    ) -> dict[str, Any]:
    """The runtime-JSON document of ``entries`` (paths are relative to the file, as in
    p4lang/tutorials)."""
    spec = entries.spec
    return {
        "target": target,
        "p4info": p4info,
        "bmv2_json": bmv2_json,
        "table_entries": [entry_json(e) for e in entries.table_entries()],
        "multicast_group_entries": [
            {"multicast_group_id": g.group_id,
             "replicas": [{"egress_port": p, "instance": REPLICA_INSTANCE} for p in g.ports]}
            for g in entries.groups],
        "topicwire": {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "version": entries.version,
            "pipeline": spec.to_dict(),
            "counters": [{"name": c.name, "unit": c.unit, "direct_table": c.direct_table}
                         for c in spec.counters()],
        },
    }


def _int(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelError(f"{where}: expected an integer, got {value!r}")
    return value


def _pair(value: object, where: str) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise ModelError(f"{where}: expected [a, b], got {value!r}")
    return _int(value[0], where), _int(value[1], where)


def _parse_match(kind: MatchKind, value: object, where: str) -> Match:
    if kind is MatchKind.EXACT:
        return Exact(_int(value, where))
    a, b = _pair(value, where)
    if kind is MatchKind.TERNARY:
        return Ternary(a, b)
    if kind is MatchKind.RANGE:
        return Range(a, b)
    return Lpm(a, b)


def _parse_entry(spec: PipelineSpec, doc: object, index: int) -> TableEntry:
    where = f"table_entries[{index}]"
    if not isinstance(doc, dict) or "table" not in doc or "action_name" not in doc:
        raise ModelError(f"{where}: an entry needs 'table' and 'action_name'")
    table = spec.table(str(doc["table"]))
    params = doc.get("action_params", {})
    if not isinstance(params, dict):
        raise ModelError(f"{where}: action_params must be an object")
    action = table.action(str(doc["action_name"]))
    ordered = tuple((p.name, _int(params.get(p.name), f"{where}: {p.name}"))
                    for p in action.params)
    if set(params) - {p.name for p in action.params}:
        raise ModelError(f"{where}: {action.name} takes {[p.name for p in action.params]}, got "
                         f"{sorted(params)}")
    priority = doc.get("priority")
    if doc.get("default_action"):
        entry = TableEntry(table.name, (), action.name, ordered, priority, True)
    else:
        match = doc.get("match")
        if not isinstance(match, dict) or set(match) != {k.field for k in table.keys}:
            raise ModelError(f"{where}: match must name {[k.field for k in table.keys]}")
        entry = TableEntry(table.name, tuple(
            (k.field, _parse_match(k.kind, match[k.field], f"{where}: {k.field}"))
            for k in table.keys), action.name, ordered, priority)
    model.validate_entry(spec, entry)
    return entry


def from_runtime_json(doc: Mapping[str, Any]) -> EntrySet:
    """The entry set of a runtime-JSON document written by ``to_runtime_json``."""
    meta = doc.get("topicwire")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelError(f"not a topicwire entry file (no 'topicwire' key of format {FORMAT!r})"
                         "; write it with nic_offload.runtime_json.save")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelError(f"entry file format {meta.get('format_version')!r}; this version reads "
                         f"{FORMAT_VERSION}")
    spec = PipelineSpec.from_dict(meta.get("pipeline", {}))
    defaults = {e.table: e for e in model.default_entries(spec)}
    key_entries, acl_entries = [], []
    for index, raw in enumerate(doc.get("table_entries", [])):
        if isinstance(raw, dict) and raw.get("table") == model.PORT_MAP_TABLE:
            continue  # the P4 program's logical -> physical ports (topicwire p4 entries)
        entry = _parse_entry(spec, raw, index)
        if entry.is_default:
            if entry != defaults[entry.table]:
                raise ModelError(f"table_entries[{index}]: {entry.table} must default to "
                                 f"{defaults[entry.table].action}, got {entry.action}")
        elif entry.table == model.TOPIC_KEY_TABLE:
            key_entries.append(entry)
        else:
            acl_entries.append(entry)
    groups = []
    # the P4 export's replicas are physical ports: the logical groups are kept beside them
    raw_groups = meta.get("logical_groups", doc.get("multicast_group_entries", []))
    for index, raw in enumerate(raw_groups):
        where = f"multicast_group_entries[{index}]"
        try:
            ports = tuple(sorted({_int(r["egress_port"], where) for r in raw["replicas"]}))
            groups.append(MulticastGroup(_int(raw["multicast_group_id"], where), ports))
        except (KeyError, TypeError):
            raise ModelError(f"{where}: needs multicast_group_id and replicas "
                             "[{egress_port, instance}]") from None
    entries = EntrySet(spec, model.key_rows_from_entries(key_entries), tuple(acl_entries),
                       tuple(groups), _int(meta.get("version", 0), "topicwire.version"))
    entries.validate()
    return entries


def save(entries: EntrySet, path: str | os.PathLike[str], **paths: str) -> None:
    """Write ``entries`` as runtime JSON (``paths``: target, p4info, bmv2_json)."""
    Path(path).write_text(json.dumps(to_runtime_json(entries, **paths), indent=1) + "\n")


def load(path: str | os.PathLike[str]) -> EntrySet:
    """Read an entry file written by ``save`` (or by hand in the same layout)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read entry file {os.fspath(path)!r} ({exc})") from None
    if not isinstance(doc, dict):
        raise ModelError(f"entry file {os.fspath(path)!r} is not a JSON object")
    return from_runtime_json(doc)
