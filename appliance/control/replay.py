"""The control agent's replay side: a client's REPLAY request, checked here and handed to
the appliance's cache (``ReplaySide``, one part of ``ControlAgent``; docs/fault-tolerance.md).

The control thread checks what it knows (a cache exists, the identity may subscribe to the
pattern) and refuses with a REPLAY_RESULT saying why; the cache agent's thread reads the page
and answers (appliance/cache/agent.py). Every refusal is counted (``replay_refused_<why>``).
"""

from __future__ import annotations

import time
from typing import Any

from appliance.control.state import Session
from appliance.dataplane.agent import CLIENT_SHM
from datapath.protocol import admin_layout as al


class ReplaySide:
    """Methods of ``ControlAgent`` (they use its state)."""

    cache: Any
    """The appliance's ``CacheAgent`` (None: no ``[cache]``); set by ``Appliance.start``."""
    forwarder: Any
    """``cache.serve_from``'s ``Forwarder`` (control/remote_replay.py), or None."""
    internal_logins: dict[str, tuple[dict, Any]]
    """Identity -> (login verifier, entitlements) of the appliance's own sessions (the
    cache's): P&M does not know them; a password made at each start proves them."""

    def _replay(self, session: Session, doc: dict) -> None:
        """A REPLAY whose document ``validate`` accepted. One that no cache here keeps goes
        to the neighbour ``cache.serve_from`` names, once the identity's entitlements here
        allow it (control/remote_replay.py)."""
        self.counters["replay_requests"] += 1  # type: ignore[attr-defined]
        pattern = doc["pattern"]
        refused = None
        forward = self.forwarder is not None and not self._kept_here(session, doc)  # type: ignore[attr-defined]
        if self.cache is None and not forward:
            refused = "no_cache", (f"cache: appliance {self.cfg.name!r} keeps no messages "  # type: ignore[attr-defined]
                                   "(its config has no [cache]); replay from an appliance "
                                   "with [cache] patterns including this one")
        elif not doc.get("delete") and (reason := self._namespace_refused(  # type: ignore[attr-defined]
                session, "replay", doc.get("namespace", 0))) is not None:
            refused = "entitlement", reason
        elif not doc.get("delete") and not session.ents.may_subscribe(pattern):
            self._deny(session.identity, "replay", pattern)  # type: ignore[attr-defined]
            refused = "entitlement", (f"identity {session.identity!r} may not subscribe to "
                                      f"{pattern!r}, so it may not replay it")
        elif forward:
            refused = self.forwarder.forward(session, doc, time.monotonic_ns())  # type: ignore[attr-defined]
        else:
            dest = session.session_id if session.channel == CLIENT_SHM else session.peer
            refused = self.cache.submit(session.session_id, session.channel, dest, doc,
                                        session.identity)
        if refused is not None:
            why, reason = refused
            self.counters[f"replay_refused_{why}"] += 1  # type: ignore[attr-defined]
            self._reply(session, al.ControlKind.REPLAY_RESULT,  # type: ignore[attr-defined]
                        {"id": doc["id"], "accepted": False, "why": why, "reason": reason})

    def _kept_here(self, session: Session, doc: dict) -> bool:
        """Whether this appliance's own cache answers ``doc``: it keeps the pattern (a
        deletion: it has the durable subscription)."""
        cache = self.cache
        if cache is None:
            return False
        if doc.get("delete"):
            return (session.identity, doc["durable"]) in cache.book.entries
        return doc.get("namespace", 0) == 0 and cache.store.log_of(doc["pattern"]) is not None

    def _entitlements_of(self, identity: str) -> Any:
        """P&M's entitlements of ``identity`` (None: it may not log in), or the appliance's
        own for its internal sessions."""
        from appliance.control import pm as pmod

        internal = self.internal_logins.get(identity)
        if internal is not None:
            return internal[1]
        return pmod.entitlements_of(self.pm_doc, identity)  # type: ignore[attr-defined]

    def _verifier_of(self, identity: str) -> dict | None:
        from appliance.control import pm as pmod

        internal = self.internal_logins.get(identity)
        if internal is not None:
            return internal[0]
        return pmod.verifier_of(self.pm_doc, identity)  # type: ignore[attr-defined]
