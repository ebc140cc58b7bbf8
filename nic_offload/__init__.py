"""Offload pipeline: match-action tables (topic key, content ACLs) and their executors."""

from nic_offload.acl import AclClass, AclRule, Verdict, compile_class, parse_rule
from nic_offload.compiler import Decision, Egress, OffloadCompiler
from nic_offload.errors import (
    AclError,
    CompileError,
    ModelError,
    OffloadError,
    OffloadUserError,
    SchemaError,
)
from nic_offload.model import (
    DEFAULT_SPEC,
    AclField,
    EntrySet,
    Exact,
    KeyRows,
    Lpm,
    MulticastGroup,
    PipelineSpec,
    Range,
    TableEntry,
    Ternary,
)
from nic_offload.runtime_json import from_runtime_json, load, save, to_runtime_json
from nic_offload.schema import FieldType, Schema, SchemaField
from nic_offload.snapshot import Snapshot, SnapshotSwitch
from nic_offload.softnic import BurstResult, SoftNic

__all__ = [
    "DEFAULT_SPEC",
    "AclClass",
    "AclError",
    "AclField",
    "AclRule",
    "BurstResult",
    "CompileError",
    "Decision",
    "Egress",
    "EntrySet",
    "Exact",
    "FieldType",
    "KeyRows",
    "Lpm",
    "ModelError",
    "MulticastGroup",
    "OffloadCompiler",
    "OffloadError",
    "OffloadUserError",
    "PipelineSpec",
    "Range",
    "Schema",
    "SchemaError",
    "SchemaField",
    "Snapshot",
    "SnapshotSwitch",
    "SoftNic",
    "TableEntry",
    "Ternary",
    "Verdict",
    "compile_class",
    "from_runtime_json",
    "load",
    "parse_rule",
    "save",
    "to_runtime_json",
]
