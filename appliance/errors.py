"""The appliance's own errors (below every module of the appliance, so each can raise them)."""

from __future__ import annotations

from datapath.errors import UserError


class ConfigError(UserError):
    """A refused configuration: names the key and what to do."""

    component = "config"
