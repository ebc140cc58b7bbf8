"""Errors of the management API and ``topicwire status`` (component ``mgmt`` / ``status``)."""

from __future__ import annotations

from datapath.errors import DeviceError, UserError


class MgmtError(UserError):
    """A refused management request or setting: names what and what to do."""

    component = "mgmt"


class StatusUsageError(UserError):
    """``topicwire status`` was given something wrong (URL, token): exit code 2."""

    component = "status"


class StatusUnreachable(DeviceError):
    """``topicwire status`` could not reach the appliance or read its answer: exit code 1."""

    component = "status"
