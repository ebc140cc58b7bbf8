"""The control agent's management side: commands from the management API (``submit``) and
the status snapshot it publishes (``ManagementSide``, one part of ``ControlAgent``;
docs/appliance.md, "Status contract")."""


import sys
import threading
import time
from collections import Counter
from typing import Any

from appliance.build_info import build_info
from appliance.config import (
    STATUS_REFRESH_NS,
    ApplianceConfig,
)
from appliance.control import pm as pmod
from appliance.control.routing import path_cost
from appliance.control.state import (
    log,
)
from appliance.dataplane.status_channels import channel_rows
from datapath.protocol import admin_layout as al

SHUTDOWN_REASON_MAX_CHARS = 200
ASKED_MOVES_KEPT = 65_536
"""Sessions asked to move that the appliance remembers until their standby tells of the move
(``ControlAgent.asked_to_move``): the oldest is forgotten beyond (only its log line and
counter change: ``session_moves_unknown`` instead of ``sessions_moved_out``)."""
"""The longest ``reason`` a ``shutdown`` command may give (it goes into the drain's log line)."""
PM_RELOADED = ("identities", "anonymous", "require_passwords", "namespaces", "schemas",
               "acl_classes")
"""The fields of P&M's document a reload rebuilds from the config (the routes and backups
stay: they come from route tables and commands)."""


class ManagementSide:
    """Management commands and the published status snapshot. Its methods run on the
    control agent's thread with the agent's state (``ControlAgent`` inherits them)."""

    shutdown_reason: str | None = None
    """Set by the ``shutdown`` command: the owner of the appliance stops it (``Appliance.
    shutdown_requested``)."""

    # --- management commands ------------------------------------------------------------------
    def submit(self, command: str, args: dict, timeout_s: float) -> dict:
        done = threading.Event()
        out: dict = {}
        with self._requests_lock:
            self.requests.append((command, args, done, out))
        self.wakeup.set()
        if not done.wait(timeout_s):
            return {"ok": False, "error": f"control: {command!r} not applied within "
                    f"{timeout_s} s; the appliance is busy or stopping"}
        return out

    def _run_requests(self) -> int:
        with self._requests_lock:
            requests, self.requests = self.requests, []
        for command, args, done, out in requests:
            try:
                out.update(self._command(command, args))
            except (KeyError, TypeError, ValueError) as exc:
                out.update(ok=False, error=f"control: {command}: bad arguments ({exc})")
            except Exception as exc:  # a command's failure is its answer, not the agent's end
                self.counters["command_failed"] += 1
                log.error("%s: command %r failed", self.cfg.name, command, exc_info=exc)
                out.update(ok=False, error=f"control: {command} failed "
                           f"({type(exc).__name__}: {exc})")
            done.set()
        return len(requests)

    def _node_named(self, name: object) -> int:
        for node, known in self.names.items():
            if known == name:
                return node
        raise ValueError(f"no appliance named {name!r}")

    def _command(self, command: str, args: dict) -> dict:
        if command == "disconnect_client":
            session = self.sessions.get(int(args["session"]))
            if session is None:
                return {"ok": False, "error": f"control: no client session {args['session']}"}
            self._reply(session, al.ControlKind.LOGOUT, {"reason": "disconnected by management"})
            self._end_session(session, "disconnected by management")
            return {"ok": True}
        if command == "move_clients":
            return self._move_clients(args)
        if command in ("set_route", "clear_route"):
            if self.cfg.pm_mode != "embedded" or self.pm_doc is None:
                return {"ok": False, "error": f"control: {command} goes to the P&M appliance "
                        f"({(self.pm_doc or {}).get('pm', 'unknown')}): route overrides are "
                        "part of its document"}
            src, dst = self._node_named(args["source"]), self._node_named(args["destination"])
            routes = {(int(a), int(b)): tuple(p) for a, b, p in self.pm_doc.get("routes", [])}
            if command == "set_route":
                path = tuple(self._node_named(n) for n in args["path"])
                graph = getattr(self, "graph", {})
                if path[0] != src or path[-1] != dst or path_cost(graph, path) is None:
                    return {"ok": False, "error": "control: set_route: the path must go from "
                            "source to destination over links that are up"}
                routes[(src, dst)] = path
            else:
                routes.pop((src, dst), None)
            self.pm_doc = {**self.pm_doc, "version": max(int(self.pm_doc["version"]) + 1,
                                                         time.time_ns() // 1_000),
                           "routes": [[a, b, list(p)] for (a, b), p in sorted(routes.items())]}
            self._apply_pm(self.pm_doc)
            self._flood(al.ControlKind.PM_UPDATE, self.pm_doc)
            return {"ok": True, "pm_version": self.pm_doc["version"]}
        if command == "set_routes":  # a route table: appliance/control/route_apply.py
            return self.routes_ext.apply(args.get("table"))
        if command == "reload":
            return self._reload(args["config"])
        if command == "shutdown":
            return self._shutdown(args)
        return {"ok": False, "error": f"control: unknown command {command!r}; known: "
                "disconnect_client, move_clients, set_route, clear_route, set_routes, reload, "
                "shutdown"}

    def _move_clients(self, args: dict) -> dict:
        """``move_clients {"sessions": [N, ...]} | {"identity": NAME} | {"all": true}`` and
        an optional ``"reason"``: ask each chosen client session whose client has a standby
        (``LOGIN.standby``) to move there. It gets a LOGOUT with ``move``, its session ends
        here at once, and the client logs in at its standby naming this session (the
        standby then tells this appliance: SESSION_MOVE). Sessions whose client has no
        standby stay, named in ``not_movable``; this appliance's own sessions (its cache,
        the MQTT edge's) are never chosen by ``identity`` or ``all``."""
        unknown = sorted(set(args) - {"sessions", "identity", "all", "reason"})
        chosen = [k for k in ("sessions", "identity", "all") if k in args]
        if unknown or len(chosen) != 1:
            raise ValueError("move_clients takes one of 'sessions' (a list of session "
                             "numbers), 'identity' (a name) or 'all' (true), and an optional "
                             "'reason'" + (f", not {', '.join(map(repr, unknown))}"
                                           if unknown else ""))
        reason = args.get("reason") or "asked to move by management"
        if not isinstance(reason, str) or len(reason) > SHUTDOWN_REASON_MAX_CHARS:
            raise ValueError(f"'reason' must be text of at most {SHUTDOWN_REASON_MAX_CHARS} "
                             "characters")
        missing: list[int] = []
        if "sessions" in args:
            ids = args["sessions"]
            if (not isinstance(ids, list) or not ids or len(ids) > self.cfg.max_sessions
                    or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
                raise ValueError(f"'sessions' must be a list of 1 to {self.cfg.max_sessions} "
                                 "session numbers (GET /clients lists them)")
            missing = [i for i in ids if i not in self.sessions]
            targets = [self.sessions[i] for i in dict.fromkeys(ids) if i in self.sessions]
        else:
            identity = args.get("identity")
            if "all" in args and args["all"] is not True:
                raise ValueError("'all' must be true")
            if "identity" in args and (not isinstance(identity, str) or not identity):
                raise ValueError("'identity' must be an identity's name")
            targets = [s for s in self.sessions.values()
                       if s.identity not in self.internal_logins
                       and (identity is None or s.identity == identity)]
        asked, stay = [], []
        for session in targets:
            if not session.standby:
                stay.append(session.session_id)
                continue
            self._reply(session, al.ControlKind.LOGOUT, {"reason": reason, "move": True})
            self.asked_to_move[session.session_id] = session.identity
            while len(self.asked_to_move) > ASKED_MOVES_KEPT:
                del self.asked_to_move[next(iter(self.asked_to_move))]
            self._end_session(session, f"asked to move to its standby ({reason})")
            asked.append(session.session_id)
        self.counters["sessions_asked_to_move"] += len(asked)
        self.counters["sessions_not_movable"] += len(stay)
        log.warning("%s: %d client sessions asked to move to their standby (%s); %d have none "
                    "and stay", self.cfg.name, len(asked), reason, len(stay))
        return {"ok": True, "asked": asked, "not_movable": stay, "unknown": missing}

    def _shutdown(self, args: dict) -> dict:
        """``shutdown {"reason"?}``: ask the process that runs the appliance to drain and
        stop it as on SIGTERM (``topicwire run`` polls ``shutdown_reason``; the stop itself
        happens there, not on this thread). Asking twice answers the same."""
        unknown = sorted(set(args) - {"reason"})
        if unknown:
            raise ValueError(f"unknown fields {', '.join(map(repr, unknown))}; shutdown takes "
                             "only an optional 'reason'")
        reason = args.get("reason", "")
        if not isinstance(reason, str) or len(reason) > SHUTDOWN_REASON_MAX_CHARS:
            raise ValueError(f"'reason' must be text of at most {SHUTDOWN_REASON_MAX_CHARS} "
                             "characters")
        if self.shutdown_reason is None:
            self.shutdown_reason = reason or "management API"
            self.counters["shutdown_requests"] += 1
            log.info("%s: shutdown requested through the management API (%s)", self.cfg.name,
                     self.shutdown_reason)
        return {"ok": True, "stopping": True, "reason": self.shutdown_reason}

    def _reload(self, new: ApplianceConfig) -> dict:
        """``reload {"config"}``: run with ``new``, a config that differs from the running
        one only in what can change at run time (appliance/reload.py decides that): the
        ``[routes]`` settings and, at the P&M appliance, a new version of its document with
        the new identities, anonymous flag, namespaces, schemas and duplicate patterns,
        applied here (sessions get their new entitlements) and flooded like a route change.
        Sessions stay; nothing else is touched."""
        if not isinstance(new, ApplianceConfig):
            raise TypeError("reload takes {\"config\": an ApplianceConfig}")
        old, self.cfg = self.cfg, new
        out: dict = {"ok": True}
        if new.routes is not None and new.routes != old.routes:
            self.routes_ext.reconfigure(new.routes)
        if new.pm_mode != "embedded" or self.pm_doc is None:
            return out
        fresh = pmod.embedded_document(new)
        doc = {**self.pm_doc, **{k: fresh[k] for k in PM_RELOADED}}
        duplicate = new.routes.duplicate if new.routes is not None else ()
        doc.pop("duplicate", None)
        if duplicate:
            doc["duplicate"] = [[ns, p] for ns in new.namespaces for p in duplicate]
        if doc == self.pm_doc:
            return out
        self.pm_doc = {**doc, "version": max(int(self.pm_doc["version"]) + 1,
                                              time.time_ns() // 1_000)}
        self._apply_pm(self.pm_doc)
        self._flood(al.ControlKind.PM_UPDATE, self.pm_doc)
        self.counters["pm_reloads"] += 1
        out["pm_version"] = self.pm_doc["version"]
        return out

    # --- status -------------------------------------------------------------------------------
    def _status_subscriptions(self) -> list[dict]:
        """The status's subscriptions: this appliance's (clients per pattern) and the
        interest of the others. Rebuilt only when the interest changed (``_advertise_interest``
        counts its runs; a neighbour's interest has its epoch and sequence): a pass over every
        subscription of every session took 180 ms at 40,000 subscriptions, four times a
        second, on the control agent's thread."""
        version = (self.__dict__.get("_interest_runs", 0),
                   tuple((origin, held[0], held[1]) for origin, held in self.interest.items()))
        cached = self.__dict__.get("_status_subs")
        if cached is not None and cached[0] == version:
            return list(cached[1])
        name = self.names.get
        subs: list[dict] = []
        local: Counter = Counter()
        qos_of: dict = {}
        for s in self.sessions.values():
            for key in s.patterns:
                local[(*key, False)] += 1
                qos = s.qos.get(key, "best-effort")
                qos_of.setdefault((*key, False), "best-effort" if qos == "guaranteed" else qos)
            for key in s.gpatterns:
                local[(*key, True)] += 1
                qos_of[(*key, True)] = "guaranteed"
        for (ns, pattern, g), n in sorted(local.items()):
            subs.append({"origin": self.cfg.name, "pattern": pattern, "namespace": ns,
                         "qos": qos_of[(ns, pattern, g)], "clients": n})
        for origin, (_, _, patterns, gpatterns) in sorted(self.interest.items()):
            for ns, pattern in sorted(patterns):
                subs.append({"origin": name(origin, str(origin)), "pattern": pattern,
                             "namespace": ns, "qos": "best-effort", "clients": 0})
            for ns, pattern in sorted(gpatterns):
                subs.append({"origin": name(origin, str(origin)), "pattern": pattern,
                             "namespace": ns, "qos": "guaranteed", "clients": 0})
        self._status_subs = (version, subs)
        return list(subs)

    def _status_clients(self, counts: dict) -> list[dict]:
        """The status's client rows. A session's sorted subscriptions are kept while its
        pattern sets are the same objects (a change replaces them): sorting every session's
        patterns four times a second took 59 ms at 3,000 sessions (a quarter of the control
        thread during their logins), 0.2 s at 10,000."""
        cache: dict[int, tuple] = self.__dict__.setdefault("_status_patterns", {})
        rows = []
        for s in self.sessions.values():
            held = cache.get(s.session_id)
            if held is None or held[0] is not s.patterns or held[1] is not s.gpatterns:
                held = cache[s.session_id] = (
                    s.patterns, s.gpatterns,
                    sorted({p for _, p in s.patterns} | {p for _, p in s.gpatterns}))
            got = counts.get(s.session_id, {})
            rows.append({"session": s.session_id, "identity": s.identity, "channel": s.channel,
                         "subscriptions": list(held[2]), "published": got.get("published", 0),
                         "delivered": got.get("delivered", 0)})
        if len(cache) > 2 * len(self.sessions) + 64:  # sessions gone: forget theirs
            for sid in set(cache) - set(self.sessions):
                del cache[sid]
        return rows

    def _build_status(self, now_ns: int) -> None:
        self._status_at = now_ns + STATUS_REFRESH_NS
        name = self.names.get
        published = self.dp.published
        dp_counters = published.get("counters", {})
        offload = dict(published.get("offload", {}))
        offload.setdefault("verdicts", {})
        offload.setdefault("malformed", {})
        offload["keys"] = len(self.registry)
        for k in ("off_path", "unknown_peer", "transit_frames", "unroutable", "parked_expired",
                  "publish_denied", "no_port", "selector_filtered", "selector_filtered_link",
                  "selector_unknown_schema"):
            offload[k] = int(dp_counters.get(k, 0))
        subs = self._status_subscriptions()
        sessions = published.get("sessions", {})
        self.status_snapshot = {
            "node": {"name": self.cfg.name, "id": self.node_id, "role": self.cfg.role,
                     "epoch": self.epoch, "uptime_s": (now_ns - self.start_ns) / 1e9,
                     "pm": (self.pm_doc or {}).get("pm"),
                     "require_passwords": (pmod.requires_passwords(self.pm_doc)
                                           if self.pm_doc is not None else None),
                     "switch_interval_us": round(sys.getswitchinterval() * 1e6),
                     "build": build_info()},
            "neighbours": [{
                "name": nb.config.name, "id": nb.node_id, "epoch": nb.epoch,
                "address": f"{nb.config.address[0]}:{nb.config.address[1]}",
                "state": "up" if nb.up else "down",
                "last_heard_ms": (now_ns - nb.last_heard_ns) / 1e6 if nb.last_heard_ns else None,
                "rtt_us": nb.rtt_us, "group": nb.config.group,
                "group_heard_ms": ((now_ns - nb.group_heard_ns) / 1e6 if nb.group_heard_ns
                                   else None)} for nb in self.neighbours.values()],
            "subscriptions": subs,
            "routes": [{"source": name(s, str(s)), "destination": name(d, str(d)),
                        "path": [name(x, str(x)) for x in path], "cost": cost}
                       for (s, d), (cost, path) in sorted(self.paths.items())],
            "channels": self._channel_rows(published),
            "offload": offload,
            "denials": [{"identity": i, "action": a, "pattern": p, "count": n}
                        for (i, a, p), n in sorted(self.denials.items())],
            "auth": {"rejected": dict(self.auth.rejected), "accepted": self.auth.accepted},
            "successors": self.successors.status(),
            "clients": self._status_clients(sessions),
            "counters": {**{k: int(v) for k, v in dp_counters.items()},
                         **{f"control_{k}": int(v) for k, v in self.counters.items()},
                         **({"control_replay_forward_pending": len(self.forwarder.pending),
                             "control_replay_forward_held_bytes": self.forwarder.held}
                            if self.forwarder is not None else {})},
            "jit": self._jit_status(),
            "routing": self._routing_status(dp_counters),
        }

    def _routing_status(self, dp_counters: dict) -> dict:
        """``routing``: the content routing mode and, in rendezvous mode, its ring, popular
        set, registrations and counters (docs/routing.md)."""
        out: dict = {"content": self.cfg.routing_content}
        if self.rdv is not None:
            out.update(self.rdv.status())
            out.update({k: int(v) for k, v in self.rdv.counters.items()})
            for k in ("rendezvous_sent", "rendezvous_matched", "rendezvous_forwarded",
                      "rendezvous_duplicates_dropped"):
                out[k] = int(dp_counters.get(k, 0))
        return out

    def _channel_rows(self, published: dict) -> list:
        """The channel rows of the status: their percentiles are worked out once per publish
        of the data path (an idle one publishes every second, the status is rebuilt every
        250 ms)."""
        cached = self._rows_cache
        if cached is None or cached[0] is not published:
            cached = (published, channel_rows(published.get("channels", [])))
            self._rows_cache = cached
        return cached[1]

    def _jit_status(self) -> dict[str, Any] | None:
        """This process's kernels, and those of a data path in a process of its own."""
        if self.jit is None:
            return None
        out = self.jit.status()
        late = getattr(self.dp, "jit_late", None)
        if late:
            out["compiled_after_start"] = {**out["compiled_after_start"],
                                           **{k: list(v) for k, v in late.items()}}
        return out
