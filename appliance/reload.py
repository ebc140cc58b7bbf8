"""What a reload (SIGHUP, docs/appliance.md "Reload (SIGHUP)") can change in a running appliance.

``plan(running, new)`` compares the running config with one just read and checked: which
changed keys apply at run time (``applied``), which need a restart (``restart``, one config
key each), and the config to run with from now on (``config``: the running one with the
run-time keys taken from the new one). A key that needs a restart keeps its running value,
so it is reported again at every reload until the appliance restarts.

Run-time keys: ``log.level`` and ``log.format`` (the process's logging), the P&M document's
inputs at the P&M appliance (``pm.identities`` with the identities of ``pm.entitlements``,
``pm.anonymous``, ``pm.schemas``, ``appliance.namespaces``) and ``[routes]``. Everything else
(addresses, channels, neighbours, the fabric key, limits, threads, the management API,
telemetry, the cache) is opened or sized at start.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from appliance.config import ApplianceConfig

RUN_TIME = {
    "namespaces": "appliance.namespaces",
    "identities": "pm.identities",
    "pm_anonymous": "pm.anonymous",
    "pm_require_passwords": "pm.require_passwords",
    "schemas": "pm.schemas",
    "acl_classes": "pm.acl_classes",
    "pm_flow_policy": "pm.flow_policy",
    "log": "log",
    "routes": "routes",
}
"""Fields of ``ApplianceConfig`` a reload applies -> their config key (``log`` and ``routes``
are reported per key)."""

CONTROL_FIELDS = ("namespaces", "identities", "pm_anonymous", "pm_require_passwords", "schemas",
                  "acl_classes", "pm_flow_policy", "routes")
"""Run-time fields the control agent applies (its ``reload`` command); ``log`` is the
process's (``topicwire run``)."""

RESTART = {
    "name": "appliance.name", "node_id": "appliance.id", "role": "appliance.role",
    "dataplane": "appliance.dataplane", "dataplane_cpus": "appliance.dataplane_cpus",
    "idle": "appliance.idle", "idle_spin_us": "appliance.idle_spin_us",
    "priority": "appliance.priority", "switch_interval_us": "appliance.switch_interval_us",
    "drain_timeout_ms": "appliance.drain_timeout_ms",
    "parked_ttl_ms": "appliance.parked_ttl_ms",
    "retransmit_buffer_messages": "appliance.retransmit_buffer_messages",
    "heartbeat_interval_ms": "appliance.heartbeat_interval_ms",
    "neighbour_dead_ms": "appliance.neighbour_dead_ms",
    "lsa_refresh_ms": "appliance.lsa_refresh_ms",
    "fabric_listen": "fabric.listen", "fabric_key": "fabric.key",
    "fabric_key_id": "fabric.key_id", "fabric_max_frame_bytes": "fabric.max_frame_bytes",
    "neighbours": "neighbours", "groups": "fabric.groups",
    "clients_udp": "clients.udp", "clients_shm": "clients.shm", "clients_rdma": "clients.rdma",
    "max_sessions": "clients.max_sessions", "session_dead_ms": "clients.session_dead_ms",
    "max_guaranteed_sessions": "clients.max_guaranteed_sessions",
    "max_subscriptions": "clients.max_subscriptions",
    "max_registrations": "clients.max_registrations",
    "max_pending_requests": "clients.max_pending_requests",
    "pm_mode": "pm.mode", "pm_registry": "pm.registry",
    "mgmt": "mgmt", "telemetry": "telemetry", "mqtt": "mqtt", "cache": "cache",
    "persist_remote": "cache.remote", "cache_serve_from": "cache.serve_from",
    "mirror_to": "clients.mirror_to",
    "routing_content": "routing.content", "popular_share": "routing.popular_share",
    "counts_interval_ms": "routing.counts_interval_ms",
}
"""Fields that need a restart -> their config key (``mgmt`` is reported per key). A field in
neither table (one added later) needs a restart and is reported by its field name."""

IGNORED = ("source",)
"""Not a key: where the config was read from."""

ROUTE_KEYS = {"switch_grace_ns": "routes.switch_grace_ms",
              "switch_hold_ns": "routes.switch_hold_ms", "table": "routes.table",
              "poll_ns": "routes.poll_ms", "duplicate": "routes.duplicate"}
"""``RouteSettings`` fields -> their config key."""

PM_FIELDS = ("namespaces", "identities", "pm_anonymous", "pm_require_passwords", "schemas",
             "acl_classes", "pm_flow_policy")
"""The P&M document's inputs: when ``pm.mode`` changed they need the restart too."""

LOG_DEFAULTS = {"format": "text", "level": "info"}


@dataclass
class Plan:
    """What a reload does (see the module docstring)."""

    config: ApplianceConfig
    applied: list[str] = field(default_factory=list)
    """Config keys that changed and apply now, in the config's order."""
    restart: list[str] = field(default_factory=list)
    """Config keys that changed and keep their running value until a restart."""
    control: bool = False
    """Whether the control agent has something to apply (its ``reload`` command)."""
    identities: tuple[int, int, int] = (0, 0, 0)
    """P&M identities added, removed, changed."""
    result: dict[str, Any] = field(default_factory=dict)
    """What the control agent's ``reload`` answered (``pm_version`` when P&M's document got
    a new version), once applied."""

    def summary(self) -> str:
        """One line: what was reloaded, what needs a restart."""
        if not self.applied and not self.restart:
            return "nothing changed"
        parts = []
        if self.applied:
            what = []
            for key in self.applied:
                if key == "pm.identities":
                    added, removed, changed = self.identities
                    key += f" ({added} added, {removed} removed, {changed} changed)"
                what.append(key)
            parts.append("applied " + ", ".join(what))
            if "pm_version" in self.result:
                parts.append(f"P&M document version {self.result['pm_version']} flooded")
        else:
            parts.append("nothing to apply")
        if self.restart:
            keys = "key needs" if len(self.restart) == 1 else "keys need"
            parts.append(f"{len(self.restart)} changed {keys} a restart "
                         f"({', '.join(self.restart)})")
        return "; ".join(parts)


def _table_keys(prefix: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [f"{prefix}.{k}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def _route_keys(old: Any, new: Any) -> list[str]:
    if old is None or new is None:
        return [] if old == new else ["routes"]
    return [key for name, key in ROUTE_KEYS.items() if getattr(old, name) != getattr(new, name)]


def plan(running: ApplianceConfig, new: ApplianceConfig) -> Plan:
    """Compare ``running`` with ``new`` (both checked by ``load_config``)."""
    take: dict[str, Any] = {}
    out = Plan(running)
    for f in fields(ApplianceConfig):
        name = f.name
        before, after = getattr(running, name), getattr(new, name)
        if name in IGNORED or before == after:
            continue
        if name in RUN_TIME and not (name in PM_FIELDS and running.pm_mode != new.pm_mode):
            take[name] = after
            if name == "log":
                out.applied += _table_keys("log", LOG_DEFAULTS | before, LOG_DEFAULTS | after)
            elif name == "routes":
                out.applied += _route_keys(before, after)
            else:
                out.applied.append(RUN_TIME[name])
            out.control = out.control or name in CONTROL_FIELDS
        elif name == "mgmt":
            out.restart += _table_keys("mgmt", before, after)
        else:
            out.restart.append(RESTART.get(name) or RUN_TIME.get(name) or name)
    if "identities" in take:
        old, new_ids = running.identities, new.identities
        out.identities = (len(new_ids.keys() - old.keys()), len(old.keys() - new_ids.keys()),
                          sum(1 for k in old.keys() & new_ids.keys() if old[k] != new_ids[k]))
    out.config = replace(running, **take)
    return out
