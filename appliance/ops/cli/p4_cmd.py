"""``topicwire p4 entries --snapshot FILE --out DIR``: program the P4 pipeline from a snapshot.

Reads a table snapshot in runtime JSON (``nic_offload.runtime_json``: what the table model
writes for the software NIC) and writes, for the P4 program in ``p4/topicwire``:

- ``DIR/runtime.json``: table entries and multicast groups in p4lang/tutorials' layout, with
  ``"p4info"`` and ``"bmv2_json"`` paths relative to DIR (for ``simple_controller``);
- ``DIR/topicwire.p4info.txt``: the P4Info the entries refer to (copied), and
  ``DIR/topicwire.json`` when the compiled program exists (copied);
- ``DIR/commands.txt``: the same entries as ``simple_switch_CLI`` commands (Thrift).

Egress ports in a snapshot are logical (16 bits, nic_offload.model.EGRESS_PORT_BITS); the
program's ``port_map`` table takes a forward's logical port to a physical one (v1model's 9-bit
``egress_spec``) and sends a port it does not name to the CPU port, where the host's data path
delivers it per session. ``--port LOGICAL=PHYSICAL`` (repeated) writes its entries; the
multicast groups' replicas are the physical ports of their logical ports (the CPU port once
for all those without one), and the logical groups stay in runtime.json's ``topicwire`` key
(``logical_groups``) so the software NIC loads the snapshot back unchanged.

Every entry is checked against the P4Info first: a table, action, match field or parameter
the program does not have, a value wider than its field, or a table over its size is refused
with the reason, and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datapath.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from nic_offload.model import EntrySet, TableEntry

COMPONENT = "p4"
P4_PROGRAM_DIR = (Path(__file__).parent / "p4_program").resolve()
"""The P4 program and its P4Info: ``p4_program`` links to the repository's p4/topicwire, and an
installed package holds them there as package data (pyproject.toml)."""
DEFAULT_P4INFO = P4_PROGRAM_DIR / "topicwire.p4info.txt"
DEFAULT_BMV2_JSON = P4_PROGRAM_DIR / "build" / "topicwire.json"
RUNTIME_FILE = "runtime.json"
COMMANDS_FILE = "commands.txt"
P4INFO_FILE = "topicwire.p4info.txt"
BMV2_JSON_FILE = "topicwire.json"

PROGRAM_ACL_FIELDS = ((0, 4), (4, 4), (8, 4), (12, 4))
"""(payload offset, width in bytes) of the ACL fields p4/topicwire/topicwire.p4 parses."""



class P4Error(UserError):
    """Entries the P4 program cannot take, or a P4Info that cannot be read."""

    component = COMPONENT


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``p4 entries``."""
    parser = subparsers.add_parser("p4", help="the P4 program of the offload pipeline")
    commands = parser.add_subparsers(dest="p4_command", metavar="COMMAND", required=True)
    entries = commands.add_parser(
        "entries", help="write runtime.json (and simple_switch_CLI commands) from a snapshot")
    entries.add_argument("--snapshot", required=True, type=Path, metavar="FILE",
                         help="table snapshot in runtime JSON (nic_offload.runtime_json.save)")
    entries.add_argument("--out", required=True, type=Path, metavar="DIR",
                         help="directory to write runtime.json, commands.txt and the P4Info to")
    entries.add_argument("--p4info", type=Path, default=DEFAULT_P4INFO, metavar="FILE",
                         help="P4Info text of the program (default: p4/topicwire's)")
    entries.add_argument("--port", action="append", default=[], type=port_pair,
                         metavar="LOGICAL=PHYSICAL", dest="ports",
                         help="a port_map entry: logical egress port (0..65535) -> physical "
                              "switch port (0..511); repeat it; a logical port without one "
                              "goes to the CPU port (the host delivers it)")
    entries.add_argument("--bmv2-json", type=Path, default=None, metavar="FILE",
                         help="compiled program to copy next to runtime.json (default: "
                              "p4/topicwire/build/topicwire.json when it exists)")
    entries.set_defaults(handler=run)


def port_pair(text: str) -> tuple[int, int]:
    """``LOGICAL=PHYSICAL`` of ``--port``, checked against the model's widths."""
    from nic_offload.model import CPU_PORT, MAX_EGRESS_PORT, MAX_PHYSICAL_PORT

    try:
        logical, physical = (int(part, 0) for part in text.split("="))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give LOGICAL=PHYSICAL, e.g. 40000=7"
                                         ) from None
    if not 0 <= logical <= MAX_EGRESS_PORT or logical == CPU_PORT:
        raise argparse.ArgumentTypeError(f"logical port {logical}: 0..{MAX_EGRESS_PORT}, not "
                                         f"the CPU port {CPU_PORT}")
    if not 0 <= physical <= MAX_PHYSICAL_PORT:
        raise argparse.ArgumentTypeError(f"physical port {physical}: 0..{MAX_PHYSICAL_PORT} "
                                         "(v1model's 9-bit egress_spec)")
    return logical, physical


def run(args: argparse.Namespace) -> int:
    written = write_entries(args.snapshot, args.out, p4info=args.p4info,
                            bmv2_json=args.bmv2_json, port_map=dict(args.ports))
    for path in written:
        print(f"wrote {path}")
    if not any(p.name == BMV2_JSON_FILE for p in written):
        print(f"note: no compiled program copied; {build_hint(args.out / BMV2_JSON_FILE)}")
    return 0


def write_entries(snapshot: Path, out_dir: Path, *, p4info: Path = DEFAULT_P4INFO,
                  bmv2_json: Path | None = None, port_map: dict[int, int] | None = None
                  ) -> list[Path]:
    """Check the snapshot against the P4Info, then write DIR's files; returns their paths.
    ``port_map``: logical egress port -> physical port (the program's port_map entries)."""
    from nic_offload import runtime_json

    entries = runtime_json.load(snapshot)
    info = P4Info.parse(_read(p4info), source=str(p4info))
    port_map = dict(sorted((port_map or {}).items()))
    check_entries(info, entries, port_map)
    doc = runtime_json.to_runtime_json(entries, p4info=P4INFO_FILE, bmv2_json=BMV2_JSON_FILE)
    doc["table_entries"] += [runtime_json.entry_json(e) for e in port_map_entries(port_map)]
    doc["topicwire"]["logical_groups"] = doc["multicast_group_entries"]
    doc["multicast_group_entries"] = [
        {"multicast_group_id": group_id,
         "replicas": [{"egress_port": p, "instance": runtime_json.REPLICA_INSTANCE}
                      for p in ports]}
        for group_id, ports in physical_groups(entries, port_map)]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = [out_dir / RUNTIME_FILE, out_dir / COMMANDS_FILE, out_dir / P4INFO_FILE]
        written[0].write_text(json.dumps(doc, indent=1) + "\n")
        written[1].write_text("\n".join(bmv2_commands(entries, port_map)) + "\n")
        shutil.copyfile(p4info, written[2])
        source = bmv2_json if bmv2_json is not None else DEFAULT_BMV2_JSON
        if bmv2_json is not None and not bmv2_json.is_file():
            raise P4Error(f"no compiled program at {bmv2_json}; "
                          f"{build_hint(out_dir / BMV2_JSON_FILE)}, or leave out --bmv2-json")
        if source.is_file():
            written.append(out_dir / BMV2_JSON_FILE)
            shutil.copyfile(source, written[-1])
    except OSError as exc:
        raise P4Error(f"cannot write to {out_dir}: {exc}") from None
    return written


def port_map_entries(port_map: dict[int, int]) -> list[TableEntry]:
    """The port_map table's entries: its default (the CPU port), then one per logical port."""
    from nic_offload import model

    default = model.TableEntry(model.PORT_MAP_TABLE, (), model.ACTION_TO_CPU, (), None, True)
    return [default, *(model.TableEntry.make(model.PORT_MAP_TABLE,
                                             {model.PORT_MAP_FIELD: model.Exact(logical)},
                                             model.ACTION_TO_PORT, {model.PARAM_PORT: physical})
                       for logical, physical in sorted(port_map.items()))]


def physical_groups(entries: EntrySet, port_map: dict[int, int]
                    ) -> list[tuple[int, tuple[int, ...]]]:
    """(group id, physical replica ports) of the snapshot's multicast groups: each logical
    port through ``port_map``, the CPU port (once) for those it does not name."""
    from nic_offload.model import CPU_PORT

    return [(g.group_id, tuple(sorted({port_map.get(p, CPU_PORT) for p in g.ports})))
            for g in entries.groups]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise P4Error(f"cannot read the P4Info {path}: {exc}; pass --p4info (the program's "
                      f"is {DEFAULT_P4INFO})") from None


def build_hint(target: Path) -> str:
    """How to compile the program (with p4c) to ``target``: ``make`` in a checkout, p4c's
    command where the package is installed (it holds the program, not its Makefile)."""
    if (P4_PROGRAM_DIR / "Makefile").is_file():
        return (f"build it with 'make -C {P4_PROGRAM_DIR}' and copy build/{BMV2_JSON_FILE} to "
                f"{target}")
    return (f"compile it with 'p4c-bm2-ss --p4v 16 -o {target} "
            f"{P4_PROGRAM_DIR / 'topicwire.p4'}' (p4lang's p4c)")


# --- P4Info text format ------------------------------------------------------------------------
_TOKEN = re.compile(r'\s*(?:#[^\n]*\n?|(?P<word>[A-Za-z_][\w.]*)|(?P<str>"(?:[^"\\]|\\.)*")'
                    r"|(?P<num>-?\d+)|(?P<sym>[{}:]))")


def parse_text_proto(text: str) -> dict[str, list[Any]]:
    """Protobuf text format as nested dicts: every field maps to the list of its values
    (scalars, enum names as strings, or nested dicts)."""
    tokens: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            if text[pos:].strip() == "":
                break
            raise P4Error(f"P4Info text: cannot read {text[pos:pos + 20]!r} at offset {pos}")
        pos = match.end()
        kind = match.lastgroup
        if kind == "str":
            raw = match.group(kind)[1:-1]
            tokens.append(("value", raw.encode("latin-1", "backslashreplace").decode(
                "unicode_escape")))
        elif kind == "num":
            tokens.append(("value", int(match.group(kind))))
        elif kind is not None:
            tokens.append((kind, match.group(kind)))
    message, rest = _message(tokens, 0)
    if rest != len(tokens):
        raise P4Error("P4Info text: unbalanced '}'")
    return message


def _message(tokens: list[tuple[str, Any]], i: int) -> tuple[dict[str, list[Any]], int]:
    out: dict[str, list[Any]] = {}
    while i < len(tokens) and tokens[i] != ("sym", "}"):
        kind, name = tokens[i]
        if kind != "word":
            raise P4Error(f"P4Info text: expected a field name, found {name!r}")
        i += 1
        if i < len(tokens) and tokens[i] == ("sym", ":"):
            i += 1
        if i < len(tokens) and tokens[i] == ("sym", "{"):
            value, i = _message(tokens, i + 1)
            if i >= len(tokens):
                raise P4Error(f"P4Info text: {name} {{ is never closed")
            i += 1
        elif i < len(tokens) and tokens[i][0] in ("value", "word"):
            value = tokens[i][1]
            i += 1
        else:
            raise P4Error(f"P4Info text: field {name} has no value")
        out.setdefault(name, []).append(value)
    return out, i


@dataclass(frozen=True, slots=True)
class MatchFieldInfo:
    name: str
    bitwidth: int
    match_type: str


@dataclass(frozen=True, slots=True)
class TableInfo:
    id: int
    name: str
    match_fields: tuple[MatchFieldInfo, ...]
    action_ids: frozenset[int]
    size: int


@dataclass(frozen=True, slots=True)
class ActionInfo:
    id: int
    name: str
    params: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class P4Info:
    """What the entries need from a P4Info: tables, actions, direct counters, digests."""

    tables: dict[str, TableInfo]
    actions: dict[str, ActionInfo]
    direct_counters: dict[str, int]
    digests: dict[str, tuple[tuple[str, int], ...]]
    """Digest name -> (member, bitwidth) of its struct."""

    @classmethod
    def parse(cls, text: str, source: str = "P4Info") -> P4Info:
        doc = parse_text_proto(text)
        try:
            tables = {}
            for t in doc.get("tables", []):
                pre = t["preamble"][0]
                fields = tuple(MatchFieldInfo(f["name"][0], int(f["bitwidth"][0]),
                                              str(f["match_type"][0]))
                               for f in t.get("match_fields", []))
                tables[pre["name"][0]] = TableInfo(
                    int(pre["id"][0]), pre["name"][0], fields,
                    frozenset(int(a["id"][0]) for a in t.get("action_refs", [])),
                    int(t.get("size", [0])[0]))
            actions = {}
            for a in doc.get("actions", []):
                pre = a["preamble"][0]
                actions[pre["name"][0]] = ActionInfo(
                    int(pre["id"][0]), pre["name"][0],
                    tuple((p["name"][0], int(p["bitwidth"][0])) for p in a.get("params", [])))
            counters = {c["preamble"][0]["name"][0]: int(c["direct_table_id"][0])
                        for c in doc.get("direct_counters", [])}
            structs = {s["key"][0]: s["value"][0]
                       for s in doc.get("type_info", [{}])[0].get("structs", [])}
            digests = {}
            for d in doc.get("digests", []):
                struct = d["type_spec"][0]["struct"][0]["name"][0]
                members = structs.get(struct, {}).get("members", [])
                digests[d["preamble"][0]["name"][0]] = tuple(
                    (m["name"][0], int(m["type_spec"][0]["bitstring"][0]["bit"][0]
                                       ["bitwidth"][0])) for m in members)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise P4Error(f"{source} is not a P4Info this tool understands ({exc!r}); "
                          "regenerate it with p4c-bm2-ss --p4runtime-files") from None
        return cls(tables, actions, counters, digests)


# --- checking entries against the P4Info --------------------------------------------------------
def check_entries(info: P4Info, entries: EntrySet, port_map: dict[int, int] | None = None
                  ) -> None:
    """Raise P4Error unless every entry, port_map entry and group fits the program ``info``
    describes."""
    spec_fields = tuple((f.offset, f.width) for f in entries.spec.acl_fields)
    if spec_fields != PROGRAM_ACL_FIELDS:
        raise P4Error(f"the snapshot's ACL fields (offset, bytes) are {list(spec_fields)}; "
                      f"the P4 program parses {list(PROGRAM_ACL_FIELDS)}; compile the snapshot "
                      "with the default pipeline spec or change p4/topicwire/topicwire.p4")
    counts: dict[str, int] = {}
    for index, entry in enumerate([*entries.table_entries(),
                                   *port_map_entries(port_map or {})]):
        _check_entry(info, entry, index)
        if not entry.is_default:
            counts[entry.table] = counts.get(entry.table, 0) + 1
    for table, count in counts.items():
        size = info.tables[table].size
        if size and count > size:
            raise P4Error(f"{table} gets {count} entries; the program's table holds {size}; "
                          "raise its size in topicwire.p4 or split the snapshot")
    from nic_offload.model import PHYSICAL_PORT_BITS

    for group_id, ports in physical_groups(entries, port_map or {}):
        wide = [p for p in ports if not 0 <= p < 1 << PHYSICAL_PORT_BITS]
        if wide:
            raise P4Error(f"multicast group {group_id}: physical ports {wide} do not fit "
                          f"{PHYSICAL_PORT_BITS} bits")


def _check_entry(info: P4Info, entry: TableEntry, index: int) -> None:
    from nic_offload.model import Exact, Lpm, Range, Ternary

    where = f"entry {index} ({entry.table})"
    table = info.tables.get(entry.table)
    if table is None:
        raise P4Error(f"{where}: the P4 program has no table {entry.table!r}; its tables are "
                      f"{', '.join(sorted(info.tables))}; regenerate the P4Info or the snapshot")
    action = info.actions.get(entry.action)
    if action is None or action.id not in table.action_ids:
        takes = ", ".join(a.name for a in info.actions.values() if a.id in table.action_ids)
        raise P4Error(f"{where}: table {entry.table} has no action {entry.action!r}; it takes "
                      f"{takes}")
    got = tuple(name for name, _ in entry.params)
    want = tuple(name for name, _ in action.params)
    if got != want:
        raise P4Error(f"{where}: action {entry.action} takes parameters {list(want)} in the "
                      f"P4 program, the entry gives {list(got)}")
    for (name, value), (_, bits) in zip(entry.params, action.params):
        _fits(f"{where}: {entry.action}({name})", value, bits)
    if entry.is_default:
        return
    names = tuple(name for name, _ in entry.match)
    fields = tuple(f.name for f in table.match_fields)
    if names != fields:
        raise P4Error(f"{where}: the program matches {list(fields)}, the entry {list(names)}")
    kinds = {Exact: "EXACT", Ternary: "TERNARY", Range: "RANGE", Lpm: "LPM"}
    for (name, match), field in zip(entry.match, table.match_fields):
        kind = kinds[type(match)]
        if kind != field.match_type:
            raise P4Error(f"{where}: {name} is a {field.match_type} field in the program, the "
                          f"entry gives a {kind} match")
        values = (match.low, match.high) if isinstance(match, Range) else (match.value,)
        for value in values:
            _fits(f"{where}: {name}", value, field.bitwidth)
    if any(f.match_type in ("RANGE", "TERNARY") for f in table.match_fields) and \
            not entry.priority:
        raise P4Error(f"{where}: range and ternary tables need a priority >= 1")


def _fits(what: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise P4Error(f"{what} = {value} does not fit the program's {bits} bits")


# --- simple_switch_CLI ---------------------------------------------------------------------------
def bmv2_commands(entries: EntrySet, port_map: dict[int, int] | None = None) -> list[str]:
    """The entries as ``simple_switch_CLI`` commands (a fresh switch: node handles from 0);
    multicast replicas on physical ports (``physical_groups``)."""
    from nic_offload.model import Range

    lines: list[str] = []
    for entry in [*entries.table_entries(), *port_map_entries(port_map or {})]:
        params = " ".join(str(value) for _, value in entry.params)
        if entry.is_default:
            lines.append(f"table_set_default {entry.table} {entry.action} {params}".rstrip())
            continue
        keys = " ".join(f"{m.low}->{m.high}" if isinstance(m, Range) else str(m.value)
                        for _, m in entry.match)
        tail = " ".join(_nonempty([params, str(entry.priority or "")]))
        lines.append(f"table_add {entry.table} {entry.action} {keys} => {tail}".rstrip())
    for handle, (group_id, ports) in enumerate(physical_groups(entries, port_map or {})):
        lines.append(f"mc_mgrp_create {group_id}")
        lines.append(f"mc_node_create {group_id} {' '.join(map(str, ports))}")
        lines.append(f"mc_node_associate {group_id} {handle}")
    return lines


def _nonempty(parts: Iterable[str]) -> list[str]:
    return [p for p in parts if p]
