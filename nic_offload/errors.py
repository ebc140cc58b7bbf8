"""Errors of the offload pipeline (component ``offload``), following datapath.errors.

``OffloadError`` is the root; what a user or the control plane asked for and the pipeline
refused is an ``OffloadUserError`` (a bad entry file, an ACL rule that does not parse, a table
that would overflow). Every message says what was refused and what to do.
"""

from __future__ import annotations

from datapath.errors import TopicwireError, UserError

COMPONENT = "offload"


class OffloadError(TopicwireError):
    """Base of every error the offload pipeline raises on purpose."""

    component = COMPONENT


class OffloadUserError(UserError, OffloadError):
    """Refused input: entries, schemas, ACL rules, control state, arguments."""

    component = COMPONENT


class ModelError(OffloadUserError):
    """An entry or entry file that does not fit the pipeline spec (nic_offload.model)."""


class SchemaError(OffloadUserError):
    """A schema that cannot be used: overlapping fields, unknown types, bad offsets."""


class AclError(OffloadUserError):
    """An ACL rule that does not parse or cannot be compiled to the ACL stages."""


class CompileError(OffloadUserError):
    """Control state that cannot be compiled into tables (unknown egress, table full, ...)."""
