"""The client API's errors: one family under ``ClientError`` (component ``client``)."""

from __future__ import annotations

from datapath.errors import UserError


class ClientError(UserError):
    """A refused client operation (component ``client``)."""

    component = "client"


class LoginError(ClientError):
    """The appliance refused the login (unknown identity, no P&M yet, shutting down)."""


class EntitlementError(ClientError):
    """P&M's entitlements refused a subscription or a publish."""
